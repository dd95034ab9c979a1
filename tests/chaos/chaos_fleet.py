"""The chaos soak's moving parts: a server it may restart, worker processes, seeded faults.

* :func:`chaos_server` starts a dedicated embedded PostgreSQL (not the session's: restarting
  that would pull the rug from under other tests) with ``max_connections`` for a fleet and
  ``synchronous_commit = on``, so a commit the server acknowledged survives an immediate
  restart (fsync stays off: the machine does not crash, only the server processes die).
  :meth:`ChaosServer.restart` runs ``pg_ctl restart -m fast|immediate`` as the OS user that owns
  the data directory (``embedded_postgres`` when the tests run as root).
* :class:`Fleet` keeps one ``python -m zeroth_pg.worker --app chaos_apps:work`` process per slot
  (slots are spread over the tenants) and respawns a killed one under a new worker id. The
  worker names its connections ``zeroth-worker:<id>`` (pool) and ``zeroth-listener:<id>``.
* :class:`FaultInjector` draws faults from RNGs seeded by the test. Every 1-2.5 s, one at a
  time, in shuffled rounds: SIGKILL a worker and respawn it (twice a round), and
  ``pg_terminate_backend`` on a worker's pool connection, and on its listener. Per tenant, every
  0.5-2 s: SIGSTOP a busy worker (never two of one tenant) and SIGCONT it once its lease has
  lapsed, 0.3-1.5 s past it (the zombie). :meth:`FaultInjector.restart` restarts the server
  between two kills. Every fault is recorded as a harness event in ``chaos_events``, with the
  live leases its victim held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import asyncpg

from zeroth_pg._server import DedicatedServer, dedicated_server
from zeroth_pg.errors import RetryableError, translate

__all__ = ["ChaosServer", "FaultInjector", "Fleet", "FleetConfig", "chaos_server", "harness_pool"]

REPO = Path(__file__).resolve().parents[2]
CHAOS_DIR = Path(__file__).resolve().parent
DEPLOYMENT = "chaos"
T = TypeVar("T")

_SERVER_SETTINGS = (("max_connections", "300"), ("fsync", "off"), ("full_page_writes", "off"),
                    ("synchronous_commit", "on"))
# What the worker logs when the fence or a renewal refuses it, or a lease runs out locally.
_LOG_MARKERS = {"write_refused": "(write refused)", "renewal_refused": ") lost",
                "deadline_fail_stop": "no confirmed lease since its deadline"}
_COMPLETED = re.compile(r"run (\S+) completed at generation (\d+)")
# The worker's line when a claim's answer arrives (DEBUG), stamped by its logging (local time).
_CLAIMED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) DEBUG \S+ "
                      r"run (\S+) claimed at generation (\d+)")


# -- the server -----------------------------------------------------------------------------


#: The soak's server: the shared embedded one, restartable (zeroth_pg._server.dedicated_server).
ChaosServer = DedicatedServer


@contextlib.contextmanager
def chaos_server() -> Iterator[ChaosServer]:
    """A dedicated embedded server for the soak, stopped and deleted on exit."""
    with dedicated_server(_SERVER_SETTINGS, data_in_memory=True) as server:
        yield server


async def harness_pool(dsn: str) -> asyncpg.Pool:
    return await asyncpg.create_pool(dsn, min_size=1, max_size=4,
                                     server_settings={"application_name": "chaos-harness"})


def transient(exc: Exception) -> bool:
    """What zeroth_pg calls retryable, and asyncpg's InternalClientError ("cannot switch to
    state …; another operation (2) is in progress"), which asyncpg raises on a pooled connection
    the server has just terminated and zeroth_pg.errors does not (yet) map: docs/reliability.md."""
    return isinstance(translate(exc), RetryableError | asyncpg.InternalClientError)


async def retrying(call: Callable[[], Awaitable[T]], within: float = 60.0) -> T:
    """``await call()``, repeated through transient errors (a restart) for up to ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except Exception as exc:
            if not transient(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


# -- the workers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FleetConfig:
    tenants: tuple[str, ...]
    workers: int
    concurrency: int
    lease: float
    fleet_limits: dict[str, int]
    """tenant → max_concurrency its workers claim with (admission slots under chaos)."""


class WorkerProcess:
    """One worker subprocess; its stderr is read continuously (tail kept, markers counted)."""

    def __init__(self, proc: asyncio.subprocess.Process, worker_id: str, tenant: str,
                 log_path: Path | None = None) -> None:
        self.proc = proc
        self.worker_id = worker_id
        self.tenant = tenant
        self.frozen = False
        self.killed = False
        self.tail: deque[str] = deque(maxlen=60)
        self.markers: Counter[str] = Counter()
        self.completed: list[tuple[str, int]] = []
        """(run id, generation) of every completion the database acknowledged (logged at
        DEBUG: a fleet started with ``log_level="DEBUG"``; the failover soak compares them with
        what the promoted standby holds)."""
        self.claimed: list[tuple[datetime, str, int]] = []
        """(when its answer arrived, run id, generation) of every claim this worker was answered
        (logged at DEBUG, stamped by the worker: the harness may read the line later)."""
        self.started = asyncio.Event()
        """Set once the worker logged that it started (its pool is connected by then)."""
        self.log_path = log_path
        """Where every line it logs is copied too (None: only the tail is kept)."""
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.ExitStack() as files:
            copy = (files.enter_context(self.log_path.open("a", encoding="utf-8"))
                    if self.log_path is not None else None)
            async for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                if copy is not None:
                    copy.write(line + "\n")
                self._line(line)

    def _line(self, line: str) -> None:
        self.tail.append(line)
        if f"worker {self.worker_id} started" in line:
            self.started.set()
        if (completed := _COMPLETED.search(line)) is not None:
            self.completed.append((completed[1], int(completed[2])))
        if (claimed := _CLAIMED.search(line)) is not None:
            at = datetime.strptime(claimed[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
            self.claimed.append((at, claimed[2], int(claimed[3])))
        for name, marker in _LOG_MARKERS.items():
            if marker in line:
                self.markers[name] += 1

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    async def until_started(self) -> None:
        """Wait (up to 30 s) until the worker has started, or has exited."""
        exited = asyncio.ensure_future(self.proc.wait())
        started = asyncio.ensure_future(self.started.wait())
        await asyncio.wait([exited, started], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        started.cancel()

    async def finish(self) -> None:
        """SIGCONT + SIGTERM (the worker drains), SIGKILL if it does not exit in 15 s."""
        await self.until_started()  # a SIGTERM before its handlers are installed is no drain
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=15)
            except TimeoutError:
                self.signal(signal.SIGKILL)
                await self.proc.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pump, timeout=5)


class Fleet:
    """One worker process per slot; slot i serves tenant i mod len(tenants)."""

    def __init__(self, dsn: str, config: FleetConfig, *, log_level: str = "INFO",
                 log_dir: Path | None = None) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        """Each worker's log is copied to ``<log_dir>/<worker id>.log`` (None: not kept)."""
        self.config = config
        self.log_level = log_level
        self.slots = [f"{config.tenants[i % len(config.tenants)]}-{i // len(config.tenants)}"
                      for i in range(config.workers)]
        self.current: dict[str, WorkerProcess] = {}
        self.every: list[WorkerProcess] = []
        self.unexpected_exits: list[str] = []
        self._incarnation: Counter[str] = Counter()

    async def start(self) -> None:
        await asyncio.gather(*(self.spawn(slot) for slot in self.slots))

    async def spawn(self, slot: str) -> WorkerProcess:
        self._incarnation[slot] += 1
        tenant = slot.rsplit("-", 1)[0]
        worker_id = f"{slot}.{self._incarnation[slot]}"
        paths = [str(CHAOS_DIR)]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "CHAOS_AUDIT_DSN": self.dsn}
        limit = self.config.fleet_limits.get(tenant)
        extra = ["--fleet-concurrency", str(limit)] if limit else []
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "zeroth_pg.worker", "--dsn", self.dsn,
            "--deployment", DEPLOYMENT, "--app", "chaos_apps:work", "--tenant", tenant,
            "--worker-id", worker_id, "--concurrency", str(self.config.concurrency),
            "--lease", str(self.config.lease), "--orphan-sweep-interval", "1",
            "--poll-interval", "0.5", "--retry-base", "0.2", "--shutdown-timeout", "5",
            "--log-level", self.log_level, *extra,
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        worker = WorkerProcess(proc, worker_id, tenant, None if self.log_dir is None
                               else self.log_dir / f"{worker_id}.log")
        self.current[slot] = worker
        self.every.append(worker)
        return worker

    def slot_of(self, worker: WorkerProcess) -> str:
        return next(slot for slot, w in self.current.items() if w is worker)

    def targets(self) -> list[WorkerProcess]:
        return [w for w in self.current.values() if w.alive and not (w.frozen or w.killed)]

    async def reap(self) -> None:
        """Respawn any worker that exited without being killed (and remember it: a failure)."""
        for slot, worker in list(self.current.items()):
            if not worker.alive and not worker.killed:
                self._unexpected(worker)
                await self.spawn(slot)

    async def finish(self) -> None:
        """Stop every worker; one that died on its own, or did not drain cleanly, is a failure."""
        dead = [w for w in self.current.values() if not w.alive and not w.killed]
        await asyncio.gather(*(w.finish() for w in self.every))
        for worker in self.current.values():
            if worker in dead or (not worker.killed and worker.proc.returncode != 0):
                self._unexpected(worker)

    def _unexpected(self, worker: WorkerProcess) -> None:
        self.unexpected_exits.append(
            f"{worker.worker_id} exited {worker.proc.returncode}:\n" + "\n".join(worker.tail))

    def claims_answered(self) -> list[tuple[datetime, str, int]]:
        """(when, run id, generation) of every claim answered to any worker (DEBUG logs)."""
        return sorted(claim for worker in self.every for claim in worker.claimed)

    def log_markers(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for worker in self.every:
            total.update(worker.markers)
        return {name: total[name] for name in _LOG_MARKERS}


# -- the faults -----------------------------------------------------------------------------


class FaultInjector:
    """Seeded, bounded faults (module docstring): one loop of kills and terminations, one at a
    time and never during a restart, and per tenant one loop of freezes."""

    # Shuffled anew each round, so every kind comes up every few seconds.
    ROUND: ClassVar[tuple[str, ...]] = ("kill", "kill", "terminate_worker", "terminate_listener")

    def __init__(self, fleet: Fleet, server: ChaosServer, harness: asyncpg.Pool, seed: int,
                 *, lease: float) -> None:
        self.fleet = fleet
        self.server = server
        self.harness = harness
        self.seed = seed
        self.lease = lease
        self.rng = random.Random(seed)
        self._one_at_a_time = asyncio.Lock()

    async def run(self) -> None:
        """Inject faults until cancelled; a frozen worker is thawed on the way out."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._faults())
            for tenant in self.fleet.config.tenants:
                group.create_task(self._freezes(tenant, random.Random(f"{self.seed}:{tenant}")))

    async def _faults(self) -> None:
        while True:
            for fault in self.rng.sample(self.ROUND, len(self.ROUND)):
                await asyncio.sleep(self.rng.uniform(1.0, 2.5))
                async with self._one_at_a_time:
                    await self.fleet.reap()
                    await getattr(self, fault)()

    async def _freezes(self, tenant: str, rng: random.Random) -> None:
        """Freezes are what make stale writes (a killed worker writes nothing more): keep one
        worker of the tenant frozen most of the time, a busy one, each time past its lease."""
        while True:
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            busy = {row["lease_worker_id"] for row in await retrying(lambda: self.harness.fetch(
                "SELECT DISTINCT r.lease_worker_id FROM zeroth.runs r"
                " WHERE r.lease_expires_at >= clock_timestamp()"))}
            candidates = [w for w in self.fleet.targets()
                          if w.tenant == tenant and w.worker_id in busy]
            if candidates:
                await self.freeze(rng.choice(candidates), self.lease + rng.uniform(0.3, 1.5))

    async def restart(self, mode: str) -> None:
        async with self._one_at_a_time:
            # A worker still starting up would exit on a refused first connection.
            for worker in self.fleet.current.values():
                await worker.until_started()
            began = time.monotonic()
            await asyncio.to_thread(self.server.restart, mode)
            await self._record(f"restart_{mode}", None,
                               {"took_s": round(time.monotonic() - began, 3)})

    # -- individual faults -------------------------------------------------------------------

    async def kill(self) -> None:
        worker = self._pick(self.fleet.targets())
        if worker is None:
            return
        worker.killed = True
        worker.signal(signal.SIGKILL)
        await worker.proc.wait()
        await self._record("kill", worker.worker_id, {"leases": await self._leases(worker)})
        await self.fleet.spawn(self.fleet.slot_of(worker))

    async def freeze(self, worker: WorkerProcess, seconds: float) -> None:
        """SIGSTOP the worker, SIGCONT it ``seconds`` later: it wakes up a zombie."""
        worker.signal(signal.SIGSTOP)
        worker.frozen = True
        try:
            await self._record("stop", worker.worker_id, {"leases": await self._leases(worker)})
            await asyncio.sleep(seconds)
        finally:
            worker.signal(signal.SIGCONT)
            worker.frozen = False
        await self._record("cont", worker.worker_id, {"frozen_s": round(seconds, 3)})

    async def terminate_worker(self) -> None:
        await self._terminate("zeroth-worker")

    async def terminate_listener(self) -> None:
        await self._terminate("zeroth-listener")

    async def _terminate(self, prefix: str) -> None:
        worker = self._pick(self.fleet.targets())
        if worker is None:
            return
        pids = await retrying(lambda: self.harness.fetch(
            "SELECT a.pid FROM pg_stat_activity a WHERE a.application_name = $1 ORDER BY a.pid",
            f"{prefix}:{worker.worker_id}"))
        if not pids:
            return
        pid = self.rng.choice(pids)["pid"]
        await retrying(lambda: self.harness.execute("SELECT pg_terminate_backend($1)", pid))
        kind = "terminate_listener" if prefix == "zeroth-listener" else "terminate_worker"
        await self._record(kind, worker.worker_id, {"pid": pid})

    # -- helpers -----------------------------------------------------------------------------

    def _pick(self, workers: list[WorkerProcess]) -> WorkerProcess | None:
        return self.rng.choice(workers) if workers else None

    async def _leases(self, worker: WorkerProcess) -> list[list[Any]]:
        """The live leases of the worker (those the fault will make another worker take)."""
        rows = await retrying(lambda: self.harness.fetch(
            "SELECT r.run_id::text, r.lease_generation FROM zeroth.runs r"
            " WHERE r.lease_worker_id = $1 AND r.lease_expires_at >= clock_timestamp()"
            " ORDER BY r.run_id", worker.worker_id))
        return [[row["run_id"], row["lease_generation"]] for row in rows]

    async def _record(self, kind: str, worker_id: str | None, data: dict[str, Any]) -> None:
        event_id = uuid.uuid4()  # one id for every try: a retried insert lands once
        await retrying(lambda: self.harness.execute(
            """INSERT INTO public.chaos_events (event_id, source, kind, worker_id, data)
               VALUES ($1, 'harness', $2, $3, $4::text::jsonb)
               ON CONFLICT (event_id) DO NOTHING""",
            event_id, kind, worker_id, json.dumps(data)))
