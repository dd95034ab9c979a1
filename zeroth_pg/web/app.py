"""The dashboard's ASGI app (see :mod:`zeroth_pg.web`)."""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from zeroth_pg import _calls

__all__ = ["create_app"]

log = logging.getLogger("zeroth_pg.web")
_HERE = Path(__file__).parent
_STATUSES = ["pending", "running", "waiting", "completed", "failed", "cancelled"]
PAGE_SIZE = 50

# Keyset page of runs, newest first: (created_at, run_id) below the cursor. Read as the caller,
# so a zeroth_reader sees only its tenant (row-level security).
_RUN_PAGE = f"""SELECT {_calls._RUN_COLUMNS}
      FROM zeroth.runs r
     WHERE ($1::text IS NULL OR r.deployment_ref = $1)
       AND ($2::text IS NULL OR r.status::text = $2)
       AND ($3::text IS NULL OR r.tenant_id = $3)
       AND ($4::text IS NULL OR r.workspace_id = $4)
       AND ($5::text IS NULL OR r.thread_id = $5)
       AND ($6::timestamptz IS NULL OR r.created_at >= $6)
       AND ($7::timestamptz IS NULL OR r.created_at < $7)
       AND ($8::text IS NULL OR r.run_id::text = $8 OR r.idempotency_key = $8)
       AND ($9::timestamptz IS NULL OR (r.created_at, r.run_id) < ($9, $10::uuid))
     ORDER BY r.created_at DESC, r.run_id DESC
     LIMIT $11"""

_WORKERS = """SELECT l.lease_worker_id AS worker_id, count(*) AS runs,
           max(l.lease_acquired_at) AS last_acquired, min(l.lease_expires_at) AS next_expiry,
           max(l.lease_expires_at) AS last_expiry
      FROM zeroth.live_leases l GROUP BY l.lease_worker_id ORDER BY l.lease_worker_id"""

_LISTENERS = """SELECT application_name, count(*) AS sessions FROM pg_stat_activity
     WHERE application_name <> '' AND datname = current_database()
     GROUP BY application_name ORDER BY application_name"""

_DEAD = """SELECT d.run_id, d.tenant_id, d.workspace_id, d.deployment_ref, d.attempts,
           d.max_attempts, d.error::text AS error, d.dead_lettered_at, d.created_at
      FROM zeroth.dead_letters d
     WHERE ($1::text IS NULL OR d.deployment_ref = $1)
       AND ($2::text IS NULL OR d.tenant_id = $2)
     ORDER BY d.dead_lettered_at DESC, d.run_id LIMIT $3"""

# Finished runs per minute over the last hour, from the runs_finished_idx range.
_PER_MINUTE = """SELECT date_trunc('minute', r.finished_at) AS minute,
           count(*) FILTER (WHERE r.status = 'completed') AS completed,
           count(*) FILTER (WHERE r.status = 'failed') AS failed
      FROM zeroth.runs r
     WHERE r.finished_at >= clock_timestamp() - interval '1 hour'
     GROUP BY 1 ORDER BY 1"""

_OLDEST_PENDING = """SELECT q.deployment_ref,
           EXTRACT(epoch FROM clock_timestamp() - min(r.created_at))::double precision AS age
      FROM zeroth.runs r JOIN (SELECT DISTINCT deployment_ref FROM zeroth.queue_depth) q
        ON q.deployment_ref = r.deployment_ref
     WHERE r.status = 'pending' GROUP BY q.deployment_ref"""


