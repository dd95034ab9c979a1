"""The dashboard's runs page at a million runs: every query shape it sends (zeroth_pg.web.app.
run_page_query: no filter, each filter, a keyset cursor, a run id, as the owner and as a
zeroth_reader with its tenant set) walks an index in (created_at, run_id) order (the runs that are
not running: runs_created_not_running_idx; the running ones, none here, are sorted) or looks the
run up by id (one probe of runs_pkey, which leads with run_id), and never sorts the table (a
thread filter may sort that thread's runs, found through runs_thread_idx).

A behavioural bound, not a timing: the plan has no Sort node and names the index, and
EXPLAIN (ANALYZE, BUFFERS) counts the shared buffers one page touches. The million rows are one
set-based INSERT as the owner (the only direct write to zeroth.runs here), then VACUUM ANALYZE.
The plans are printed and saved to ZEROTH_PG_TEST_REPORTS/plans/run_list.txt.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from zeroth_pg.web.app import PAGE_SIZE, run_page_query
from zeroth_pg.web.paging import COUNT_CAP

RUNS = 1_000_000


async def add_runs(connection: asyncpg.Connection) -> None:
    """1M runs over 30 days: 3 tenants, 7 deployments (moduli prime to the status cycle's, so
    every filter combination has runs), 70% completed, 10% failed, 5%
    cancelled, 15% pending; one in ten on a thread (finished ones only)."""
    await connection.execute(
        """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, thread_id,
                                    status, run_after, attempts, created_at, updated_at,
                                    started_at, finished_at, idempotency_key, lease_generation)
           SELECT gen_random_uuid(), 't' || (g % 3), NULL, 'd' || (g % 7),
                  CASE WHEN g % 10 = 1 AND s.st <> 'pending' THEN 'th-' || (g % 1000) END,
                  s.st::zeroth.run_status, t, 1, t, t, t, CASE WHEN s.st <> 'pending' THEN t END,
                  'k' || g, 1
             FROM generate_series(1, $1) AS g,
                  LATERAL (SELECT clock_timestamp() - interval '30 days'
                                  + g * interval '2592 ms' AS t,
                                  CASE WHEN g % 20 < 14 THEN 'completed'
                                       WHEN g % 20 < 16 THEN 'failed'
                                       WHEN g % 20 = 16 THEN 'cancelled'
                                       ELSE 'pending' END AS st) AS s""", RUNS)
    await connection.execute("VACUUM ANALYZE zeroth.runs")


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


async def explain(connection: asyncpg.Connection, sql: str, args: list[Any]
                  ) -> tuple[dict[str, Any], str]:
    raw = await connection.fetchval(
        f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}", *args)
    text = "\n".join(r[0] for r in await connection.fetch(
        f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF) {sql}", *args))
    return json.loads(raw)[0]["Plan"], text


async def shapes(connection: asyncpg.Connection) -> dict[str, tuple[str, list[Any]]]:
    middle: datetime = await connection.fetchval(
        "SELECT r.created_at FROM zeroth.run_list r ORDER BY r.created_at LIMIT 1 OFFSET $1",
        RUNS // 2)
    row = await connection.fetchrow(
        "SELECT r.created_at, r.run_id FROM zeroth.run_list r "
        "WHERE r.created_at >= $1 ORDER BY r.created_at, r.run_id LIMIT 1", middle)
    cursor = (row["created_at"], row["run_id"])
    later: datetime = await connection.fetchval(
        "SELECT r.created_at FROM zeroth.run_list r ORDER BY r.created_at LIMIT 1 OFFSET $1",
        RUNS // 2 + 5000)
    one: uuid.UUID = row["run_id"]
    limit = PAGE_SIZE + 1
    return {
        "first page": run_page_query({}, None, limit),
        "page after a cursor": run_page_query({}, cursor, limit),
        "status failed": run_page_query({"status": "failed"}, None, limit),
        "status pending, after a cursor": run_page_query({"status": "pending"}, cursor, limit),
        "deployment d3": run_page_query({"deployment": "d3"}, None, limit),
        "tenant t1 and deployment d5": run_page_query({"tenant": "t1", "deployment": "d5"},
                                                      None, limit),
        "thread th-1": run_page_query({"thread": "th-1"}, None, limit),
        "time range": run_page_query({"since": middle, "until": later}, None, limit),
        "run id": run_page_query({"search": str(one)}, None, limit),
        # The newer page (paging back): the same index walked forwards from the cursor.
        "page before a cursor": run_page_query({}, None, limit, before=cursor),
        "status failed, before a cursor": run_page_query({"status": "failed"}, None, limit,
                                                         before=cursor),
        # The bulk confirmation's selection: the statuses an action takes.
        "statuses failed or cancelled": run_page_query(
            {"statuses": ["failed", "cancelled"], "deployment": "d3"}, None, limit),
    }


def counts() -> dict[str, tuple[str, list[Any]]]:
    """The totals' bounded counts (zeroth_pg.web.paging): at most COUNT_CAP + 1 rows each."""
    cap = COUNT_CAP + 1
    return {
        "count, no filter": run_page_query({}, None, cap, count=True),
        "count, status failed": run_page_query({"status": "failed"}, None, cap, count=True),
        "count, tenant t1 and deployment d5": run_page_query(
            {"tenant": "t1", "deployment": "d5"}, None, cap, count=True),
        "count, statuses pending/running/waiting": run_page_query(
            {"statuses": ["pending", "running", "waiting"]}, None, cap, count=True),
    }


