"""The dashboard's ASGI app (see :mod:`zeroth_pg.web`)."""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import secrets
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from zeroth_pg import _calls, fleet_metrics
from zeroth_pg._connect import connect, create_pool
from zeroth_pg._hosts import LOOPBACK_HOSTS, host_name, netloc
from zeroth_pg.web import (
    pages_deployments,
    pages_events,
    pages_run_events,
    pages_schedules,
    pages_workers,
    paging,
)
from zeroth_pg.web._shared import Context, run_url, short_time
from zeroth_pg.web.flash import FlashMiddleware
from zeroth_pg.web.pages_runs import FAILURE_SHOWN, failure_view, shown, timeline
from zeroth_pg.web.paging import (
    LISTED_CHARS,
    Page,
    dead_page_query,
    keyset_page,
    parse_cursors,
)
from zeroth_pg.web.run_filters import (
    _STATUSES,
    PAGE_SETTINGS,
    RunInSeveralScopes,
    _opt,
    bounded,
    no_nul,
    parse_run_filters,
    run_filters,
    run_page_query,
)

__all__ = ["LOOPBACK_HOSTS", "create_app"]

log = logging.getLogger("zeroth_pg.web")
_HERE = Path(__file__).parent
PAGE_SIZE = 50
#: The largest form an action takes (bulk ids: 500 ids of 37 bytes; an event payload: 32 KiB).
_POST_MAX = 65536
#: How often a page refreshes its live parts (``data-live``; paused while hidden or by the user).
LIVE_SECONDS = 5.0
#: The Host names the dashboard always answers; create_app's ``allowed_hosts`` adds to them.
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}

# Every read goes through the documented views (sql/functions/views/), read as the DSN's role, so
# a zeroth_reader sees only its tenant (row-level security); the actions call the SQL functions.


#: What a page shows of one stored value, in characters: the run page's payload, output,
#: progress and metadata (SHOWN_CHARS), a value in a list (a step's result, a checkpoint's data,
#: a dead letter's error: paging.LISTED_CHARS). Handlers and callers choose their size, and a
#: page that refreshes every few seconds must stay small: the database sends one character more
#: than is shown (left()), so the page can say the value was cut. An error document is read
#: with its message cut to MESSAGE_CHARS and its traceback to FAILURE_SHOWN, at most ERROR_CHARS
#: in all (room for their JSON escapes; _bounded_error): the run page shows its summary (500
#: characters) and FAILURE_SHOWN of its traceback.
SHOWN_CHARS = 20_000
MESSAGE_CHARS = 2_000
ERROR_CHARS = 2 * FAILURE_SHOWN + 2 * MESSAGE_CHARS
#: The most rows of each list on the run page (attempts, children, steps, waits, checkpoints).
LIST_ROWS = 100
#: The most scopes the overview lists (`zeroth-pg status` lists every one).
OVERVIEW_SCOPES = 500


def _bounded_error(column: str) -> str:
    """The SQL text of an error document (jsonb) with its message cut to MESSAGE_CHARS and its
    traceback to FAILURE_SHOWN (+1), so a long one still parses (failure_view shows its summary
    and its traceback), the whole text to ERROR_CHARS (a document of another shape). ``column``
    is one of this module's own column names, never input."""
    return (f"left(CASE WHEN jsonb_typeof({column}) = 'object' THEN {column} || "
            f"jsonb_strip_nulls(jsonb_build_object("
            f"'message', left({column}->>'message', {MESSAGE_CHARS}), "
            f"'traceback', left({column}->>'traceback', {FAILURE_SHOWN + 1}))) "
            f"ELSE {column} END::text, {ERROR_CHARS})")

_OVERVIEW = f"""SELECT o.tenant_id, o.workspace_id, o.deployment_ref, o.pending, o.due, o.scheduled,
           o.running, o.live_leases, o.expired_leases, o.waiting, o.failed, o.dead_letters,
           o.paused,
           o.max_concurrency,
           EXTRACT(epoch FROM clock_timestamp() - o.oldest_due_at)::double precision
               AS oldest_due_s
      FROM zeroth.scope_overview o
     ORDER BY o.tenant_id, o.workspace_id NULLS FIRST, o.deployment_ref
     LIMIT {OVERVIEW_SCOPES + 1}"""

