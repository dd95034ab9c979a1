"""enqueue_run / enqueue_runs read a deployment's registered defaults (zeroth.deployments) with one
primary-key lookup, also from a generic plan cached while the registry was small: a session with
plan_cache_mode = force_generic_plan and autovacuum off for the registry (an ANALYZE would
invalidate the cached plans) enqueues on a one-row registry, another session then registers
20,000 deployments (one set-based INSERT, the only direct write), and the first session's next
enqueue reads one index entry and no table tuple of a sequential scan
(pg_stat_get_xact_tuples_returned / blocks_fetched of the table and its indexes, as
test_generic_plans_all.py counts them). The lookup's own statement, prepared and explained with
a generic plan, is an Index Scan using deployments_pkey."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

GROWN = 20_000
LOOKUP = """SELECT d.priority, d.max_attempts FROM zeroth.deployments d
             WHERE d.deployment_ref = $1"""
COUNTERS = """SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) AS tuples,
                     pg_stat_get_xact_blocks_fetched(c.oid) AS blocks
                FROM pg_class c
               WHERE c.oid = 'zeroth.deployments'::regclass
                  OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                WHERE i.indrelid = 'zeroth.deployments'::regclass)"""


@pytest.fixture
async def session(database_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    admin = await asyncpg.connect(database_dsn)
    await admin.execute("ALTER TABLE zeroth.deployments SET (autovacuum_enabled = false)")
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn
    finally:
        await conn.close()
        await admin.execute("ALTER TABLE zeroth.deployments RESET (autovacuum_enabled)")
        await admin.execute("DELETE FROM zeroth.runs WHERE deployment_ref = 'plan-d'")
        await admin.execute("DELETE FROM zeroth.deployment_changes WHERE deployment_ref = 'plan-d'")
        await admin.execute("DELETE FROM zeroth.deployments "
                            "WHERE deployment_ref = 'plan-d' OR deployment_ref LIKE 'grown-%'")
        await admin.close()


async def read(conn: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    return {r["relname"]: (r["tuples"], r["blocks"]) for r in await conn.fetch(COUNTERS)}


async def measured(conn: asyncpg.Connection, query: str,
                   *args: object) -> dict[str, tuple[int, int]]:
    async with conn.transaction():
        before = await read(conn)
        await conn.fetch(query, *args)
        after = await read(conn)
    return {name: (after[name][0] - before[name][0], after[name][1] - before[name][1])
            for name in after}


ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)"
ENQUEUE_MANY = "SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::jsonb)"


async def test_the_enqueue_lookup_stays_one_primary_key_probe_after_the_registry_grew(
        session: asyncpg.Connection, database_dsn: str) -> None:
    await session.execute("SELECT zeroth.register_deployment(deployment_ref => 'plan-d', "
                          "max_attempts => 6, priority => 2)")
    for _ in range(3):  # planned on the one-row registry, the generic plan cached
        await session.fetch(ENQUEUE, "plan-d")
        await session.fetch(ENQUEUE_MANY, "plan-d", json.dumps([{}, {}]))
    other = await asyncpg.connect(database_dsn)
    try:
        await other.execute(
            """INSERT INTO zeroth.deployments (deployment_ref, max_attempts, priority, managed_by,
                                               created_at, updated_at, updated_by)
               SELECT 'grown-' || g, 3, 0, 'sql', now(), now(), 'test'
                 FROM generate_series(1, $1) AS g""", GROWN)
    finally:
        await other.close()

    for query, args in ((ENQUEUE, ("plan-d",)), (ENQUEUE_MANY, ("plan-d", json.dumps([{}] * 5)))):
        reading = await measured(session, query, *args)
        assert reading["deployments"][0] == 0, reading  # no tuple from a sequential scan
        assert reading["deployments_pkey"][0] <= 2, reading  # the one entry (and a dead version)
        assert max(blocks for _, blocks in reading.values()) <= 4, reading
    run = await session.fetchrow("SELECT max_attempts, priority FROM zeroth.runs "
                                 "WHERE deployment_ref = 'plan-d' ORDER BY created_at DESC LIMIT 1")
    assert tuple(run) == (6, 2)


async def test_the_lookup_statement_is_a_primary_key_index_scan_in_a_generic_plan(
        session: asyncpg.Connection) -> None:
    await session.execute(f"PREPARE registry_lookup(text) AS {LOOKUP}")
    plan = "\n".join(r[0] for r in await session.fetch("EXPLAIN EXECUTE registry_lookup('x')"))
    assert "Index Scan using deployments_pkey on deployments" in plan, plan
    assert "Seq Scan" not in plan, plan


CLAIM = """SELECT * FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'w',
    tenant_id => 't')"""
CLAIM_SCOPES = """SELECT * FROM zeroth.claim_and_start_scopes(deployment_refs => ARRAY[$1],
    worker_id => 'w', batch_size => 2)"""


async def test_the_claims_lease_lookup_stays_one_primary_key_probe_after_the_registry_grew(
        session: asyncpg.Connection, database_dsn: str) -> None:
    """A claim that names no lease reads the deployment's registered lease_seconds (migration
    0020): one primary-key probe per deployment claimed, also from a generic plan cached while
    the registry was small."""
    await session.execute("SELECT zeroth.register_deployment(deployment_ref => 'plan-d', "
                          "lease_seconds => 321)")
    for _ in range(3):  # planned on the one-row registry, the generic plans cached
        await session.fetch(CLAIM, "plan-d")
        await session.fetch(CLAIM_SCOPES, "plan-d")
    other = await asyncpg.connect(database_dsn)
    try:
        await other.execute(
            """INSERT INTO zeroth.deployments (deployment_ref, max_attempts, priority, managed_by,
                                               created_at, updated_at, updated_by,
                                               lease_seconds)
               SELECT 'grown-' || g, 3, 0, 'sql', now(), now(), 'test', 30
                 FROM generate_series(1, $1) AS g""", GROWN)
    finally:
        await other.close()
    for query in (CLAIM, CLAIM_SCOPES):
        await session.execute("SELECT zeroth.enqueue_run(deployment_ref => 'plan-d', "
                              "tenant_id => 't')")
        reading = await measured(session, query, "plan-d")
        assert reading["deployments"][0] == 0, reading  # no tuple from a sequential scan
        assert reading["deployments_pkey"][0] <= 2, reading
        assert max(blocks for _, blocks in reading.values()) <= 4, reading
    leases = await session.fetch("SELECT lease_expires_at - lease_acquired_at AS lease "
                                 "FROM zeroth.runs WHERE deployment_ref = 'plan-d'")
    assert [r["lease"].total_seconds() for r in leases] == [321, 321]