@pytest.mark.slow
class TestRunsPageAtAMillionRuns:
    async def test_every_page_shape_walks_an_index_and_never_sorts(self, connect: Any) -> None:
        owner = await connect()
        await add_runs(owner)
        report: list[str] = []
        costs: dict[str, int] = {}
        for role in ("owner", "zeroth_reader, tenant t1"):
            for name, (sql, args) in (await shapes(owner)).items():
                transaction = owner.transaction()
                await transaction.start()
                try:
                    if role != "owner":
                        await owner.execute("SET LOCAL ROLE zeroth_reader")
                        await owner.execute("SET LOCAL zeroth.tenant_id = 't1'")
                    plan, text = await explain(owner, sql, args)
                finally:
                    await transaction.rollback()
                key = f"{name} ({role})"
                report.append(f"-- {key}\n{sql}\n{text}\n")
                kinds = {n["Node Type"] for n in nodes(plan)}
                indexes = {n.get("Index Name") for n in nodes(plan)} - {None}
                assert "Seq Scan" not in kinds, (key, text)
                sorted_rows = [int(c["Actual Rows"]) for n in nodes(plan)
                               if n["Node Type"] in ("Sort", "Incremental Sort")
                               for c in n["Plans"]]
                assert max(sorted_rows, default=0) < 10_000, (key, text)
                if name == "thread th-1":
                    # A thread's runs (a thousand here) come from runs_thread_idx and may be
                    # sorted: a sort of one thread, never of the table.
                    assert ("runs_thread_idx" in indexes
                            or "runs_created_not_running_idx" in indexes), text
                elif name == "run id":
                    # One probe of runs_pkey (run_id, tenant_id, workspace_key), as the owner and
                    # as a reader (its tenant: the key's second column), whatever the number of
                    # scopes (zeroth_pg._calls.run_by_id). One row, maybe "sorted".
                    assert indexes == {"runs_pkey"}, (key, text)
                else:
                    # The runs that are not running by a walk of the index; the running ones
                    # (none here) sorted.
                    assert max(sorted_rows, default=0) == 0, (key, text)
                    assert "runs_created_not_running_idx" in indexes, (key, text)
                costs[key] = int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
        # A total counts at most COUNT_CAP + 1 rows, whatever the plan: bounded, never the table.
        for name, (sql, args) in counts().items():
            plan, text = await explain(owner, sql, args)
            report.append(f"-- {name}\n{sql}\n{text}\n")
            assert int(plan["Actual Rows"]) == 1, text
            scanned = max(int(n["Actual Rows"]) for n in nodes(plan) if "Scan" in n["Node Type"])
            assert scanned <= COUNT_CAP + 1, (name, text)
            costs[name] = int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
            assert await owner.fetchval(sql, *args) == COUNT_CAP + 1, name  # capped
        out = Path(os.environ.get("ZEROTH_PG_TEST_REPORTS", "build/test-reports")) / "plans"
        out.mkdir(parents=True, exist_ok=True)
        (out / "run_list.txt").write_text("\n".join(report))
        print("\n".join(report))
        print(costs)
        # A page reads about its own rows: the unfiltered pages a few dozen buffers, a filter
        # that keeps one run in ten (or one in twenty, tenant and deployment) some hundreds. A
        # filter that matches almost nothing walks far down the index (docs/dba-guide.md).
        assert costs["first page (owner)"] < 100, costs
        assert costs["page after a cursor (owner)"] < 100, costs
        # A run id: one probe of runs_pkey (a few buffers), whatever the number of scopes
        # (zeroth_pg._calls.run_by_id).
        assert costs["run id (owner)"] < 20, costs
        assert costs["run id (zeroth_reader, tenant t1)"] < 20, costs
        # A thread's page (th-1 holds one run in a thousand): through runs_thread_idx, its
        # thousand runs and a sort; or, as PostgreSQL 15 plans it, the created-order index
        # walked backwards until 51 of them are found, 2,007 buffers (about 51,000 entries).
        # Either reads in proportion to the thread's share, never the table.
        assert costs["thread th-1 (owner)"] < 3000, costs
        assert costs["thread th-1 (zeroth_reader, tenant t1)"] < 3000, costs
        assert {k: c for k, c in costs.items() if c >= 2000 and not k.startswith(("count",
                                                                                 "thread"))
                } == {}, costs