# Finished runs per minute over the last hour, every scope together.
_PER_MINUTE = """SELECT a.minute, sum(a.completed)::bigint AS completed,
           sum(a.failed)::bigint AS failed
      FROM zeroth.run_activity a GROUP BY a.minute ORDER BY a.minute"""

_DEAD = """SELECT d.run_id, d.tenant_id, d.workspace_id, d.deployment_ref, d.attempts,
           d.max_attempts, d.error::text AS error, d.dead_lettered_at, d.created_at
      FROM zeroth.dead_letters d
     WHERE ($1::text IS NULL OR d.deployment_ref = $1)
       AND ($2::text IS NULL OR d.tenant_id = $2)
     ORDER BY d.dead_lettered_at DESC, d.run_id LIMIT $3"""

# A run by its id alone: one probe of runs_pkey (run_id, tenant_id, workspace_key), whatever its
# status and the number of scopes (zeroth_pg._calls.run_by_id).
_RUN = _calls.run_by_id(f"""r.run_id, r.tenant_id, r.workspace_id, r.workspace_key,
           r.deployment_ref, r.thread_id, r.status::text AS status, r.wait_reason, r.priority,
           r.run_after,
           r.attempts, r.max_attempts, r.created_at, r.updated_at, r.started_at, r.finished_at,
           r.dead_lettered_at, r.idempotency_key, r.lease_worker_id, r.lease_generation,
           r.lease_acquired_at, r.lease_expires_at, r.recovery_checkpoint_id, r.cancel_action,
           r.cancel_requested_at, r.checkpoint_seq,
           left(r.payload::text, {SHOWN_CHARS + 1}) AS payload,
           left(r.output::text, {SHOWN_CHARS + 1}) AS output,
           {_bounded_error("r.error")} AS error,
           left(r.metadata::text, {SHOWN_CHARS + 1}) AS metadata,
           left(r.progress::text, {SHOWN_CHARS + 1}) AS progress, r.parent_run_id,
           r.code_version_id,
           r.status = 'running' AND r.lease_expires_at < clock_timestamp() AS lease_expired""",
                        "$1")

# The text of the code version that started a run (issue 34), by its key
# (zeroth.code_versions_version_id_idx; two identical rows at most).
_CODE_VERSION = """SELECT v.code_version FROM zeroth.code_versions v WHERE v.version_id = $1
    LIMIT 1"""

# The run's children, each with its current status (zeroth.child_list: a range of
# child_runs_pkey), in the order they were started.
_CHILDREN = f"""SELECT c.child_run_id, c.step_key, c.deployment_ref, c.status::text AS status,
           c.detached, c.created_at, c.finished_at
      FROM zeroth.child_list c
     WHERE c.tenant_id = $1 AND c.workspace_key = $2 AND c.parent_run_id = $3
     ORDER BY c.created_at DESC, c.step_key DESC LIMIT {LIST_ROWS + 1}"""

# The per-run views, on (tenant_id, workspace_key, run_id): a range of each table's index.
_CHECKPOINTS = f"""SELECT c.checkpoint_order, c.checkpoint_id, c.lease_generation, c.created_at,
           left(c.data::text, {LISTED_CHARS + 1}) AS data
      FROM zeroth.checkpoint_list c
     WHERE c.tenant_id = $1 AND c.workspace_key = $2 AND c.run_id = $3
     ORDER BY c.checkpoint_order DESC LIMIT {LIST_ROWS + 1}"""

_STEPS = f"""SELECT s.step_key, s.attempt, s.lease_generation, s.recorded_at,
           left(s.result::text, {LISTED_CHARS + 1}) AS result
      FROM zeroth.step_list s
     WHERE s.tenant_id = $1 AND s.workspace_key = $2 AND s.run_id = $3
     ORDER BY s.recorded_at DESC, s.step_key DESC LIMIT {LIST_ROWS + 1}"""

