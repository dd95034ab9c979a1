"""A run's event stream as server-sent events (issue 34, item 1):
``GET /runs/{run_id}/events`` answers ``text/event-stream``, one message per event (``id:`` its
number, ``event:`` its name, ``data:`` its JSON), then ``event: end`` (data: the run's status and
outcome), and closes. A browser's ``EventSource`` resumes after a reconnect from the last id it
received (``Last-Event-ID``; ``?after=N`` does the same for a first request); once a stream has
delivered END, a request from at or past it gets 204, which tells ``EventSource`` not to
reconnect.

Read as the DSN's role like every page (a zeroth_reader sees its tenant's runs only, by row-level
security), with the same Host check and token; GET only, nothing changes.

What a stream holds: no database connection while it waits. One connection of the dashboard
LISTENs on ``zeroth_run_events`` for every stream (:class:`_Listener`, opened with the first
stream, opened again after it is lost) and wakes the streams a notification concerns; a stream
reads with a page-pool connection for one short transaction, after a hint or a slow poll (NOTIFY
is only a hint). A stream that has sent nothing for ``idle_seconds`` ends (its first message
set the browser's ``retry:``), and the browser's EventSource reconnects with Last-Event-ID: a
tab left open on a waiting run costs a request every ``idle_seconds``, never a held slot. At most
``max_streams`` streams at once (503 beyond) and ``max_streams_per_client`` from one client
address (429 beyond), each a task and a little memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import asyncpg
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from zeroth_pg import _calls, streams
from zeroth_pg.notify import RUN_EVENTS_CHANNEL
from zeroth_pg.types import RunEvent
from zeroth_pg.web._shared import Context

__all__ = ["IDLE_SECONDS", "MAX_STREAMS", "MAX_STREAMS_PER_CLIENT", "EventStreams",
           "sse_message"]

log = logging.getLogger("zeroth_pg.web")

#: Streams the dashboard serves at once (each a task; none holds a database connection).
MAX_STREAMS = 256
#: Streams one client address may hold at once (a browser allows about 6 per host over HTTP/1.1).
MAX_STREAMS_PER_CLIENT = 32
#: A stream that has sent nothing for this long ends; the browser reconnects with Last-Event-ID.
IDLE_SECONDS = 30.0
#: The browser's reconnection delay (the SSE ``retry:`` field), in milliseconds.
RETRY_MS = 2000
#: Events one read takes; the slow poll between hints (NOTIFY is only a hint): while the
#: listening connection is up a hint is lost only with it (a new one wakes every stream), so the
#: poll is slower then.
_BATCH = 100
_POLL_SECONDS = 1.0
_POLL_LISTENING_SECONDS = 5.0
#: The least time one send may wait on a client that does not read before its stream ends (the
#: bound is idle_seconds, at least this).
_MIN_SEND_SECONDS = 1.0

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


class _Listener:
    """The one connection that LISTENs on ``zeroth_run_events`` for every stream: a notification
    sets the events of the streams waiting on its payload (the run's key) and of those that wait
    on any (a role that may not compute keys). Opened on first use and again after it is lost
    (``ensure``); while it is down, the streams poll."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]]) -> None:
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        self._opening = asyncio.Lock()
        self._waiters: dict[str | None, set[asyncio.Event]] = {}

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        for key in (payload, None):
            for woken in self._waiters.get(key, ()):
                woken.set()

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def ensure(self) -> None:
        """Listening, or an exception (the caller polls meanwhile)."""
        if self.connected:
            return
        async with self._opening:
            if self.connected:
                return
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
            conn = await self._connect()
            try:
                await conn.add_listener(RUN_EVENTS_CHANNEL, self._on_notify)
            except BaseException:
                conn.terminate()
                raise
            self._conn = conn
            # A hint sent while no connection listened is lost: every waiting stream reads.
            for waiting in self._waiters.values():
                for woken in waiting:
                    woken.set()

    @contextlib.contextmanager
    def subscribe(self, key: str | None, woken: asyncio.Event) -> Iterator[None]:
        self._waiters.setdefault(key, set()).add(woken)
        try:
            yield
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[key]

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)
            conn.terminate()


class _Stream(StreamingResponse):
    """A StreamingResponse that gives its slot back however it ends (END, idle, an error, the
    client gone: Starlette cancels the body)."""

    def __init__(self, body: AsyncIterator[str], release: Callable[[], None],
                 send_seconds: float) -> None:
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._release = release
        self._send_seconds = send_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded_send(message: Message) -> None:
            # A client that stops reading (its window closed, the socket kept open) blocks a
            # send for as long as it likes: a send pending for send_seconds ends the stream, so
            # no client holds a slot by not reading.
            try:
                async with asyncio.timeout(self._send_seconds):
                    await send(message)
            except TimeoutError:
                raise _Stalled from None

        try:
            await super().__call__(scope, receive, bounded_send)
        except _Stalled:
            log.warning("run event stream: the client read nothing for %g s; ending it",
                        self._send_seconds)
        finally:
            self._release()


class _Stalled(Exception):
    """A send of a stream's message waited past its bound: the client stopped reading."""


