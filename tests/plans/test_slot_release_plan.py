"""Ending an attempt frees its admission slot by the slot's address, whatever else holds slots.

zeroth._settle frees the slots of the runs it settled in a statement of its own (issue 30). A
session's cached generic plan for that UPDATE once reached the slots through
admission_slots_run_idx (every occupied slot of the database, any tenant) and filtered them by
address: a worker's fail_run read all 3,000 slots another tenant's worker held, per call (found by
an adversarial review; test_generic_plans_all grows free slots only, so it did not see it). Now
the statement has no condition a plan could serve from an index, only the addresses.

One session caches its plans (plan_cache_mode = force_generic_plan, autovacuum off for the two
tables, so no ANALYZE replaces the plans) on a small database, with the tables never analyzed or
analyzed while empty; another tenant's worker then holds 3,000 slots; the first session's next
failure (fail_run → zeroth._settle) reads a bounded number of slot tuples and blocks.
"""

from __future__ import annotations

import asyncpg
import pytest

OCCUPIED = 3000

#: The tuples the scans of admission_slots and its indexes returned, and the blocks they read, in
#: this transaction (pg_stat_get_xact_*: the index entries an index scan returned count as
#: tuples of the index).
SLOT_READS = """
    SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0)::bigint AS tuples,
           coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint AS blocks
      FROM pg_class c
     WHERE c.relnamespace = 'zeroth'::regnamespace
       AND c.relname IN ('admission_slots', 'admission_slots_run_idx', 'admission_slots_pkey')"""


async def fail_one_slotted_run(session: asyncpg.Connection) -> tuple[int, int]:
    """Enqueue, claim under a concurrency limit (a slot) and fail one run of tenant `mine`;
    the slot reads of the fail_run call alone."""
    await session.execute(
        "SELECT zeroth.enqueue_run(deployment_ref => 'mine', payload => '{}')")
    claimed = await session.fetchrow(
        """SELECT c.run_id, c.lease_generation FROM zeroth.claim_and_start(
               deployment_ref => 'mine', worker_id => 'me', max_concurrency => 3) c
            WHERE c.run_id IS NOT NULL""")
    async with session.transaction():
        before = await session.fetchrow(SLOT_READS)
        outcome = await session.fetchval(
            """SELECT zeroth.fail_run(run_id => $1, worker_id => 'me', generation => $2,
                                      error => '{"message": "x"}', retryable => false)""",
            claimed["run_id"], claimed["lease_generation"])
        after = await session.fetchrow(SLOT_READS)
    assert outcome == "failed"
    assert await session.fetchval(
        "SELECT count(*) FROM zeroth.admission_slots WHERE run_id = $1", claimed["run_id"]) == 0
    return after["tuples"] - before["tuples"], after["blocks"] - before["blocks"]


@pytest.mark.parametrize("analyzed_while_empty", [False, True],
                         ids=["never-analyzed", "analyzed-while-empty"])
async def test_freeing_a_slot_reads_its_own_slot_not_every_occupied_one(
        database_dsn: str, analyzed_while_empty: bool) -> None:
    admin = await asyncpg.connect(database_dsn)
    session = await asyncpg.connect(database_dsn)
    try:
        for table in ("zeroth.runs", "zeroth.admission_slots"):
            await admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            if analyzed_while_empty:
                await admin.execute(f"ANALYZE {table}")
        await session.execute("SET plan_cache_mode = force_generic_plan")
        small = [await fail_one_slotted_run(session) for _ in range(3)]

        # Another tenant's worker holds 3,000 slots.
        await admin.execute(
            """SELECT count(*) FROM zeroth.enqueue_runs(
                   deployment_ref => 'busy', tenant_id => 'other',
                   runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $1)))""",
            OCCUPIED)
        for _ in range(OCCUPIED // 1000):
            await admin.fetchval(
                """SELECT count(*) FROM zeroth.claim_and_start(
                       deployment_ref => 'busy', tenant_id => 'other', worker_id => 'them',
                       batch_size => 1000, max_concurrency => $1, lease_seconds => 3600)""",
                2 * OCCUPIED)
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.admission_slots WHERE run_id IS NOT NULL") == OCCUPIED

        tuples, blocks = await fail_one_slotted_run(session)
        # Small: 2-4 tuples, 10-11 blocks (the lock's probe of the run's slot and its address).
        # The walk read 3,002 tuples and up to 2,973 blocks.
        assert tuples <= 10, (tuples, blocks, small)
        assert blocks <= 40, (tuples, blocks, small)
    finally:
        await session.close()
        await admin.close()