_WAITS = f"""SELECT w.step_key, w.name, w.created_at, w.timeout_at, w.emitted_at
      FROM zeroth.wait_list w
     WHERE w.tenant_id = $1 AND w.workspace_key = $2 AND w.run_id = $3
     ORDER BY w.created_at DESC, w.step_key DESC LIMIT {LIST_ROWS + 1}"""

# The thread's latest runs: a range of runs_thread_idx (tenant_id, workspace_key, thread_id,
# created_at DESC, run_id DESC).
_THREAD = """SELECT r.run_id, r.status::text AS status, r.thread_queued_at AS queued,
           r.created_at
      FROM zeroth.run_list r
     WHERE r.tenant_id = $1 AND r.workspace_key = $2 AND r.thread_id = $3
     ORDER BY r.created_at DESC, r.run_id DESC LIMIT 20"""

# One row per attempt (lease generation), the latest first (the run page keeps LIST_ROWS of
# each list, the latest, and shows them oldest first: the open attempt last).
_ATTEMPTS = f"""SELECT h.attempt, h.lease_generation, h.worker_id, h.claimed_at, h.started_at,
           h.ended_at, h.outcome, {_bounded_error("h.error")} AS error
      FROM zeroth.attempt_history h
     WHERE h.tenant_id = $1 AND h.workspace_key = $2 AND h.run_id = $3
     ORDER BY h.lease_generation DESC, h.ended_at DESC NULLS FIRST LIMIT {LIST_ROWS + 1}"""


# The scope of a run known by its id alone (an action's target), as _RUN finds it.
_SCOPE_OF_RUN = _calls.run_by_id("r.tenant_id, r.workspace_id", "$1")


_R = TypeVar("_R", bound=Response)


