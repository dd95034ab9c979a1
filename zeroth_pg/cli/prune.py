"""``zeroth-pg prune``: delete finished runs (and the events no run waits on, and the registry's
old deployment changes) in batches."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from zeroth_pg.cli._common import (
    Dsn,
    JsonOutput,
    TenantFilter,
    err,
    out,
    parse_duration,
    print_json,
    run_async,
    setting,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["prune"]

def prune(
    older_than: Annotated[timedelta, typer.Option(
        envvar="ZEROTH_PG_PRUNE_OLDER_THAN", parser=parse_duration, metavar="DURATION",
        help="Delete finished runs (completed, failed, cancelled) that finished longer ago than "
             "this: 7d, 12h, 1d12h.", show_default=False)],
    batch_size: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_PRUNE_BATCH", min=1, max=10000,
        help="Runs (and, besides, events and deployment changes) deleted per "
             "transaction.")] = 1000,
    tenant: TenantFilter = None,
    workspace: Annotated[str | None, setting(
        "--workspace", "Only this workspace of --tenant (none: the null workspace).")] = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Delete finished runs older than --older-than, in batches (zeroth.prune_runs).

    Completed, failed (dead letters too) and cancelled runs whose finished_at lies before
    now - older_than on the database clock go, with their checkpoints, one short transaction per
    batch, until none is left; so do the events older than that which no run waits on and,
    without --tenant, the registry's deployment changes older than that (each deployment's
    latest change is kept).
    """
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from zeroth_pg.client import LeaseManager

    started = time.monotonic()

    async def work(conn: asyncpg.Connection) -> tuple[int, int]:
        lm = LeaseManager(conn)
        deleted = batches = 0
        columns = (SpinnerColumn(), TextColumn("pruning runs finished before now - "
                                               f"{older_than}"), BarColumn(),
                   TextColumn("{task.completed:,} deleted"), TimeElapsedColumn())
        with Progress(*columns, console=err.console, transient=as_json) as progress:
            task = progress.add_task("prune", total=None)
            while True:
                count = await lm.prune_runs(older_than, batch_size=batch_size, tenant_id=tenant,
                                            workspace_id=workspace)
                batches += 1
                deleted += count
                progress.advance(task, count)
                if count == 0:
                    return deleted, batches

    deleted, batches = run_async(dsn, work)
    if as_json:
        print_json({"deleted": deleted, "batches": batches,
                     "older_than_seconds": older_than.total_seconds(),
                     "seconds": round(time.monotonic() - started, 3)})
    else:
        out.print(f"deleted {deleted:,} finished run(s), event(s) and deployment change(s) in "
                  f"{batches} batch(es)")
