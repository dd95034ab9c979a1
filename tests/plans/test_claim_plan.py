"""The claim queries reach work through their partial indexes, never a scan of runs.

Volume: 100,000 finished runs (completed and failed) sit in the same scope as 1,000 pending runs
and 40 running runs (half of them orphaned). The 1,000 pending and 40 running runs are made
through the API; the 100,000 finished rows exist only to be skipped, so they are written with
one set-based INSERT in the shape complete_run / fail_run leave behind (the only direct write to
zeroth.runs, to build volume fast). Then VACUUM ANALYZE, the steady state autovacuum keeps.

Checked three ways: EXPLAIN of the candidates queries copied from claim_pending / claim_orphaned
(sql/functions/internal/claims.sql) with literal values; the same queries as a generic plan
(parameters, as PL/pgSQL may cache them); and the real function calls, by the scan counters of
their own transaction (pg_stat_xact_*), across enough calls for PL/pgSQL to switch plans.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from zeroth_pg import migrate
from zeroth_pg.migrate import with_database

#: Under xdist the module's tests all run in one worker, which builds the volume (a module-scoped
#: fixture, about 10 s of the server's CPU) once: spread over the workers, each built its own (five
#: times in a 6-worker run).
pytestmark = pytest.mark.xdist_group("claim-plan-volume")

FINISHED = 100_000
PENDING = 1_000
RUNNING = 40
DEPLOYMENT = "d"

PENDING_CANDIDATES = """
    WITH candidates AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = {tenant}
           AND r.workspace_key = {wskey}
           AND r.deployment_ref = {deployment}
           AND r.status = 'pending'
           AND r.run_after <= {now}
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < {now})
         ORDER BY r.priority DESC, r.run_after, r.created_at
         LIMIT {limit}
           FOR UPDATE SKIP LOCKED
    )
    SELECT c.run_id FROM candidates c"""

ORPHAN_CANDIDATES = """
    WITH candidates AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = {tenant}
           AND r.workspace_key = {wskey}
           AND r.deployment_ref = {deployment}
           AND r.status = 'running'
           AND r.lease_expires_at < {now}
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT {limit}
           FOR UPDATE SKIP LOCKED
    )
    SELECT c.run_id FROM candidates c"""

CLAIM_PENDING = """SELECT * FROM zeroth.claim_pending(deployment_ref => 'd', worker_id => 'w',
                       batch_size => $1)"""
CLAIM_ORPHANED = """SELECT * FROM zeroth.claim_orphaned(deployment_ref => 'd', worker_id => 'w',
                        claim_limit => $1)"""

SCANS = """SELECT pg_stat_get_xact_numscans('zeroth.runs'::regclass) AS seq_scan,
                 pg_stat_get_xact_numscans($1::regclass) AS index_scans"""

CASES = {
    "pending": (PENDING_CANDIDATES, "runs_claim_pending_idx", CLAIM_PENDING),
    "orphaned": (ORPHAN_CANDIDATES, "runs_running_idx", CLAIM_ORPHANED),
}


async def build_volume(connection: asyncpg.Connection) -> None:
    """100k finished + 1k pending + 40 running (20 with expired leases) runs in deployment d."""
    await connection.execute(
        """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, status,
                                    run_after, attempts, created_at, updated_at, started_at,
                                    finished_at, output, error, lease_generation)
           SELECT gen_random_uuid(), 'default', NULL, $1,
                  CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END::zeroth.run_status,
                  t, 1, t, t + interval '2 s', t + interval '1 s', t + interval '2 s',
                  CASE WHEN g % 10 = 0 THEN NULL ELSE '{"ok": true}'::jsonb END,
                  CASE WHEN g % 10 = 0 THEN '{"reason": "boom"}'::jsonb END, 1
             FROM generate_series(1, $2) AS g,
                  LATERAL (SELECT clock_timestamp() - interval '30 days'
                                  + g * interval '10 ms' AS t) AS s""",
        DEPLOYMENT, FINISHED)
    await connection.fetch(
        "SELECT 1 FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        DEPLOYMENT,
        json.dumps([{"priority": n % 3, "payload": {"n": n}} for n in range(PENDING + RUNNING)]))
    rows = await connection.fetch(
        """SELECT c.run_id, c.lease_generation FROM zeroth.claim_pending(deployment_ref => $1,
               worker_id => 'crashed', batch_size => $2, lease_seconds => 600) c""",
        DEPLOYMENT, RUNNING)
    for i, row in enumerate(rows):
        fence = (row["run_id"], "crashed", row["lease_generation"])
        assert await connection.fetchval(
            "SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3)", *fence)
        if i % 2:
            assert await connection.fetchval(
                """SELECT zeroth.expire_recovery_lease(run_id => $1, worker_id => $2,
                       generation => $3)""", *fence)
    counts = dict(await connection.fetch(
        "SELECT r.status::text, count(*) FROM zeroth.runs r GROUP BY r.status"))
    assert counts == {"completed": FINISHED * 9 // 10, "failed": FINISHED // 10,
                      "pending": PENDING, "running": RUNNING}
    await connection.execute("VACUUM ANALYZE zeroth.runs")


@pytest.fixture(scope="module")
async def volume_dsn(pg_server_dsn: str) -> AsyncIterator[str]:
    """One migrated database with the volume, shared by this module's read-only tests (every
    call that writes is rolled back), dropped at the end."""
    name = f"plans_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = with_database(pg_server_dsn, name)
        try:
            await asyncio.to_thread(migrate.upgrade, dsn)
            connection = await asyncpg.connect(dsn)
            try:
                await build_volume(connection)
            finally:
                await connection.close()
            yield dsn
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def volume(volume_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(volume_dsn)
    try:
        yield connection
    finally:
        await connection.close()


def literal(query: str, now: datetime, limit: int) -> str:
    return query.format(tenant="'default'", wskey="''", deployment=f"'{DEPLOYMENT}'",
                        now=f"'{now.isoformat()}'::timestamptz", limit=limit)


def parameterised(query: str) -> str:
    return query.format(tenant="$1", wskey="$2", deployment="$3", now="$4", limit="$5")


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [node]
    for child in node.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def runs_access(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(node type, index name) of every node that reads zeroth.runs or one of its indexes."""
    index_names = {"runs_claim_pending_idx", "runs_running_idx", "runs_pkey",
                   "runs_idempotency_key_idx", "runs_dead_letter_idx"}
    return [(node["Node Type"], node.get("Index Name"))
            for node in plan_nodes(plan)
            if node.get("Relation Name") == "runs" or node.get("Index Name") in index_names]