class EventStreams:
    """The SSE route and what its streams share: the listening connection and the slots."""

    def __init__(self, ctx: Context, connect: Callable[[], Awaitable[asyncpg.Connection]], *,
                 idle_seconds: float = IDLE_SECONDS, max_streams: int = MAX_STREAMS,
                 max_streams_per_client: int = MAX_STREAMS_PER_CLIENT,
                 poll_seconds: float = _POLL_SECONDS) -> None:
        if idle_seconds < 0 or max_streams < 1 or max_streams_per_client < 1:
            raise ValueError("idle_seconds must be >= 0 and the stream bounds >= 1")
        self._ctx = ctx
        self._listener = _Listener(connect)
        self._idle = idle_seconds
        self._poll = poll_seconds
        self._max = max_streams
        self._max_per_client = max_streams_per_client
        self._open: Counter[str] = Counter()
        self._total = 0

    @property
    def open_streams(self) -> int:
        """Streams open now (all clients)."""
        return self._total

    def routes(self) -> list[Route]:
        return [Route("/runs/{run_id}/events", self._run_events)]

    async def close(self) -> None:
        await self._listener.close()

    def _take_slot(self, client: str) -> Response | None:
        """A slot for the client's new stream, or the answer that refuses it (no await between
        the check and the count: one event loop)."""
        if self._total >= self._max:
            return PlainTextResponse("too many event streams open", status_code=503,
                                     headers={"Retry-After": "5"})
        if self._open[client] >= self._max_per_client:
            return PlainTextResponse("too many event streams open from this client",
                                     status_code=429, headers={"Retry-After": "5"})
        self._open[client] += 1
        self._total += 1
        return None

    def _release(self, client: str) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._total -= 1
                self._open[client] -= 1
                if self._open[client] <= 0:
                    del self._open[client]
        return release

    async def _run_events(self, request: Request) -> Response:
        try:
            run_id = uuid.UUID(request.path_params["run_id"])
        except ValueError:
            return PlainTextResponse("not a run id", status_code=400)
        after = _after(request)
        if after is None:
            return PlainTextResponse("Last-Event-ID (or after) must be an event number",
                                     status_code=400)
        async with self._ctx.pool().acquire() as conn:
            # run_id is unique per scope only: the run of ?tenant= (and ?workspace=), as on the
            # run page; an id several scopes hold, without them, streams none of the runs.
            q = request.query_params
            found = [r for r in await conn.fetch(_SCOPE, run_id)
                     if ("tenant" not in q or r["tenant_id"] == q["tenant"])
                     and ("workspace" not in q or (r["workspace_id"] or "") == q["workspace"])]
            if not found:
                return PlainTextResponse(f"no run {run_id} visible to this role",
                                         status_code=404)
            if len(found) > 1:
                return PlainTextResponse(
                    f"run {run_id} exists in several scopes: add ?tenant= and ?workspace=",
                    status_code=409)
            scope = found[0]
            tenant, workspace, wskey = (scope["tenant_id"], scope["workspace_id"],
                                        scope["workspace_key"])
            first = await streams.reader_events(conn, tenant, wskey, run_id, after, _BATCH)
            if len(first) == 1 and first[0].is_end and first[0].event_id <= after:
                return Response(status_code=204)  # already delivered: EventSource stops here
            # A role that may compute the run's key (a worker's or the owner's DSN) wakes on
            # its notifications only; a zeroth_reader on any of the channel's (a hint).
            try:
                key: str | None = str(await conn.fetchval(_calls.RUN_EVENTS_KEY, run_id,
                                                          tenant, workspace))
            except asyncpg.InsufficientPrivilegeError:
                key = None
        client = request.client.host if request.client else "?"
        refused = self._take_slot(client)
        if refused is not None:
            return refused
        return _Stream(self._follow(run_id, tenant, wskey, key, after, first),
                       self._release(client), max(self._idle, _MIN_SEND_SECONDS))

    async def _follow(self, run_id: uuid.UUID, tenant: str, wskey: str, key: str | None,
                      after: int, first: list[RunEvent]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        yield f"retry: {RETRY_MS}\n\n"
        last = after
        sent_at = loop.time()
        woken = asyncio.Event()
        events = first
        with self._listener.subscribe(key, woken):
            while True:
                for event in events:
                    if event.is_end:
                        yield sse_message(event)
                        return
                    if event.event_id <= last:
                        continue
                    yield sse_message(event)
                    last = event.event_id
                    sent_at = loop.time()
                if len(events) < _BATCH:
                    if loop.time() - sent_at >= self._idle:
                        # Nothing to send for idle_seconds: end; the browser reconnects after
                        # retry: with Last-Event-ID (no slot held while the run waits).
                        return
                    try:
                        await self._listener.ensure()
                    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                            TimeoutError) as exc:
                        log.warning("run event streams: cannot listen (%s); polling", exc)
                    poll = (max(self._poll, _POLL_LISTENING_SECONDS) if self._listener.connected
                            else self._poll)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(
                                min(poll, max(self._idle - (loop.time() - sent_at), 0))):
                            await woken.wait()
                woken.clear()
                try:
                    async with self._ctx.pool().acquire() as conn:
                        events = await streams.reader_events(conn, tenant, wskey, run_id, last,
                                                             _BATCH)
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                        TimeoutError) as exc:
                    # The browser reconnects from the last id it received.
                    log.warning("run event stream of %s: read failed (%s); ending it", run_id,
                                exc)
                    return
