"""The events page: the waiting runs (zeroth.run_list) with what each waits for — an event
(zeroth.wait_list: its name, since when, its timeout), its children (zeroth.child_list: how many
are still open) or its thread's turn — and, with actions enabled, a form that emits an event
through zeroth.emit_event (the call of ``LeaseManager.emit_event``). The list pages by cursor both
ways (zeroth_pg.web.paging), longest waiting first, with its bounded total."""

from __future__ import annotations

import urllib.parse
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web._shared import BadInput, Context, form_json, form_name, form_optional_name
from zeroth_pg.web.paging import COUNT_CAP, Cursor, keyset_page, parse_cursors

__all__ = ["PAGE_SIZE", "routes", "waiting_page_query"]

#: The waiting runs one page lists, longest waiting first (cursor paging: zeroth_pg.web.paging).
PAGE_SIZE = 50

# Waiting runs (runs_waiting_idx), longest waiting first, keyed (updated_at, run_id), each with
# its event wait if any (one: the open one first, else the newest) and its children's count.
_WAITING_COLUMNS = """r.run_id, r.tenant_id, r.workspace_id, r.deployment_ref, r.wait_reason,
           r.run_after, r.updated_at, w.name AS event, w.step_key, w.created_at AS waiting_since,
           w.timeout_at, w.emitted_at,
           (SELECT count(*) FROM zeroth.child_list c
             WHERE c.tenant_id = r.tenant_id AND c.workspace_key = r.workspace_key
               AND c.parent_run_id = r.run_id AND c.finished_at IS NULL) AS open_children,
           (SELECT count(*) FROM zeroth.child_list c
             WHERE c.tenant_id = r.tenant_id AND c.workspace_key = r.workspace_key
               AND c.parent_run_id = r.run_id) AS children"""
_WAIT_OF_RUN = """LEFT JOIN LATERAL (
           SELECT x.name, x.step_key, x.created_at, x.timeout_at, x.emitted_at
             FROM zeroth.wait_list x
            WHERE x.tenant_id = r.tenant_id AND x.workspace_key = r.workspace_key
              AND x.run_id = r.run_id
            ORDER BY x.emitted_at IS NULL DESC, x.created_at DESC, x.step_key
            LIMIT 1) w ON true"""


def waiting_page_query(deployment: str | None, after: Cursor | None, before: Cursor | None,
                       limit: int, count: bool = False) -> tuple[str, list[Any]]:
    """The events page's keyset query (see :func:`zeroth_pg.web.paging.keyset_page`): waiting
    runs by (updated_at, run_id) ascending, the page after ``after``; ``before``: the rows
    before it, nearest first (the caller reverses); ``count``: a count of at most ``limit``."""
    where = ["r.status = 'waiting'", "($1::text IS NULL OR r.deployment_ref = $1)"]
    args: list[Any] = [deployment]
    if after is not None:
        where.append("(r.updated_at, r.run_id) > ($2, $3)")
        args += list(after)
    elif before is not None:
        where.append("(r.updated_at, r.run_id) < ($2, $3)")
        args += list(before)
    args.append(limit)
    predicate = " AND ".join(where)
    if count:
        return (f"SELECT count(*) FROM (SELECT 1 FROM zeroth.run_list r WHERE {predicate}"
                f" LIMIT ${len(args)}) AS matching", args)
    order = "DESC" if before is not None else "ASC"
    return (f"SELECT {_WAITING_COLUMNS}\n      FROM zeroth.run_list r\n      {_WAIT_OF_RUN}"
            f"\n     WHERE {predicate}\n     ORDER BY r.updated_at {order}, r.run_id {order}"
            f"\n     LIMIT ${len(args)}", args)


def routes(ctx: Context) -> list[Route]:
    async def events(request: Request) -> Response:
        q = request.query_params
        try:
            deployment = form_optional_name(q, "deployment")
            after, before = parse_cursors(q)
        except ValueError as exc:  # BadInput included: a bad filter or cursor, nothing read
            return ctx.bad_input(request, BadInput(str(exc)))
        async with ctx.pool().acquire() as conn:
            page = await keyset_page(
                conn, lambda a, b, n, c: waiting_page_query(deployment, a, b, n, c),
                after, before, PAGE_SIZE, lambda r: (r["updated_at"], r["run_id"]),
                {"deployment": deployment} if deployment else {})
        return ctx.render(request, "events.html", rows=page.rows, deployment=deployment,
                          next_params=page.older, prev_params=page.newer, total=page.total,
                          count_cap=COUNT_CAP, emitted=q.get("emitted"), woken=q.get("woken"),
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
