"""What one run costs the database: index entries, WAL bytes and statements (issue 30, item 3).

    python -m bench.per_run_cost ADMIN_DSN [--runs N]

ADMIN_DSN: a superuser DSN of a server whose ``shared_preload_libraries`` holds
``pg_stat_statements`` (the statements are counted there; with ``pg_stat_statements.track =
all`` the statements the functions run inside are counted too) and that nothing else uses while this
runs (the WAL counters are cluster-wide). A fresh database is created and migrated, then two
phases, each measured between two points of the WAL (``pg_current_wal_insert_lsn``), with a
CHECKPOINT before each so that full-page images do not depend on what ran before:

* enqueue — N ``enqueue_run`` calls, one run each (a producer at concurrency 1);
* worker — a ``RunWorker`` with ``max_concurrency = 1`` (``--concurrency C``; ``--claim-ahead
  A``: its claim_ahead) and a no-op
  handler drains those N runs (claim, start, completion: whatever statements the worker sends
  for them, its LISTEN connection's included); with ``--fail-fraction F`` the handler fails a
  share F of them for good (``NonRetryableError``, spread evenly), so their failures are
  written too;
* batch enqueue, batch claim, batch completion (``--batch B``, default 100) — N more runs
  enqueued by ``enqueue_runs`` B at a time, claimed and started by ``claim_and_start`` B at a
  time, completed by ``complete_runs`` B at a time: each transition its own phase, so that
  the index entries, WAL and statements of a claim and of a completion are apart.

For each phase, per run: WAL bytes (and full-page-image bytes, and the WAL without them: the
bytes of the images taken because a page was first touched after the phase's CHECKPOINT depend
on how many distinct pages the phase touched, not on the run), the WAL records of the btree
inserts into each index of zeroth.runs (pg_walinspect: records of resource manager Btree whose
block reference names the index's relfilenode; INSERT_LEAF is one index entry), heap updates
that were not HOT and those that were, transactions committed, and the statements the clients
sent (pg_stat_statements, top level, the measured database only). Autovacuum is switched off on
the server for the measurement (ALTER SYSTEM, put back at the end) so that its WAL is not
counted. Nothing asserts a cost: numbers go to stdout (and, with ``--json FILE``, every value of
every phase to FILE). ``--without-index NAME`` (repeatable) drops an index of schema zeroth
after migrating: what that index costs a run (an experiment; nothing else is measured about the
database without it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import uuid
from collections import Counter
from typing import Any

import asyncpg

from bench.harness import pool as worker_pool
from bench.harness import wait_until
from zeroth_pg import LeaseManager, RunWorker, migrate
from zeroth_pg._libpq import with_database
from zeroth_pg.errors import NonRetryableError

BLOCK = re.compile(r"rel \d+/\d+/(\d+)")


class Phase:
    """The measurements between two WAL positions, read from the admin database."""

    def __init__(self, admin: asyncpg.Connection, db: asyncpg.Connection, dbname: str) -> None:
        self.admin, self.db, self.dbname = admin, db, dbname
        self.result: dict[str, Any] = {}

    async def __aenter__(self) -> Phase:
        await self.admin.execute("CHECKPOINT")
        await self.admin.execute("SELECT pg_stat_statements_reset()")
        self.commits = await self._commits()
        self.start = await self.admin.fetchval("SELECT pg_current_wal_insert_lsn()")
        return self

    async def _commits(self) -> int:
        await asyncio.sleep(1.1)  # backends flush their statistics at most once a second
        return int(await self.admin.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", self.dbname))

    async def __aexit__(self, *exc: object) -> None:
        end = await self.admin.fetchval("SELECT pg_current_wal_insert_lsn()")
        names = {str(r["relfilenode"]): r["relname"] for r in await self.db.fetch(
            """SELECT c.relfilenode, c.relname FROM pg_class c
                WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind IN ('r', 'i')""")}
        records = await self.admin.fetch(
            """SELECT resource_manager, record_type, fpi_length, block_ref
                 FROM pg_get_wal_records_info($1, $2)""", self.start, end)
        by_type = await self.admin.fetch(
            """SELECT "resource_manager/record_type" AS kind, count, combined_size, record_size
                 FROM pg_get_wal_stats($1, $2, true)
                WHERE count > 0 ORDER BY combined_size DESC""", self.start, end)
        statements = await self.admin.fetch(
            """SELECT s.query, s.calls FROM pg_stat_statements s
                 JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = $1 AND s.toplevel ORDER BY s.calls DESC""", self.dbname)
        nested = await self.admin.fetch(
            """SELECT s.query, s.calls FROM pg_stat_statements s
                 JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = $1 AND NOT s.toplevel ORDER BY s.calls DESC""", self.dbname)
        commits = await self._commits()
        index_records: Counter[tuple[str, str]] = Counter()
        heap: Counter[str] = Counter()
        for r in records:
            found = BLOCK.search(r["block_ref"] or "")
            relation = names.get(found.group(1), "other") if found else "none"
            if r["resource_manager"] == "Btree":
                index_records[(relation, r["record_type"])] += 1
            elif r["resource_manager"] in ("Heap", "Heap2") and relation == "runs":
                heap[r["record_type"]] += 1
        self.result = {
            "wal_bytes": int(await self.admin.fetchval("SELECT $1::pg_lsn - $2::pg_lsn",
                                                       end, self.start)),
            "fpi_bytes": sum(int(r["fpi_length"] or 0) for r in records),
            "index_records": index_records, "heap_runs": heap,
            "commits": commits - self.commits,
            "by_type": [(r["kind"], int(r["count"]), int(r["combined_size"]),
                         int(r["record_size"])) for r in by_type],
            "statements": [(r["query"], int(r["calls"])) for r in statements],
            "nested_statements": [(r["query"], int(r["calls"])) for r in nested],
        }


RESULTS: dict[str, Any] = {}


def report(name: str, n: int, result: dict[str, Any]) -> None:
    RESULTS[name] = {
        "runs": n, **result,
        "index_records": {f"{rel}:{kind}": c for (rel, kind), c in
                          sorted(result["index_records"].items())},
        "heap_runs": dict(result["heap_runs"])}
    print(f"\n== {name}: {n} runs")
    print(f"WAL bytes/run {result['wal_bytes'] / n:8.1f} (full-page images "
          f"{result['fpi_bytes'] / n:.1f}, without them "
          f"{(result['wal_bytes'] - result['fpi_bytes']) / n:.1f}); "
          f"commits/run {result['commits'] / n:.2f}")
    leaf: Counter[str] = Counter()
    for (rel, kind), c in result["index_records"].items():
        if kind.startswith("INSERT_LEAF") or kind.startswith("INSERT_POST"):
            leaf[rel] += c
    print(f"index entries/run {sum(leaf.values()) / n:.2f}: "
          + ", ".join(f"{rel} {c / n:.2f}" for rel, c in sorted(leaf.items())))
    other = {f"{rel}:{kind}": c for (rel, kind), c in result["index_records"].items()
             if not (kind.startswith("INSERT_LEAF") or kind.startswith("INSERT_POST"))}
    if other:
        print("other btree records: " + ", ".join(f"{k} {c}" for k, c in sorted(other.items())))
    print("heap records of zeroth.runs/run: " + ", ".join(
        f"{k} {c / n:.2f}" for k, c in sorted(result["heap_runs"].items())))
    print("WAL bytes/run by record type (records/run, bytes/run with full-page images, "
          "without):")
    for kind, count, size, record in result["by_type"]:
        if size >= 10 * n:
            print(f"  {kind:28} {count / n:6.2f} {size / n:8.1f} {record / n:8.1f}")
    total = sum(c for _, c in result["statements"])
    print(f"statements/run {total / n:.3f} ({total} calls):")
    for query, calls in result["statements"][:8]:
        if calls >= min(n // 20, 5):
            print(f"  {calls / n:6.2f}  {' '.join(query.split())[:110]}")
    nested = sum(c for _, c in result["nested_statements"])
    print(f"statements run inside the functions/run {nested / n:.2f} ({nested} calls; "
          "pg_stat_statements.track = all, else 0)")


async def batches(admin: asyncpg.Connection, db: asyncpg.Connection, dbname: str, n: int,
                  batch: int, deployment: str) -> None:
    """N runs through the set-based calls, B at a time, one phase per transition."""
    sizes = [min(batch, n - i) for i in range(0, n, batch)]
    async with Phase(admin, db, dbname) as enqueue:
        for size in sizes:
            await db.execute(
                "SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2)",
                deployment, json.dumps([{"payload": {}} for _ in range(size)]))
    report(f"batch enqueue (enqueue_runs, {batch} runs a call)", n, enqueue.result)
    claimed: list[asyncpg.Record] = []
    async with Phase(admin, db, dbname) as claim:
        for size in sizes:
            claimed += await db.fetch(
                """SELECT run_id, lease_generation FROM zeroth.claim_and_start(
                       deployment_ref => $1, worker_id => 'per-run-cost', batch_size => $2)""",
                deployment, size)
    report(f"batch claim (claim_and_start, {batch} runs a call)", n, claim.result)
    assert len(claimed) == n, len(claimed)
    async with Phase(admin, db, dbname) as complete:
        for i in range(0, n, batch):
            part = claimed[i:i + batch]
            done = await db.fetch(
                """SELECT * FROM zeroth.complete_runs(worker_id => 'per-run-cost',
                       run_ids => $1, generations => $2)""",
                [r["run_id"] for r in part], [r["lease_generation"] for r in part])
            assert all(d["completed"] for d in done)
    report(f"batch completion (complete_runs, {batch} runs a call)", n, complete.result)


async def main_async(admin_dsn: str, n: int, batch: int = 100,
                     without: tuple[str, ...] = (), fail_fraction: float = 0.0,
                     concurrency: int = 1, claim_ahead: int = 0) -> None:
    dbname = f"per_run_cost_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f"CREATE DATABASE {dbname}")
    dsn = with_database(admin_dsn, dbname)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            await admin.execute(f"ALTER SYSTEM SET {setting} = on")
        await admin.execute("ALTER SYSTEM SET autovacuum = off")
        await admin.execute("SELECT pg_reload_conf()")
        await asyncio.to_thread(migrate.upgrade, dsn)
        if without:
            # What an index costs: the same phases without it (an experiment, never a
            # configuration: the functions' plans and the dashboard need every index).
            migrated = await asyncpg.connect(dsn)
            try:
                for name in without:
                    await migrated.execute(f"DROP INDEX zeroth.{name}")
            finally:
                await migrated.close()
            print(f"without {', '.join(without)}")
            RESULTS["without"] = list(without)
        version = await admin.fetchval("SHOW server_version")
        print(f"PostgreSQL {version}; durable; database {dbname}")
        RESULTS["server_version"] = version
        db = await asyncpg.connect(dsn)
        deployment = "per-run-cost"
        async with worker_pool(dsn, 4) as pool:
            lm = LeaseManager(pool, lease_duration_seconds=60)
            async with Phase(admin, db, dbname) as enqueue:
                for _ in range(n):
                    await lm.enqueue_run(deployment)
            report("enqueue (enqueue_run, one run a call)", n, enqueue.result)

            handled = 0

            async def handler(_run: object) -> None:
                nonlocal handled
                handled += 1
                # Spread evenly: the i-th handled run fails when i * F crosses an integer.
                if int(handled * fail_fraction) != int((handled - 1) * fail_fraction):
                    raise NonRetryableError("per-run-cost: a failure for good")

            async with worker_pool(dsn, 4) as workers, Phase(admin, db, dbname) as drain:
                run_worker = RunWorker(workers, deployment, handler, dsn=dsn,
                                       max_concurrency=concurrency, claim_ahead=claim_ahead)
                await run_worker.start()
                try:
                    await wait_until(lambda: handled >= n and not run_worker.active_run_ids,
                                     limit=600, what="per-run-cost drain")
                    # the last completion is sent after the handler returns
                    await wait_until(lambda: not run_worker.active_run_ids,
                                     limit=60, what="last completion")
                    await asyncio.sleep(0.5)
                finally:
                    await run_worker.graceful_shutdown()
            failing = f", {fail_fraction:.0%} failing for good" if fail_fraction else ""
            ahead = f", claim_ahead {claim_ahead}" if claim_ahead else ""
            report(f"worker (RunWorker, max_concurrency {concurrency}{ahead}: claim, start, "
                   f"complete{failing})", n, drain.result)
            await batches(admin, db, dbname, n, batch, deployment)
            left = await db.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE status NOT IN ('completed', 'failed')")
            failed = await db.fetchval("SELECT count(*) FROM zeroth.runs WHERE status = 'failed'")
            print(f"\nruns neither completed nor failed at the end: {left}; failed: {failed}")
        await db.close()
    finally:
        await admin.execute("ALTER SYSTEM RESET autovacuum")
        await admin.execute("SELECT pg_reload_conf()")
        await admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", help="write every value of every phase to this file")
    parser.add_argument("--without-index", action="append", default=[], metavar="NAME",
                        help="drop this index of schema zeroth after migrating (repeatable): "
                             "what it costs a run")
    parser.add_argument("--fail-fraction", type=float, default=0.0, metavar="F",
                        help="the worker phase's handler fails this share of its runs for good "
                             "(NonRetryableError, spread evenly)")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="the worker phase's max_concurrency (default 1)")
    parser.add_argument("--claim-ahead", type=int, default=0,
                        help="the worker phase's claim_ahead (default 0)")
    args = parser.parse_args()
    if not 0 <= args.fail_fraction <= 1 or args.concurrency < 1:
        parser.error("need 0 <= --fail-fraction <= 1 and --concurrency >= 1")
    asyncio.run(main_async(args.dsn, args.runs, args.batch, tuple(args.without_index),
                           args.fail_fraction, args.concurrency, args.claim_ahead))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(RESULTS, out, indent=1, default=str)


if __name__ == "__main__":
    main()
