"""A run's event stream as server-sent events (issue 34, item 1):
``GET /runs/{run_id}/events`` answers ``text/event-stream``, one message per event (``id:`` its
number, ``event:`` its name, ``data:`` its JSON), then ``event: end`` (data: the run's status and
outcome), and closes. A browser's ``EventSource`` resumes after a reconnect from the last id it
received (``Last-Event-ID``; ``?after=N`` does the same for a first request); once a stream has
delivered END, a request from at or past it gets 204, which tells ``EventSource`` not to
reconnect.

Read as the DSN's role like every page (a zeroth_reader sees its tenant's runs only, by row-level
security), with the same Host check and token; GET only, nothing changes. Each stream has a
connection of its own outside the page pool (it LISTENs on ``zeroth_run_events`` for as long as
the browser keeps it open), at most :data:`MAX_STREAMS` at once (503 beyond).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from zeroth_pg import _calls, streams
from zeroth_pg.types import RunEvent
from zeroth_pg.web._shared import Context

__all__ = ["MAX_STREAMS", "routes", "sse_message"]

#: Streams the dashboard serves at once (each holds a database connection).
MAX_STREAMS = 16
#: Events one read takes; the slow poll between hints (NOTIFY is only a hint).
_BATCH = 100
_POLL_SECONDS = 1.0

# The run's scope by its id alone, as the run page finds it (zeroth_pg._calls.run_by_id).
_SCOPE = _calls.run_by_id("r.tenant_id, r.workspace_id, r.workspace_key", "$1")


def sse_message(event: RunEvent) -> str:
    """One server-sent event: ``id:`` the event number, ``event:`` its name (``end`` for END),
    ``data:`` its JSON on one line. Names hold no control characters (zeroth.append_run_event
    refuses them), and JSON text holds no line break, so a message cannot be split or forged."""
    data = json.dumps(event.data, separators=(",", ":"))
    return f"id: {event.event_id}\nevent: {event.name}\ndata: {data}\n\n"


def _after(request: Request) -> int | None:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    # ASCII digits only: str.isdigit() is true of '²' (int() raises: a 500) and of other
    # scripts' digits.
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def routes(ctx: Context, connect: Callable[[], Awaitable[asyncpg.Connection]]) -> list[Route]:
    """The SSE route; ``connect`` opens a connection of the dashboard's DSN for one stream."""
    open_streams = asyncio.Semaphore(MAX_STREAMS)

    @contextlib.asynccontextmanager
    async def dedicated() -> AsyncIterator[asyncpg.Connection]:
        conn = await connect()
        try:
            yield conn
        finally:
            await conn.close()

    async def run_events(request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return PlainTextResponse("not a run id", status_code=400)
        after = _after(request)
        if after is None:
            return PlainTextResponse("Last-Event-ID (or after) must be an event number",
                                     status_code=400)
        async with ctx.pool().acquire() as conn:
            scope = await conn.fetchrow(_SCOPE, run_id)
            if scope is None:
                return PlainTextResponse(f"no run {run_id} visible to this role",
                                         status_code=404)
            tenant, workspace, wskey = (scope["tenant_id"], scope["workspace_id"],
                                        scope["workspace_key"])
            first = await streams.reader_events(conn, tenant, wskey, run_id, after, _BATCH)
        if len(first) == 1 and first[0].is_end and first[0].event_id <= after:
            return Response(status_code=204)  # already delivered: EventSource stops here
        if open_streams.locked():
            return PlainTextResponse("too many event streams open", status_code=503)

        async def read(conn: asyncpg.Connection, last: int) -> list[RunEvent]:
            return await streams.reader_events(conn, tenant, wskey, run_id, last, _BATCH)

        async def key(conn: asyncpg.Connection) -> str | None:
            # A role that may compute the run's key (a worker's or the owner's DSN) wakes on
            # its notifications only; a zeroth_reader on any of the channel's (a hint).
            try:
                return str(await conn.fetchval(_calls.RUN_EVENTS_KEY, run_id, tenant, workspace))
            except asyncpg.InsufficientPrivilegeError:
                return None

        async def body() -> AsyncIterator[str]:
            async with open_streams:
                yield "retry: 2000\n\n"
                async for event in streams.follow(dedicated, read, key, after=after,
                                                  poll_interval=_POLL_SECONDS, batch=_BATCH,
                                                  max_reconnects=5):
                    yield sse_message(event)

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return [Route("/runs/{run_id}/events", run_events)]
