"""The schedules page: every schedule this role sees (zeroth.schedules, row-level security for a
zeroth_reader) with its next and last fire times, last error and paused flag; with actions
enabled, pause / resume / fire now through zeroth.pause_schedule, zeroth.resume_schedule and
zeroth.fire_schedule_now (the same calls as ``zeroth-pg schedules``); each "Fire now" form carries
a random idempotency key of its own, so the same form submitted twice makes one run. The list pages
by cursor both ways (zeroth_pg.web.paging), newest first, with its bounded total."""

from __future__ import annotations

import secrets
import urllib.parse
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web._shared import BadInput, Context, form_name, form_optional_name, run_url
from zeroth_pg.web.paging import COUNT_CAP, Cursor, keyset_page, parse_cursors

__all__ = ["PAGE_SIZE", "routes", "schedule_page_query"]

#: The schedules one page lists, newest first (cursor paging: zeroth_pg.web.paging).
PAGE_SIZE = 50

_SCHEDULE_COLUMNS = """s.schedule_id, s.tenant_id, s.workspace_id, s.name, s.deployment_ref,
           s.cron, s.interval_seconds, s.time_zone, s.missed_fire_policy, s.paused, s.managed_by,
           s.next_fire_at, s.last_fire_at, s.fire_count, s.skipped_count, s.last_error,
           s.last_error_at, s.created_at"""


def schedule_page_query(deployment: str | None, tenant: str | None, after: Cursor | None,
                        before: Cursor | None, limit: int, count: bool = False
                        ) -> tuple[str, list[Any]]:
    """The schedules page's keyset query on zeroth.schedules (row-level security for a
    zeroth_reader), keyed (created_at, schedule_id), newest first (``before``: oldest first, the
    caller reverses); ``count``: a count of at most ``limit`` rows."""
    where = ["($1::text IS NULL OR s.deployment_ref = $1)",
             "($2::text IS NULL OR s.tenant_id = $2)"]
    args: list[Any] = [deployment, tenant]
    if after is not None:
        where.append("(s.created_at, s.schedule_id) < ($3, $4)")
        args += list(after)
    elif before is not None:
        where.append("(s.created_at, s.schedule_id) > ($3, $4)")
        args += list(before)
    args.append(limit)
    predicate = " AND ".join(where)
    if count:
        return (f"SELECT count(*) FROM (SELECT 1 FROM zeroth.schedules s WHERE {predicate}"
                f" LIMIT ${len(args)}) AS matching", args)
    order = "ASC" if before is not None else "DESC"
    return (f"SELECT {_SCHEDULE_COLUMNS}\n      FROM zeroth.schedules s\n     WHERE {predicate}"
            f"\n     ORDER BY s.created_at {order}, s.schedule_id {order} LIMIT ${len(args)}",
            args)


_CALLS = {"pause": _calls.PAUSE_SCHEDULE, "resume": _calls.RESUME_SCHEDULE,
          "fire": _calls.FIRE_SCHEDULE_NOW}


def routes(ctx: Context) -> list[Route]:
    async def schedules(request: Request) -> Response:
        q = request.query_params
        try:
            deployment = form_optional_name(q, "deployment")
            tenant = form_optional_name(q, "tenant")
            after, before = parse_cursors(q)
        except ValueError as exc:  # BadInput included: a bad filter or cursor, nothing read
            return ctx.bad_input(request, BadInput(str(exc)))
        async with ctx.pool().acquire() as conn:
            page = await keyset_page(
                conn, lambda a, b, n, c: schedule_page_query(deployment, tenant, a, b, n, c),
                after, before, PAGE_SIZE, lambda r: (r["created_at"], r["schedule_id"]),
                {k: v for k, v in (("deployment", deployment), ("tenant", tenant)) if v})
            now = await conn.fetchval(_calls.DATABASE_NOW)
        return ctx.render(request, "schedules.html", rows=page.rows, deployment=deployment,
                          tenant=tenant, now=now, done=q.get("done"), next_params=page.older,
                          prev_params=page.newer, total=page.total, count_cap=COUNT_CAP,
                          fire_key=lambda: f"web-{secrets.token_hex(16)}")

    async def schedule_action(request: Request) -> Response:
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            name = form_name(form, "name")
            tenant = form_name(form, "tenant")
            workspace = form_optional_name(form, "workspace")
            op = str(form.get("op", ""))
            if op not in _CALLS:
                raise BadInput(f"op must be one of {', '.join(_CALLS)}")
            # The fire form's own key (rendered into it): a double click or a resent POST of
            # that form returns the run the first one made (zeroth.fire_schedule_now).
            extra = (form_optional_name(form, "key"),) if op == "fire" else ()
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            row = await ctx.act(request, f"schedule {op}", f"{tenant}/{workspace or ''}/{name}",
                                _CALLS[op], name, tenant, workspace, *extra)
        except asyncpg.PostgresError as exc:
            return ctx.refused(request, exc)
        if op == "fire" and row is not None and row["run_id"] is not None:
            return RedirectResponse(run_url(row["run_id"], tenant, workspace), status_code=303)
        return RedirectResponse("/schedules?" + urllib.parse.urlencode({"done": f"{op} {name}"}),
                                status_code=303)

    return [Route("/schedules", schedules),
            Route("/actions/schedule", schedule_action, methods=["POST"])]
