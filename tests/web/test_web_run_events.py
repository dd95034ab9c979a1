"""GET /runs/{run_id}/events: a run's event stream as server-sent events (issue 34, item 1) —
``id:`` the event number, Last-Event-ID resumption, END then the end of the response, 204 once
END was delivered, the Host check and token of every page, and a zeroth_reader DSN that sees its
tenant's runs only (and no function: it reads the tables under row-level security)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from helpers import WORKER, dashboard, make_run
from roles import dsn_as, login_role

from zeroth_pg.web import create_app


async def _finished_run_with_events(conn: asyncpg.Connection, texts: list[str], *,
                                    tenant_id: str | None = None) -> UUID:
    now: datetime = await conn.fetchval("SELECT clock_timestamp()")
    lease = await make_run(conn, "running", now=now, tenant_id=tenant_id, lease_seconds=600)
    for text in texts:
        assert await conn.fetchval(
            """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2, generation => $3,
                   name => 'token', data => $4::text::jsonb, tenant_id => $5)""",
            lease.run_id, WORKER, lease.generation, json.dumps({"t": text}), tenant_id)
    assert await conn.fetchval(
        """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
               tenant_id => $4)""", lease.run_id, WORKER, lease.generation, tenant_id)
    return lease.run_id


def _messages(body: str) -> list[dict[str, Any]]:
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append({"id": int(fields["id"]), "event": fields["event"],
                        "data": json.loads(fields["data"])})
    return out


class TestServerSentEvents:
    async def test_streams_every_event_then_end_and_resumes_from_last_event_id(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            run_id = await _finished_run_with_events(conn, ["he", "llo", "<script>"])
            with dashboard(create_app(database_dsn)) as client:
                whole = client.get(f"/runs/{run_id}/events")
                resumed = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "2"})
                by_query = client.get(f"/runs/{run_id}/events?after=3")
                done = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "4"})
                bad = client.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": "x"})
                unknown = client.get("/runs/00000000-0000-0000-0000-000000000000/events")
        finally:
            await conn.close()

        assert whole.status_code == 200
        assert whole.headers["content-type"].startswith("text/event-stream")
        assert _messages(whole.text) == [
            {"id": 1, "event": "token", "data": {"t": "he"}},
            {"id": 2, "event": "token", "data": {"t": "llo"}},
            {"id": 3, "event": "token", "data": {"t": "<script>"}},
            {"id": 4, "event": "end", "data": {"status": "completed", "outcome": "completed"}}]
        assert [m["id"] for m in _messages(resumed.text)] == [3, 4]
        assert [m["id"] for m in _messages(by_query.text)] == [4]
        assert done.status_code == 204
        assert bad.status_code == 400
        assert unknown.status_code == 404

    async def test_a_run_that_emitted_nothing_streams_end(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            lease = await make_run(conn, "cancelled",
                                   now=await conn.fetchval("SELECT clock_timestamp()"))
            with dashboard(create_app(database_dsn)) as client:
                response = client.get(f"/runs/{lease.run_id}/events")
        finally:
            await conn.close()

        assert _messages(response.text) == [
            {"id": 1, "event": "end", "data": {"status": "cancelled", "outcome": "cancelled"}}]

    async def test_the_token_and_host_checks_apply(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            run_id = await _finished_run_with_events(conn, ["a"])
            app = create_app(database_dsn, token="s3cret")
            with dashboard(app) as client:
                without = client.get(f"/runs/{run_id}/events")
                foreign = client.get(f"/runs/{run_id}/events?token=s3cret",
                                     headers={"Host": "evil.example"})
                with_token = client.get(f"/runs/{run_id}/events?token=s3cret")
        finally:
            await conn.close()

        assert without.status_code in (401, 403)
        assert foreign.status_code == 421
        assert [m["id"] for m in _messages(with_token.text)] == [1, 2]

    async def test_a_reader_streams_its_tenants_runs_only(self, database_dsn, pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            mine = await _finished_run_with_events(conn, ["ours"], tenant_id="acme")
            theirs = await _finished_run_with_events(conn, ["secret"], tenant_id="initech")
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                reader = dsn_as(database_dsn, name, password)
                with dashboard(create_app(reader)) as client:
                    ours = client.get(f"/runs/{mine}/events")
                    hidden = client.get(f"/runs/{theirs}/events")
        finally:
            await conn.close()

        assert [(m["event"], m["data"]) for m in _messages(ours.text)] == [
            ("token", {"t": "ours"}), ("end", {"status": "completed", "outcome": "completed"})]
        assert hidden.status_code == 404
        assert "secret" not in hidden.text
