"""``zeroth-pg status [--watch]``: queue depth, leases and dead letters per scope."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from zeroth_pg import _calls
from zeroth_pg.cli._common import (
    DeploymentFilter,
    Dsn,
    JsonOutput,
    TenantFilter,
    WorkspaceFilter,
    cell,
    out,
    print_json,
    rows_table,
    run_async,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["status"]

_STATUS_COLUMNS = [("tenant_id", "tenant"), ("workspace_id", "workspace"),
                   ("deployment_ref", "deployment"), ("pending", "pending"),
                   ("claimable", "claimable"), ("scheduled", "scheduled"),
                   ("live_leases", "leased"), ("expired_leases", "expired"),
                   ("dead_letters", "dead")]


def _status_table(rows: list[dict[str, Any]], at: datetime, footer: str = "") -> Table:
    table = rows_table(rows, _STATUS_COLUMNS, keep=[key for key, _ in _STATUS_COLUMNS[2:]],
                   title=f"zeroth_pg status at {cell(at)} UTC (database clock){footer}")
    table.caption = ("leased / expired: runs with a live / an expired lease; dead: dead letters"
                     if rows else "no pending runs, leases or dead letters")
    return table


def status(
    deployment: DeploymentFilter = None,
    tenant: TenantFilter = None,
    workspace: WorkspaceFilter = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh like top until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_WATCH_INTERVAL", min=0.1, help="Seconds between refreshes.")] = 2.0,
    count: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_WATCH_COUNT", min=0,
        help="With --watch: stop after this many refreshes (0: never).")] = 0,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Queue depth, live and expired leases and dead letters per deployment and tenant."""
    from rich.live import Live

    async def sample(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], datetime]:
        rows = await conn.fetch(_calls.STATUS, deployment, tenant, workspace)
        return [dict(row) for row in rows], await conn.fetchval(_calls.DATABASE_NOW)

    def emit_json(rows: list[dict[str, Any]], at: datetime) -> None:
        print_json({"at": at, "scopes": rows})

    async def work(conn: asyncpg.Connection) -> None:
        rows, at = await sample(conn)
        if not watch:
            if as_json:
                emit_json(rows, at)
            else:
                out.print(_status_table(rows, at))
            return
        footer = f" · every {interval:g}s · Ctrl-C quits"
        shown = 0
        live = None if as_json else Live(_status_table(rows, at, footer), console=out,
                                         auto_refresh=False)
        with live or contextlib.nullcontext():
            while True:
                if live is None:
                    emit_json(rows, at)
                else:
                    live.update(_status_table(rows, at, footer), refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                await asyncio.sleep(interval)
                rows, at = await sample(conn)

    try:
        run_async(dsn, work)
    except KeyboardInterrupt:
        if not watch:
            raise
