"""A deer-flow style thread service on zeroth_pg: HTTP in front, worker processes behind.

Routes (docs/threads.md has the full outcome → status table):

* ``POST /threads/{thread_id}/runs?strategy=reject|interrupt|rollback|enqueue`` — body: the
  run's JSON payload; header ``Idempotency-Key`` optional. 202 admitted or queued (``Location``,
  ``Retry-After`` when the thread waits for a leased run), 200 reused, 409 busy, 422 bad input.
* ``POST /runs/{run_id}/cancel?action=interrupt|rollback|cancel&wait=seconds`` — 202 cancelled,
  cancel requested or taken over (``Retry-After`` with a request); with ``wait``, 204 once the
  run has ended; 409 not cancellable; 404 unknown.
* ``GET /runs/{run_id}/join?timeout=seconds`` — 200 when the run has ended, 202 when it is still
  going after the timeout, 404 unknown.
* ``GET /runs/{run_id}`` and ``GET /threads/{thread_id}/runs?limit=n`` — reads.

The service admits runs without owning them; any number of ``python -m zeroth_pg.worker
--deployment thread-service --app handlers:chat`` processes execute them. A cancel that lands on
this service while a worker owns the run is a durable request the worker hears by NOTIFY.

Run it: ``ZEROTH_PG_DSN=… uvicorn --factory app:create_app`` (see README.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import asyncpg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zeroth_pg import CancelOutcome
from zeroth_pg.errors import InvalidArgumentError
from zeroth_pg.threads import (
    Admission,
    CancelResult,
    Strategy,
    ThreadRun,
    ThreadRuns,
    http_response,
)

DEPLOYMENT = "thread-service"
MAX_WAIT = 300.0


def _threads(request: Request) -> ThreadRuns:
    threads: ThreadRuns = request.app.state.threads
    return threads


def _run_id(request: Request) -> UUID | None:
    try:
        return UUID(request.path_params["run_id"])
    except ValueError:
        return None


def _seconds(request: Request, name: str, default: float) -> float:
    value = float(request.query_params.get(name, default))
    if not 0 <= value <= MAX_WAIT:
        raise ValueError(f"{name} must be between 0 and {MAX_WAIT:g} seconds")
    return value


def _run_json(run: ThreadRun) -> dict[str, Any]:
    return {
        "run_id": str(run.run_id), "thread_id": run.thread_id, "status": run.status,
        "queued": run.queued, "cancel_action": run.cancel_action, "output": run.output,
        "error": run.error, "progress": run.progress, "accounting": run.accounting,
        "worker_id": run.lease_worker_id, "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at and run.finished_at.isoformat(),
    }


def _outcome_json(result: Admission | CancelResult) -> dict[str, Any]:
    body: dict[str, Any] = {
        "outcome": result.outcome, "run_id": result.run_id and str(result.run_id),
        "status": result.status, "retry_after_s": result.retry_after_s}
    if isinstance(result, Admission):
        body["active_run_id"] = result.active_run_id and str(result.active_run_id)
        body["displaced"] = [{"run_id": str(d.run_id), "outcome": d.outcome}
                             for d in result.displaced]
    return body


def _error(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


async def admit(request: Request) -> Response:
    strategy = request.query_params.get("strategy", Strategy.REJECT)
    if strategy not in set(Strategy):
        return _error(422, f"strategy must be one of {', '.join(Strategy)}")
    body = await request.body()
    try:
        payload = await request.json() if body else {}
    except ValueError:
        return _error(422, "the body must be JSON")
    if not isinstance(payload, dict):
        return _error(422, "the body must be a JSON object")
    admission = await _threads(request).admit(
        DEPLOYMENT, request.path_params["thread_id"], payload, strategy=strategy,
        idempotency_key=request.headers.get("Idempotency-Key"))
    status, headers = http_response(admission)
    if admission.run_id is not None:
        headers["Location"] = f"/runs/{admission.run_id}"
    return JSONResponse(_outcome_json(admission), status_code=status, headers=headers)


async def cancel(request: Request) -> Response:
    run_id = _run_id(request)
    if run_id is None:
        return _error(404, "no such run")
    wait = _seconds(request, "wait", 0)
    threads = _threads(request)
    result = await threads.cancel(run_id, action=request.query_params.get("action", "interrupt"))
    status, headers = http_response(result)
    accepted = {CancelOutcome.CANCELLED, CancelOutcome.CANCEL_REQUESTED, CancelOutcome.TAKEN_OVER}
    if wait and result.outcome in accepted:
        run = await threads.join(run_id, timeout=wait)
        if run is not None and run.finished:
            return Response(status_code=204)
    return JSONResponse(_outcome_json(result), status_code=status, headers=headers)


async def join(request: Request) -> Response:
    run_id = _run_id(request)
    run = None if run_id is None else await _threads(request).join(
        run_id, timeout=_seconds(request, "timeout", 30))
    if run is None:
        return _error(404, "no such run")
    return JSONResponse(_run_json(run), status_code=200 if run.finished else 202)


async def get_run(request: Request) -> Response:
    run_id = _run_id(request)
    run = None if run_id is None else await _threads(request).get(run_id)
    if run is None:
        return _error(404, "no such run")
    return JSONResponse(_run_json(run))


async def list_runs(request: Request) -> Response:
    runs = await _threads(request).list_by_thread(
        request.path_params["thread_id"], limit=int(request.query_params.get("limit", 20)))
    return JSONResponse([_run_json(run) for run in runs])


async def _invalid(request: Request, exc: Exception) -> Response:
    return _error(422, str(exc))


def create_app(dsn: str | None = None, *, grace_seconds: float = 10.0) -> Starlette:
    """The service on the database at ``dsn`` (default: ``ZEROTH_PG_DSN``)."""
    database = dsn or os.environ["ZEROTH_PG_DSN"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Each join holds a pooled connection while it listens: size the pool for them.
        pool = await asyncpg.create_pool(database, min_size=1, max_size=20)
        app.state.threads = ThreadRuns(pool, grace_seconds=grace_seconds)
        try:
            yield
        finally:
            await pool.close()

    return Starlette(
        routes=[
            Route("/threads/{thread_id}/runs", admit, methods=["POST"]),
            Route("/threads/{thread_id}/runs", list_runs, methods=["GET"]),
            Route("/runs/{run_id}", get_run, methods=["GET"]),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
            Route("/runs/{run_id}/join", join, methods=["GET"]),
        ],
        exception_handlers={InvalidArgumentError: _invalid, ValueError: _invalid},
        lifespan=lifespan,
    )
