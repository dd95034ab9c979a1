"""The dashboard's event streams hold no slot nor connection while their runs wait (issue 34):
many streams on waiting runs (more than the 16 slots a stream used to hold a connection in) are
all served over ONE listening connection of the dashboard, each receiving its own run's events
then END; a stream that has sent nothing for ``stream_idle_seconds`` ends (its ``retry:`` was
set first) and the browser's reconnect with Last-Event-ID resumes after the last event it got;
one client address holds at most ``max_streams_per_client`` streams (429 beyond), every client
together ``max_streams`` (503 beyond), and a slot comes back when its client goes away.

Real HTTP: a uvicorn server in a thread and httpx clients holding their streams open, against a
real database. No timed assertion: every wait has a generous failure bound only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import asyncpg
import httpx
import pytest
from helpers import WORKER, dashboard, make_run, wait_until

from zeroth_pg.web import create_app

WAIT = 60.0  # a failure bound for every read of a stream, never a pace

APPEND = """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2, generation => $3,
               name => 'token', data => $4::text::jsonb)"""
COMPLETE = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3)"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:  # startup, not a timed assertion
        threading.Event().wait(0.05)
        assert thread.is_alive(), "the dashboard did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()


def _messages(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append({"id": int(fields["id"]), "event": fields["event"],
                        "data": json.loads(fields["data"])})
    return out


class Stream:
    """One open SSE response: its text so far, read on demand."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.text = ""
        self._chunks = response.aiter_text()

    async def until(self, needle: str) -> str:
        async def read() -> None:
            while needle not in self.text:
                self.text += await anext(self._chunks)
        await asyncio.wait_for(read(), WAIT)
        return self.text

    async def rest(self) -> str:
        async def read() -> None:
            async for chunk in self._chunks:
                self.text += chunk
        await asyncio.wait_for(read(), WAIT)
        return self.text


@contextlib.asynccontextmanager
async def open_stream(client: httpx.AsyncClient, url: str,
                      headers: dict[str, str] | None = None) -> AsyncIterator[Stream]:
    async with client.stream("GET", url, headers=headers) as response:
        yield Stream(response)


async def _running(conn: asyncpg.Connection, n: int, **kwargs: Any) -> list[Any]:
    now: datetime = await conn.fetchval("SELECT clock_timestamp()")
    return [await make_run(conn, "running", now=now, lease_seconds=600, **kwargs)
            for _ in range(n)]


