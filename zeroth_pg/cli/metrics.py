"""``zeroth-pg metrics``: the fleet's database gauges for Prometheus (zeroth_pg.fleet_metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Annotated

import typer

from zeroth_pg.cli._common import Dsn, database

__all__ = ["metrics"]


def metrics(
    dsn: Dsn = None,
    host: Annotated[str, typer.Option(
        "--host", envvar="ZEROTH_PG_METRICS_HOST",
        help="Address to bind (default: loopback only; 0.0.0.0 for a Prometheus elsewhere: the "
             "exporter has no token, so keep it on a private network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        "--port", envvar="ZEROTH_PG_METRICS_EXPORTER_PORT",
        help="Port of GET /metrics (0: any free port, printed).")] = 9641,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", envvar="ZEROTH_PG_METRICS_ALLOWED_HOSTS",
        help="A Host name Prometheus reaches the exporter by, besides loopback names and the "
             "bound address (repeat for several): any other Host is refused with 421, so a "
             "web page whose name points at this address (DNS rebinding) reads nothing.")] = None,
) -> None:
    """Serve the database's gauges once for the whole fleet at GET /metrics: runs per
    deployment and state (pending, due, scheduled, running, waiting, failed, dead_lettered),
    live and expired leases, the oldest due run's age, paused scopes (zeroth_fleet_*, read from
    zeroth.scope_overview at each scrape). Run one per fleet (or scrape `zeroth-pg web`'s
    /metrics instead), never one per worker. The role must read every scope (zeroth_owner): a
    zeroth_reader member sees one tenant at most."""

    from zeroth_pg.fleet_metrics import serve

    def ready(bound: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        print(f"zeroth-pg metrics: http://{shown}:{bound}/metrics", flush=True)

    async def main(url: str) -> None:
        task = asyncio.create_task(serve(url, host=host, port=port,
                                         allowed_hosts=allowed_host or (), on_ready=ready))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stop: exit 0
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        print("zeroth-pg metrics: stopped", file=sys.stderr, flush=True)

    with database(dsn) as url:
        asyncio.run(main(url))
