"""``zeroth-pg schedules list | add | pause | resume | fire | delete``: a DBA's schedules
(zeroth.create_schedule and friends: admin functions, so connect as a member of zeroth_owner)."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zeroth_pg.cli._common import (
    EXIT_CODES,
    DeploymentFilter,
    Dsn,
    JsonOutput,
    Tenant,
    Workspace,
    json_object,
    out,
    print_json,
    rows_table,
    run_async,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["schedules_app"]

schedules_app = typer.Typer(help="List, add, pause, resume, fire and delete schedules (periodic "
                                 "runs).",
                            no_args_is_help=True, epilog=EXIT_CODES)

NameArg = Annotated[str, typer.Argument(help="The schedule's name (unique in its scope).",
                                        show_default=False)]
FireKey = Annotated[str | None, typer.Option(
    "--idempotency-key",
    help="This fire's idempotency key (at most 200 characters): the same key again returns the "
         "run it made instead of firing twice. Default: a new random key per command.",
    show_default=False)]

_COLUMNS = [("name", "name"), ("deployment_ref", "deployment"), ("timing", "timing"),
            ("time_zone", "zone"), ("missed", "missed fires"), ("paused", "paused"),
            ("next_fire_at", "next fire (UTC)"), ("last_fire_at", "last fire (UTC)"),
            ("fire_count", "fired"), ("managed_by", "by"), ("last_error", "last error")]


def _row(schedule: Any) -> dict[str, Any]:
    row = asdict(schedule)
    row["timing"] = schedule.cron or f"every {schedule.interval_seconds}s"
    row["missed"] = (schedule.missed_fire_policy if schedule.catch_up_limit is None
                     else f"catch_up {schedule.catch_up_limit}")
    return row


def _show(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(rows)
    else:
        out.print(rows_table(rows, _COLUMNS))


@schedules_app.command("list")
def schedules_list(
    deployment: DeploymentFilter = None,
    tenant: Tenant = None,
    workspace: Workspace = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """The schedules of one scope, by name (zeroth.list_schedules)."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> list[dict[str, Any]]:
        found = await LeaseManager(conn).list_schedules(
            tenant_id=tenant, workspace_id=workspace,
            deployment_refs=None if deployment is None else [deployment])
        return [_row(s) for s in found]

    _show(run_async(dsn, work), as_json)


@schedules_app.command("add")
def schedules_add(
    name: NameArg,
    deployment: Annotated[str, typer.Option(
        "--deployment", envvar="ZEROTH_PG_DEPLOYMENT", help="The deployment its runs are for.",
        show_default=False)],
    cron: Annotated[str | None, typer.Option(
        help="A standard 5-field cron expression ('*/5 * * * *'), on the wall clock of --tz.",
        show_default=False)] = None,
    every: Annotated[int | None, typer.Option(
        "--every", min=1, help="Instead of --cron: fire every N seconds.",
        show_default=False)] = None,
    tz: Annotated[str, typer.Option("--tz", help="IANA time zone of the cron expression.")] = "UTC",
    payload: Annotated[str, typer.Option(help="The runs' payload, a JSON object.")] = "{}",
    catch_up: Annotated[int | None, typer.Option(
        "--catch-up", min=1, max=1000,
        help="Missed fire times to fire after an outage (default: skip them, fire the latest "
             "only if it is at most --grace seconds late).", show_default=False)] = None,
    grace: Annotated[int, typer.Option(
        "--grace", min=1, max=86400, help="Seconds a fire time may be late and still fire "
                                          "(skip policy).")] = 60,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    tenant: Tenant = None,
    workspace: Workspace = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Create a schedule (zeroth.create_schedule, admin)."""
    from zeroth_pg.client import LeaseManager

    data = json_object(payload, "--payload")

    async def work(conn: asyncpg.Connection) -> list[dict[str, Any]]:
        created = await LeaseManager(conn).create_schedule(
            name, deployment, cron=cron, interval_seconds=every, tenant_id=tenant,
            workspace_id=workspace, time_zone=tz, payload=data,
            missed_fire_policy="skip" if catch_up is None else "catch_up",
            catch_up_limit=catch_up, misfire_grace_seconds=grace, paused=paused)
        return [_row(created)]

    _show(run_async(dsn, work), as_json)


def _one(action: str) -> Any:
    def command(name: NameArg, tenant: Tenant = None, workspace: Workspace = None,
                dsn: Dsn = None, as_json: JsonOutput = False) -> None:
        from zeroth_pg.client import LeaseManager

        async def work(conn: asyncpg.Connection) -> Any:
            lm = LeaseManager(conn)
            if action == "delete":
                return {"name": name, "deleted": str(await lm.delete_schedule(
                    name, tenant_id=tenant, workspace_id=workspace))}
            method = lm.pause_schedule if action == "pause" else lm.resume_schedule
            return _row(await method(name, tenant_id=tenant, workspace_id=workspace))

        result = run_async(dsn, work)
        if action == "delete":
            if as_json:
                print_json(result)
            else:
                out.print(f"deleted schedule {name} ({result['deleted']})")
            return
        _show([result], as_json)

    command.__doc__ = {
        "pause": "Pause a schedule: it fires nothing until resumed (zeroth.pause_schedule).",
        "resume": "Resume a schedule from its next fire time after now "
                  "(zeroth.resume_schedule).",
        "delete": "Delete a schedule and its fire records; its runs stay "
                  "(zeroth.delete_schedule).",
    }[action]
    return command


@schedules_app.command("fire")
def schedules_fire(name: NameArg, tenant: Tenant = None, workspace: Workspace = None,
                   idempotency_key: FireKey = None, dsn: Dsn = None,
                   as_json: JsonOutput = False) -> None:
    """Fire a schedule now: one run at once, its fire times, count and pause left as they are
    (zeroth.fire_schedule_now, admin). The command's idempotency key (--idempotency-key, or a
    new random one) makes a repeat of this fire return its run instead of firing again."""
    from zeroth_pg.client import LeaseManager

    fire_key = idempotency_key or f"cli-{uuid.uuid4()}"

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        fire = await LeaseManager(conn).fire_schedule_now(name, tenant_id=tenant,
                                                          workspace_id=workspace,
                                                          idempotency_key=fire_key)
        return {"name": fire.name, "deployment_ref": fire.deployment_ref,
                "run_id": str(fire.run_id), "fire_at": fire.fire_at.isoformat(),
                "created": fire.created, "idempotency_key": fire_key}

    result = run_async(dsn, work)
    if as_json:
        print_json(result)
    elif result["created"]:
        out.print(f"fired schedule {name}: run {result['run_id']} "
                  f"(deployment {result['deployment_ref']})")
    else:
        out.print(f"schedule {name} was already fired with key {fire_key}: run "
                  f"{result['run_id']} (deployment {result['deployment_ref']}); nothing new")


schedules_app.command("pause")(_one("pause"))
schedules_app.command("resume")(_one("resume"))
schedules_app.command("delete")(_one("delete"))
