"""Rate limits against the roles the product keeps out, on a database exactly as shipped (no test
clock):

* a zeroth_worker can neither raise, lift nor delete a limit (zeroth.rate_limits, set_rate_limit),
  nor move its scope off the key (zeroth.scope_limits), nor write or truncate the log of starts
  (zeroth.rate_limit_starts) that the window is counted from; the limit holds against every
  claim it can make;
* a zeroth_reader sees the keys its own tenant's scopes use and nothing else, changes none and
  never sees the log, nor a key's last_start_at (a shared key's may be another tenant's);
* a role with no grant can do none of it;
* a DBA's manual UPDATE of the limit takes effect on the very next claim.
"""

from __future__ import annotations

import asyncpg
import pytest

WRITES = (
    "UPDATE zeroth.rate_limits SET max_starts = 1000000",
    "DELETE FROM zeroth.rate_limits",
    "INSERT INTO zeroth.rate_limits (name, max_starts, period_seconds) VALUES ('mine', 9, 1)",
    "TRUNCATE zeroth.rate_limits CASCADE",
    "SELECT zeroth.set_rate_limit(name => 'llm', max_starts => 1000000, period_seconds => 1)",
    "UPDATE zeroth.scope_limits SET rate_limit = NULL",
    "DELETE FROM zeroth.rate_limit_starts",
    "TRUNCATE zeroth.rate_limit_starts",
    "INSERT INTO zeroth.rate_limit_starts (name, started_at, starts) "
    "VALUES ('llm', now() - interval '1 year', 1)",
    "UPDATE zeroth.rate_limit_starts SET started_at = started_at - interval '1 hour'",
)

CLAIM_ONE = """SELECT run_id, retry_at FROM zeroth.claim_and_start(deployment_ref => 'd',
    worker_id => 'w', tenant_id => 'acme', batch_size => 100)"""
CLAIM_SCOPES = """SELECT run_id, retry_at FROM zeroth.claim_and_start_scopes(
    deployment_refs => ARRAY['d'], worker_id => 'w', batch_size => 100)"""
CLAIM_PENDING = """SELECT run_id, retry_at FROM zeroth.claim_pending(deployment_ref => 'd',
    worker_id => 'w', tenant_id => 'acme', batch_size => 100)"""


async def seed(admin: asyncpg.Connection, max_starts: int = 2) -> None:
    """acme's scope of 'd' draws from key llm (max_starts per hour); globex's from key other."""
    for tenant in ("acme", "globex"):
        for _ in range(5):
            await admin.execute(
                "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1)",
                tenant)
    await admin.execute("SELECT zeroth.set_rate_limit(name => 'llm', max_starts => $1, "
                        "period_seconds => 3600)", max_starts)
    await admin.execute("SELECT zeroth.set_rate_limit(name => 'other', max_starts => 1, "
                        "period_seconds => 3600)")
    await admin.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, rate_limit) "
                        "VALUES ('acme', 'd', 'llm'), ('globex', 'd', 'other')")