async def _web_connections(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("""SELECT application_name, count(*) AS n FROM pg_stat_activity
                                WHERE application_name LIKE 'zeroth-pg web%'
                                GROUP BY application_name""")
    return {r["application_name"]: int(r["n"]) for r in rows}


class TestManyStreams:
    async def test_twenty_waiting_streams_share_one_listening_connection_and_each_gets_its_events(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            runs = await _running(conn, 20)
            app = create_app(database_dsn, stream_idle_seconds=3600)
            with served(app) as base:
                async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client, \
                        contextlib.AsyncExitStack() as stack:
                    opened = [await stack.enter_async_context(
                        open_stream(client, f"/runs/{lease.run_id}/events")) for lease in runs]
                    assert [s.response.status_code for s in opened] == [200] * 20
                    for stream in opened:
                        await stream.until("retry: ")
                    assert app.state.event_streams.open_streams == 20

                    # each waiting stream woken by its run's hint: one listening connection for
                    # all of them, none held by a stream (the page pool has at most 4)
                    for n, lease in enumerate(runs):
                        assert await conn.fetchval(APPEND, lease.run_id, WORKER,
                                                   lease.generation, json.dumps({"n": n})) == 1
                    for stream in opened:
                        await stream.until("id: 1\n")
                    connections = await _web_connections(conn)
                    assert connections.get("zeroth-pg web events") == 1
                    assert connections.get("zeroth-pg web", 0) <= 4

                    for lease in runs:
                        assert await conn.fetchval(COMPLETE, lease.run_id, WORKER,
                                                   lease.generation)
                    bodies = [await stream.rest() for stream in opened]
                await wait_until(lambda: app.state.event_streams.open_streams == 0,
                                 "every stream's slot to come back", within=WAIT)
        finally:
            await conn.close()

        for n, body in enumerate(bodies):
            assert _messages(body) == [
                {"id": 1, "event": "token", "data": {"n": n}},
                {"id": 2, "event": "end", "data": {"status": "completed",
                                                   "outcome": "completed"}}]


class TestBounds:
    async def test_one_client_holds_at_most_its_share_and_a_slot_comes_back_when_it_leaves(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            runs = await _running(conn, 4)
            app = create_app(database_dsn, stream_idle_seconds=3600, max_streams=3,
                             max_streams_per_client=2)
            streams = app.state.event_streams
            with served(app) as base:
                # a second client address on the loopback (the Host stays 127.0.0.1)
                other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
                async with httpx.AsyncClient(base_url=base, timeout=WAIT) as one, \
                        httpx.AsyncClient(base_url=base, timeout=WAIT, transport=other) as two:
                    async with open_stream(one, f"/runs/{runs[0].run_id}/events") as a, \
                            open_stream(one, f"/runs/{runs[1].run_id}/events") as b:
                        await a.until("retry: ")
                        await b.until("retry: ")
                        third = await one.get(f"/runs/{runs[2].run_id}/events")
                        async with open_stream(two, f"/runs/{runs[2].run_id}/events") as c:
                            await c.until("retry: ")
                            full = await two.get(f"/runs/{runs[3].run_id}/events")
                            assert streams.open_streams == 3
                    # the client went away: its slots come back
                    await wait_until(lambda: streams.open_streams == 0,
                                     "the slots of the closed streams", within=WAIT)
                    async with open_stream(one, f"/runs/{runs[3].run_id}/events") as again:
                        await again.until("retry: ")
                        again_status = again.response.status_code
        finally:
            await conn.close()

        assert third.status_code == 429
        assert full.status_code == 503
        assert again_status == 200


class TestIdleStreams:
    async def test_an_idle_stream_ends_with_its_retry_hint_and_resumes_from_last_event_id(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            (lease,) = await _running(conn, 1)
            url = f"/runs/{lease.run_id}/events"
            for n in (1, 2):
                assert await conn.fetchval(APPEND, lease.run_id, WORKER, lease.generation,
                                           json.dumps({"n": n})) == n
            # idle 0: a stream ends as soon as it has nothing more to send
            with dashboard(create_app(database_dsn, stream_idle_seconds=0)) as client:
                first = client.get(url)
                assert await conn.fetchval(APPEND, lease.run_id, WORKER, lease.generation,
                                           json.dumps({"n": 3})) == 3
                # the browser's EventSource reconnects with the last id it received
                second = client.get(url, headers={"Last-Event-ID": "2"})
                nothing_new = client.get(url, headers={"Last-Event-ID": "3"})
                assert await conn.fetchval(COMPLETE, lease.run_id, WORKER, lease.generation)
                last = client.get(url, headers={"Last-Event-ID": "3"})
                after_end = client.get(url, headers={"Last-Event-ID": "4"})
        finally:
            await conn.close()

        assert first.status_code == 200
        assert first.text.startswith("retry: ")
        assert [(m["id"], m["event"]) for m in _messages(first.text)] == [
            (1, "token"), (2, "token")]
        assert [(m["id"], m["data"]) for m in _messages(second.text)] == [(3, {"n": 3})]
        assert nothing_new.status_code == 200
        assert _messages(nothing_new.text) == []
        assert [(m["id"], m["event"]) for m in _messages(last.text)] == [(4, "end")]
        assert after_end.status_code == 204

    @pytest.mark.parametrize("kwargs", [{"stream_idle_seconds": -1}, {"max_streams": 0},
                                        {"max_streams_per_client": 0}])
    def test_bad_bounds_are_refused(self, kwargs):
        with pytest.raises(ValueError, match="idle_seconds must be"):
            create_app("postgresql://localhost/x", **kwargs)


async def test_a_readers_stream_hears_other_tenants_hints_but_sends_its_own_events_only(
        database_dsn, pg_server_dsn):
    """A zeroth_reader may not compute run keys, so its stream wakes on every hint of the
    shared listening connection: it still reads its own run only (row-level security)."""
    from roles import dsn_as, login_role

    conn = await asyncpg.connect(database_dsn)
    try:
        (mine,) = await _running(conn, 1, tenant_id="acme")
        (theirs,) = await _running(conn, 1, tenant_id="initech")
        with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
            await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
            app = create_app(dsn_as(database_dsn, name, password), stream_idle_seconds=3600)
            with served(app) as base:
                async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
                    hidden = await client.get(f"/runs/{theirs.run_id}/events")
                    async with open_stream(client, f"/runs/{mine.run_id}/events") as stream:
                        await stream.until("retry: ")
                        for text in ("secret-1", "secret-2"):
                            await conn.fetchval(
                                """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2,
                                       generation => $3, name => 'token', data => $4::text::jsonb,
                                       tenant_id => 'initech')""",
                                theirs.run_id, WORKER, theirs.generation, json.dumps(text))
                        await conn.fetchval(
                            """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2,
                                   generation => $3, name => 'token', data => '"ours"',
                                   tenant_id => 'acme')""", mine.run_id, WORKER, mine.generation)
                        await stream.until("id: 1\n")
                        await conn.fetchval(
                            """SELECT zeroth.complete_run(run_id => $1, worker_id => $2,
                                   generation => $3, tenant_id => 'acme')""",
                            mine.run_id, WORKER, mine.generation)
                        body = await stream.rest()
    finally:
        await conn.close()

    assert hidden.status_code == 404
    assert "secret" not in body
    assert [(m["id"], m["data"]) for m in _messages(body)] == [
        (1, "ours"), (2, {"status": "completed", "outcome": "completed"})]




class TestStalledReader:
    async def test_a_client_that_stops_reading_gives_its_stream_slot_back(self, database_dsn):
        """A hostile client asks for a long stream and never reads it (a tiny receive window,
        kept open): the server's sends block once the socket buffers are full. Its slot must come
        back anyway (a send pending for stream_idle_seconds ends the stream), or 32 such
        sockets from each of 8 addresses hold all 256 slots for as long as they stay open."""
        conn = await asyncpg.connect(database_dsn)
        sock = socket.socket()
        try:
            (lease,) = await _running(conn, 1)
            pad = json.dumps({"pad": "x" * 60000})
            for _ in range(200):  # 12 MB: more than every buffer between us and the socket
                assert await conn.fetchval(APPEND, lease.run_id, WORKER, lease.generation,
                                           pad) is not None
            app = create_app(database_dsn, stream_idle_seconds=2)
            streams = app.state.event_streams
            with served(app) as base:
                host = base.removeprefix("http://")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                loop = asyncio.get_running_loop()
                await loop.sock_connect(sock, ("127.0.0.1", int(host.split(":")[1])))
                await loop.sock_sendall(sock, (f"GET /runs/{lease.run_id}/events HTTP/1.1\r\n"
                                               f"Host: {host}\r\n\r\n").encode())
                try:
                    head = await asyncio.wait_for(loop.sock_recv(sock, 1024), WAIT)
                    assert head.startswith(b"HTTP/1.1 200")
                    # never read again, never close: only the server can give the slot back
                    await wait_until(lambda: streams.open_streams == 0,
                                     "the stalled stream's slot to come back", within=WAIT)
                finally:
                    sock.close()  # before the server stops: it waits for its connections
        finally:
            sock.close()
            await conn.close()
