"""Every zeroth.* function reads in proportion to its work once the table has grown under a
session whose plans were cached while it was small (the audit that followed issue 13).

test_generic_plans.py pins the batch UPDATEs of the claim, renew_leases and complete_runs; this
module makes the same worst case for every public function and the internal paths they reach
(the admissions, the cancels and takeovers, the thread-finished trigger). One session with
plan_cache_mode = force_generic_plan and autovacuum off for the tables (an ANALYZE would
invalidate the cached plans and hide the bug) works three cycles that call every function on
every path on a small table. Another session then grows the database, and the first session works
one more cycle, each call in its own transaction, and counts what the call read:

* tuples: the tuples zeroth.runs and zeroth.admission_slots returned to sequential scans plus the
  entries their indexes returned (pg_stat_get_xact_tuples_returned; the table-level
  tuples_fetched counter stays 0 for index scans);
* blocks: the most buffers the call requested from any one of those tables or indexes
  (pg_stat_get_xact_blocks_fetched). A walk that an index condition filters inside the index
  returns nothing, but it still reads the index's pages.

Both stay under a bound proportional to the runs the call was asked to handle, far below any walk
of what the growth added. Two growths, so that every walk shows:

* history: 30,000 finished runs in the worker's own scope and deployment, a third of them in the
  thread the cycle uses and a third with idempotency keys (what complete_run leaves).
* live_work: work of other deployments and threads in the same scope: 3,000 running runs held by
  another worker, 1,000 threads with an active run and 20 queued runs each, and 100 deployments'
  admission slots (10,000 slot rows).

The finished and queued runs are written by one set-based INSERT each, shaped like what the
functions leave (the only direct writes to zeroth.runs, to build volume fast); the running runs
and the slots come from the API.

What the audit found with cached generic plans (per call, before → after the fix):

* enqueue_run returning the run of a repeated key or run_id, enqueue_runs for each such item, and
  _admission_reuse (enqueue_run / enqueue_runs with a thread_id, admit_run with a key or run_id):
  an OR of "same key" and "same run_id" is no index condition, and the plan filtered the whole
  scope through runs_pkey: 30,084 tuples → 2 (enqueue_runs with two repeated items and a thread
  item, four lookups: 120,384 → 4; admit_run and a queued enqueue_run look twice: 60,198 → 4).
* complete_run, fail_run, pause_run, update_run_progress, save_checkpoint, hand_back_to_pending,
  expire_recovery_lease: `status = 'running'` in the fenced UPDATE let the plan reach the run
  through runs_running_idx and walk every running run of the scope: 3,016 tuples → 2.
* the thread-finished trigger path (_promote_thread_head): `thread_queued_at IS NOT NULL` let the
  UPDATE of the promoted run walk runs_thread_queue_idx, every queued run of the scope: 247
  blocks of that index → at most 25 of any relation (6 tuples either way: only the block count
  sees a walk that returns one entry).
* complete_runs: locking the slots joined by filter walked every slot of the scope through
  admission_slots_pkey: 10,020 tuples (10,008 of them slot rows) → 19 (no slot row read).
* reconcile_thread_runs: on a small table runs_thread_idx (every run of every thread) costs the
  same as runs_thread_active_idx, and the cached plan walked the threads' history: 10,050 tuples
  → 10; with 1,001 active thread runs to look at, 21,052 → 1,006.

* enqueue_runs with a thread item, on PostgreSQL 15 only: the lookup of the threads' active runs
  by `thread_id = ANY (array)` put only the scope in runs_thread_active_idx's index condition and
  filtered every active thread run of the scope (live_work: 1,004 tuples, 687 blocks → 14 tuples
  for the 14 items); now one probe per thread (issue 30).

Runs on the session's server (PostgreSQL 18, embedded). To run it on PostgreSQL 15, point
ZEROTH_PG_TEST_DSN at a superuser DSN of a 15 server; as root, start one as the postgres OS user
(/usr/lib/postgresql/15/bin: `runuser -u postgres -- initdb -D DIR -U postgres --auth=trust`, then
`runuser -u postgres -- pg_ctl -D DIR -o "-p PORT -k DIR" -w start`). Every module of tests/plans
passes on both, on a server with no other work (the suite runs serially on a server it is given:
a transaction open in another database of it keeps on-access pruning from removing what these
tests count as read; tests/conftest.py, _one_process).

The counts move a little from run to run (an index probe also returns the versions of its row
that no scan has marked dead yet), so the bounds leave room; every walk is far above them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from helpers import save_report

DEPLOYMENT = "d"
WORKER = "w"
THREAD = "t1"
FINISHED = 30_000
RUNNING = 3_000
QUEUE_THREADS = 1_000
QUEUED_PER_THREAD = 20
SLOT_DEPLOYMENTS = 100
SLOTS_PER_DEPLOYMENT = 100
# The cycle's own max_concurrency: a claim under it looks at every slot of the deployment.
SLOTS = 8
# Per run (or slot) a call handles: the lookups, row locks and writes of that run, each probe
# returning every version of its row that autovacuum (off) has not removed; per call: the thread
# and slot bookkeeping around them. A walk of the growth reads thousands of tuples, or hundreds of
# blocks of one index.
TUPLES_PER_RUN = 12
TUPLES_PER_CALL = 48
BLOCKS_PER_RUN = 12
BLOCKS_PER_CALL = 48

TABLES = ("zeroth.runs", "zeroth.admission_slots")
# What this transaction read so far: per table or index, tuples returned and blocks requested.
COUNTERS = """SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) AS tuples,
                     pg_stat_get_xact_blocks_fetched(c.oid) AS blocks
                FROM pg_class c
               WHERE c.oid = ANY ($1::text[]::regclass[])
                  OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                WHERE i.indrelid = ANY ($1::text[]::regclass[]))"""


@dataclass
class Reading:
    work: int
    tuples: int
    blocks: int
    relation: str

    def within_bounds(self) -> bool:
        return (self.tuples <= TUPLES_PER_RUN * self.work + TUPLES_PER_CALL
                and self.blocks <= BLOCKS_PER_RUN * self.work + BLOCKS_PER_CALL)


@dataclass
class Worker:
    """The measured session. Calls run as they are until `measuring`; then each call runs in its
    own transaction and what it read is recorded under its name."""

    session: asyncpg.Connection
    admin: asyncpg.Connection
    measuring: bool = False
    readings: dict[str, Reading] = field(default_factory=dict)

    async def call(self, name: str, query: str, *args: Any, work: int = 1) -> list[Any]:
        if not self.measuring:
            return list(await self.session.fetch(query, *args))
        async with self.session.transaction():
            before = await self._counters()
            rows = await self.session.fetch(query, *args)
            after = await self._counters()
        tuples = sum(after[r][0] - before.get(r, (0, 0))[0] for r in after)
        blocks, relation = max((after[r][1] - before.get(r, (0, 0))[1], r) for r in after)
        assert name not in self.readings, name
        self.readings[name] = Reading(work, tuples, blocks, relation)
        return list(rows)

    async def run(self, query: str, *args: Any) -> list[Any]:
        """A call that only sets up the next one: never measured."""
        return list(await self.session.fetch(query, *args))

    async def _counters(self) -> dict[str, tuple[int, int]]:
        rows = await self.session.fetch(COUNTERS, list(TABLES))
        return {row["relname"]: (row["tuples"], row["blocks"]) for row in rows}


def fence(lease: dict[uuid.UUID, int], run_id: uuid.UUID) -> tuple[uuid.UUID, str, int]:
    return run_id, WORKER, lease[run_id]


FENCED = "(run_id => $1, worker_id => $2, generation => $3)"


async def running(w: Worker) -> int:
    """The running runs of the deployment: what a claim_orphaned scan looks at to find the
    expired ones (there is no index on the expiry)."""
    return int(await w.admin.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'running'",
        DEPLOYMENT))


async def cycle(w: Worker, i: int, grown: bool) -> None:
    """Every function on every path; the same statements in every cycle."""
    d, key = DEPLOYMENT, f"k{i}"
    # A key that exists already: one of the finished history's once it has grown.
    old_key = "g-2" if grown else f"{key}-a"

    # -- enqueue: new, repeated key, repeated run_id, a batch with all of them and a thread
    await w.call("enqueue_run", "SELECT * FROM zeroth.enqueue_run(deployment_ref => $1)", d)
    enqueue_key = "SELECT * FROM zeroth.enqueue_run(deployment_ref => $1, idempotency_key => $2)"
    await w.call("enqueue_run (new key)", enqueue_key, d, f"{key}-a")
    await w.call("enqueue_run (repeated key)", enqueue_key, d, old_key)
    chosen = uuid.uuid4()
    enqueue_id = "SELECT * FROM zeroth.enqueue_run(deployment_ref => $1, run_id => $2)"
    await w.run(enqueue_id, d, chosen)
    await w.call("enqueue_run (repeated run_id)", enqueue_id, d, chosen)
    items: list[dict[str, Any]] = [{"payload": {"n": n}} for n in range(10)]
    items += [{"idempotency_key": f"{key}-b"}, {"idempotency_key": old_key},
              {"run_id": str(chosen)}, {"thread_id": f"t2-{i}", "idempotency_key": f"{key}-c"}]
    await w.call("enqueue_runs", """SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1,
                                         runs => $2::text::jsonb)""",
                 d, json.dumps(items), work=len(items))
    pending = await w.admin.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'pending'", d)
    await w.call("count_pending", "SELECT zeroth.count_pending(deployment_ref => $1)", d,
                 work=pending)
    # The listed scopes only: with tenant_ids NULL it is the skip scan of every pending scope
    # that claim_and_start_scopes makes too (one probe per scope, not per run of `d`).
    await w.call("count_pending_scopes", """SELECT * FROM zeroth.count_pending_scopes(
                     deployment_refs => ARRAY[$1], tenant_ids => ARRAY['default'])""", d,
                 work=pending)

    # -- the thread: admitted, queued, reused, busy, listed
    thread_enqueue = """SELECT * FROM zeroth.enqueue_run(deployment_ref => $1, thread_id => $2,
                            idempotency_key => $3)"""
    head = (await w.call("enqueue_run (thread, idle)", thread_enqueue, d, THREAD, None))[0]
    await w.call("enqueue_run (thread, busy: queued)", thread_enqueue, d, THREAD, f"{key}-t")
    await w.call("enqueue_run (thread, repeated key)", thread_enqueue, d, THREAD, f"{key}-t")
    await w.call("admit_run (reject: busy)", """SELECT * FROM zeroth.admit_run(
                     deployment_ref => $1, thread_id => $2, idempotency_key => $3)""",
                 d, THREAD, f"{key}-u")
    await w.call("admit_run (enqueue)", """SELECT * FROM zeroth.admit_run(deployment_ref => $1,
                     thread_id => $2, strategy => 'enqueue', idempotency_key => $3)""",
                 d, THREAD, f"{key}-v")
    await w.call("list_thread_runs", "SELECT * FROM zeroth.list_thread_runs(thread_id => $1)",
                 THREAD, work=20)
    await w.call("get_thread_run", "SELECT * FROM zeroth.get_thread_run(run_id => $1)",
                 head["run_id"])

    # -- claim everything due; the head of the thread is asked to stop by an interrupt
    claim_all = """SELECT * FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => $2,
                       batch_size => 1000)"""
    due = await w.admin.fetchval(
        """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'pending'
               AND run_after <= clock_timestamp()""", d)
    claimed = await w.call("claim_and_start", claim_all, d, WORKER, work=due)
    lease = {row["run_id"]: row["lease_generation"] for row in claimed if row["run_id"]}
    assert head["run_id"] in lease
    admitted = (await w.call("admit_run (interrupt)", """SELECT * FROM zeroth.admit_run(
                                 deployment_ref => $1, thread_id => $2, strategy => 'interrupt',
                                 worker_id => 'w2')""", d, THREAD, work=4))[0]
    assert admitted["outcome"] == "queued", admitted
    ids = list(lease)
    await w.call("renew_leases", """SELECT * FROM zeroth.renew_leases(worker_id => $1,
                     run_ids => $2, generations => $3)""",
                 WORKER, ids, [lease[x] for x in ids], work=len(ids))
    await w.call("renew_lease", f"SELECT zeroth.renew_lease{FENCED}", *fence(lease, ids[0]))
    await w.call("complete_run (thread: promotes its queue)",
                 f"SELECT zeroth.complete_run{FENCED}", *fence(lease, head["run_id"]), work=2)
    del lease[head["run_id"]]

    # -- one run per path of the lease holder's and the operator's calls
    threaded = {row["run_id"] for row in claimed if row["thread_id"]}
    plain = [x for x in lease if x not in threaded]
    (done, retried, failed, cancelled, paused, released, handed, expired, cleared,
     asked) = plain[:10]
    rest = [x for x in lease if x not in plain[:10]]
    await w.call("commit_fenced", """SELECT zeroth.commit_fenced(run_id => $1, worker_id => $2,
                     generation => $3, columns => '{"output": {"x": 1}}')""", *fence(lease, done))
    await w.call("update_run_progress", """SELECT zeroth.update_run_progress(run_id => $1,
                     worker_id => $2, generation => $3, progress => '{"p": 1}')""",
                 *fence(lease, done))
    await w.call("save_checkpoint", """SELECT zeroth.save_checkpoint(run_id => $1,
                     worker_id => $2, generation => $3, data => '{"c": 1}')""",
                 *fence(lease, done))
    await w.call("start_run (already running)", f"SELECT zeroth.start_run{FENCED}",
                 *fence(lease, done))
    for read in ("current_generation", "current_holder", "get_recovery_checkpoint_id"):
        await w.call(read, f"SELECT zeroth.{read}(run_id => $1)", done)
    await w.call("complete_run (fenced out)", f"SELECT zeroth.complete_run{FENCED}",
                 done, WORKER, lease[done] + 5)
    await w.call("complete_run", f"SELECT zeroth.complete_run{FENCED}", *fence(lease, done))
    await w.call("fail_run (retryable)", """SELECT zeroth.fail_run(run_id => $1, worker_id => $2,
                     generation => $3, retry_base_seconds => 3600, retry_max_seconds => 3600)""",
                 *fence(lease, retried))
    await w.call("fail_run (not retryable)", """SELECT zeroth.fail_run(run_id => $1,
                     worker_id => $2, generation => $3, retryable => false)""",
                 *fence(lease, failed))
    await w.call("redrive_run", "SELECT zeroth.redrive_run(run_id => $1)", failed)
    await w.call("cancel_run", f"SELECT zeroth.cancel_run{FENCED}", *fence(lease, cancelled))
    await w.call("pause_run", """SELECT zeroth.pause_run(run_id => $1, worker_id => $2,
                     generation => $3, reason => 'approval')""", *fence(lease, paused))
    await w.call("resume_run", "SELECT zeroth.resume_run(run_id => $1, input => '{}')", paused)
    await w.run("""SELECT zeroth.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
                       data => '{"c": 2}')""", *fence(lease, released))
    await w.call("release_lease (running)", f"SELECT zeroth.release_lease{FENCED}",
                 *fence(lease, released))
    await w.call("hand_back_to_pending", f"SELECT zeroth.hand_back_to_pending{FENCED}",
                 *fence(lease, handed))
    await w.call("expire_recovery_lease", f"SELECT zeroth.expire_recovery_lease{FENCED}",
                 *fence(lease, expired))
    await w.call("claim_for_takeover", """SELECT * FROM zeroth.claim_for_takeover(run_id => $1,
                     grace_seconds => 0)""", expired)
    await w.call("clear_lease", "SELECT zeroth.clear_lease(run_id => $1)", cleared)
    await w.call("request_cancel_v2 (taken over)", """SELECT * FROM zeroth.request_cancel_v2(
                     run_id => $1, grace_seconds => 0)""", cleared)
    await w.call("request_cancel_v2 (cancel requested)",
                 "SELECT * FROM zeroth.request_cancel_v2(run_id => $1)", asked)
    await w.call("request_cancel (terminal)", "SELECT zeroth.request_cancel(run_id => $1)", done)
    await w.call("request_cancel (unknown)", "SELECT zeroth.request_cancel(run_id => $1)",
                 uuid.uuid4())
    batch = [asked, *rest]
    await w.call("complete_runs", """SELECT * FROM zeroth.complete_runs(worker_id => $1,
                     run_ids => $2, generations => $3)""",
                 WORKER, batch, [lease[x] for x in batch], work=len(batch))

    # -- orphans: one re-leased with its checkpoint, one out of attempts, one not resumable
    last = (await w.run("""SELECT * FROM zeroth.enqueue_run(deployment_ref => $1,
                               max_attempts => 1)""", d))[0]["run_id"]
    lease = {row["run_id"]: row["lease_generation"]
             for row in await w.run(claim_all, d, WORKER) if row["run_id"]}
    await w.run(f"SELECT zeroth.release_lease{FENCED}", *fence(lease, last))
    del lease[last]
    own = (await w.run("""SELECT * FROM zeroth.admit_run(deployment_ref => $1, thread_id => $2,
                              worker_id => $3)""", d, f"t3-{i}", WORKER))[0]
    await w.run(f"SELECT zeroth.start_run{FENCED}", own["run_id"], WORKER,
                own["lease_generation"])
    await w.run(f"SELECT zeroth.expire_recovery_lease{FENCED}", own["run_id"], WORKER,
                own["lease_generation"])
    orphans = await w.call("claim_orphaned", """SELECT * FROM zeroth.claim_orphaned(
                               deployment_ref => $1, worker_id => $2, grace_seconds => 0)""",
                           d, WORKER, work=await running(w))
    lease.update({row["run_id"]: row["lease_generation"] for row in orphans if row["run_id"]})
    assert released in lease
    await w.call("get_recovery_checkpoint_id (recovered)",
                 "SELECT zeroth.get_recovery_checkpoint_id(run_id => $1)", released)
    ids = list(lease)
    await w.call("complete_runs (recovered)", """SELECT * FROM zeroth.complete_runs(
                     worker_id => $1, run_ids => $2, generations => $3)""",
                 WORKER, ids, [lease[x] for x in ids], work=len(ids))

    # -- one mixed batch ended by settle_runs (completion, retry, hand-back)
    for _ in range(3):
        await w.run("SELECT * FROM zeroth.enqueue_run(deployment_ref => $1)", d)
    mixed = {row["run_id"]: row["lease_generation"]
             for row in await w.run(claim_all, d, WORKER) if row["run_id"]}
    ids = list(mixed)
    await w.call("settle_runs", """SELECT * FROM zeroth.settle_runs(worker_id => $1,
                     run_ids => $2, generations => $3, outcomes => $4)""",
                 WORKER, ids, [mixed[x] for x in ids],
                 # as many outcomes as runs claimed: a run an earlier claim of this session
                 # passed over (the claim floor: sql/README.md) may be claimed here too
                 (["complete", "retry", "hand_back"] * len(ids))[:len(ids)], work=len(ids))

    # -- under max_concurrency
    for _ in range(4):
        await w.run("SELECT * FROM zeroth.enqueue_run(deployment_ref => $1)", d)
    claim_slotted = """SELECT * FROM zeroth.{}(deployment_ref => $1, worker_id => $2,
                           batch_size => $3, max_concurrency => $4)"""
    claimed = {name: [row for row in await w.call(
                   f"{name} (max_concurrency)", claim_slotted.format(name), d, WORKER, 2, SLOTS,
                   work=SLOTS + 2)
                   if row["run_id"]]
               for name in ("claim_pending", "claim_and_start")}
    lease = {row["run_id"]: row["lease_generation"] for rows in claimed.values() for row in rows}
    (first, given_back), (recovered, _) = ([row["run_id"] for row in rows]
                                           for rows in claimed.values())
    await w.call("start_run", f"SELECT zeroth.start_run{FENCED}", *fence(lease, first))
    await w.call("release_lease (pending)", f"SELECT zeroth.release_lease{FENCED}",
                 *fence(lease, given_back))
    del lease[given_back]
    await w.run(f"SELECT zeroth.expire_recovery_lease{FENCED}", *fence(lease, recovered))
    rows = await w.call("claim_orphaned (max_concurrency)", """SELECT * FROM
                            zeroth.claim_orphaned(deployment_ref => $1, worker_id => $2,
                            max_concurrency => $3)""", d, WORKER, SLOTS,
                        work=SLOTS + await running(w))
    rows += await w.call("claim_pending (max_concurrency, rest)", claim_slotted.format(
                             "claim_pending"), d, WORKER, 10, SLOTS, work=SLOTS + 3)
    lease.update({row["run_id"]: row["lease_generation"] for row in rows if row["run_id"]})
    await w.call("complete_run (slot freed)", f"SELECT zeroth.complete_run{FENCED}",
                 *fence(lease, first))
    del lease[first]
    for run_id in lease:
        await w.run(f"SELECT zeroth.start_run{FENCED}", *fence(lease, run_id))
    ids = list(lease)
    await w.call("complete_runs (slots freed)", """SELECT * FROM zeroth.complete_runs(
                     worker_id => $1, run_ids => $2, generations => $3)""",
                 WORKER, ids, [lease[x] for x in ids], work=len(ids))

    # -- the thread again: admit-and-own, rollback of its own run, reconcile, redrives
    own = (await w.call("admit_run (admit and own)", """SELECT * FROM zeroth.admit_run(
                            deployment_ref => $1, thread_id => $2, worker_id => $3,
                            idempotency_key => $4)""", d, THREAD, WORKER, f"{key}-o"))[0]
    assert own["outcome"] == "admitted", own
    await w.run(f"SELECT zeroth.start_run{FENCED}", own["run_id"], WORKER,
                own["lease_generation"])
    new = (await w.call("admit_run (rollback of its own run)", """SELECT * FROM zeroth.admit_run(
                            deployment_ref => $1, thread_id => $2, worker_id => $3,
                            strategy => 'rollback', owner_generation => $4)""",
                        d, THREAD, WORKER, own["lease_generation"], work=2))[0]
    assert new["outcome"] == "admitted", new
    await w.run(f"SELECT zeroth.start_run{FENCED}", new["run_id"], WORKER,
                new["lease_generation"])
    await w.run(f"SELECT zeroth.expire_recovery_lease{FENCED}", new["run_id"], WORKER,
                new["lease_generation"])
    # The pass looks at every active thread run of the scope: that is its work.
    active = await w.admin.fetchval(
        """SELECT count(*) FROM zeroth.runs WHERE thread_id IS NOT NULL
               AND status IN ('pending', 'running', 'waiting') AND thread_queued_at IS NULL""")
    await w.call("reconcile_thread_runs",
                 "SELECT * FROM zeroth.reconcile_thread_runs(grace_seconds => 0)", work=active)
    await w.call("redrive_run (thread idle)", "SELECT zeroth.redrive_run(run_id => $1)",
                 new["run_id"])
    await w.call("redrive_run (thread busy: queued)", "SELECT zeroth.redrive_run(run_id => $1)",
                 own["run_id"])
    await w.call("request_cancel (pending: promotes its queue)",
                 "SELECT zeroth.request_cancel(run_id => $1)", new["run_id"], work=2)
    await w.call("request_cancel_v2 (pending)",
                 "SELECT * FROM zeroth.request_cancel_v2(run_id => $1)", own["run_id"])

    # -- prune: the history is a day old; nothing in a cycle is
    prune = """SELECT zeroth.prune_runs(older_than => $1, batch_size => 100,
                   tenant_id => $2)"""
    # With statistics, as autovacuum gives them sooner or later (a loaded test machine got them
    # mid-test): the batch's DELETE was then planned as a hash join over every run.
    await w.admin.execute("ANALYZE zeroth.runs")
    await w.call("prune_runs (scope)", prune, timedelta(hours=1), "default", work=100)
    await w.call("prune_runs (every tenant)", prune, timedelta(hours=1), None, work=100)
    await w.call("prune_runs (nothing old enough)", prune, timedelta(days=30), None)

    # -- leave nothing held and the thread idle for the next cycle
    for row in await w.admin.fetch(
            """SELECT run_id, lease_generation, status FROM zeroth.runs
                WHERE lease_worker_id = $1 AND lease_expires_at > clock_timestamp()""", WORKER):
        fenced = (row["run_id"], WORKER, row["lease_generation"])
        if row["status"] == "pending":
            await w.run(f"SELECT zeroth.start_run{FENCED}", *fenced)
        await w.run(f"SELECT zeroth.complete_run{FENCED}", *fenced)
    for row in await w.admin.fetch(
            """SELECT run_id FROM zeroth.runs WHERE thread_id = $1
                  AND status IN ('pending', 'running', 'waiting')""", THREAD):
        await w.run("SELECT zeroth.request_cancel(run_id => $1)", row["run_id"])


async def grow_history(dsn: str) -> None:
    """FINISHED completed runs in the worker's scope and deployment, a third in THREAD and a
    third with idempotency keys g-<n>, written by another session."""
    other = await asyncpg.connect(dsn)
    try:
        await other.execute(
            """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, thread_id,
                                        idempotency_key, status, run_after, attempts, created_at,
                                        updated_at, started_at, finished_at, output,
                                        lease_generation)
               SELECT gen_random_uuid(), 'default', NULL, $1,
                      CASE WHEN g % 3 = 1 THEN $3 END, CASE WHEN g % 3 = 2 THEN 'g-' || g END,
                      'completed', t, 1, t, t + interval '2 s', t + interval '1 s',
                      t + interval '2 s', '{"ok": true}'::jsonb, 1
                 FROM generate_series(1, $2) AS g,
                      LATERAL (SELECT clock_timestamp() - interval '1 day'
                                      + g * interval '1 ms' AS t) AS s""",
            DEPLOYMENT, FINISHED, THREAD)
        assert await other.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE thread_id = $1", THREAD) >= FINISHED // 3
    finally:
        await other.close()


async def grow_live_work(dsn: str) -> None:
    """Work of other deployments and threads in the worker's scope, by another session: RUNNING
    running runs of another worker, QUEUE_THREADS threads each with an active run and
    QUEUED_PER_THREAD queued runs, and the admission slots of SLOT_DEPLOYMENTS deployments."""
    other = await asyncpg.connect(dsn)
    try:
        await other.execute(
            """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => 'busy',
                   runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, $1)))""",
            RUNNING)
        for _ in range(RUNNING // 1000):
            await other.execute(
                """SELECT count(*) FROM zeroth.claim_and_start(deployment_ref => 'busy',
                       worker_id => 'other', batch_size => 1000, lease_seconds => 3600)""")
        await other.execute(
            """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, thread_id,
                                        status, wait_reason, thread_queued_at, run_after,
                                        created_at, updated_at)
               SELECT gen_random_uuid(), 'default', NULL, 'queues', 'q' || t,
                      CASE WHEN n = 0 THEN 'pending' ELSE 'waiting' END::zeroth.run_status,
                      CASE WHEN n > 0 THEN 'thread_queue' END,
                      CASE WHEN n > 0 THEN at + n * interval '1 microsecond' END, at, at, at
                 FROM generate_series(1, $1) AS t, generate_series(0, $2) AS n,
                      LATERAL (SELECT clock_timestamp() AS at) AS s""",
            QUEUE_THREADS, QUEUED_PER_THREAD)
        for n in range(SLOT_DEPLOYMENTS):
            await other.execute(
                """SELECT count(*) FROM zeroth.claim_pending(deployment_ref => $1,
                       worker_id => 'other', max_concurrency => $2)""",
                f"slots-{n}", SLOTS_PER_DEPLOYMENT)
        assert await other.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE status = 'running'") >= RUNNING
        assert await other.fetchval("SELECT count(*) FROM zeroth.admission_slots") >= (
            SLOT_DEPLOYMENTS * SLOTS_PER_DEPLOYMENT)
    finally:
        await other.close()


GROWTHS = {"history": grow_history, "live_work": grow_live_work}


@pytest.fixture
async def worker(database_dsn: str) -> AsyncIterator[Worker]:
    admin = await asyncpg.connect(database_dsn)
    for table in (*TABLES, "zeroth.checkpoints"):
        await admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    session = await asyncpg.connect(database_dsn)
    try:
        await session.execute("SET plan_cache_mode = force_generic_plan")
        yield Worker(session, admin)
    finally:
        await session.close()
        await admin.close()


@pytest.mark.parametrize("analyzed_empty", [False, True],
                         ids=["never-analyzed", "analyzed-while-empty"])
@pytest.mark.parametrize("growth", list(GROWTHS))
async def test_every_call_reads_in_proportion_to_its_work_after_the_table_grew(
        worker: Worker, database_dsn: str, growth: str, analyzed_empty: bool) -> None:
    if analyzed_empty:
        # A DBA's ANALYZE of the new database: statistics that say every table is empty, so the
        # planner no longer assumes ten pages of a table it never analyzed.
        for table in (*TABLES, "zeroth.checkpoints"):
            await worker.admin.execute(f"ANALYZE {table}")
    # Three cycles on the small table: every statement is planned and its generic plan cached.
    for i in range(3):
        await cycle(worker, i, grown=False)
    await GROWTHS[growth](database_dsn)
    worker.measuring = True
    await cycle(worker, 3, grown=growth == "history")

    save_report(f"generic_plans_all_{growth}" + ("_analyzed_empty" if analyzed_empty else ""), {
        name: {"work": r.work, "tuples": r.tuples, "blocks": r.blocks, "relation": r.relation}
        for name, r in worker.readings.items()})
    assert len(worker.readings) >= 60
    walked = {name: reading for name, reading in worker.readings.items()
              if not reading.within_bounds()}
    assert not walked, "\n".join(
        f"{name}: {r.tuples} tuples, {r.blocks} blocks of {r.relation} for {r.work} run(s)"
        for name, r in walked.items())