async def explain(connection: asyncpg.Connection, statement: str, *args: Any) -> dict[str, Any]:
    raw = await connection.fetchval(f"EXPLAIN (FORMAT JSON) {statement}", *args)
    return json.loads(raw)[0]["Plan"]  # type: ignore[no-any-return]


class TestCandidatesPlanWithLiterals:
    @pytest.mark.parametrize("case", ["pending", "orphaned"])
    @pytest.mark.parametrize("limit", [1, 100])
    async def test_candidates_query_reads_runs_only_through_its_partial_index(
            self, volume: asyncpg.Connection, case: str, limit: int) -> None:
        query, index, _ = CASES[case]
        now = await volume.fetchval("SELECT clock_timestamp()")
        access = runs_access(await explain(volume, literal(query, now, limit)))
        assert access, "the plan does not read zeroth.runs at all"
        assert all(node_type != "Seq Scan" for node_type, _ in access), access
        assert {name for _, name in access} == {index}, access
        if case == "pending":
            # An ordered walk of the claim index: the LIMIT stops it after the claimed rows.
            assert access == [("Index Scan", index)], access

    async def test_plans_still_use_the_indexes_when_the_scope_is_empty(
            self, volume: asyncpg.Connection) -> None:
        now = await volume.fetchval("SELECT clock_timestamp()")
        for query, index, _ in CASES.values():
            text = literal(query, now, 1).replace(f"'{DEPLOYMENT}'", "'no-such-deployment'")
            access = runs_access(await explain(volume, text))
            assert {name for _, name in access} == {index}, access
            assert all(node_type != "Seq Scan" for node_type, _ in access), access


class TestCandidatesGenericPlan:
    @pytest.mark.parametrize("case", ["pending", "orphaned"])
    async def test_generic_plan_reads_runs_only_through_its_partial_index(
            self, volume: asyncpg.Connection, case: str) -> None:
        query, index, _ = CASES[case]
        async with volume.transaction():
            await volume.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            now = await volume.fetchval("SELECT clock_timestamp()")
            plan = await explain(volume, parameterised(query), "default", "", DEPLOYMENT, now, 1)
        access = runs_access(plan)
        assert access
        assert all(node_type != "Seq Scan" for node_type, _ in access), access
        assert {name for _, name in access} == {index}, access


class TestRealCallsScanCounters:
    @pytest.mark.parametrize("case", ["pending", "orphaned"])
    async def test_every_call_reaches_runs_through_indexes_never_a_seq_scan(
            self, volume: asyncpg.Connection, case: str) -> None:
        _, index, call = CASES[case]
        # Eight calls in one session: PL/pgSQL plans the first five custom and may then switch
        # to a cached generic plan; both must stay on the index. Each call is rolled back so
        # every call sees the same table.
        for attempt in range(8):
            transaction = volume.transaction()
            await transaction.start()
            try:
                # The xact counters also hold this backend's not yet flushed earlier work, and
                # nothing is flushed inside a transaction block: compare before and after.
                before = await volume.fetchrow(SCANS, f"zeroth.{index}")
                rows = await volume.fetch(call, 1)
                assert [row["run_id"] is not None for row in rows] == [True], attempt
                after = await volume.fetchrow(SCANS, f"zeroth.{index}")
            finally:
                await transaction.rollback()
            assert after["seq_scan"] == before["seq_scan"], (attempt, dict(before), dict(after))
            assert after["index_scans"] > before["index_scans"], (attempt, dict(after))
