"""``zeroth-pg deployments list | show | set``: the registry of deployments (zeroth.deployments):
the max_attempts and priority a run gets when its enqueue names none, from every client, the
retry policy fail_run applies and the lease a claim gives when their callers name none. Per-scope
concurrency, pause, weight and rate limit are zeroth.scope_limits (``zeroth-pg limits``), shown
by ``show``.

``list`` and ``show`` read through zeroth.list_deployments (a zeroth_worker may); ``show`` adds the
deployment's per-scope limits (zeroth.scope_limits) and its change log
(zeroth.deployment_changes), which a zeroth_reader or the owner may read; ``set`` is
zeroth.set_deployment_defaults, an admin function: connect as a member of zeroth_owner."""

from __future__ import annotations

import enum
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zeroth_pg.cli._common import (
    EXIT_CODES,
    Dsn,
    JsonOutput,
    NotFoundError,
    UsageError,
    err,
    out,
    print_json,
    record,
    rows_table,
    run_async,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["deployments_app"]

deployments_app = typer.Typer(
    help="List, show and set the deployments' defaults (max_attempts, priority, retry policy, "
         "lease, attempt and run timeouts) that every client's enqueue, failure and claim gets "
         "when it names none.",
    no_args_is_help=True, epilog=EXIT_CODES)

class PolicyField(enum.StrEnum):
    """A policy value ``set --unset`` sets back to not set."""

    RETRY_BASE = "retry_base_seconds"
    RETRY_MAX = "retry_max_seconds"
    LEASE = "lease_seconds"
    ATTEMPT_TIMEOUT = "attempt_timeout_seconds"
    RUN_TIMEOUT = "run_timeout_seconds"


NameArg = Annotated[str, typer.Argument(help="The deployment (deployment_ref).",
                                        show_default=False)]

#: Columns of list / show / set. managed_by: app (the last application registration decides) or
#: sql (a DBA set it; registrations keep it); version: how many changes made the row.
_COLUMNS = [("deployment_ref", "deployment"), ("max_attempts", "max attempts"),
            ("priority", "priority"), ("retry_base_seconds", "retry base (s)"),
            ("retry_max_seconds", "retry max (s)"), ("lease_seconds", "lease (s)"),
            ("attempt_timeout_seconds", "attempt timeout (s)"),
            ("run_timeout_seconds", "run timeout (s)"), ("managed_by", "set by"),
            ("version", "version"),
            ("updated_at", "changed (UTC)"), ("updated_by", "changed by"),
            ("outcome", "outcome"), ("previous", "previous")]
_LIMIT_COLUMNS = [("tenant_id", "tenant"), ("workspace_id", "workspace"),
                  ("max_concurrency", "max concurrency"), ("weight", "weight"),
                  ("paused", "paused"), ("rate_limit", "rate limit"), ("note", "note")]
_CHANGE_COLUMNS = [("version", "version"), ("changed_at", "at (UTC)"), ("changed_by", "by"),
                   ("acting_role", "as role"), ("via", "via"), ("old_values", "old"),
                   ("new_values", "new")]

_HELP_COLUMNS = (
    "Columns: deployment · max attempts and priority (what a run gets when its enqueue names "
    "none) · retry base and retry max (s): the backoff of a retry whose fail_run names none, "
    "read at each failure (empty: not set, 1 and 300) · lease (s): the lease of a claim that "
    "names none (empty: not set, 60) · attempt timeout and run timeout (s): the bound on an "
    "attempt's wall time and on a run's total time from its first claim, fixed as deadlines "
    "by the claims (empty: not set, no bound) · set by: app (the last application registration "
    "decides) or sql (a DBA set it; registrations keep it) · version (changes so far) · "
    "changed (UTC) and changed by (the session user of the last change). Concurrency, pause, "
    "weight and rate limit are per scope: `zeroth-pg limits`, shown by `show`.")


@deployments_app.command("list", epilog=_HELP_COLUMNS)
def deployments_list(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """The registered deployments and their defaults, by name (zeroth.list_deployments)."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> list[dict[str, Any]]:
        return [asdict(d) for d in await LeaseManager(conn).list_deployments()]

    rows = run_async(dsn, work)
    if as_json:
        print_json(rows)
    else:
        out.print(rows_table(rows, _COLUMNS))


@deployments_app.command("show", epilog=_HELP_COLUMNS)
def deployments_show(
    name: NameArg,
    changes: Annotated[int, typer.Option(
        "--changes", min=0, max=10_000, help="How many of the latest changes to show.")] = 20,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """One deployment: its defaults (zeroth.list_deployments), its per-scope limits
    (zeroth.scope_limits: concurrency, pause, weight, rate limit) and its latest changes
    (zeroth.deployment_changes: who, when, old → new). A role that may not read the last two
    (zeroth_worker) gets the defaults and a note on stderr."""
    import asyncpg

    from zeroth_pg import _calls
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        found = await LeaseManager(conn).list_deployments(name)
        if not found:
            raise NotFoundError(f"no deployment named {name!r} is registered")
        shown: dict[str, Any] = {"deployment": asdict(found[0]), "scope_limits": None,
                                 "changes": None}
        try:
            shown["scope_limits"] = [record(r) for r in await conn.fetch(
                _calls.DEPLOYMENT_SCOPE_LIMITS, name)]
            shown["changes"] = [record(r) for r in await conn.fetch(
                _calls.DEPLOYMENT_CHANGES, name, changes)]
        except asyncpg.InsufficientPrivilegeError:
            err.print("note: this role may not read zeroth.scope_limits / "
                      "zeroth.deployment_changes (a zeroth_reader or the owner may)")
        return shown

    shown = run_async(dsn, work)
    if as_json:
        print_json(shown)
        return
    out.print(rows_table([shown["deployment"]], _COLUMNS))
    if shown["scope_limits"] is not None:
        out.print(rows_table(shown["scope_limits"], _LIMIT_COLUMNS, "per-scope limits",
                             keep=("tenant_id",)) if shown["scope_limits"]
                  else "per-scope limits: none (every scope runs with the claimers' own)")
    if shown["changes"] is not None:
        out.print(rows_table(shown["changes"], _CHANGE_COLUMNS, "changes, newest first"))


@deployments_app.command("set", epilog=_HELP_COLUMNS)
def deployments_set(
    name: NameArg,
    max_attempts: Annotated[int | None, typer.Option(
        "--max-attempts", help="Attempts of a run enqueued without max_attempts (1-1000).",
        show_default=False)] = None,
    priority: Annotated[int | None, typer.Option(
        "--priority", help="Priority of a run enqueued without priority.",
        show_default=False)] = None,
    retry_base_seconds: Annotated[float | None, typer.Option(
        "--retry-base", help="Seconds: backoff base of a retry whose fail_run names none "
                             "(0 to 30 days, at most the retry max).",
        show_default=False)] = None,
    retry_max_seconds: Annotated[float | None, typer.Option(
        "--retry-max", help="Seconds: backoff cap of a retry whose fail_run names none "
                            "(at most 30 days).", show_default=False)] = None,
    lease_seconds: Annotated[float | None, typer.Option(
        "--lease", help="Seconds: lease of a claim that names none (1 <= s <= 86400).",
        show_default=False)] = None,
    attempt_timeout_seconds: Annotated[float | None, typer.Option(
        "--attempt-timeout", help="Seconds: bound on an attempt's wall time, from its claim "
                                  "(1 s to 30 days): past it the attempt is retried or "
                                  "dead-lettered.", show_default=False)] = None,
    run_timeout_seconds: Annotated[float | None, typer.Option(
        "--run-timeout", help="Seconds: bound on a run's total time, from its first claim "
                              "(1 s to 365 days): past it the run fails for good.",
        show_default=False)] = None,
    unset: Annotated[list[PolicyField] | None, typer.Option(
        "--unset", help="Set this policy value back to not set (repeatable).",
        show_default=False)] = None,
    managed_by: Annotated[str, typer.Option(
        "--managed-by", help="sql: keep these values against applications' registrations; "
                             "app: hand the deployment back to them.")] = "sql",
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Set a deployment's defaults as a DBA (zeroth.set_deployment_defaults, admin); an option
    left out keeps its value. Audited; runs enqueued before keep their attempts and priority, a
    retry policy applies from the next failure, a lease and timeouts from the next claim."""
    from zeroth_pg.client import LeaseManager

    cleared = [field.value for field in unset or ()]
    if (max_attempts is None and priority is None and retry_base_seconds is None
            and retry_max_seconds is None and lease_seconds is None and not cleared
            and attempt_timeout_seconds is None and run_timeout_seconds is None
            and managed_by == "sql"):
        raise UsageError("nothing to set: give --max-attempts, --priority, --retry-base, "
                         "--retry-max, --lease, --attempt-timeout, --run-timeout, --unset or "
                         "--managed-by app")

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        result = await LeaseManager(conn).set_deployment_defaults(
            name, max_attempts=max_attempts, priority=priority, managed_by=managed_by,
            retry_base_seconds=retry_base_seconds, retry_max_seconds=retry_max_seconds,
            lease_seconds=lease_seconds, unset=cleared,
            attempt_timeout_seconds=attempt_timeout_seconds,
            run_timeout_seconds=run_timeout_seconds)
        return asdict(result)

    row = run_async(dsn, work)
    if as_json:
        print_json(row)
    else:
        out.print(rows_table([row], _COLUMNS))
