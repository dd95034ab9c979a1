"""The batch functions' work grows with the batch, not with its square.

A generic plan believes an array argument holds 10 elements. Joining a batch's rows to its
request (run_ids[i] with generations[i]) by a nested loop then looks cheapest, and for the
largest batch a worker sends (1,000 leases renewed, 1,000 runs completed) it compared every row
with every request: 1,000,000 join-filter comparisons, 0.16 s for renew_leases and 0.17 s for
complete_runs on this machine, where 100 leases took 4 ms (the renewal scenario of bench/ showed
it: 161 ms to renew 1,000 leases in one statement, slower than 1,000 renew_lease calls).

The test reads the plans PostgreSQL executed (auto_explain, with ANALYZE, of every statement
inside the functions) for a claim, a renewal and a completion of 1,000 runs, with and without
max_concurrency slots, in a session whose plans are generic, and bounds the rows any plan node
removed by a join filter by the batch size: a nested loop pairing the batch with itself removes
the square.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

import asyncpg
import pytest

BATCH = 1000
DEPLOYMENT = "d"
JOIN_FILTER = re.compile(r"Rows Removed by Join Filter: (\d+)")


@pytest.fixture
async def explained(database_dsn: str) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    session = await asyncpg.connect(database_dsn)
    plans: list[str] = []
    try:
        await session.execute("SET plan_cache_mode = force_generic_plan")
        await session.execute("LOAD 'auto_explain'")
        await session.execute("""SET auto_explain.log_min_duration = 0;
                                 SET auto_explain.log_analyze = on;
                                 SET auto_explain.log_nested_statements = on;
                                 SET auto_explain.log_level = notice;
                                 SET client_min_messages = notice""")
        session.add_log_listener(lambda _conn, message: plans.append(message.message))
        yield session, plans
    finally:
        await session.close()


def worst_join_filter(plans: list[str]) -> tuple[int, str]:
    worst = (0, "")
    for plan in plans:
        for removed in JOIN_FILTER.findall(plan):
            if int(removed) > worst[0]:
                worst = (int(removed), plan.split("\n", 2)[1][:120])
    return worst


@pytest.mark.parametrize("max_concurrency", [None, 2 * BATCH], ids=["unbounded", "slotted"])
async def test_claim_renew_and_complete_of_a_full_batch_pair_rows_linearly(
        explained: tuple[asyncpg.Connection, list[str]], max_concurrency: int | None) -> None:
    session, plans = explained
    await session.execute(
        "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        DEPLOYMENT, json.dumps([{"payload": {"n": n}} for n in range(BATCH)]))
    # Twice: the first call of each statement plans it, the second runs the cached generic plan.
    for _ in range(2):
        plans.clear()
        claimed = await session.fetch(
            """SELECT c.run_id, c.lease_generation FROM zeroth.claim_and_start(
                   deployment_ref => $1, worker_id => 'w', batch_size => $2,
                   max_concurrency => $3, lease_seconds => 60) c WHERE c.run_id IS NOT NULL""",
            DEPLOYMENT, BATCH, max_concurrency)
        assert len(claimed) == BATCH
        run_ids = [row["run_id"] for row in claimed]
        generations = [row["lease_generation"] for row in claimed]
        renewed = await session.fetch(
            """SELECT renewed FROM zeroth.renew_leases(worker_id => 'w', run_ids => $1,
                   generations => $2, lease_seconds => 60)""", run_ids, generations)
        assert [row["renewed"] for row in renewed] == [True] * BATCH
        completed = await session.fetch(
            """SELECT completed FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1,
                   generations => $2, outputs => $3::jsonb[])""",
            run_ids, generations, [json.dumps({"n": n}) for n in range(BATCH)])
        assert [row["completed"] for row in completed] == [True] * BATCH
        assert await session.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE status = 'completed' AND output ? 'n'"
        ) >= BATCH
        removed, statement = worst_join_filter(plans)
        assert plans, "auto_explain logged no plan"
        assert removed <= BATCH, (removed, statement)
        # The next round claims a fresh batch.
        await session.execute(
            "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, "
            "runs => $2::text::jsonb)",
            DEPLOYMENT, json.dumps([{"payload": {"n": n}} for n in range(BATCH)]))


# A plan node's line and the "Rows Removed by Filter" / "by Join Filter" lines under it: EXPLAIN
# ANALYZE prints the average per loop, so a node's work is that times its loops.
NODE = re.compile(r"actual time=[\d.]+\.\.[\d.]+ rows=[\d.]+ loops=(\d+)\)")
REMOVED = re.compile(r"Rows Removed by (?:Join )?Filter: ([\d.]+)")


def worst_rows_removed(plans: list[str]) -> tuple[float, str]:
    """The most rows any one plan node removed by a filter or join filter, over all its loops."""
    worst = (0.0, "")
    for plan in plans:
        loops = 1
        for line in plan.splitlines():
            if node := NODE.search(line):
                loops = int(node.group(1))
            elif removed := REMOVED.search(line):
                total = float(removed.group(1)) * loops
                if total > worst[0]:
                    worst = (total, plan.split("\n", 2)[1][:120])
    return worst


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
async def test_enqueue_runs_of_a_full_batch_reads_its_items_linearly(
        explained: tuple[asyncpg.Connection, list[str]], keyed: bool) -> None:
    """enqueue_runs says, per item, whether it created the item's run: once by comparing each
    item with every run the batch created and every earlier item (a subplan per item), 3,000
    items made 9,000,000 comparisons (3.5 s of a 3.9 s call on this machine; 10,000 items, the
    most a batch holds, about 18 s, under the batch's thread and key locks)."""
    session, plans = explained
    items = [{"payload": {"n": n}} | ({"idempotency_key": f"k{n % (BATCH // 2)}"} if keyed else {})
             for n in range(BATCH)]
    for round_ in range(2):  # the second call runs the cached generic plans
        plans.clear()
        rows = await session.fetch(
            "SELECT ordinality, run_id, created FROM zeroth.enqueue_runs(deployment_ref => $1, "
            "runs => $2::text::jsonb, tenant_id => $3)",
            DEPLOYMENT, json.dumps(items), f"t{round_}")
        assert [row["ordinality"] for row in rows] == list(range(1, BATCH + 1))
        # keyed: items n and n + BATCH/2 share a key; the first creates it, the second gets it
        created = [row["created"] for row in rows]
        assert created == ([True] * (BATCH // 2) + [False] * (BATCH // 2) if keyed
                           else [True] * BATCH)
        if keyed:
            assert [row["run_id"] for row in rows[BATCH // 2:]] == \
                [row["run_id"] for row in rows[:BATCH // 2]]
        assert plans, "auto_explain logged no plan"
        removed, statement = worst_rows_removed(plans)
        assert removed <= 4 * BATCH, (removed, statement)
