"""``zeroth-pg web``: serve the operator dashboard (:mod:`zeroth_pg.web`)."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from zeroth_pg.cli._common import Dsn, database

__all__ = ["is_loopback", "serve", "web"]

_WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True when binding ``host`` keeps the dashboard on this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(url: str, *, host: str, port: int, enable_actions: bool,
          allowed_hosts: Sequence[str] = ()) -> None:
    """Run the dashboard on ``host:port`` until interrupted (uvicorn).

    Every page needs a token: ``ZEROTH_PG_WEB_TOKEN``, or one generated for this run, printed
    in the URL it shows (a loopback address is every local user's and process's: the
    read-only dashboard without a token showed them every run its DSN's role reads). It
    answers the loopback names, ``host`` (unless a wildcard) and ``allowed_hosts``.
    """
    from zeroth_pg.cli._common import UsageError

    try:
        import uvicorn

        from zeroth_pg._hosts import host_name
        from zeroth_pg.web import create_app
    except ImportError as exc:  # pragma: no cover - the web extra is missing
        raise UsageError(f"zeroth-pg web needs the web extra: pip install 'zeroth-pg[web]' "
                         f"({exc})") from exc
    names = [name for entry in allowed_hosts for name in entry.replace(",", " ").split()]
    try:
        remote = [name for name in names if not is_loopback(host_name(name))]
    except ValueError as exc:
        raise UsageError(f"--allowed-host: {exc}") from None
    if host not in _WILDCARDS:
        names.append(host)
    token = os.environ.get("ZEROTH_PG_WEB_TOKEN") or None
    generated = None
    if token is None:
        token = generated = secrets.token_urlsafe(24)
    logging.basicConfig(level=logging.INFO)
    try:
        app = create_app(url, enable_actions=enable_actions, token=token, allowed_hosts=names)
    except ValueError as exc:
        raise UsageError(f"--host: {exc}") from None
    if not is_loopback(host):
        print(f"zeroth-pg web: warning: --host {host} serves the dashboard to the network: every "
              "page needs the token, and it answers only the Host names 127.0.0.1, localhost, "
              "::1, the bound address and those given with --allowed-host "
              f"({', '.join(names) or 'none'}); put TLS in front of it", file=sys.stderr,
              flush=True)
    elif remote:
        print(f"zeroth-pg web: warning: --allowed-host {', '.join(remote)}: the dashboard is "
              "served to whoever reaches it by that name (a proxy), so every page needs the "
              "token", file=sys.stderr, flush=True)
    shown = "127.0.0.1" if host in _WILDCARDS else host
    shown = f"[{shown}]" if ":" in shown else shown
    mode = "actions enabled" if enable_actions else "read-only"
    if generated:
        print(f"zeroth-pg web: http://{shown}:{port}/?token={generated} ({mode}; token generated "
              "for this run: set ZEROTH_PG_WEB_TOKEN to choose one)", flush=True)
    else:
        print(f"zeroth-pg web: http://{shown}:{port}/?token=… ({mode}; the token of "
              "ZEROTH_PG_WEB_TOKEN)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def web(
    dsn: Dsn = None,
    host: Annotated[str, typer.Option(
        "--host", envvar="ZEROTH_PG_WEB_HOST",
        help="Address to bind (default: loopback only). Every page needs a token: "
             "ZEROTH_PG_WEB_TOKEN, or one generated for the run and printed in its URL.")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="ZEROTH_PG_WEB_PORT")] = 8787,
    enable_actions: Annotated[bool, typer.Option(
        "--enable-actions", envvar="ZEROTH_PG_WEB_ENABLE_ACTIONS",
        help="Allow the actions: redrive, cancel, a scope's pause/resume/limits, a rate limit, a "
             "schedule's pause/resume/fire now, emitting an event (POST from the dashboard's own "
             "origin + CSRF, as the DSN's role). Default: read-only.")]
    = False,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", envvar="ZEROTH_PG_WEB_ALLOWED_HOSTS", show_default=False,
        help="A Host name the dashboard also answers (repeat it; the variable takes a list "
             "separated by spaces or commas): the name a proxy or the users reach it by "
             "(one that is not a loopback name prints a warning). Always answered: 127.0.0.1, "
             "localhost, ::1 and --host.")]
    = None,
) -> None:
    """Serve the operator dashboard (read-only unless --enable-actions). Every page needs a
    token: ZEROTH_PG_WEB_TOKEN, or one generated for this run and printed in the URL shown."""
    with database(dsn) as url:
        serve(url, host=host, port=port, enable_actions=enable_actions,
              allowed_hosts=allowed_host or ())
