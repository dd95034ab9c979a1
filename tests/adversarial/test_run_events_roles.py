"""Run event streams against the roles the product keeps out, on a database exactly as shipped
(no test clock; issue 34, item 1):

* a role with no grant can call none of append_run_event, read_run_events, run_events_key and
  read no run_events row (42501), and changes nothing;
* a zeroth_reader can call none of them either (42501), and reads run_events directly only for
  the tenant named in zeroth.tenant_id (nothing while unset);
* a zeroth_worker appends only as the live holder: another worker id, another tenant, an older
  generation after a takeover, its own lease expired on the real clock append nothing; another
  tenant reads the victim's run as not found, and its stream ends at once.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from held_runs import CLAIM, ENQUEUE, ORPHANED, lapse

APPEND = """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2, generation => $3,
                name => 'token', data => '"evil"', tenant_id => $4)"""
READ = """SELECT event_id, kind, data::text AS data FROM zeroth.read_run_events(run_id => $1,
              tenant_id => $2)"""


async def events(admin: asyncpg.Connection, run_id: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await admin.fetch(
        "SELECT e.* FROM zeroth.run_events e WHERE e.run_id = $1 ORDER BY e.event_id", run_id)]


async def held_run(admin: asyncpg.Connection, worker: asyncpg.Connection, *,
                   tenant: str = "acme", worker_id: str = "w1",
                   lease_seconds: float = 60) -> tuple[Any, int]:
    run_id = await admin.fetchval(ENQUEUE, tenant)
    (row,) = await worker.fetch(CLAIM, worker_id, tenant, lease_seconds)
    assert row["run_id"] == run_id
    assert await worker.fetchval(APPEND, run_id, worker_id, row["lease_generation"], tenant) == 1
    return run_id, row["lease_generation"]


async def refused(conn: asyncpg.Connection, query: str, *args: Any) -> str | None:
    try:
        await conn.fetch(query, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


class TestNoGrantAndReader:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_calls_none_of_the_stream_functions(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        before = await events(admin, run_id)
        stranger = await login(kind)

        assert await refused(stranger, APPEND, run_id, "w1", generation, "acme") == "42501"
        assert await refused(stranger, READ, run_id, "acme") == "42501"
        assert await refused(stranger, "SELECT zeroth.run_events_key($1, 'acme')",
                             run_id) == "42501"
        assert await events(admin, run_id) == before

    async def test_nobody_reads_no_event_row(self, login, admin):
        worker = await login("worker")
        await held_run(admin, worker)
        nobody = await login("nobody")

        assert await refused(nobody, "SELECT * FROM zeroth.run_events") == "42501"

    async def test_a_reader_reads_its_tenants_events_only(self, login, admin):
        worker = await login("worker")
        mine, _ = await held_run(admin, worker, tenant="acme")
        theirs, _ = await held_run(admin, worker, tenant="globex")
        reader = await login("reader")

        unset = await reader.fetchval("SELECT count(*) FROM zeroth.run_events")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        seen = {r["run_id"] for r in await reader.fetch("SELECT run_id FROM zeroth.run_events")}

        assert unset == 0
        assert seen == {mine}
        assert theirs not in seen
        assert await refused(reader, "INSERT INTO zeroth.run_events SELECT * FROM "
                             "zeroth.run_events") == "42501"


class TestAWorkerThatIsNotTheLiveHolder:
    async def test_another_worker_id_or_tenant_appends_nothing(self, login, admin):
        victim_worker = await login("worker")
        run_id, generation = await held_run(admin, victim_worker)
        before = await events(admin, run_id)
        attacker = await login("worker")

        assert await attacker.fetchval(APPEND, run_id, "w2", generation, "acme") is None
        assert await attacker.fetchval(APPEND, run_id, "w1", generation, "globex") is None
        assert await events(admin, run_id) == before

    async def test_another_tenant_reads_the_run_as_not_found(self, login, admin):
        victim_worker = await login("worker")
        run_id, _ = await held_run(admin, victim_worker)
        attacker = await login("worker")

        rows = await attacker.fetch(READ, run_id, "globex")

        assert [(r["kind"], json.loads(r["data"])) for r in rows] == [
            ("end", {"status": None, "outcome": "not_found"})]

    async def test_an_old_holder_after_a_takeover_and_an_expired_lease_append_nothing(
            self, login, admin):
        worker = await login("worker")
        run_id, old = await held_run(admin, worker)  # its append while the lease lived: event 1
        # The lease lapses on the real clock; the holder's append is refused even before anyone
        # takes the run.
        await lapse(admin, worker, run_id, old)
        assert await worker.fetchval(APPEND, run_id, "w1", old, "acme") is None
        (taken,) = await worker.fetch(ORPHANED, "w2", "acme")
        assert taken["run_id"] == run_id

        assert await worker.fetchval(APPEND, run_id, "w1", old, "acme") is None
        assert await worker.fetchval(APPEND, run_id, "w2", taken["lease_generation"],
                                     "acme") is not None
        rows = await events(admin, run_id)
        assert {r[6] for r in rows} == {'"evil"'}
        # The events numbered without a gap, each by the generation that held the lease.
        assert [r[3] for r in rows] == list(range(1, len(rows) + 1))
        assert rows[-1][7] == taken["lease_generation"]
        assert {r[7] for r in rows[:-1]} == {old}
