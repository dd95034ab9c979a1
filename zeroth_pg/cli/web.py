"""``zeroth-pg web``: serve the operator dashboard (:mod:`zeroth_pg.web`)."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

from zeroth_pg.cli._common import Dsn, UsageError, database

__all__ = ["serve", "web"]


def serve(url: str, *, host: str, port: int, enable_actions: bool) -> None:
    """Run the dashboard on ``host:port`` until interrupted (uvicorn)."""
    try:
        import uvicorn

        from zeroth_pg.web import create_app
    except ImportError as exc:  # pragma: no cover - the web extra is missing
        raise UsageError(f"zeroth-pg web needs the web extra: pip install 'zeroth-pg[web]' "
                         f"({exc})") from exc
    token = os.environ.get("ZEROTH_PG_WEB_TOKEN") or None
    logging.basicConfig(level=logging.INFO)
    app = create_app(url, enable_actions=enable_actions, token=token)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    print(f"zeroth-pg web: http://{shown}:{port}/{'?token=…' if token else ''} "
          f"({'actions enabled' if enable_actions else 'read-only'})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def web(
    dsn: Dsn = None,
    host: Annotated[str, typer.Option("--host", envvar="ZEROTH_PG_WEB_HOST",
                                      help="Address to bind (default: loopback only).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="ZEROTH_PG_WEB_PORT")] = 8787,
    enable_actions: Annotated[bool, typer.Option(
        "--enable-actions", envvar="ZEROTH_PG_WEB_ENABLE_ACTIONS",
        help="Allow redrive and cancel (POST + CSRF, as the DSN's role). Default: read-only.")]
    = False,
) -> None:
    """Serve the operator dashboard (read-only unless --enable-actions; set
    ZEROTH_PG_WEB_TOKEN to require a token on every page)."""
    with database(dsn) as url:
        serve(url, host=host, port=port, enable_actions=enable_actions)
