"""The hot path writes only the index entries a queue needs, and the dashboard's pages and
lookups by run id stay index-driven without an index on zeroth.runs that every run writes
(issue 30, item 3).

Every claim and completion changes `status`, which the partial indexes name, so each is a non-HOT
update and inserts an entry into every index of zeroth.runs whose predicate its new row version
meets. Until issue 30 two indexes for the dashboard had no predicate (runs_created_idx
(created_at, run_id), runs_run_id_idx (run_id)): six of the thirteen index entries a run cost
from its enqueue to its completion. They are gone; the runs page merges the runs that are not
running (runs_created_not_running_idx, which a claim does not write) with the running ones, and a
run known by its id alone is one probe of the primary key, which leads with run_id (run_id,
tenant_id, workspace_key: migration 0023), whatever its status and the number of scopes; no index
on run_id (runs_run_id_not_running_idx until 0023) takes an entry at every enqueue and completion.

* the catalog: no index of zeroth.runs without a predicate but its primary key;
* the WAL: the btree leaf inserts into each index between two WAL positions (pg_walinspect),
  for runs enqueued by enqueue_runs, claimed and started by claim_and_start, completed by
  complete_runs: per run at most the entries each transition needs (enqueue: runs_pkey,
  runs_claim_pending_idx, runs_created_not_running_idx; claim: runs_pkey, runs_running_idx;
  completion: runs_pkey, runs_finished_idx, runs_created_not_running_idx: 8; 13 before issue 30,
  11 before migration 0022, when a completion at the run's first claim also inserted its attempt
  into zeroth.run_attempts and its index run_attempts_run_idx — it is kept in the runs row now,
  and the view zeroth.run_attempts still shows it —, 10 before 0023, when
  runs_run_id_not_running_idx took one at the enqueue and one at the completion);
* the enqueue's heap records: a run with no idempotency key and no run_id of its own is inserted
  plainly (no speculative insertion, no HEAP_CONFIRM record: 48 bytes of WAL a run), by
  enqueue_run and enqueue_runs alike; a run with a key still goes through ON CONFLICT;
* the plans: 200,000 runs in mixed statuses (500 of them running) written by one set-based INSERT
  (the only direct write to zeroth.runs here), never analyzed (autovacuum off for the table, and
  checked), then again after ANALYZE: every page shape of the dashboard and of `zeroth-pg runs
  list` without a filter that needs statistics, and every lookup of a run by its id alone, reads
  through an index, with no sequential scan, and requests a number of buffers bounded by the page
  and the running runs (EXPLAIN (ANALYZE, BUFFERS), no timing); every lookup by id alone (of a
  finished, a running and an unknown run) is runs_pkey alone and a few buffers, also as a
  zeroth_reader (row-level security: its tenant is a constant of the plan). Plans saved with
  helpers.save_report (hot_path_indexes).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from typing import Any

import asyncpg
import pytest
from helpers import save_report

from zeroth_pg import _calls
from zeroth_pg.web.app import PAGE_SIZE, run_page_query
from zeroth_pg.web.run_filters import PAGE_SETTINGS

RUNS = 200_000
RUNNING = 500
BLOCK = re.compile(r"rel \d+/(\d+)/(\d+)")


async def test_zeroth_runs_has_no_index_without_a_predicate_but_its_primary_key(
        conn: asyncpg.Connection) -> None:
    unconditional = await conn.fetch(
        """SELECT i.indexrelid::regclass::text AS name
             FROM pg_index i
            WHERE i.indrelid = 'zeroth.runs'::regclass AND i.indpred IS NULL
              AND NOT i.indisprimary
            ORDER BY 1""")
    assert [r["name"] for r in unconditional] == []


async def _index_entries(admin: asyncpg.Connection, start: str, end: str) -> Counter[str]:
    """Btree leaf inserts (an entry each, a posting-list insert included) into the indexes of
    schema zeroth of this database between two WAL positions."""
    names = {str(r["relfilenode"]): r["relname"] for r in await admin.fetch(
        """SELECT c.relfilenode, c.relname FROM pg_class c
            WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind = 'i'""")}
    database = str(await admin.fetchval(
        "SELECT oid FROM pg_database WHERE datname = current_database()"))
    entries: Counter[str] = Counter()
    for r in await admin.fetch(
            """SELECT record_type, block_ref
                 FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                WHERE resource_manager = 'Btree'
                  AND record_type IN ('INSERT_LEAF', 'INSERT_POST')""", start, end):
        found = BLOCK.search(r["block_ref"] or "")
        if found and found.group(1) == database and found.group(2) in names:
            entries[names[found.group(2)]] += 1
    return entries


async def test_a_run_writes_only_the_index_entries_its_transitions_need(connect: Any) -> None:
    admin = await connect()
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    n = 50
    lsn = "SELECT pg_current_wal_insert_lsn()::text"

    start = await admin.fetchval(lsn)
    await admin.execute("SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
                        json.dumps([{"payload": {"i": i}} for i in range(n)]))
    enqueued = await admin.fetchval(lsn)
    claimed = await admin.fetch("""SELECT * FROM zeroth.claim_and_start(deployment_ref => 'd',
                                       worker_id => 'w', batch_size => $1)""", n)
    assert len(claimed) == n
    started = await admin.fetchval(lsn)
    done = await admin.fetch(
        """SELECT * FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1,
                                              generations => $2)""",
        [c["run_id"] for c in claimed], [c["lease_generation"] for c in claimed])
    assert len(done) == n
    assert all(d["completed"] for d in done)
    end = await admin.fetchval(lsn)
    # pg_walinspect reads flushed WAL only: one commit that waits for its flush.
    await admin.execute("SET synchronous_commit = on")
    await admin.execute("SELECT pg_logical_emit_message(true, 'zeroth-test', 'flush')")

    enqueue = await _index_entries(admin, start, enqueued)
    claim = await _index_entries(admin, enqueued, started)
    complete = await _index_entries(admin, started, end)
    report = {"enqueue": dict(enqueue), "claim": dict(claim), "complete": dict(complete)}
    save_report("hot_path_index_entries", report)
    assert dict(enqueue) == {"runs_pkey": n, "runs_claim_pending_idx": n,
                             "runs_created_not_running_idx": n}, report
    # The claim makes the runs running: their pending entries stay for VACUUM, the new row
    # versions need the key and the running index only.
    assert dict(claim) == {"runs_pkey": n, "runs_running_idx": n}, report
    # A completion at the first claim keeps its attempt in the runs row (migration 0022): no row
    # of zeroth.run_attempt_log, no entry of its index; readers still see the attempt. No index
    # on run_id alone: runs_pkey leads with it (migration 0023).
    assert dict(complete) == {"runs_pkey": n, "runs_finished_idx": n,
                              "runs_created_not_running_idx": n}, report
    assert sum((enqueue + claim + complete).values()) == 8 * n
    assert await admin.fetchval(
        """SELECT count(*) FROM zeroth.run_attempts
            WHERE run_id = ANY ($1::uuid[]) AND worker_id = 'w' AND outcome = 'completed'
              AND lease_generation = 1 AND attempt = 1""", [c["run_id"] for c in claimed]) == n


async def _heap_records(admin: asyncpg.Connection, start: str, end: str) -> Counter[str]:
    """Heap WAL records of zeroth.runs of this database between two WAL positions, by type."""
    node = await admin.fetchval(
        "SELECT relfilenode FROM pg_class WHERE oid = 'zeroth.runs'::regclass")
    database = str(await admin.fetchval(
        "SELECT oid FROM pg_database WHERE datname = current_database()"))
    found: Counter[str] = Counter()
    for r in await admin.fetch(
            """SELECT record_type, block_ref
                 FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                WHERE resource_manager = 'Heap'""", start, end):
        block = BLOCK.search(r["block_ref"] or "")
        if block and block.groups() == (database, str(node)):
            found[r["record_type"].split("+")[0]] += 1
    return found


async def test_an_enqueue_without_a_key_inserts_without_speculation(connect: Any) -> None:
    """A run with no idempotency key and no run_id of its own cannot conflict: enqueue_run and
    enqueue_runs insert it plainly, without the speculative insertion of ON CONFLICT and its
    HEAP_CONFIRM record per run (issue 30, item 3); a run with a key still goes through ON
    CONFLICT and a repeated key still returns the first run."""
    admin = await connect()
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    lsn = "SELECT pg_current_wal_insert_lsn()::text"
    n = 20
    start = await admin.fetchval(lsn)
    for _ in range(n):
        await admin.execute("SELECT * FROM zeroth.enqueue_run(deployment_ref => 'd')")
    await admin.execute("SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
                        json.dumps([{"payload": {"i": i}} for i in range(n)]))
    plain = await admin.fetchval(lsn)
    first = await admin.fetchrow(
        "SELECT * FROM zeroth.enqueue_run(deployment_ref => 'd', idempotency_key => 'k1')")
    again = await admin.fetchrow(
        "SELECT * FROM zeroth.enqueue_run(deployment_ref => 'd', idempotency_key => 'k1')")
    batch = await admin.fetch(
        "SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
        json.dumps([{"idempotency_key": "k2"}, {"idempotency_key": "k1"}, {},
                    {"idempotency_key": "k2"}]))
    end = await admin.fetchval(lsn)
    await admin.execute("SET synchronous_commit = on")
    await admin.execute("SELECT pg_logical_emit_message(true, 'zeroth-test', 'flush')")

    assert first["created"]
    assert not again["created"]
    assert again["run_id"] == first["run_id"]
    assert [r["created"] for r in batch] == [True, False, True, False]
    assert batch[1]["run_id"] == first["run_id"]
    assert batch[3]["run_id"] == batch[0]["run_id"]
    without_key = await _heap_records(admin, start, plain)
    with_key = await _heap_records(admin, plain, end)
    save_report("enqueue_heap_records", {"without_key": dict(without_key),
                                         "with_key": dict(with_key)})
    assert without_key["INSERT"] == 2 * n, without_key
    assert without_key["HEAP_CONFIRM"] == 0, without_key
    # k1, k2 and the batch's keyless item are new; every keyed insert confirms its row.
    assert with_key["INSERT"] == 3, with_key
    assert with_key["HEAP_CONFIRM"] == 2, with_key
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 2 * n + 3


async def add_runs(connection: asyncpg.Connection) -> None:
    """RUNS runs over 30 days: 3 tenants, each with a default workspace and one named one, 7
    deployments, 65% completed, 10% failed, 5% cancelled, 15% pending, 5% waiting (a few of
    them, RUNNING, running instead); one in ten finished ones on a thread."""
    await connection.execute(
        """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, thread_id,
                                    status, run_after, attempts, created_at, updated_at,
                                    started_at, finished_at, idempotency_key, lease_generation,
                                    lease_worker_id, lease_acquired_at, lease_expires_at)
           SELECT gen_random_uuid(), 't' || (g % 3), CASE WHEN g % 5 = 0 THEN 'ws' END,
                  'd' || (g % 7),
                  CASE WHEN g % 10 = 1 AND s.st NOT IN ('pending', 'running', 'waiting')
                       THEN 'th-' || (g % 1000) END,
                  s.st::zeroth.run_status, t, 1, t, t, t,
                  CASE WHEN s.st NOT IN ('pending', 'running', 'waiting') THEN t END,
                  'k' || g, 1,
                  CASE WHEN s.st = 'running' THEN 'w' END,
                  CASE WHEN s.st = 'running' THEN t END,
                  CASE WHEN s.st = 'running' THEN t + interval '1 hour' END
             FROM generate_series(1, $1) AS g,
                  LATERAL (SELECT clock_timestamp() - interval '30 days'
                                  + g * (interval '30 days' / $1) AS t,
                                  CASE WHEN g % 20 < 13 THEN 'completed'
                                       WHEN g % 20 < 15 THEN 'failed'
                                       WHEN g % 20 = 15 THEN 'cancelled'
                                       WHEN g % 20 = 16 AND g % ($1 / $2) = 16 THEN 'running'
                                       WHEN g % 20 = 16 THEN 'waiting'
                                       ELSE 'pending' END AS st) AS s""", RUNS, RUNNING)


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(n for child in plan.get("Plans", []) for n in nodes(child))]


async def explain(connection: asyncpg.Connection, sql: str, args: list[Any]
                  ) -> tuple[dict[str, Any], str]:
    raw = await connection.fetchval(
        f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}", *args)
    text = "\n".join(r[0] for r in await connection.fetch(
        f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, COSTS OFF) {sql}", *args))
    return json.loads(raw)[0]["Plan"], text


@pytest.mark.slow
async def test_pages_and_run_lookups_read_through_indexes_before_and_after_analyze(
        connect: Any) -> None:
    owner = await connect()
    await owner.execute("ALTER TABLE zeroth.runs SET (autovacuum_enabled = off)")
    await add_runs(owner)
    rows = await owner.fetch(
        """SELECT r.run_id, r.created_at, r.tenant_id FROM zeroth.runs r
            WHERE r.status IN ('completed', 'running') ORDER BY r.created_at
           OFFSET $1 LIMIT 1""", RUNS // 3)
    one, middle = rows[0]["run_id"], rows[0]["created_at"]
    running = await owner.fetchval(
        "SELECT run_id FROM zeroth.runs WHERE status = 'running' ORDER BY created_at LIMIT 1")
    assert await owner.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE status = 'running'") == RUNNING
    cursor = (middle, one)
    limit = PAGE_SIZE + 1
    later = await owner.fetchval("SELECT $1::timestamptz + interval '1 day'", middle)
    shapes: dict[str, tuple[str, list[Any]]] = {
        "runs page: first": run_page_query({}, None, limit),
        "runs page: after a cursor": run_page_query({}, cursor, limit),
        "runs page: status failed": run_page_query({"status": "failed"}, None, limit),
        "runs page: status running": run_page_query({"status": "running"}, None, limit),
        "runs page: deployment d3": run_page_query({"deployment": "d3"}, None, limit),
        "runs page: time range": run_page_query({"since": middle, "until": later}, None, limit),
        "runs page: run id": run_page_query({"search": str(one)}, None, limit),
        "runs page: run id, running": run_page_query({"search": str(running)}, None, limit),
        "runs page: unknown run id": run_page_query({"search": str(uuid.uuid4())}, None, limit),
        "run page (web _RUN)": (_run_query(), [one]),
        "zeroth-pg runs list": (_calls.LIST_RUNS, [None, None, None, None, 50]),
        "zeroth-pg runs show": (_calls.FIND_RUN, [one, None, None]),
    }
    report: list[str] = []
    for analyzed in (False, True):
        if analyzed:
            await owner.execute("ANALYZE zeroth.runs")
        else:
            assert await owner.fetchval(
                """SELECT last_analyze IS NULL AND last_autoanalyze IS NULL
                     FROM pg_stat_user_tables WHERE relid = 'zeroth.runs'::regclass""")
        # A zeroth_reader's row-level security makes its tenant a constant of every plan: the
        # lookups by id alone as one (its own tenant's run and another's).
        readers = {f"{name}, as a zeroth_reader of t1": shape for name, shape in shapes.items()
                   if "run id" in name or name.startswith(("run page", "zeroth-pg runs show"))}
        for name, (sql, args) in {**shapes, **readers}.items():
            key = f"{name} ({'analyzed' if analyzed else 'never analyzed'})"
            transaction = owner.transaction()
            await transaction.start()
            try:
                if name.startswith("runs page"):
                    await owner.execute(PAGE_SETTINGS)  # as the dashboard runs them
                if "zeroth_reader" in name:
                    await owner.execute("SET LOCAL ROLE zeroth_reader")
                    await owner.execute("SET LOCAL zeroth.tenant_id = 't1'")
                plan, text = await explain(owner, sql, args)
            finally:
                await transaction.rollback()
            report.append(f"-- {key}\n{sql}\n{text}\n")
            found = nodes(plan)
            kinds = {n["Node Type"] for n in found}
            indexes = {n.get("Index Name") for n in found} - {None}
            buffers = int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
            assert "Seq Scan" not in kinds, (key, text)
            sorted_rows = max((int(c["Actual Rows"]) for n in found
                               if n["Node Type"] in ("Sort", "Incremental Sort")
                               for c in n["Plans"]), default=0)
            if "run id" in name or name.startswith(("run page", "zeroth-pg runs show")):
                # One probe of runs_pkey (run_id, tenant_id, workspace_key), whatever the run's
                # status, the number of scopes and the statistics (zeroth_pg._calls.run_by_id);
                # a zeroth_reader's tenant (a constant of its plan) is the key's second column.
                assert indexes == {"runs_pkey"}, (key, text)
                assert buffers < 20, (key, buffers, text)
            elif name.endswith("status running"):
                assert indexes == {"runs_running_idx"}, (key, text)
                assert sorted_rows <= RUNNING, (key, text)
                assert buffers < 2 * RUNNING, (key, buffers, text)
            else:
                # A page of the runs that are not running (a walk of the index, never sorted)
                # and at most the running runs, sorted.
                assert "runs_created_not_running_idx" in indexes, (key, text)
                assert sorted_rows <= RUNNING, (key, text)
                assert buffers < 2 * RUNNING + 20 * PAGE_SIZE, (key, buffers, text)
    save_report("hot_path_indexes", {"plans": report})


def _run_query() -> str:
    from zeroth_pg.web import app

    return app._RUN


async def test_zeroth_runs_has_no_before_row_update_trigger(conn: asyncpg.Connection) -> None:
    """A BEFORE ROW UPDATE trigger, whatever its WHEN, makes every UPDATE of a run lock the row
    first to hand the trigger its latest version: a heap LOCK record (54 bytes of WAL) on every
    claim and completion that had not locked the row itself (issue 30). runs_kept_attempt_to_log
    is an AFTER trigger."""
    before = await conn.fetch(
        """SELECT tgname FROM pg_trigger
            WHERE tgrelid = 'zeroth.runs'::regclass AND NOT tgisinternal
              AND tgtype & 2 <> 0 AND tgtype & 16 <> 0 AND tgtype & 1 <> 0""")
    assert [r["tgname"] for r in before] == []


async def _runs_heap_locks(admin: asyncpg.Connection, start: str, end: str) -> tuple[int, int, int]:
    """Heap LOCK records of zeroth.runs of this database between two WAL positions, its UPDATE
    records, and those of them whose new version went to another page (two block references:
    heap_update logs a lock of the old version before it lets go of its page)."""
    node = str(await admin.fetchval(
        "SELECT relfilenode FROM pg_class WHERE oid = 'zeroth.runs'::regclass"))
    database = str(await admin.fetchval(
        "SELECT oid FROM pg_database WHERE datname = current_database()"))
    locks = updates = crossed = 0
    for r in await admin.fetch(
            """SELECT record_type, block_ref
                 FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                WHERE resource_manager = 'Heap'""", start, end):
        blocks = BLOCK.findall(r["block_ref"] or "")
        if not blocks or blocks[0] != (database, node):
            continue
        kind = r["record_type"].split("+")[0]
        if kind == "LOCK":
            locks += 1
        elif kind in ("UPDATE", "HOT_UPDATE"):
            updates += 1
            crossed += len(blocks) > 1
    return locks, updates, crossed


async def test_a_completion_and_a_claim_write_one_heap_lock_record_each(connect: Any) -> None:
    """The worker at concurrency 1 completes one run a call (complete_and_claim, complete_runs,
    settle_runs). A completion locks its run first (zeroth._lock_settle: the fence judges the
    lease by the clock read once it holds the row) and the claim locks its runs FOR UPDATE SKIP
    LOCKED: one heap LOCK record each, and no more (no BEFORE trigger on zeroth.runs making an
    UPDATE lock the row again), but for an update whose new version goes to another page, which
    heap_update itself logs as a lock. Every completion lands and its attempt is recorded."""
    admin = await connect()
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    lsn = "SELECT pg_current_wal_insert_lsn()::text"
    n = 30
    await admin.execute("SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
                        json.dumps([{"payload": {"i": i}} for i in range(2 * n + 1)]))
    claimed = await admin.fetch("""SELECT * FROM zeroth.claim_and_start(deployment_ref => 'd',
                                       worker_id => 'w', batch_size => $1)""", 2 * n)
    start = await admin.fetchval(lsn)
    for c in claimed[:n]:
        done = await admin.fetch(
            """SELECT * FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1,
                                                  generations => $2)""",
            [c["run_id"]], [c["lease_generation"]])
        assert [d["completed"] for d in done] == [True]
    for c in claimed[n:]:
        done = await admin.fetch(
            """SELECT * FROM zeroth.settle_runs(worker_id => 'w', run_ids => $1,
                                                generations => $2, outcomes => '{complete}')""",
            [c["run_id"]], [c["lease_generation"]])
        assert [d["outcome"] for d in done] == ["completed"]
    completed = await admin.fetchval(lsn)
    # As the worker: each completion carries the next claim.
    first = await admin.fetchrow("""SELECT * FROM zeroth.claim_and_start(deployment_ref => 'd',
                                        worker_id => 'w2')""")
    await admin.execute("SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
                        json.dumps([{} for _ in range(n)]))
    paired = await admin.fetchval(lsn)
    current = (first["run_id"], first["lease_generation"])
    for _ in range(n):
        rows = await admin.fetch(
            """SELECT x.completed, (x.claimed).run_id, (x.claimed).lease_generation
                 FROM zeroth.complete_and_claim(deployment_ref => 'd', worker_id => 'w2',
                                                run_ids => $1, generations => $2) x""",
            [current[0]], [current[1]])
        assert rows[0]["completed"] == [True]
        current = (rows[0]["run_id"], rows[0]["lease_generation"])
    end = await admin.fetchval(lsn)
    await admin.execute("SET synchronous_commit = on")
    await admin.execute("SELECT pg_logical_emit_message(true, 'zeroth-test', 'flush')")

    alone = await _runs_heap_locks(admin, start, completed)
    with_claims = await _runs_heap_locks(admin, paired, end)
    save_report("single_completion_heap_locks", {"completions alone": alone,
                                                  "complete_and_claim": with_claims})
    locks, updates, crossed = alone
    assert updates == 2 * n, alone
    assert locks == 2 * n + crossed, alone  # each completion's own lock of its run
    locks, updates, crossed = with_claims
    assert updates == 2 * n, with_claims  # n completions, n claims
    assert locks == 2 * n + crossed, with_claims  # a completion's lock and a claim's
    assert await admin.fetchval(
        """SELECT count(*) FROM zeroth.run_attempts
            WHERE run_id = ANY ($1::uuid[]) AND outcome = 'completed'""",
        [c["run_id"] for c in claimed]) == 2 * n


def _incompressible(length: int) -> str:
    return "".join(uuid.uuid4().hex for _ in range(length // 32 + 1))[:length]


async def test_a_claim_and_a_completion_do_not_log_the_payload(connect: Any) -> None:
    """The columns no claim nor completion writes (the payload, the metadata…) are the last of the
    runs row (migration 0024), so both non-HOT updates leave them out of their WAL record: a new
    version on the same page logs only the bytes between the first and the last byte that differ
    from the old one (prefix/suffix compression). With a 1,200-byte payload and 300 bytes of
    metadata (random text, under the TOAST threshold: stored in the row, uncompressed), each such
    UPDATE record of zeroth.runs stays a few hundred bytes; before, both carried the payload and
    the metadata (about 1.7 kB each: 3.4 kB of WAL a run)."""
    admin = await connect()
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    lsn = "SELECT pg_current_wal_insert_lsn()::text"
    n = 10
    await admin.execute(
        "SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', runs => $1)",
        json.dumps([{"payload": {"i": i, "text": _incompressible(1200)},
                     "metadata": {"m": _incompressible(300)}} for i in range(n)]))
    start = await admin.fetchval(lsn)
    claimed = await admin.fetch("""SELECT * FROM zeroth.claim_and_start(deployment_ref => 'd',
                                       worker_id => 'w', batch_size => $1)""", n)
    for c in claimed:
        done = await admin.fetch(
            """SELECT * FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1,
                                                  generations => $2)""",
            [c["run_id"]], [c["lease_generation"]])
        assert [d["completed"] for d in done] == [True]
    end = await admin.fetchval(lsn)
    await admin.execute("SET synchronous_commit = on")
    await admin.execute("SELECT pg_logical_emit_message(true, 'zeroth-test', 'flush')")

    node = str(await admin.fetchval(
        "SELECT relfilenode FROM pg_class WHERE oid = 'zeroth.runs'::regclass"))
    database = str(await admin.fetchval(
        "SELECT oid FROM pg_database WHERE datname = current_database()"))
    sizes = []
    for r in await admin.fetch(
            """SELECT record_type, record_length, fpi_length, block_ref
                 FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
                WHERE resource_manager = 'Heap' AND record_type LIKE 'UPDATE%'""", start, end):
        blocks = BLOCK.findall(r["block_ref"] or "")
        # Same page and no full-page image: where the compression applies.
        if blocks == [(database, node)] and not r["fpi_length"]:
            sizes.append(int(r["record_length"]))
    save_report("update_record_sizes_with_a_payload", {"sizes": sizes})
    # How many of the 2n updates stay on their page depends on where the versions land: rows
    # this big (about 1.7 kB) fit three to a page under fillfactor 70, and a batch claim of a
    # page's three runs keeps the first new version there and moves the others to a page of
    # their own, whole (1,774-byte records on PostgreSQL 15: 6 and 14 of 20 same-page updates in
    # two runs). Those that stay are what this asserts: none logs the payload.
    assert len(sizes) >= 2, sizes
    assert max(sizes) < 400, sizes
    assert await admin.fetchval(
        """SELECT count(*) FROM zeroth.runs WHERE status = 'completed'
              AND length(payload ->> 'text') = 1200 AND length(metadata ->> 'm') = 300""") == n


async def test_the_pages_settings_turn_jit_off_with_the_sequential_scan(connect: Any) -> None:
    """Before PostgreSQL 18 a statement that cannot avoid the scan PAGE_SETTINGS turns off is
    costed at 1e10 and, where the server has LLVM, JIT-compiled at each execution: the same
    transaction-local settings turn JIT off (docs/performance.md, "JIT")."""
    conn = await connect()
    async with conn.transaction():
        await conn.execute(PAGE_SETTINGS)
        assert await conn.fetchval("SELECT current_setting('enable_seqscan')") == "off"
        assert await conn.fetchval("SELECT current_setting('jit')") == "off"
    assert await conn.fetchval("SELECT current_setting('enable_seqscan')") == "on"  # LOCAL
