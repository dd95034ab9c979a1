"""A fresh database keeps up before its first ANALYZE: every call of the worker's hot path (claim,
renew, complete, the orphan sweep) reads in proportion to its own runs while zeroth.runs has never
been analyzed and a monitor pins the xmin horizon beside it (issue 30).

Issue 30 measured a freshly migrated database under continuous load whose rate fell from 1,063 to
321 runs/s as the table grew, until the first autovacuum + analyze of zeroth.runs (a plain
ANALYZE ended it too). Before the first ANALYZE a table has no column statistics, and the
planner guesses that each equality keeps 0.5% of the rows: `tenant_id = $1 AND workspace_key =
$2`, a whole scope (often the whole table), looks like 0.0025% of it, about one row. The generic
plans the claim, renew and complete functions cache per session (force_generic_plan) were made on
that guess:

* PostgreSQL 15 (16 plans them alike; 17 reworked nbtree's arrays): the UPDATEs by `tenant_id,
  workspace_key, run_id = ANY (array)` (the lease of a claim and of the orphan sweep, the renewal,
  the completion) put only the scope in the index condition of runs_pkey and filtered the
  array: every call walked every row version of the scope (9,623 rows removed by filter, 9,700
  buffers for a claim of 12 runs at 20 s of load; 7,356 buffers for an orphan sweep that found
  nothing);
* both versions: renew_leases' check of a run it did not renew (another session holds the row,
  or the run has ended) became a hashed sub-select that read every lease in the scope: 11,809
  buffers per call on PostgreSQL 18 (auto_explain; 101 after an ANALYZE).

A monitor that pins the horizon for moments (pgstattuple, a long report) makes each walk longer:
the versions it keeps are walked too. After an ANALYZE the plans know the scope is the table and
probe by key; the fix makes the plans not depend on it (the UPDATEs reach the locked rows by their
addresses, a TID scan; the check is a key probe per run).

The test: a fresh clone of the migrated template, autovacuum off for the zeroth tables (an
analyze of zeroth.runs would replan and hide the bug, and it is checked that none ran; one of
another table would pin the horizon where the test does not), a worker session that works a few
cycles on the small table (its plans cached), then GROWN runs enqueued, claimed and completed in
the worker's scope by another session, a monitor's snapshot held from the last 1,000 of them
through the measured cycle, and the worker works one more cycle, each call in its own
transaction, counting the blocks it requested from zeroth.runs and its indexes
(pg_stat_get_xact_blocks_fetched). Each stays under a bound per run it handled (its index probes,
row versions and the index entries its non-HOT updates insert, and the versions the snapshot
kept), far below a walk of the scope. Deterministic: no timing. Runs on the session's server
(PostgreSQL 18, embedded); point ZEROTH_PG_TEST_DSN at a PostgreSQL 15 server to run it there
(both checked for issue 30).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from helpers import save_report

DEPLOYMENT = "d"
WORKER = "w"
BATCH = 16
# Runs enqueued, claimed and completed in the scope while the horizon is pinned.
GROWN = 10_000
# Per run a call handles: its key probe (every version of its row, none removable while the
# horizon is pinned), the row, and the entries a non-HOT update inserts into the eleven indexes of
# zeroth.runs. Per call: the head of the partial index it scans (runs_claim_pending_idx,
# runs_running_idx): the entries of the runs the pinned snapshot keeps (1,000, their heap pages
# visited) and the leaf pages of the entries of every run that passed since the table's last
# VACUUM (marked dead by scans but removed only by VACUUM: about one page per 300 runs) — 104 to
# 208 blocks for an orphan sweep on this data, whatever the plan statistics. A walk of the scope
# reads at least 12,000.
BLOCKS_PER_RUN = 40
BLOCKS_PER_CALL = 400

# The production default (the test server turns it off): with commits that flush their WAL a
# scan may set the hint bits that let it mark the index entries of removed versions dead at once.
DURABLE = {"synchronous_commit": "on"}
COUNTERS = """SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint
                FROM pg_class c
               WHERE c.oid = 'zeroth.runs'::regclass
                  OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                WHERE i.indrelid = 'zeroth.runs'::regclass)"""
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => $2, batch_size => $3, lease_seconds => 60)"""
RENEW = """SELECT run_id, renewed FROM zeroth.renew_leases(worker_id => $1, run_ids => $2,
               generations => $3, lease_seconds => 60)"""
COMPLETE = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1, run_ids => $2,
                  generations => $3)"""
COMPLETE_AND_CLAIM = """SELECT completed, (claimed).run_id, (claimed).lease_generation
    FROM zeroth.complete_and_claim(deployment_ref => $1, worker_id => $2, run_ids => $3,
                                   generations => $4, batch_size => $5, lease_seconds => 60)"""
SWEEP = """SELECT run_id FROM zeroth.claim_orphaned(deployment_ref => $1, worker_id => $2,
               grace_seconds => 0)"""


class Session:
    """The worker's session: calls run as they are until `measuring`; then each runs in its own
    transaction and the blocks it requested from zeroth.runs and its indexes are recorded."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.measuring = False
        self.readings: dict[str, tuple[int, int]] = {}

    async def call(self, name: str, query: str, *args: Any, work: int) -> list[Any]:
        if not self.measuring:
            return list(await self.conn.fetch(query, *args))
        async with self.conn.transaction():
            before = await self.conn.fetchval(COUNTERS)
            rows = await self.conn.fetch(query, *args)
            after = await self.conn.fetchval(COUNTERS)
        self.readings[name] = (work, after - before)
        return list(rows)


def leases(rows: list[Any]) -> dict[Any, int]:
    return {row["run_id"]: row["lease_generation"] for row in rows if row["run_id"] is not None}


