"""``zeroth-pg status [--watch] [--by deployment]``: queue depth, leases and dead letters per
scope, with the scope's limits (zeroth.scope_limits), or summed per deployment; below, the runs
pinned to a code version (zeroth.pinned_runs: waiting for a worker of their version)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

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
    from rich.table import Table

__all__ = ["status"]


class By(StrEnum):
    SCOPE = "scope"  # one row per (tenant, workspace, deployment)
    DEPLOYMENT = "deployment"  # the scopes of each deployment summed


_COUNTS = [("pending", "pending"), ("due", "due"), ("scheduled", "scheduled"),
           ("running", "running"), ("live_leases", "leased"), ("expired_leases", "expired"),
           ("waiting", "waiting"), ("failed", "failed"), ("dead_letters", "dead")]
#: Per scope: the counts, then the scope's zeroth.scope_limits row (empty without one; the
#: columns are left out when no scope shown has a row).
_SCOPE_COLUMNS = [("tenant_id", "tenant"), ("workspace_id", "workspace"),
                  ("deployment_ref", "deployment"), *_COUNTS, ("max_concurrency", "limit"),
                  ("weight", "weight"), ("paused", "paused"), ("rate_limit", "rate")]
_DEPLOYMENT_COLUMNS = [("deployment_ref", "deployment"), ("scopes", "scopes"), *_COUNTS,
                       ("paused_scopes", "paused")]
_KEEP = {By.SCOPE: ["deployment_ref", *(key for key, _ in _COUNTS)],
         By.DEPLOYMENT: [key for key, _ in _DEPLOYMENT_COLUMNS]}
_CAPTION = ("pending = due (nobody holds it, its time has come) + scheduled (run_after later) + "
            "claimed; leased / expired: runs with a live / an expired lease; waiting: for an "
            "event, children or a thread's turn; failed: ended failed without a dead letter "
            "(non-retryable); dead: dead letters (attempts exhausted)")
_LIMITS_CAPTION = ("; limit, weight, paused: the scope's zeroth.scope_limits row; rate: its "
                   "rate limit, key:max_starts/period (zeroth.rate_limits)")
_DEPLOYMENT_CAPTION = ("every scope of a deployment summed; " + _CAPTION
                       + "; paused: scopes paused in zeroth.scope_limits")


#: The runs pinned to a code version (issue 34): started runs of deployments whose version policy
#: is not any, which only a worker of an allowed version resumes.
_PINNED_COLUMNS = [("tenant_id", "tenant"), ("workspace_id", "workspace"),
                   ("deployment_ref", "deployment"), ("code_version", "code version"),
                   ("version_policy", "policy"), ("pending", "pending"), ("running", "running"),
                   ("waiting", "waiting"), ("waiting_for_version", "waiting for version"),
                   ("oldest_pending_at", "oldest pending")]
_PINNED_CAPTION = ("started runs that only a worker of their code version (or of a compatible "
                   "one) resumes; waiting for version: due and nobody holds them. When no worker "
                   "serves that version any more: zeroth.retire_code_version (move or fail)")


def _pinned_table(rows: list[dict[str, Any]]) -> Table:
    table = rows_table(rows, _PINNED_COLUMNS, keep=[key for key, _ in _PINNED_COLUMNS],
                       title="runs pinned to a code version")
    table.caption = _PINNED_CAPTION
    return table


def _status_view(rows: list[dict[str, Any]], pinned: list[dict[str, Any]], at: datetime,
                 footer: str = "", by: By = By.SCOPE) -> Any:
    """The status table, and under it the pinned runs' table when there are any."""
    from rich.console import Group

    table = _status_table(rows, at, footer, by)
    return Group(table, _pinned_table(pinned)) if pinned else table


def _status_table(rows: list[dict[str, Any]], at: datetime, footer: str = "",
                  by: By = By.SCOPE) -> Table:
    columns = _SCOPE_COLUMNS if by is By.SCOPE else _DEPLOYMENT_COLUMNS
    # A scope's paused flag reads yes / no (blank: the scope has no limits row).
    shown = [{**row, "paused": "yes" if row["paused"] else "no"}
             if by is By.SCOPE and row.get("paused") is not None else row for row in rows]
    table = rows_table(shown, columns, keep=_KEEP[by],
                       title=f"zeroth_pg status at {cell(at)} UTC (database clock){footer}")
    if not rows:
        table.caption = ("no pending, running, waiting or failed runs, leases, dead letters or "
                         "scope limits")
    elif by is By.DEPLOYMENT:
        table.caption = _DEPLOYMENT_CAPTION
    else:
        limited = any(row.get("weight") is not None for row in rows)
        table.caption = _CAPTION + (_LIMITS_CAPTION if limited else "")
    return table


def status(
    deployment: DeploymentFilter = None,
    tenant: TenantFilter = None,
    workspace: WorkspaceFilter = None,
    by: Annotated[By, typer.Option(
        "--by", envvar="ZEROTH_PG_STATUS_BY",
        help="One row per scope (tenant, workspace, deployment) with its limits, or per "
             "deployment (its scopes summed: for a fleet of many tenants).")] = By.SCOPE,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh like top until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_WATCH_INTERVAL", min=0.1, help="Seconds between refreshes.")] = 2.0,
    count: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_WATCH_COUNT", min=0,
        help="With --watch: stop after this many refreshes (0: never).")] = 0,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Queue depth (pending: due, scheduled), running, live and expired leases, waiting runs,
    failed runs and dead letters per deployment and tenant, with
    each scope's limits (zeroth.scope_limits: max_concurrency, weight, paused, and the rate
    limit it draws from as key:max_starts/periods); scopes with a limits row but no runs are
    shown too. Below, the runs pinned to a code version (zeroth.pinned_runs: started runs only a
    worker of their version may resume, and how many of them wait for one). A zeroth_reader
    sees the tenant it names in zeroth.tenant_id."""
    from rich.live import Live

    query = _calls.STATUS if by is By.SCOPE else _calls.STATUS_BY_DEPLOYMENT
    key = "scopes" if by is By.SCOPE else "deployments"

    async def sample(conn: asyncpg.Connection
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], datetime]:
        rows = await conn.fetch(query, deployment, tenant, workspace)
        pinned = await conn.fetch(_calls.PINNED_RUNS, deployment, tenant, workspace)
        return ([dict(row) for row in rows], [dict(row) for row in pinned],
                await conn.fetchval(_calls.DATABASE_NOW))

    def emit_json(rows: list[dict[str, Any]], pinned: list[dict[str, Any]], at: datetime) -> None:
        print_json({"at": at, key: rows, "pinned": pinned})

    async def work(conn: asyncpg.Connection) -> None:
        rows, pinned, at = await sample(conn)
        if not watch:
            if as_json:
                emit_json(rows, pinned, at)
            else:
                out.print(_status_view(rows, pinned, at, by=by))
            return
        footer = f" · every {interval:g}s · Ctrl-C quits"
        shown = 0
        live = None if as_json else Live(_status_view(rows, pinned, at, footer, by),
                                         console=out.console, auto_refresh=False)
        with live or contextlib.nullcontext():
            while True:
                if live is None:
                    emit_json(rows, pinned, at)
                else:
                    live.update(_status_view(rows, pinned, at, footer, by), refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                await asyncio.sleep(interval)
                rows, pinned, at = await sample(conn)

    try:
        run_async(dsn, work, reads_only=True)
    except KeyboardInterrupt:
        if not watch:
            raise
