"""A claim reads a handful of buffers, however many finished runs the table holds.

A behavioural bound, not a timing: EXPLAIN (ANALYZE, BUFFERS) counts the shared buffers (hit or
read) one claim touches. With 100,000 finished runs beside 1,000 pending ones the candidates
query of claim_pending, a whole claim_pending call, and the orphan scan each stay under 100
buffers, and the count does not grow when the finished runs are added.

Volume: pending and running runs through the API; the finished rows, which exist only to be
skipped, are one set-based INSERT shaped like what complete_run / fail_run leave (the only
direct write to zeroth.runs), followed by VACUUM ANALYZE, the steady state autovacuum keeps.
Every measured claim runs in a transaction that is rolled back.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

FINISHED = 100_000
PENDING = 1_000
RUNNING = 40
DEPLOYMENT = "d"
BOUND = 100

PENDING_CANDIDATES = """
    WITH candidates AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = 'default'
           AND r.workspace_key = ''
           AND r.deployment_ref = 'd'
           AND r.status = 'pending'
           AND r.run_after <= $1
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < $1)
         ORDER BY r.priority DESC, r.run_after, r.created_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED
    )
    SELECT c.run_id FROM candidates c"""

ORPHAN_CANDIDATES = """
    WITH candidates AS MATERIALIZED (
        SELECT r.tenant_id, r.workspace_key, r.run_id
          FROM zeroth.runs r
         WHERE r.tenant_id = 'default'
           AND r.workspace_key = ''
           AND r.deployment_ref = 'd'
           AND r.status = 'running'
           AND r.lease_expires_at < $1
         ORDER BY r.lease_expires_at, r.started_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED
    )
    SELECT c.run_id FROM candidates c"""

CLAIM_PENDING = """SELECT * FROM zeroth.claim_pending(deployment_ref => 'd', worker_id => 'w',
                       batch_size => $1, max_concurrency => $2)"""
CLAIM_ORPHANED = """SELECT * FROM zeroth.claim_orphaned(deployment_ref => 'd', worker_id => 'w',
                        claim_limit => $1, max_concurrency => $2)"""


async def add_live_work(connection: asyncpg.Connection) -> None:
    """1k pending and 40 running runs (20 with expired leases) in deployment d, via the API."""
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
    await connection.execute("VACUUM ANALYZE zeroth.runs")


async def add_finished(connection: asyncpg.Connection) -> None:
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
    await connection.execute("VACUUM ANALYZE zeroth.runs")
    assert await connection.fetchval(
        "SELECT count(*) FROM zeroth.runs r WHERE r.status IN ('completed', 'failed')") == FINISHED


async def buffers(connection: asyncpg.Connection, statement: str, *args: Any) -> int:
    """Shared buffers (hit + read) the execution of ``statement`` touched, planning excluded.
    Runs in a transaction that is rolled back, so the claim it makes is undone."""
    transaction = connection.transaction()
    await transaction.start()
    try:
        raw = await connection.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {statement}", *args)
    finally:
        await transaction.rollback()
    plan = json.loads(raw)[0]["Plan"]
    assert plan["Actual Rows"] >= 1
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


async def claim_costs(connection: asyncpg.Connection) -> dict[tuple[str, int], int]:
    """Buffers per (statement, runs claimed)."""
    now = await connection.fetchval("SELECT clock_timestamp()")
    # Warm this session's plan cache, so the function calls measure claiming, not planning.
    for statement in (CLAIM_PENDING, CLAIM_ORPHANED):
        for limit in (1, 10):
            await buffers(connection, statement, limit, None)
            await buffers(connection, statement, limit, 5)
    return {
        ("pending candidates", 1): await buffers(connection, PENDING_CANDIDATES, now, 1),
        ("pending candidates", 10): await buffers(connection, PENDING_CANDIDATES, now, 10),
        ("orphan candidates", 1): await buffers(connection, ORPHAN_CANDIDATES, now, 1),
        ("orphan candidates", 10): await buffers(connection, ORPHAN_CANDIDATES, now, 10),
        ("claim_pending", 1): await buffers(connection, CLAIM_PENDING, 1, None),
        ("claim_pending, max_concurrency 5", 1): await buffers(connection, CLAIM_PENDING, 1, 5),
        ("claim_pending", 10): await buffers(connection, CLAIM_PENDING, 10, None),
        ("claim_orphaned", 1): await buffers(connection, CLAIM_ORPHANED, 1, None),
        ("claim_orphaned, max_concurrency 5", 1): await buffers(connection, CLAIM_ORPHANED, 1, 5),
        ("claim_orphaned", 10): await buffers(connection, CLAIM_ORPHANED, 10, None),
    }


class TestClaimCostWithManyFinishedRuns:
    async def test_claims_touch_few_buffers_and_finished_runs_add_almost_none(
            self, connect: Any) -> None:
        connection = await connect()
        await add_live_work(connection)
        small = await claim_costs(connection)
        await add_finished(connection)
        large = await claim_costs(connection)

        # Claiming one run — the candidates query, or a whole claim_pending / claim_orphaned
        # call with its UPDATEs, slot and checkpoint lookups — stays under 100 buffers.
        assert {key: cost for key, cost in large.items() if key[1] == 1 and cost >= BOUND} == {}
        # A batch costs a bounded amount per claimed run (heap page, index entries, checkpoint
        # lookup, and the attempt history: nothing for a claim from no holder, one INSERT through
        # run_attempts_run_idx for a claim that ends another attempt, an orphan's): under 20
        # buffers a run.
        assert {key: cost for key, cost in large.items()
                if key[1] > 1 and cost >= 20 * key[1]} == {}, large
        # The candidates queries read exactly as much with 100,000 finished runs as without.
        assert {key: (small[key], cost) for key, cost in large.items()
                if "candidates" in key[0] and cost > small[key] + 2} == {}, (small, large)
        # Whole calls may pay one more btree level per index entry they write, nothing more.
        assert {key: (small[key], cost) for key, cost in large.items()
                if cost > small[key] + 5 + 3 * key[1]} == {}, (small, large)
