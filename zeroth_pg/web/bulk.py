"""Bulk cancel and redrive (retry) of a filtered selection, with a confirmation step.

``GET /bulk?op=cancel|redrive&source=runs|dead&<filters>`` selects, read-only, the runs the
action applies to (the runs list's filters, or the dead letters' deployment and tenant, narrowed
to the statuses the action takes: cancel pending, running and waiting runs; redrive failed and
cancelled ones), newest first, at most :data:`BULK_MAX`, and shows how many match (a bounded
count, :mod:`zeroth_pg.web.paging`) and which (the first :data:`SHOWN_IDS` ids). Its form posts
the selected ids themselves to ``POST /actions/bulk``, which acts on those ids only, one call of
the SQL function per run as the CLI does (``zeroth.request_cancel(action => 'cancel')``,
``zeroth.redrive_run``), each logged as the single actions are. A run that changed in between is
skipped and reported (the function refuses it: finished, no longer failed, gone); a run that
started to match the filter after the confirmation is not touched. A role that may not act
(``zeroth_reader``: 42501) stops the whole action at its first call.
"""

from __future__ import annotations

import logging
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from zeroth_pg import _calls
from zeroth_pg.web import run_filters as _app
from zeroth_pg.web.paging import COUNT_CAP, bounded_count, dead_page_query

__all__ = ["BULK_MAX", "SHOWN_IDS", "Actions", "routes"]

log = logging.getLogger("zeroth_pg.web")
_STATUS_BY_ID = _calls.run_by_id("r.run_id, r.status::text AS status", "$1")

#: The most runs one bulk action acts on (the newest of the selection; run it again for more).
BULK_MAX = 500
#: How many of the selected ids the confirmation lists (all of them are acted on).
SHOWN_IDS = 20

# op -> (the statuses it takes, its verb, SQL, extra arguments after run/tenant/workspace)
_OPS: dict[str, tuple[tuple[str, ...], str, str, tuple[Any, ...]]] = {
    "cancel": (("pending", "running", "waiting"), "Cancel", _calls.REQUEST_CANCEL, ("cancel",)),
    "redrive": (("failed", "cancelled"), "Redrive", _calls.REDRIVE_RUN, ()),
}
_SOURCES = ("runs", "dead")
_REASONS = {"not_cancellable": "already finished", "unknown": "not found (for this role)",
            "ZP001": "not found (for this role)", "ZP003": "no longer failed or cancelled"}


@dataclass(frozen=True)
class Actions:
    """What the bulk pages borrow from :func:`zeroth_pg.web.app.create_app`."""

    render: Callable[..., HTMLResponse]
    pool: Callable[[], asyncpg.Pool]
    check_post: Callable[[Request], Awaitable[tuple[dict[str, Any], Response | None]]]
    act: Callable[..., Awaitable[Any]]
    refused: Callable[[Request, asyncpg.PostgresError], Response]
    enabled: bool


def _back(source: str, params: dict[str, str]) -> str:
    path = "/dead-letters" if source == "dead" else "/runs"
    return path + ("?" + urllib.parse.urlencode(params) if params else "")