async def cycle(w: Session) -> None:
    """What a RunWorker does: claim, renew (one of the runs has already ended: the renewal's
    check of a run it did not renew), complete, complete-and-claim, an orphan sweep."""
    held = leases(await w.call("claim_and_start", CLAIM, DEPLOYMENT, WORKER, BATCH, work=BATCH))
    assert len(held) == BATCH
    first, *rest = held
    await w.conn.fetch(COMPLETE, WORKER, [first], [held[first]])
    renewed = await w.call("renew_leases (one ended)", RENEW, WORKER, list(held),
                           list(held.values()), work=BATCH)
    assert [row["renewed"] for row in renewed] == [False] + [True] * len(rest)
    half = rest[: len(rest) // 2]
    completed = await w.call("complete_runs", COMPLETE, WORKER, half,
                             [held[r] for r in half], work=len(half))
    assert all(row["completed"] for row in completed)
    others = rest[len(rest) // 2:]
    rows = await w.call("complete_and_claim", COMPLETE_AND_CLAIM, DEPLOYMENT, WORKER, others,
                        [held[r] for r in others], BATCH, work=len(others) + BATCH)
    assert rows[0]["completed"] == [True] * len(others)
    claimed = leases(rows)
    assert len(claimed) == BATCH
    await w.conn.fetch(COMPLETE, WORKER, list(claimed), list(claimed.values()))
    swept = await w.call("claim_orphaned (nothing expired)", SWEEP, DEPLOYMENT, WORKER, work=1)
    assert [row["run_id"] for row in swept] == [None]  # the marker: nothing to re-lease


async def grow(dsn: str, pin: asyncpg.Connection) -> asyncpg.transaction.Transaction:
    """GROWN runs through the worker's scope and deployment, by another session: enqueued,
    claimed and completed in batches of 1,000 (three versions of each row), with an orphan sweep
    now and then (a worker's). The monitor (`pin`) takes its snapshot before the last batch and
    holds it: returned open."""
    other = await asyncpg.connect(dsn, server_settings=DURABLE)
    try:
        await other.execute(
            """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
                   runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $2)))""",
            DEPLOYMENT, GROWN)
        for n in range(GROWN // 1000):
            if n == GROWN // 1000 - 1:
                # The monitor: a snapshot held open pins the horizon, so no version left from
                # here on may be pruned, nor its index entries marked dead.
                pinned = pin.transaction(isolation="repeatable_read")
                await pinned.start()
                await pin.fetchval("SELECT count(*) FROM zeroth.runs")
            held = leases(list(await other.fetch(CLAIM, DEPLOYMENT, "grower", 1000)))
            rows = await other.fetch(COMPLETE, "grower", list(held), list(held.values()))
            assert all(row["completed"] for row in rows)
            await other.fetch(SWEEP, DEPLOYMENT, "grower")
        return pinned
    finally:
        await other.close()


@pytest.fixture
async def fresh(database_dsn: str) -> AsyncIterator[tuple[Session, asyncpg.Connection]]:
    admin = await asyncpg.connect(database_dsn, server_settings=DURABLE)
    # No autovacuum: an analyze of zeroth.runs would replan and hide the bug, and one of another
    # table holds a snapshot for a moment, pinning the horizon where the test does not.
    for table in await admin.fetch(
            """SELECT c.oid::regclass::text FROM pg_class c
                WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind = 'r'"""):
        await admin.execute(f"ALTER TABLE {table[0]} SET (autovacuum_enabled = false)")
    conn = await asyncpg.connect(database_dsn, server_settings=DURABLE)
    try:
        yield Session(conn), admin
    finally:
        await conn.close()
        await admin.close()


async def test_a_fresh_database_under_load_reads_per_run_before_its_first_analyze(
        fresh: tuple[Session, asyncpg.Connection], database_dsn: str) -> None:
    w, admin = fresh
    # Never analyzed: no statistics at all (a clone of the migrated template).
    assert await admin.fetchval(
        "SELECT reltuples FROM pg_class WHERE oid = 'zeroth.runs'::regclass") < 0
    await admin.execute(
        """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
               runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $2)))""",
        DEPLOYMENT, 4 * BATCH)
    # Cycles on the small table: every statement is planned and its generic plan cached.
    for _ in range(2):
        await cycle(w)

    monitor = await asyncpg.connect(database_dsn, server_settings=DURABLE)
    try:
        pinned = await grow(database_dsn, monitor)
        await admin.execute(
            """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
                   runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $2)))""",
            DEPLOYMENT, 4 * BATCH)
        w.measuring = True
        await cycle(w)  # the horizon still pinned
        await pinned.rollback()
    finally:
        await monitor.close()

    stats = await admin.fetchrow(
        """SELECT analyze_count + autoanalyze_count AS analyzes,
                  vacuum_count + autovacuum_count AS vacuums
             FROM pg_stat_user_tables WHERE relid = 'zeroth.runs'::regclass""")
    version = await admin.fetchval("SHOW server_version")
    save_report(f"fresh_database_pg{version.split('.')[0]}", {
        name: {"work": work, "blocks": blocks} for name, (work, blocks) in w.readings.items()})
    # Measured before any ANALYZE or VACUUM of zeroth.runs: the plans had no statistics.
    assert (stats["analyzes"], stats["vacuums"]) == (0, 0), dict(stats)
    assert len(w.readings) == 5
    walked = {name: (work, blocks) for name, (work, blocks) in w.readings.items()
              if blocks > BLOCKS_PER_RUN * work + BLOCKS_PER_CALL}
    assert not walked, "\n".join(
        f"{name}: {blocks} blocks of zeroth.runs and its indexes for {work} run(s)"
        for name, (work, blocks) in walked.items())
