"""``zeroth-pg runs list | show | cancel | redrive``."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any
from uuid import UUID

import typer

from zeroth_pg import _calls
from zeroth_pg.cli._common import (
    EXIT_CODES,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    DeploymentFilter,
    Dsn,
    JsonOutput,
    NotFoundError,
    TenantFilter,
    UsageError,
    WorkspaceFilter,
    err,
    out,
    print_json,
    record,
    rows_table,
    run_async,
)
from zeroth_pg.types import CancelOutcome, RunStatus

if TYPE_CHECKING:
    import asyncpg

__all__ = ["CancelAction", "runs_app"]

runs_app = typer.Typer(help="List, show, cancel and redrive runs.", no_args_is_help=True,
                       epilog=EXIT_CODES)




_LIST_COLUMNS = [("run_id", "run_id"), ("deployment_ref", "deployment"), ("tenant_id", "tenant"),
                 ("workspace_id", "workspace"), ("status", "status"), ("tries", "tries"),
                 ("priority", "prio"), ("created_at", "created (UTC)"),
                 ("lease_worker_id", "lease holder")]


@runs_app.command("list")
def runs_list(
    deployment: DeploymentFilter = None,
    status: Annotated[list[RunStatus] | None, typer.Option(
        "--status", help="Only runs in this status (repeatable).", show_default=False)] = None,
    limit: Annotated[int, typer.Option(envvar="ZEROTH_PG_LIMIT", min=1,
                                       help="At most this many runs, newest first.")] = 50,
    tenant: TenantFilter = None,
    workspace: WorkspaceFilter = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Runs, newest first."""
    statuses = [s.value for s in status] if status else None

    async def work(conn: asyncpg.Connection) -> list[dict[str, Any]]:
        rows = await conn.fetch(_calls.LIST_RUNS, deployment, statuses, tenant, workspace, limit)
        return [record(row) for row in rows]

    rows = run_async(dsn, work, reads_only=True)
    if as_json:
        print_json(rows)
        return
    for row in rows:
        row["tries"] = f"{row['attempts']}/{row['max_attempts']}"
    out.print(rows_table(rows, _LIST_COLUMNS))


RunIdArg = Annotated[UUID, typer.Argument(help="The run id.", show_default=False)]


async def _locate(conn: asyncpg.Connection, run_id: UUID, tenant: str | None,
                  workspace: str | None) -> dict[str, Any]:
    """The run with this id; without --tenant, in whichever scope holds it."""
    rows = await conn.fetch(_calls.FIND_RUN, run_id, tenant, workspace)
    if not rows:
        raise NotFoundError(f"no run {run_id}"
                            + (f" in tenant {tenant!r}" if tenant is not None else ""))
    if len(rows) > 1:
        scopes = ", ".join(f"{r['tenant_id']}/{r['workspace_id'] or '-'}" for r in rows)
        raise UsageError(f"run {run_id} exists in several scopes ({scopes}): give --tenant "
                         "and --workspace")
    return record(rows[0])


@runs_app.command("show")
def runs_show(run_id: RunIdArg, tenant: TenantFilter = None, workspace: WorkspaceFilter = None,
              dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """One run, its checkpoints and its attempt history."""

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        run = await _locate(conn, run_id, tenant, workspace)
        scope = (run["tenant_id"], run.pop("workspace_key"), run_id)
        checkpoints = await conn.fetch(_calls.RUN_CHECKPOINTS, *scope)
        run["checkpoints"] = [record(c) for c in checkpoints]
        run["attempt_history"] = [record(a) for a in await conn.fetch(_calls.RUN_ATTEMPTS, *scope)]
        return run

    run = run_async(dsn, work, reads_only=True)
    if as_json:
        print_json(run)
        return
    checkpoints = run.pop("checkpoints")
    attempts = run.pop("attempt_history")
    fields = [{"field": key, "value": value} for key, value in run.items() if value is not None]
    out.print(rows_table(fields, [("field", "field"), ("value", "value")], title=f"run {run_id}"))
    out.print(rows_table(checkpoints, [("checkpoint_order", "#"),
                                       ("checkpoint_id", "checkpoint_id"),
                                       ("lease_generation", "generation"),
                                       ("created_at", "created (UTC)"), ("data", "data")],
                         title=f"{len(checkpoints)} checkpoint(s)"))
    for attempt in attempts:
        attempt["outcome"] = attempt["outcome"] or "(open)"
    out.print(rows_table(attempts, [("attempt", "#"), ("lease_generation", "generation"),
                                    ("worker_id", "worker"), ("claimed_at", "claimed (UTC)"),
                                    ("started_at", "started (UTC)"), ("ended_at", "ended (UTC)"),
                                    ("outcome", "outcome"), ("error", "error")],
                         title=f"{len(attempts)} attempt(s)"))


class CancelAction(StrEnum):
    """The ``action`` argument of ``zeroth.request_cancel``."""

    CANCEL = "cancel"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


@runs_app.command("cancel")
def runs_cancel(
    run_id: RunIdArg,
    action: Annotated[CancelAction, typer.Option(
        help="What the owner is asked to do with a running run.")] = CancelAction.CANCEL,
    tenant: TenantFilter = None, workspace: WorkspaceFilter = None, dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Cancel a run now, or ask its live owner to (zeroth.request_cancel); exit 1 if finished."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> tuple[dict[str, Any], CancelOutcome]:
        run = await _locate(conn, run_id, tenant, workspace)
        outcome = await LeaseManager(conn).request_cancel(
            run_id, action=action.value, tenant_id=run["tenant_id"],
            workspace_id=run["workspace_id"])
        return run, outcome

    run, outcome = run_async(dsn, work)
    if as_json:
        print_json({"run_id": run_id, "outcome": outcome})
    else:
        out.print(f"{run_id}: {outcome.value}")
    if outcome is CancelOutcome.UNKNOWN:
        raise typer.Exit(EXIT_NOT_FOUND)
    if outcome is CancelOutcome.NOT_CANCELLABLE:
        err.print(f"run {run_id} is already {run['status']}")
        raise typer.Exit(EXIT_FAILURE)


@runs_app.command("redrive")
def runs_redrive(run_id: RunIdArg, tenant: TenantFilter = None,
                 workspace: WorkspaceFilter = None, dsn: Dsn = None,
                 as_json: JsonOutput = False) -> None:
    """Put a failed or cancelled run back to pending (zeroth.redrive_run); exit 1 otherwise."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> bool:
        run = await _locate(conn, run_id, tenant, workspace)
        return await LeaseManager(conn).redrive_run(run_id, tenant_id=run["tenant_id"],
                                                    workspace_id=run["workspace_id"])

    redriven = run_async(dsn, work)
    if as_json:
        print_json({"run_id": run_id, "redriven": redriven})
    else:
        out.print(f"{run_id}: back to pending")