def routes(actions: Actions) -> list[Route]:
    """The confirmation page and the bulk action."""
    render = actions.render

    def bad(request: Request, message: str) -> Response:
        return render(request, "error.html", status_code=400, message=message)

    async def confirm(request: Request) -> Response:
        if not actions.enabled:
            return render(request, "error.html", status_code=403,
                          message="actions are disabled: start with --enable-actions")
        q = request.query_params
        op, source = q.get("op", ""), q.get("source", "runs")
        if op not in _OPS or source not in _SOURCES:
            return bad(request, "op must be cancel or redrive, source runs or dead")
        statuses, verb, _, _ = _OPS[op]
        note = None
        rows: list[Any] = []
        total = "0"
        if source == "dead":
            if op != "redrive":
                return bad(request, "dead letters can be redriven, not cancelled")
            kept = {k: v for k in ("deployment", "tenant") if (v := _app._opt(q.get(k)))}
            try:
                _app.no_nul(kept.values())
                _app.bounded(kept)
            except ValueError as exc:
                return bad(request, f"bad filter: {exc}")
            async with actions.pool().acquire() as conn:
                rows = list(await conn.fetch(*_flat(dead_page_query(
                    kept.get("deployment"), kept.get("tenant"), None, None, BULK_MAX + 1))))
                total = await bounded_count(conn, *dead_page_query(
                    kept.get("deployment"), kept.get("tenant"), None, None, COUNT_CAP + 1,
                    True))
            rows = [{**dict(r), "status": "failed"} for r in rows]
        else:
            filters = _app.run_filters(q)
            try:
                query = _app.parse_run_filters(filters)
            except ValueError as exc:
                return bad(request, f"bad filter: {exc}")
            kept = {k: v for k, v in filters.items() if v}
            if query["status"] and query["status"] not in statuses:
                note = (f"{verb} acts on {', '.join(statuses)} runs; the filter selects "
                        f"{query['status']} runs only")
            else:
                query["statuses"] = None if query["status"] else list(statuses)
                async with actions.pool().acquire() as conn, conn.transaction():
                    await conn.execute(_app.PAGE_SETTINGS)
                    rows = list(await conn.fetch(*_flat(_app.run_page_query(
                        query, None, BULK_MAX + 1))))
                    total = await bounded_count(conn, *_app.run_page_query(
                        query, None, COUNT_CAP + 1, count=True))
        more = len(rows) > BULK_MAX
        rows = rows[:BULK_MAX]
        return render(request, "bulk_confirm.html", op=op, verb=verb, statuses=statuses,
                      rows=rows, shown=rows[:SHOWN_IDS], total=total, more=more,
                      bulk_max=BULK_MAX, note=note, source=source, filters=kept,
                      back=_back(source, kept))

    async def act(request: Request) -> Response:
        form, refused = await actions.check_post(request)
        if refused:
            return refused
        op = str(form.get("op", ""))
        if op not in _OPS:
            return bad(request, "op must be cancel or redrive")
        words = str(form.get("ids", "")).split()
        if not words:
            return bad(request, "no runs selected")
        if len(words) > BULK_MAX:
            return bad(request, f"at most {BULK_MAX} runs per action ({len(words)} given)")
        try:
            ids = list(dict.fromkeys(uuid.UUID(w) for w in words))
        except ValueError:
            return bad(request, "not a list of run ids")
        source = str(form.get("source", "runs"))
        back = _back(source if source in _SOURCES else "runs",
                     {k: str(form[k])[:200] for k in ("status", "deployment", "tenant",
                                                       "workspace", "thread", "search",
                                                       "since", "until")
                      if str(form.get(k, "")).strip()})
        _, verb, sql, extra = _OPS[op]
        done: list[tuple[uuid.UUID, str]] = []
        skipped: list[tuple[uuid.UUID, str]] = []
        for run_id in ids:
            try:
                outcome = await actions.act(request, f"bulk {op}", sql, run_id, *extra)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == "42501":
                    log.warning("web bulk %s stopped after %d of %d runs", op, len(done),
                                len(ids))
                    return actions.refused(request, exc)
                reason = _REASONS.get(exc.sqlstate or "", f"refused ({exc.sqlstate}): {exc}")
                skipped.append((run_id, reason[:300]))
                continue
            except _app.RunInSeveralScopes as exc:
                skipped.append((run_id, f"in several scopes ({', '.join(exc.scopes)})"[:300]))
                continue
            if outcome in ("cancelled", "cancel_requested", True):
                done.append((run_id, "redriven" if outcome is True else str(outcome)))
            else:
                skipped.append((run_id, _REASONS.get(str(outcome), str(outcome))))
        # Each skipped run's status now, by its id as the run page finds one (one probe of
        # runs_pkey, which leads with run_id since 0023: zeroth_pg._calls.run_by_id).
        now: dict[uuid.UUID, str] = {}
        async with actions.pool().acquire() as conn:
            for run_id, _ in skipped:
                rows = await conn.fetch(_STATUS_BY_ID, run_id)
                if len(rows) == 1:  # an id several scopes hold has no one status
                    now[run_id] = rows[0]["status"]
        log.warning("web bulk %s: %d done, %d skipped of %d confirmed", op, len(done),
                    len(skipped), len(ids))
        return render(request, "bulk_done.html", verb=verb, op=op, done=done,
                      skipped=[(i, r, now.get(i)) for i, r in skipped], confirmed=len(ids),
                      back=back)

    return [Route("/bulk", confirm), Route("/actions/bulk", act, methods=["POST"])]


def _flat(query: tuple[str, list[Any]]) -> tuple[Any, ...]:
    sql, args = query
    return (sql, *args)