def _private(response: _R) -> _R:
    """A page of run data: kept by no cache (a shared proxy's, the browser's back-forward
    disk cache) and never sniffed into another type than it says."""
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _chart(points: list[asyncpg.Record], now: datetime) -> str:
    """An inline SVG bar chart over the last 60 minutes: completions (green) and failures (red)
    per minute, one slot a minute, the newest on the right. The bars' height is on a logarithmic
    scale (log(1 + n)), so one busy minute does not flatten every other (a minute of 1 run stays
    visible next to one of 10,000); the y axis is labelled with that scale's ticks (0, 1, 10, …,
    the top), the x axis in minutes ago, and each bar's tooltip gives its exact count."""
    left, width, plot, slot = 44, 644, 100, 10.0
    height = plot + 16
    top = max([max(int(p["completed"]), int(p["failed"])) for p in points] or [1]) or 1
    current = now.replace(second=0, microsecond=0)

    def y(value: float) -> float:
        return plot - math.log1p(value) / math.log1p(top) * (plot - 6)

    parts = [f'<line class="axis" x1="{left}" y1="{plot + 0.5}" x2="{width}" y2="{plot + 0.5}"/>',
             f'<line class="axis" x1="{left - 0.5}" y1="0" x2="{left - 0.5}" y2="{plot}"/>']
    ticks = {0, top, *(10 ** k for k in range(len(str(top))) if 10 ** k < top / 2)}
    for tick in sorted(ticks):
        parts.append(f'<text class="tick" x="{left - 4}" y="{y(tick) + 4:.1f}" '
                     f'text-anchor="end">{tick}</text>')
    for ago, label in ((59, "60 min ago"), (30, "30 min"), (0, "now")):
        anchor = "start" if ago == 59 else "end" if ago == 0 else "middle"
        x = left + (59 - ago) * slot + (slot if ago == 0 else 0)
        parts.append(f'<text class="tick" x="{x:.1f}" y="{height - 2}" '
                     f'text-anchor="{anchor}">{label}</text>')
    for p in points:
        ago = int((current - p["minute"]).total_seconds() // 60)
        if not 0 <= ago < 60:
            continue
        x = left + (59 - ago) * slot
        for j, (key, cls) in enumerate((("completed", "ok"), ("failed", "bad"))):
            value = int(p[key])
            if not value:
                continue
            parts.append(f'<rect class="{cls}" x="{x + j * slot / 2:.1f}" y="{y(value):.1f}" '
                         f'width="{slot / 2 - 0.5:.1f}" height="{plot - y(value):.1f}">'
                         f"<title>{p['minute']:%H:%M} {key} {value}</title></rect>")
    return (f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="finished runs per minute, last hour (logarithmic scale)">'
            f'{"".join(parts)}</svg>')


class _Origins(BaseHTTPMiddleware):
    """DNS rebinding and cross-site requests: a request whose Host is not an allowed name is
    refused (421) before anything is read or a cookie set; a POST (any method but GET, HEAD,
    OPTIONS) is refused (403) unless its Origin — or, without one, its Referer — is this very
    host and port. A page on a name that its DNS points at 127.0.0.1 sends its own name as Host;
    a page on another origin sends its own Origin."""

    def __init__(self, app: Any, allowed: frozenset[str]) -> None:
        super().__init__(app)
        self.allowed = allowed

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        host = netloc(request.headers.get("host", ""))
        if host is None or host[0] not in self.allowed:
            shown = request.headers.get("host", "")[:100]
            log.warning("web request refused: Host %r is not allowed", shown)
            return Response(f"zeroth-pg web: this dashboard does not answer to the Host "
                            f"{shown!r}; start it with --allowed-host NAME for the name its "
                            "users (or a proxy) reach it by", status_code=421,
                            media_type="text/plain")
        if request.method not in _SAFE_METHODS:
            origin = request.headers.get("origin")
            source = origin if origin is not None else request.headers.get("referer", "")
            parts = urllib.parse.urlsplit(source)
            default = _DEFAULT_PORTS.get(parts.scheme)
            found = netloc(parts.netloc) if default is not None else None
            if found is None or (found[0], found[1] or default) != (host[0], host[1] or default):
                log.warning("web %s refused: %s %r is not this dashboard (%s)", request.method,
                            "Origin" if origin is not None else "Referer", source[:200],
                            request.headers.get("host", "")[:100])
                return Response("zeroth-pg web: a POST must come from this dashboard's own pages "
                                "(its Origin or Referer must be this host and port)",
                                status_code=403, media_type="text/plain")
        return await call_next(request)


class _Guard(BaseHTTPMiddleware):
    """The optional token: ?token= sets a cookie; the cookie or a Bearer header is checked."""

    def __init__(self, app: Any, token: str | None) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if not self.token:
            return await call_next(request)
        cookie = _token_cookie(request)
        given = (request.query_params.get("token") or request.cookies.get(cookie)
                 or request.headers.get("authorization", "").removeprefix("Bearer "))
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Response("zeroth-pg web: a token is required (ZEROTH_PG_WEB_TOKEN): open "
                            "the URL with ?token=…", status_code=401,
                            media_type="text/plain")
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie(cookie, self.token, httponly=True, samesite="strict")
        return response


def _token_cookie(request: Request) -> str:
    """The token's cookie, named by the port the browser reached the dashboard on: a cookie
    belongs to a host name whatever its port, and two dashboards on one name (``zeroth-pg web``
    and ``zeroth-pg demo --web``), each with its own token, overwrote each other's, so the
    other one's pages answered 401."""
    port = request.url.port
    return "zp_token" if port is None else f"zp_token_{port}"


def create_app(dsn: str, *, enable_actions: bool = False, token: str | None = None,
               allowed_hosts: Iterable[str] = (), live_seconds: float = LIVE_SECONDS,
               stream_idle_seconds: float = pages_run_events.IDLE_SECONDS,
               max_streams: int = pages_run_events.MAX_STREAMS,
               max_streams_per_client: int = pages_run_events.MAX_STREAMS_PER_CLIENT
               ) -> Starlette:
    """The dashboard for the database at ``dsn``, read as that DSN's role.

    It answers only requests whose Host is a loopback name (:data:`LOOPBACK_HOSTS`) or one of
    ``allowed_hosts`` (names, any port), and accepts a POST only from its own origin (see
    :class:`_Origins`); ``token``, when given, is required on every request. Its pages refresh
    their live parts every ``live_seconds`` (static/web.js). A run's event stream
    (``/runs/{id}/events``) that has sent nothing for ``stream_idle_seconds`` ends and the
    browser reconnects; at most ``max_streams`` streams at once, ``max_streams_per_client`` from
    one client address (zeroth_pg/web/pages_run_events.py)."""
    from zeroth_pg.web import bulk

    allowed = frozenset(host_name(h) for h in (*LOOPBACK_HOSTS, *allowed_hosts) if h.strip())
    env = Environment(loader=FileSystemLoader(_HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters["failure"] = failure_view
    env.filters["shown"] = lambda value: shown(value, SHOWN_CHARS)
    env.filters["listed"] = lambda value: shown(value, LISTED_CHARS)
    env.filters["when"] = short_time  # every page's timestamps: one format
    env.globals["run_url"] = run_url  # every link to a run names its scope
    csrf_secret = secrets.token_bytes(32)
    state: dict[str, Any] = {}

    def csrf_for(request: Request) -> str:
        session = request.cookies.get("zp_session") or ""
        return hmac.new(csrf_secret, session.encode(), "sha256").hexdigest()

    def render(request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        session = request.cookies.get("zp_session")
        new_session = None
        if not session:
            new_session = secrets.token_hex(16)
            request.cookies["zp_session"] = new_session
        html = env.get_template(name).render(
            request=request, actions=enable_actions, csrf=csrf_for(request), page=name,
            live_ms=int(live_seconds * 1000), **ctx)
        response = HTMLResponse(html, status_code=status_code)
        if new_session:
            response.set_cookie("zp_session", new_session, httponly=True, samesite="strict")
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:")
        response.headers["X-Frame-Options"] = "DENY"
        # A page opened with ?token=… would send it in the Referer of its stylesheet, script
        # and every link followed (a proxy's access log records them): the origin only.
        # (Not no-referrer: a browser then sends "Origin: null" on a POST, which is refused.)
        response.headers["Referrer-Policy"] = "strict-origin"
        return _private(response)

    def pool() -> asyncpg.Pool:
        return state["pool"]

    async def overview_data() -> dict[str, Any]:
        async with pool().acquire() as conn:
            scopes = await conn.fetch(_OVERVIEW)
            points = await conn.fetch(_PER_MINUTE)
            now = await conn.fetchval("SELECT clock_timestamp()")
        return {"scopes": scopes[:OVERVIEW_SCOPES], "more_scopes": len(scopes) > OVERVIEW_SCOPES,
                "scope_cap": OVERVIEW_SCOPES, "chart": _chart(list(points), now), "now": now,
                "finished": sum(int(p["completed"]) + int(p["failed"]) for p in points)}

    async def overview(request: Request) -> Response:
        return render(request, "overview.html", **await overview_data())

    async def overview_fragment(request: Request) -> Response:
        data = await overview_data()
        html = env.get_template("_overview_body.html").render(**data)
        return _private(JSONResponse({"html": html}))

    async def runs(request: Request) -> Response:
        q = request.query_params
        filters = run_filters(q)
        error = None
        page = Page()
        try:
            query_filters = parse_run_filters(filters)
            after, before = parse_cursors(q)
        except ValueError as exc:
            error = f"bad filter: {exc}"
        else:
            async with pool().acquire() as conn, conn.transaction():
                await conn.execute(PAGE_SETTINGS)
                page = await keyset_page(
                    conn, lambda a, b, n, c: run_page_query(query_filters, a, n, before=b,
                                                            count=c),
                    after, before, PAGE_SIZE, lambda r: (r["created_at"], r["run_id"]),
                    {k: v for k, v in filters.items() if v})
        return render(request, "runs.html", status_code=400 if error else 200, rows=page.rows,
                      filters=filters, statuses=_STATUSES, next_params=page.older,
                      prev_params=page.newer, total=page.total, error=error,
                      bulk_max=bulk.BULK_MAX, count_cap=paging.COUNT_CAP)

    async def run_detail(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return render(request, "error.html", status_code=400, message="not a run id")
        async with pool().acquire() as conn:
            # run_id is unique per scope only: every scope's run of this id that the role sees,
            # the one of ?tenant= (and ?workspace=) shown, the others named on the page.
            found = await conn.fetch(_RUN, run_id)
            q = request.query_params
            picked = [r for r in found
                      if ("tenant" not in q or r["tenant_id"] == q["tenant"])
                      and ("workspace" not in q or (r["workspace_id"] or "") == q["workspace"])]
            if not picked:
                return render(request, "error.html", status_code=404,
                              message=f"no run {run_id} visible to this role")
            run = picked[0]
            others = [(r["tenant_id"], r["workspace_id"] or "") for r in found if r is not run]
            scope = (run["tenant_id"], run["workspace_key"], run_id)
            lists = {name: list(await conn.fetch(query, *scope)) for name, query in (
                ("checkpoints", _CHECKPOINTS), ("steps", _STEPS), ("waits", _WAITS),
                ("attempts", _ATTEMPTS), ("children", _CHILDREN))}
            thread = []
            if run["thread_id"]:
                thread = await conn.fetch(_THREAD, run["tenant_id"], run["workspace_key"],
                                          run["thread_id"])
            code_version = (None if run["code_version_id"] is None
                            else await conn.fetchval(_CODE_VERSION, run["code_version_id"]))
            now = await conn.fetchval(_calls.DATABASE_NOW)
        # Each list at most LIST_ROWS (the query read one more: then the page says so).
        cut = {name: len(rows) > LIST_ROWS for name, rows in lists.items()}
        # Read latest first (a run that loops keeps its open wait, its newest checkpoint and
        # its recent steps on the page): shown oldest first.
        lists = {name: rows[:LIST_ROWS][::-1] for name, rows in lists.items()}
        checkpoints, steps, waits, attempts, children = (
            lists[name] for name in ("checkpoints", "steps", "waits", "attempts", "children"))
        sections = [("Attempt history", "_attempts.html", "attempts"),
                    ("Children", "_children.html", "children"), ("Steps", "_steps.html", "steps"),
                    ("Event waits", "_waits.html", "waits"),
                    ("Checkpoints", "_checkpoints.html", "checkpoints"),
                    ("Thread queue", "_thread.html", None)]
        return render(request, "run.html", run=run, others=others, checkpoints=checkpoints,
                      thread=thread,
                      steps=steps, waits=waits, attempts=attempts, children=children,
                      code_version=code_version, cut=cut, list_rows=LIST_ROWS,
                      failure=failure_view(run["error"]), sections=sections,
                      timeline=timeline(run, attempts, steps, waits, checkpoints, children, now))

    async def dead_letters(request: Request) -> Response:
        q = request.query_params
        deployment, tenant = _opt(q.get("deployment")), _opt(q.get("tenant"))
        try:
            no_nul((deployment, tenant))
            bounded({"deployment": deployment, "tenant": tenant})
            after, before = parse_cursors(q)
        except ValueError as exc:
            return render(request, "error.html", status_code=400, message=f"bad filter: {exc}")
        async with pool().acquire() as conn:
            page = await keyset_page(
                conn, lambda a, b, n, c: dead_page_query(deployment, tenant, a, b, n, c),
                after, before, PAGE_SIZE, lambda r: (r["dead_lettered_at"], r["run_id"]),
                {k: v for k, v in (("deployment", deployment), ("tenant", tenant)) if v})
        return render(request, "dead.html", rows=page.rows, deployment=deployment, tenant=tenant,
                      done=q.get("done"), next_params=page.older, prev_params=page.newer,
                      total=page.total, bulk_max=bulk.BULK_MAX,
                      count_cap=paging.COUNT_CAP)

    async def _check_post(request: Request) -> tuple[dict[str, Any], Response | None]:
        # application/x-www-form-urlencoded, parsed here (no python-multipart dependency). Nothing
        # is read when actions are disabled, and never more than _POST_MAX bytes: a larger body
        # is refused (413) as its Content-Length says, or as soon as it has sent that much.
        if not enable_actions:
            return {}, render(request, "error.html", status_code=403,
                              message="actions are disabled: start with --enable-actions")
        too_large = render(request, "error.html", status_code=413,
                           message=f"the form is larger than {_POST_MAX} bytes")
        try:
            if int(request.headers.get("content-length") or 0) > _POST_MAX:
                return {}, too_large
        except ValueError:
            return {}, render(request, "error.html", status_code=400,
                              message="bad Content-Length")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > _POST_MAX:
                return {}, too_large
            chunks.append(chunk)
        body = b"".join(chunks).decode("utf-8", "replace")
        form: dict[str, Any] = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
        given = str(form.get("csrf", ""))
        if not request.cookies.get("zp_session") or not hmac.compare_digest(
                given.encode(), csrf_for(request).encode()):
            return form, render(request, "error.html", status_code=403,
                                message="CSRF token missing or wrong: reload the page")
        return form, None

    async def _act(request: Request, what: str, sql: str, run_id: uuid.UUID,
                   *extra: Any, scope: tuple[str, str | None] | None = None) -> Any:
        """Call ``sql`` (run_id, tenant_id, workspace_id, *extra) as the DSN's role, in
        ``scope`` (tenant, workspace) when the caller knows it (a row of a list), else in the
        run's scope as this role sees it in run_list (a run it cannot see: the default scope,
        so the function answers ZP001 or the role's 42501). An id that several scopes hold
        (run_id is unique per scope only) raises RunInSeveralScopes: acted on in none."""
        async with pool().acquire() as conn:
            role = await conn.fetchval("SELECT current_user")
            log.warning("web action %s %s as %s from %s", what, run_id,
                        role, request.client.host if request.client else "?")
            tenant, workspace = scope if scope is not None else (None, None)
            if scope is None:
                found = [(r["tenant_id"], r["workspace_id"])
                         for r in await conn.fetch(_SCOPE_OF_RUN, run_id)]
                if len(found) > 1:
                    raise RunInSeveralScopes(run_id, found)
                if found:
                    tenant, workspace = found[0]
            return await conn.fetchval(sql, run_id, tenant, workspace, *extra)

    def _ambiguous(request: Request, exc: RunInSeveralScopes) -> Response:
        log.warning("web action refused: %s", exc)
        return render(request, "error.html", status_code=409, message=str(exc))

    def _refused(request: Request, exc: asyncpg.PostgresError) -> Response:
        code = exc.sqlstate
        message = (f"the database refused the action for this role ({code}): {exc}"
                   if code == "42501" else f"the database refused the action ({code}): {exc}")
        log.warning("web action refused: %s", message)
        return render(request, "error.html", status_code=403 if code == "42501" else 409,
                      message=message)

    async def redrive(request: Request) -> Response:
        form, refused = await _check_post(request)
        if refused:
            return refused
        try:
            run_id = uuid.UUID(str(form.get("run_id", "")))
        except ValueError:
            return render(request, "error.html", status_code=400, message="not a run id")
        try:
            await _act(request, "redrive", _calls.REDRIVE_RUN, run_id)
        except asyncpg.PostgresError as exc:
            return _refused(request, exc)
        except RunInSeveralScopes as exc:
            return _ambiguous(request, exc)
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    async def redrive_matching(request: Request) -> Response:
        form, refused = await _check_post(request)
        if refused:
            return refused
        deployment, tenant = _opt(str(form.get("deployment", ""))), _opt(
            str(form.get("tenant", "")))
        done = 0
        try:
            async with pool().acquire() as conn:
                # Each in the scope the dead letters list holds it in: a run of another scope
                # may have the same id.
                rows = await conn.fetch(_DEAD, deployment, tenant, 1000)
            for row in rows:
                await _act(request, "redrive", _calls.REDRIVE_RUN, row["run_id"],
                           scope=(row["tenant_id"], row["workspace_id"]))
                done += 1
        except asyncpg.PostgresError as exc:
            return _refused(request, exc)
        return RedirectResponse(f"/dead-letters?done={done}", status_code=303)

    async def cancel(request: Request) -> Response:
        form, refused = await _check_post(request)
        if refused:
            return refused
        try:
            run_id = uuid.UUID(str(form.get("run_id", "")))
        except ValueError:
            return render(request, "error.html", status_code=400, message="not a run id")
        try:
            await _act(request, "cancel", _calls.REQUEST_CANCEL, run_id, "cancel")
        except asyncpg.PostgresError as exc:
            return _refused(request, exc)
        except RunInSeveralScopes as exc:
            return _ambiguous(request, exc)
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    pages = Context(render=render, pool=pool, check_post=_check_post, refused=_refused,
                    actions=enable_actions)

    async def database_error(request: Request, exc: Exception) -> Response:
        # A role without the grants (42501) or any other database error: a page that says so,
        # never a stack trace, and no data.
        code = getattr(exc, "sqlstate", None) or "?"
        log.warning("web read refused (%s): %s", code, exc)
        if code == "42501":
            return render(request, "error.html", status_code=403, message=(
                f"the database refused this role a read ({code}: {exc}); the dashboard needs a "
                "role in zeroth_reader (or zeroth_owner)"))
        return render(request, "error.html", status_code=500,
                      message=f"the database answered an error ({code}): {exc}")

    event_streams = pages_run_events.EventStreams(
        pages, lambda: connect(dsn, reads_only=not enable_actions, server_settings={
            "application_name": "zeroth-pg web events"}),
        idle_seconds=stream_idle_seconds, max_streams=max_streams,
        max_streams_per_client=max_streams_per_client)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # Without actions the dashboard only reads: a hot standby serves it (docs/scaling.md).
        state["pool"] = await create_pool(dsn, min_size=1, max_size=4,
                                          reads_only=not enable_actions,
                                          server_settings={"application_name": "zeroth-pg web"})
        try:
            yield
        finally:
            await event_streams.close()
            await state["pool"].close()

    async def metrics(request: Request) -> Response:
        # The fleet's database gauges (zeroth_pg/fleet_metrics.py), behind the same Host check
        # and token as every page (Prometheus sends the token as a Bearer header).
        return Response(await fleet_metrics.scrape(pool()), media_type=fleet_metrics.CONTENT_TYPE)

    routes = [
        Route("/", overview),
        Route("/metrics", metrics),
        Route("/overview.json", overview_fragment),
        Route("/runs", runs),
        Route("/runs/{run_id}", run_detail),
        # A run's event stream as server-sent events (issue 34): one listening connection for
        # every stream, reads from the page pool.
        *event_streams.routes(),
        Route("/dead-letters", dead_letters),
        *pages_workers.routes(pages),
        *pages_deployments.routes(pages),
        *pages_schedules.routes(pages),
        *pages_events.routes(pages),
        Route("/actions/redrive", redrive, methods=["POST"]),
        Route("/actions/redrive-matching", redrive_matching, methods=["POST"]),
        Route("/actions/cancel", cancel, methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        *bulk.routes(bulk.Actions(render=render, pool=pool, check_post=_check_post, act=_act,
                                  refused=_refused, enabled=enable_actions)),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={asyncpg.PostgresError: database_error},
                    middleware=[Middleware(_Origins, allowed=allowed),
                                Middleware(_Guard, token=token),
                                # Innermost: a page's message after an action is signed (flash.py).
                                Middleware(FlashMiddleware, secret=csrf_secret)])
    app.state.event_streams = event_streams  # its open_streams, for an operator's probe and tests
    return app
