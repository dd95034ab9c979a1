"""``zeroth-pg limits set | rate``: a scope's limits (zeroth.set_scope_limits: paused,
max_concurrency, weight, rate limit key) and a rate limit key (zeroth.set_rate_limit), the same
calls as the dashboard's deployment page. Admin functions: connect as a member of zeroth_owner."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zeroth_pg.cli._common import (
    EXIT_CODES,
    Dsn,
    JsonOutput,
    Tenant,
    Workspace,
    out,
    print_json,
    run_async,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["limits_app"]

limits_app = typer.Typer(help="Pause, resume and limit a scope; create or change a rate limit.",
                         no_args_is_help=True, epilog=EXIT_CODES)

@limits_app.command("set")
def limits_set(
    deployment: Annotated[str, typer.Argument(help="The deployment of the scope.",
                                              show_default=False)],
    tenant: Tenant = None,
    workspace: Workspace = None,
    paused: Annotated[bool | None, typer.Option(
        "--pause/--resume", show_default=False,
        help="Pause the scope (nothing in it is leased) or resume it. Not given: unchanged.")]
    = None,
    max_concurrency: Annotated[int | None, typer.Option(
        min=0, max=10000, show_default=False,
        help="Live leases allowed in the scope, fleet-wide (1-10000; 0 removes the limit). Not "
             "given: unchanged.")] = None,
    weight: Annotated[int | None, typer.Option(
        min=1, max=1000, show_default=False,
        help="The scope's share of a multi-scope claim (1-1000). Not given: unchanged.")] = None,
    rate_limit: Annotated[str | None, typer.Option(
        show_default=False,
        help="The rate limit key its starts count against ('' removes it). Not given: "
             "unchanged.")] = None,
    note: Annotated[str | None, typer.Option(show_default=False,
                                             help="Why the limit is there.")] = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Create or change a scope's zeroth.scope_limits row (zeroth.set_scope_limits, admin); the
    next claim of every worker applies it."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        return asdict(await LeaseManager(conn).set_scope_limits(
            deployment, tenant_id=tenant, workspace_id=workspace, paused=paused,
            max_concurrency=max_concurrency, weight=weight, rate_limit=rate_limit, note=note))

    row = run_async(dsn, work)
    if as_json:
        print_json(row)
    else:
        out.print(f"{row['tenant_id']}/{row['workspace_id'] or '-'}/{row['deployment_ref']}: "
                  f"{'paused' if row['paused'] else 'serving'}, max_concurrency "
                  f"{row['max_concurrency'] if row['max_concurrency'] is not None else 'none'}, "
                  f"weight {row['weight']}, rate limit {row['rate_limit'] or 'none'}",
                  highlight=False, markup=False)


@limits_app.command("rate")
def limits_rate(
    name: Annotated[str, typer.Argument(help="The rate limit key.", show_default=False)],
    max_starts: Annotated[int, typer.Option(min=1, max=1_000_000, show_default=False,
                                            help="Starts allowed per period.")],
    per: Annotated[float, typer.Option(min=0.001, max=86400, show_default=False,
                                       help="The period, in seconds.")],
    note: Annotated[str | None, typer.Option(show_default=False, help="A note.")] = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Create or change a rate limit key (zeroth.set_rate_limit, admin): at most --max-starts
    starts in any rolling window of --per seconds, for every scope that names it."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> bool:
        return await LeaseManager(conn).set_rate_limit(name, max_starts, per, note=note)

    created = run_async(dsn, work)
    if as_json:
        print_json({"name": name, "max_starts": max_starts, "period_seconds": per,
                    "created": created})
    else:
        out.print(f"rate limit {name}: {max_starts} starts per {per:g} s "
                  f"({'created' if created else 'changed'})", highlight=False, markup=False)
