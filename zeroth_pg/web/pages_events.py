"""The events page: the waiting runs (zeroth.run_list) with what each waits for — an event
(zeroth.wait_list: its name, since when, its timeout), its children (zeroth.child_list: how many
are still open) or its thread's turn — and, with actions enabled, a form that emits an event
through zeroth.emit_event (the call of ``LeaseManager.emit_event``)."""

from __future__ import annotations

import urllib.parse

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web._shared import BadInput, Context, form_json, form_name, form_optional_name

__all__ = ["routes"]

#: The most waiting runs the page lists, longest waiting first.
WAITING_SHOWN = 200

# Waiting runs (runs_waiting_idx), each with its open event wait if any and its children's count.
_WAITING = """SELECT r.run_id, r.tenant_id, r.workspace_id, r.deployment_ref, r.wait_reason,
           r.run_after, r.updated_at, w.name AS event, w.step_key, w.created_at AS waiting_since,
           w.timeout_at, w.emitted_at,
           (SELECT count(*) FROM zeroth.child_list c
             WHERE c.tenant_id = r.tenant_id AND c.workspace_key = r.workspace_key
               AND c.parent_run_id = r.run_id AND c.finished_at IS NULL) AS open_children,
           (SELECT count(*) FROM zeroth.child_list c
             WHERE c.tenant_id = r.tenant_id AND c.workspace_key = r.workspace_key
               AND c.parent_run_id = r.run_id) AS children
      FROM zeroth.run_list r
      LEFT JOIN zeroth.wait_list w
             ON w.tenant_id = r.tenant_id AND w.workspace_key = r.workspace_key
            AND w.run_id = r.run_id
     WHERE r.status = 'waiting'
       AND ($1::text IS NULL OR r.deployment_ref = $1)
     ORDER BY r.updated_at, r.run_id
     LIMIT $2"""


def routes(ctx: Context) -> list[Route]:
    async def events(request: Request) -> Response:
        q = request.query_params
        try:
            deployment = form_optional_name(q, "deployment")
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        async with ctx.pool().acquire() as conn:
            rows = await conn.fetch(_WAITING, deployment, WAITING_SHOWN + 1)
        return ctx.render(request, "events.html", rows=rows[:WAITING_SHOWN],
                          more=len(rows) > WAITING_SHOWN, deployment=deployment,
                          emitted=q.get("emitted"), woken=q.get("woken"),
                          repeat=q.get("repeat"))

    async def emit(request: Request) -> Response:
        form, refused = await ctx.check_post(request)
        if refused:
            return refused
        try:
            name = form_name(form, "name")
            tenant = form_optional_name(form, "tenant")
            workspace = form_optional_name(form, "workspace")
            if workspace is not None and tenant is None:
                raise BadInput("a workspace needs a tenant")
            payload = form_json(form, "payload")
        except BadInput as exc:
            return ctx.bad_input(request, exc)
        try:
            row = await ctx.act(request, "emit event", f"{tenant or ''}/{workspace or ''}/{name}",
                                _calls.EMIT_EVENT, name, payload, tenant, workspace)
        except asyncpg.PostgresError as exc:
            return ctx.refused(request, exc)
        params = {"emitted": name, "woken": str(row["woken"] if row else 0)}
        if row is not None and not row["emitted"]:
            params["repeat"] = "1"
        return RedirectResponse("/events?" + urllib.parse.urlencode(params), status_code=303)

    return [Route("/events", events),
            Route("/actions/emit-event", emit, methods=["POST"])]
