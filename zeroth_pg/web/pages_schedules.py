"""The schedules page: every schedule this role sees (zeroth.schedules, row-level security for a
zeroth_reader) with its next and last fire times, last error and paused flag; with actions
enabled, pause / resume / fire now through zeroth.pause_schedule, zeroth.resume_schedule and
zeroth.fire_schedule_now (the same calls as ``zeroth-pg schedules``); each "Fire now" form carries
a random idempotency key of its own, so the same form submitted twice makes one run."""

from __future__ import annotations

import secrets
import urllib.parse

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web._shared import BadInput, Context, form_name, form_optional_name

__all__ = ["routes"]

#: The most schedules the page lists (filter by deployment or tenant for the rest).
SCHEDULES_SHOWN = 500

_SCHEDULES = """SELECT s.schedule_id, s.tenant_id, s.workspace_id, s.name, s.deployment_ref,
           s.cron, s.interval_seconds, s.time_zone, s.missed_fire_policy, s.paused, s.managed_by,
           s.next_fire_at, s.last_fire_at, s.fire_count, s.skipped_count, s.last_error,
           s.last_error_at
      FROM zeroth.schedules s
     WHERE ($1::text IS NULL OR s.deployment_ref = $1)
       AND ($2::text IS NULL OR s.tenant_id = $2)
     ORDER BY s.tenant_id, s.workspace_key, s.name
     LIMIT $3"""

_CALLS = {"pause": _calls.PAUSE_SCHEDULE, "resume": _calls.RESUME_SCHEDULE,
          "fire": _calls.FIRE_SCHEDULE_NOW}


def routes(ctx: Context) -> list[Route]:
    async def schedules(request: Request) -> Response:
        q = request.query_params
        try:
            deployment = form_optional_name(q, "deployment")
            tenant = form_optional_name(q, "tenant")
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        async with ctx.pool().acquire() as conn:
            rows = await conn.fetch(_SCHEDULES, deployment, tenant, SCHEDULES_SHOWN + 1)
            now = await conn.fetchval(_calls.DATABASE_NOW)
        return ctx.render(request, "schedules.html", rows=rows[:SCHEDULES_SHOWN],
                          more=len(rows) > SCHEDULES_SHOWN, deployment=deployment,
                          tenant=tenant, now=now, done=q.get("done"),
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
            return RedirectResponse(f"/runs/{row['run_id']}", status_code=303)
        return RedirectResponse("/schedules?" + urllib.parse.urlencode({"done": f"{op} {name}"}),
                                status_code=303)

    return [Route("/schedules", schedules),
            Route("/actions/schedule", schedule_action, methods=["POST"])]