async def sqlstate(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def state(admin: asyncpg.Connection) -> list[tuple[object, ...]]:
    rows = await admin.fetch(
        "SELECT k.name, k.max_starts, k.period_seconds, "
        "       (SELECT coalesce(sum(s.starts), 0) FROM zeroth.rate_limit_starts s "
        "         WHERE s.name = k.name), "
        "       (SELECT array_agg(l.rate_limit ORDER BY l.tenant_id) FROM zeroth.scope_limits l) "
        "  FROM zeroth.rate_limits k ORDER BY k.name")
    return [tuple(r) for r in rows]


class TestWorker:
    @pytest.mark.parametrize("statement", ["SELECT * FROM zeroth.rate_limits",
                                           "SELECT * FROM zeroth.rate_limit_starts", *WRITES])
    async def test_cannot_read_or_change_a_limit_or_the_log(self, login, admin, statement):
        await seed(admin)
        worker = await login("worker")
        await worker.fetch(CLAIM_ONE)  # something in the log to tamper with
        before = await state(admin)
        assert await sqlstate(worker, statement) == "42501"
        assert await state(admin) == before

    async def test_the_limit_holds_against_every_claim_it_can_make(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        claimed = []
        for statement in (CLAIM_ONE, CLAIM_SCOPES, CLAIM_PENDING, CLAIM_ONE, CLAIM_SCOPES):
            claimed += [r["run_id"] for r in await worker.fetch(statement) if r["run_id"]]
        per_tenant = await admin.fetch(
            "SELECT tenant_id, count(*) AS n FROM zeroth.runs WHERE run_id = ANY ($1::uuid[]) "
            "GROUP BY tenant_id ORDER BY tenant_id", claimed)
        assert [tuple(r) for r in per_tenant] == [("acme", 2), ("globex", 1)]
        (held,) = await worker.fetch(CLAIM_ONE)
        assert held["run_id"] is None
        assert held["retry_at"] is not None


class TestReader:
    async def test_sees_only_the_keys_of_its_tenant_and_never_the_log(self, login, admin):
        await seed(admin)
        reader = await login("reader")
        assert await reader.fetchval("SELECT count(*) FROM zeroth.rate_limits") == 0
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        assert [r["name"] for r in await reader.fetch("SELECT name FROM zeroth.rate_limits")] == [
            "llm"]
        assert await sqlstate(reader, "SELECT * FROM zeroth.rate_limit_starts") == "42501"

    async def test_never_sees_when_another_tenant_last_started_under_a_shared_key(self, login,
                                                                              admin):
        # One key shared by two tenants' scopes (by design): each tenant's reader sees the key's
        # settings, and neither sees last_start_at, the time of the last claim under it, which
        # may be the other tenant's.
        await seed(admin)
        await admin.execute("UPDATE zeroth.scope_limits SET rate_limit = 'llm'")
        worker = await login("worker")
        globex_claim = CLAIM_ONE.replace("'acme'", "'globex'")
        assert [r["run_id"] for r in await worker.fetch(globex_claim) if r["run_id"]]
        assert await admin.fetchval(
            "SELECT last_start_at FROM zeroth.rate_limits WHERE name = 'llm'") is not None
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        rows = await reader.fetch(
            "SELECT name, max_starts, period_seconds, note FROM zeroth.rate_limits")
        assert [tuple(r) for r in rows] == [("llm", 2, 3600.0, None)]
        for statement in ("SELECT last_start_at FROM zeroth.rate_limits",
                          "SELECT * FROM zeroth.rate_limits",
                          "SELECT count(*) FROM zeroth.rate_limits "
                          "WHERE last_start_at > now() - interval '1 hour'",
                          "SELECT k FROM zeroth.rate_limits k"):
            assert await sqlstate(reader, statement) == "42501", statement

    @pytest.mark.parametrize("statement", WRITES)
    async def test_changes_nothing(self, login, admin, statement):
        await seed(admin)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        before = await state(admin)
        assert await sqlstate(reader, statement) == "42501"
        assert await state(admin) == before


class TestNoGrant:
    @pytest.mark.parametrize("statement", [CLAIM_ONE, "SELECT * FROM zeroth.rate_limits",
                                           "SELECT * FROM zeroth.rate_limit_starts", *WRITES])
    async def test_can_do_nothing(self, login, admin, statement):
        await seed(admin)
        nobody = await login("nobody")
        before = await state(admin)
        assert await sqlstate(nobody, statement) == "42501"
        assert await state(admin) == before


class TestDba:
    async def test_a_manual_update_takes_effect_on_the_next_claim(self, login, admin):
        await seed(admin, max_starts=1)
        worker = await login("worker")
        assert len([r for r in await worker.fetch(CLAIM_ONE) if r["run_id"]]) == 1
        (held,) = await worker.fetch(CLAIM_ONE)
        assert held["run_id"] is None
        await admin.execute("UPDATE zeroth.rate_limits SET max_starts = 3 WHERE name = 'llm'")
        assert len([r for r in await worker.fetch(CLAIM_ONE) if r["run_id"]]) == 2
        # Lifting the limit for the scope is a DBA's UPDATE too: the rest starts at once.
        await admin.execute("UPDATE zeroth.scope_limits SET rate_limit = NULL "
                            "WHERE tenant_id = 'acme'")
        assert len([r for r in await worker.fetch(CLAIM_ONE) if r["run_id"]]) == 2
