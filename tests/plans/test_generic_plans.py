"""A plan cached while the table was small still reaches runs by primary key once it is large.

PL/pgSQL prepares every statement once per session and may keep a generic plan for it. A worker
session starts on an empty or small table, and the table then grows by every finished run while
the session lives. Under continuous load (issue 13) the batch UPDATEs of complete_runs,
renew_leases and the claim joined zeroth.runs to their locked rows by a filter: each run of a
batch walked the whole scope (auto_explain showed 10,239 rows removed by filter, 32 times per
call), the worker fell behind a steady producer, and pickup latency went from milliseconds to
seconds. Every batch UPDATE now also names its rows with `run_id = ANY (<array>)`, which the
planner turns into a primary-key probe whatever it believed about the table's size.

The test makes the worst case deterministic: one session with plan_cache_mode =
force_generic_plan and autovacuum off for zeroth.runs (an ANALYZE would invalidate the cached
plans and hide the bug) calls every batch function on a nearly empty table, then another session
adds 30,000 finished runs to the same scope (the one direct write to zeroth.runs, shaped like what
complete_runs leaves) and the first session works one more batch. The bound is behavioural, not
a timing: the tuples the batch reads from zeroth.runs (pg_stat_get_xact_tuples_fetched and
of its indexes, this transaction only) stay proportional to the batch, far below the scope's size.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

FINISHED = 30_000
BATCH = 32
DEPLOYMENT = "d"
# Per run of the batch: the claim index walk, the row lock, the UPDATE, the slot bookkeeping and
# the thread checks touch a few tuples each; a scope walk touches FINISHED per run.
TUPLES_PER_RUN = 12

# Tuples read from zeroth.runs by sequential scans plus entries read from each of its indexes.
READ = """SELECT pg_stat_get_xact_tuples_returned('zeroth.runs'::regclass)
                 + (SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))::bigint
                      FROM pg_index i WHERE i.indrelid = 'zeroth.runs'::regclass)"""


@pytest.fixture
async def worker_session(database_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    admin = await asyncpg.connect(database_dsn)
    try:
        await admin.execute("ALTER TABLE zeroth.runs SET (autovacuum_enabled = false)")
    finally:
        await admin.close()
    session = await asyncpg.connect(database_dsn)
    try:
        await session.execute("SET plan_cache_mode = force_generic_plan")
        yield session
    finally:
        await session.close()


async def enqueue(session: asyncpg.Connection, count: int) -> None:
    await session.execute(
        "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        DEPLOYMENT, json.dumps([{"payload": {"n": n}} for n in range(count)]))


async def work_one_batch(session: asyncpg.Connection,
                         max_concurrency: int | None) -> dict[str, int]:
    """Claim, renew and complete one batch; the tuples of zeroth.runs each call read."""
    await enqueue(session, BATCH)
    read: dict[str, int] = {}
    async with session.transaction():
        before = await session.fetchval(READ)
        claimed = await session.fetch(
            """SELECT c.run_id, c.lease_generation FROM zeroth.claim_and_start(
                   deployment_ref => $1, worker_id => 'w', batch_size => $2,
                   max_concurrency => $3, lease_seconds => 60) c""",
            DEPLOYMENT, BATCH, max_concurrency)
        read["claim_and_start"] = await session.fetchval(READ) - before
    assert len(claimed) == BATCH
    run_ids = [row["run_id"] for row in claimed]
    generations = [row["lease_generation"] for row in claimed]
    async with session.transaction():
        before = await session.fetchval(READ)
        renewed = await session.fetch(
            """SELECT * FROM zeroth.renew_leases(worker_id => 'w', run_ids => $1,
                   generations => $2, lease_seconds => 60)""", run_ids, generations)
        read["renew_leases"] = await session.fetchval(READ) - before
    assert len(renewed) == BATCH
    async with session.transaction():
        before = await session.fetchval(READ)
        for run_id, generation in zip(run_ids[:4], generations[:4], strict=True):
            assert await session.fetchval(
                """SELECT zeroth.renew_lease(run_id => $1, worker_id => 'w', generation => $2,
                       lease_seconds => 60)""", run_id, generation)
        read["renew_lease"] = (await session.fetchval(READ) - before) * BATCH // 4
    async with session.transaction():
        before = await session.fetchval(READ)
        completed = await session.fetch(
            """SELECT * FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1,
                   generations => $2)""", run_ids, generations)
        read["complete_runs"] = await session.fetchval(READ) - before
    assert [row["completed"] for row in completed] == [True] * BATCH
    return read


async def grow_scope(dsn: str) -> None:
    """FINISHED completed runs in the worker's scope, written by another session, no ANALYZE."""
    other = await asyncpg.connect(dsn)
    try:
        await other.execute(
            """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, status,
                                        run_after, attempts, created_at, updated_at, started_at,
                                        finished_at, output, lease_generation)
               SELECT gen_random_uuid(), 'default', NULL, $1, 'completed', t, 1, t,
                      t + interval '2 s', t + interval '1 s', t + interval '2 s',
                      '{"ok": true}'::jsonb, 1
                 FROM generate_series(1, $2) AS g,
                      LATERAL (SELECT clock_timestamp() - interval '1 day'
                                      + g * interval '1 ms' AS t) AS s""",
            DEPLOYMENT, FINISHED)
        assert await other.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE status = 'completed'") >= FINISHED
    finally:
        await other.close()


@pytest.mark.parametrize("analyzed_empty", [False, True],
                         ids=["never-analyzed", "analyzed-while-empty"])
@pytest.mark.parametrize("max_concurrency", [None, 64], ids=["unbounded", "slotted"])
async def test_batch_calls_read_in_proportion_to_the_batch_after_the_table_grew(
        worker_session: asyncpg.Connection, database_dsn: str,
        max_concurrency: int | None, analyzed_empty: bool) -> None:
    if analyzed_empty:
        # A DBA's ANALYZE (vacuumdb -Z) of the new, empty database: statistics that say the table
        # is empty (reltuples 0, not "never analyzed"), so the planner no longer assumes ten
        # pages, and a sequential scan of "nothing" is the cheapest generic plan of a key lookup.
        admin = await asyncpg.connect(database_dsn)
        try:
            await admin.execute("ANALYZE zeroth.runs")
        finally:
            await admin.close()
    # Three batches on the small table: every statement is planned and its generic plan cached.
    for _ in range(3):
        await work_one_batch(worker_session, max_concurrency)
    await grow_scope(database_dsn)
    read = await work_one_batch(worker_session, max_concurrency)
    bound = BATCH * TUPLES_PER_RUN
    assert all(count <= bound for count in read.values()), (bound, read)
    # The bound is far below one walk of the scope, so a plan that walks it per run (or once)
    # cannot pass.
    assert bound < FINISHED // 10