def _opt(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


def _time(value: str | None) -> datetime | None:
    text = _opt(value)
    return datetime.fromisoformat(text) if text else None


def _chart(points: list[asyncpg.Record], now: datetime) -> str:
    """An inline SVG bar chart over the last 60 minutes: completions (green) and failures (red)
    per minute, one slot a minute, the newest on the right."""
    width, height, slot = 600, 80, 10.0
    top = max([max(int(p["completed"]), int(p["failed"])) for p in points] or [1]) or 1
    current = now.replace(second=0, microsecond=0)
    parts = [f'<line class="axis" x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>']
    for p in points:
        ago = int((current - p["minute"]).total_seconds() // 60)
        if not 0 <= ago < 60:
            continue
        x = (59 - ago) * slot
        for j, (key, cls) in enumerate((("completed", "ok"), ("failed", "bad"))):
            h = int(p[key]) / top * (height - 10)
            parts.append(f'<rect class="{cls}" x="{x + j * slot / 2:.1f}" y="{height - h:.1f}" '
                         f'width="{slot / 2 - 0.5:.1f}" height="{h:.1f}">'
                         f"<title>{p['minute']:%H:%M} {key} {int(p[key])}</title></rect>")
    return (f'<svg class="chart" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
            f'role="img" aria-label="finished runs per minute, last hour">{"".join(parts)}</svg>')


class _Guard(BaseHTTPMiddleware):
    """The optional token: ?token= sets a cookie; the cookie or a Bearer header is checked."""

    def __init__(self, app: Any, token: str | None) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if not self.token:
            return await call_next(request)
        given = (request.query_params.get("token") or request.cookies.get("zp_token")
                 or request.headers.get("authorization", "").removeprefix("Bearer "))
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return Response("zeroth-pg web: a token is required (ZEROTH_PG_WEB_TOKEN): open "
                            "the URL with ?token=…", status_code=401,
                            media_type="text/plain")
        response = await call_next(request)
        if request.query_params.get("token"):
            response.set_cookie("zp_token", self.token, httponly=True, samesite="strict")
        return response


def create_app(dsn: str, *, enable_actions: bool = False, token: str | None = None) -> Starlette:
    """The dashboard for the database at ``dsn``, read as that DSN's role."""
    env = Environment(loader=FileSystemLoader(_HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
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
            request=request, actions=enable_actions, csrf=csrf_for(request), page=name, **ctx)
        response = HTMLResponse(html, status_code=status_code)
        if new_session:
            response.set_cookie("zp_session", new_session, httponly=True, samesite="strict")
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:")
        response.headers["X-Frame-Options"] = "DENY"
        return response

    def pool() -> asyncpg.Pool:
        return state["pool"]

    async def overview_data() -> dict[str, Any]:
        async with pool().acquire() as conn:
            scopes = [dict(r) for r in await conn.fetch(_calls.STATUS, None, None, None)]
            running = {(r["tenant_id"], r["workspace_id"], r["deployment_ref"]): r["n"]
                       for r in await conn.fetch(
                           "SELECT l.tenant_id, l.workspace_id, l.deployment_ref, count(*) AS n"
                           " FROM zeroth.live_leases l WHERE l.status = 'running'"
                           " GROUP BY 1, 2, 3")}
            oldest = {r["deployment_ref"]: r["age"] for r in await conn.fetch(_OLDEST_PENDING)}
            points = await conn.fetch(_PER_MINUTE)
            now = await conn.fetchval(_calls.DATABASE_NOW)
        for s in scopes:
            s["running"] = running.get((s["tenant_id"], s["workspace_id"], s["deployment_ref"]), 0)
            s["due"] = (s["claimable"] or 0) - (s["scheduled"] or 0)
            s["oldest_pending_s"] = oldest.get(s["deployment_ref"])
        return {"scopes": scopes, "chart": _chart(list(points), now), "now": now,
                "finished": sum(int(p["completed"]) + int(p["failed"]) for p in points)}

    async def overview(request: Request) -> Response:
        return render(request, "overview.html", **await overview_data())

    async def overview_fragment(request: Request) -> Response:
        data = await overview_data()
        html = env.get_template("_overview_body.html").render(**data)
        return JSONResponse({"html": html})

    async def runs(request: Request) -> Response:
        q = request.query_params
        filters = {k: _opt(q.get(k)) for k in
                   ("status", "deployment", "tenant", "workspace", "thread", "search",
                    "since", "until")}
        error = None
        rows: list[asyncpg.Record] = []
        try:
            since, until = _time(filters["since"]), _time(filters["until"])
            after_at = _time(q.get("after_at"))
            after_id = uuid.UUID(q["after_id"]) if q.get("after_id") else None
            if filters["status"] and filters["status"] not in _STATUSES:
                raise ValueError(f"unknown status {filters['status']!r}")
        except ValueError as exc:
            error = f"bad filter: {exc}"
        else:
            async with pool().acquire() as conn:
                rows = await conn.fetch(
                    _RUN_PAGE, filters["deployment"], filters["status"], filters["tenant"],
                    filters["workspace"], filters["thread"], since, until, filters["search"],
                    after_at, after_id, PAGE_SIZE + 1)
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        next_params = None
        if more:
            last = rows[-1]
            next_params = {**{k: v for k, v in filters.items() if v},
                           "after_at": last["created_at"].isoformat(),
                           "after_id": str(last["run_id"])}
        return render(request, "runs.html", status_code=400 if error else 200, rows=rows,
                      filters=filters, statuses=_STATUSES, next_params=next_params, error=error)

    async def run_detail(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return render(request, "error.html", status_code=400, message="not a run id")
        async with pool().acquire() as conn:
            run = await conn.fetchrow(_calls.FIND_RUN, run_id, None, None)
            if run is None:
                return render(request, "error.html", status_code=404,
                              message=f"no run {run_id} visible to this role")
            checkpoints = await conn.fetch(_calls.RUN_CHECKPOINTS, run["tenant_id"],
                                           run["workspace_key"], run_id)
            thread = []
            if run["thread_id"]:
                thread = await conn.fetch(_calls.LIST_THREAD_RUNS, run["thread_id"],
                                          run["tenant_id"], run["workspace_id"], 20)
        # Sections: each is (title, template); issue 16's steps / events / attempts add theirs.
        sections = [("Checkpoints", "_checkpoints.html"), ("Thread queue", "_thread.html")]
        return render(request, "run.html", run=run, checkpoints=checkpoints, thread=thread,
                      sections=sections)

    async def dead_letters(request: Request) -> Response:
        q = request.query_params
        deployment, tenant = _opt(q.get("deployment")), _opt(q.get("tenant"))
        async with pool().acquire() as conn:
            rows = await conn.fetch(_DEAD, deployment, tenant, 200)
        return render(request, "dead.html", rows=rows, deployment=deployment, tenant=tenant,
                      done=q.get("done"))

    async def workers(request: Request) -> Response:
        async with pool().acquire() as conn:
            rows = await conn.fetch(_WORKERS)
            listeners = await conn.fetch(_LISTENERS)
        return render(request, "workers.html", rows=rows, listeners=listeners)

    async def _check_post(request: Request) -> tuple[dict[str, Any], Response | None]:
        # application/x-www-form-urlencoded, parsed here (no python-multipart dependency).
        body = (await request.body())[:65536].decode("utf-8", "replace")
        form: dict[str, Any] = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
        if not enable_actions:
            return form, render(request, "error.html", status_code=403,
                                message="actions are disabled: start with --enable-actions")
        given = str(form.get("csrf", ""))
        if not request.cookies.get("zp_session") or not hmac.compare_digest(
                given.encode(), csrf_for(request).encode()):
            return form, render(request, "error.html", status_code=403,
                                message="CSRF token missing or wrong: reload the page")
        return form, None

    async def _act(request: Request, what: str, sql: str, *args: Any) -> Any:
        async with pool().acquire() as conn:
            role = await conn.fetchval("SELECT current_user")
            log.warning("web action %s %s as %s from %s", what, args,
                        role, request.client.host if request.client else "?")
            return await conn.fetchval(sql, *args)

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
            await _act(request, "redrive", _calls.REDRIVE_RUN, run_id, None, None)
        except asyncpg.PostgresError as exc:
            return _refused(request, exc)
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
                ids = [r["run_id"] for r in await conn.fetch(_DEAD, deployment, tenant, 1000)]
            for run_id in ids:
                await _act(request, "redrive", _calls.REDRIVE_RUN, run_id, None, None)
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
            await _act(request, "cancel", _calls.REQUEST_CANCEL, run_id, None, None, "cancel")
        except asyncpg.PostgresError as exc:
            return _refused(request, exc)
        return RedirectResponse(f"/runs/{run_id}", status_code=303)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state["pool"] = await asyncpg.create_pool(dsn, min_size=1, max_size=4,
                                                  server_settings={"application_name":
                                                                   "zeroth-pg web"})
        try:
            yield
        finally:
            await state["pool"].close()

    routes = [
        Route("/", overview),
        Route("/overview.json", overview_fragment),
        Route("/runs", runs),
        Route("/runs/{run_id}", run_detail),
        Route("/dead-letters", dead_letters),
        Route("/workers", workers),
        Route("/actions/redrive", redrive, methods=["POST"]),
        Route("/actions/redrive-matching", redrive_matching, methods=["POST"]),
        Route("/actions/cancel", cancel, methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(_Guard, token=token)])
