"""complete_and_claim holds its fence and its limits against hostile callers, on a database
exactly as shipped (no test clock).

* a completion whose lease expired or was taken over (by another worker id, or by the same id in
  a second process) lands nothing and claims no slot it did not free; a batch mixing scopes
  completes only the named scope (workspace none and a named workspace are different scopes);
* the claim along respects a paused scope, max_concurrency (also below the scope limit row), a
  rate limit (the completion still lands) and one active run per thread;
* bad input raises ZP and the completion does not stand (more than 1000 runs, outputs of another
  length); a LOGIN role with no grant and a zeroth_reader cannot call it;
* runs claimed by a session that dies after its commit are recovered;
* workers completing with claims along, under continuous load, never exceed the limits and
  never stall, also when a stale completion carries a claim.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from helpers import wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunWorker

ENQUEUE = """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2,
                 workspace_id => $3)"""

CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => $2, tenant_id => $3, workspace_id => $4, max_concurrency => $5,
               lease_seconds => $6) WHERE run_id IS NOT NULL"""

ORPHANED = """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(deployment_ref => $1,
                  worker_id => $2, tenant_id => $3, grace_seconds => 0, max_concurrency => $4)
               WHERE run_id IS NOT NULL"""

CAC = """SELECT completed, (claimed).run_id AS run_id,
                (claimed).lease_generation AS lease_generation,
                (claimed).concurrency_saturated AS saturated
           FROM zeroth.complete_and_claim(deployment_ref => $1, worker_id => $2,
                run_ids => $3::uuid[], generations => $4::bigint[], tenant_id => $5,
                workspace_id => $6, max_concurrency => $7, batch_size => $8,
                lease_seconds => $9)"""

LIVE = """SELECT count(*) FROM zeroth.runs r
           WHERE r.deployment_ref = $1 AND r.lease_expires_at >= clock_timestamp()"""


async def everything(admin: asyncpg.Connection) -> tuple[Any, ...]:
    """Every row of every table the attacked functions write."""
    tables = ("runs", "admission_slots", "run_steps", "events", "event_waits", "checkpoints")
    found = []
    for table in tables:
        rows = await admin.fetch(f"SELECT t.* FROM zeroth.{table} t")
        found.append(sorted(tuple(map(str, r)) for r in rows))
    return tuple(found)


async def held(admin: asyncpg.Connection, worker: asyncpg.Connection, *, deployment: str = "d",
               tenant: str | None = "acme", workspace: str | None = None,
               worker_id: str = "w1", max_concurrency: int | None = None,
               lease_seconds: float = 60) -> tuple[UUID, int]:
    run_id = await admin.fetchval(ENQUEUE, deployment, tenant, workspace)
    rows = await worker.fetch(CLAIM, deployment, worker_id, tenant, workspace, max_concurrency,
                              lease_seconds)
    assert [r["run_id"] for r in rows] == [run_id]
    return run_id, rows[0]["lease_generation"]


async def expire(admin: asyncpg.Connection, run_id: UUID) -> None:
    """The lease lapses (as on the real clock, without waiting for it)."""
    await admin.execute("""UPDATE zeroth.runs SET lease_expires_at = clock_timestamp()
                                                                      - interval '1 s'
                            WHERE run_id = $1""", run_id)


class TestCompleteAndClaimFence:
    async def test_a_taken_over_completion_lands_nothing_and_claims_no_slot_it_did_not_free(
            self, login, admin):
        """Promise 1 + max_concurrency: w1's lease of A was taken over by w2 (A still holds the
        only slot). w1's complete_and_claim is refused for A, and its claim finds no slot."""
        worker = await login("worker")
        a, gen = await held(admin, worker, max_concurrency=1)
        b = await admin.fetchval(ENQUEUE, "d", "acme", None)
        await expire(admin, a)
        (taken,) = await worker.fetch(ORPHANED, "d", "w2", "acme", 1)
        assert (taken["run_id"], taken["lease_generation"]) == (a, gen + 1)
        rows = await worker.fetch(CAC, "d", "w1", [a], [gen], "acme", None, 1, 1, 60)
        assert [r["completed"] for r in rows] == [[False]]
        assert [r["run_id"] for r in rows] == [None]
        assert rows[0]["saturated"] is True
        status = await admin.fetchrow("SELECT status, lease_worker_id, lease_generation "
                                      "FROM zeroth.runs WHERE run_id = $1", a)
        assert tuple(status) == ("running", "w2", gen + 1)
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    b) == "pending"
        assert await admin.fetchval(LIVE, "d") == 1

    async def test_the_same_worker_id_in_a_second_process_cannot_complete_the_old_generation(
            self, login, admin):
        """Promise 1: process 1 of w1 held A at generation g; its lease lapsed and process 2
        (same worker id) re-leased A at g+1. Process 1's complete_and_claim of (A, g) lands
        nothing: A stays running for process 2, and process 2's own completion still lands."""
        first, second = await login("worker"), await login("worker")
        a, gen = await held(admin, first)
        await expire(admin, a)
        (taken,) = await second.fetch(ORPHANED, "d", "w1", "acme", None)
        assert taken["lease_generation"] == gen + 1
        other = await admin.fetchval(ENQUEUE, "d", "acme", None)
        rows = await first.fetch(CAC, "d", "w1", [a], [gen], "acme", None, None, 1, 60)
        assert rows[0]["completed"] == [False]
        # The claim of a refused completion is a plain claim_and_start: it may take other work.
        assert [r["run_id"] for r in rows] == [other]
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    a) == "running"
        done = await second.fetch(CAC, "d", "w1", [a], [gen + 1], "acme", None, None, 1, 60)
        assert done[0]["completed"] == [True]
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    a) == "completed"

    async def test_a_batch_mixing_scopes_completes_only_the_named_scope(self, login, admin):
        """Promise 3: a batch naming tenant acme that carries a run of tenant globex (with its
        true worker and generation) completes nothing of globex and claims only acme's work."""
        worker = await login("worker")
        mine, g1 = await held(admin, worker, tenant="acme")
        theirs, g2 = await held(admin, worker, tenant="globex")
        globex_pending = await admin.fetchval(ENQUEUE, "d", "globex", None)
        rows = await worker.fetch(CAC, "d", "w1", [mine, theirs], [g1, g2], "acme", None, None,
                                  2, 60)
        assert rows[0]["completed"] == [True, False]
        assert [r["run_id"] for r in rows] == [None]
        statuses = dict(await admin.fetch("SELECT run_id, status::text FROM zeroth.runs"))
        assert statuses[theirs] == "running"
        assert statuses[globex_pending] == "pending"

    async def test_workspace_none_and_a_named_workspace_are_different_scopes(self, login, admin):
        """Promise 3: workspace NULL and workspace 'w' of one tenant never share a completion."""
        worker = await login("worker")
        named, gen = await held(admin, worker, workspace="w")
        rows = await worker.fetch(CAC, "d", "w1", [named], [gen], "acme", None, None, 1, 60)
        assert rows[0]["completed"] == [False]
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    named) == "running"


class TestCompleteAndClaimLimits:
    async def test_a_paused_scope_completes_but_claims_nothing(self, login, admin):
        worker = await login("worker")
        a, gen = await held(admin, worker)
        waiting = await admin.fetchval(ENQUEUE, "d", "acme", None)
        await admin.execute("""INSERT INTO zeroth.scope_limits (tenant_id, workspace_id,
                                   deployment_ref, paused)
                               VALUES ('acme', NULL, 'd', true)""")
        rows = await worker.fetch(CAC, "d", "w1", [a], [gen], "acme", None, None, 1, 60)
        assert rows[0]["completed"] == [True]
        assert [r["run_id"] for r in rows] == [None]
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    waiting) == "pending"

    async def test_a_claim_along_never_exceeds_max_concurrency(self, login, admin):
        """max_concurrency 2, two runs held: completing one and asking for a batch of 5 claims
        exactly one (the freed slot), however large the batch."""
        worker = await login("worker")
        a, ga = await held(admin, worker, max_concurrency=2)
        await held(admin, worker, max_concurrency=2)
        for _ in range(5):
            await admin.fetchval(ENQUEUE, "d", "acme", None)
        rows = await worker.fetch(CAC, "d", "w1", [a], [ga], "acme", None, 2, 5, 60)
        assert rows[0]["completed"] == [True]
        assert len([r for r in rows if r["run_id"] is not None]) == 1
        assert await admin.fetchval(LIVE, "d") == 2

    async def test_a_smaller_max_concurrency_than_the_scope_limit_row_is_overridden(
            self, login, admin):
        """The scope's zeroth.scope_limits row replaces the caller's max_concurrency: a worker
        cannot claim past the DBA's limit by passing a larger one."""
        worker = await login("worker")
        await admin.execute("""INSERT INTO zeroth.scope_limits (tenant_id, workspace_id,
                                   deployment_ref, max_concurrency)
                               VALUES ('acme', NULL, 'd', 1)""")
        a, ga = await held(admin, worker, max_concurrency=1)
        for _ in range(3):
            await admin.fetchval(ENQUEUE, "d", "acme", None)
        rows = await worker.fetch(CAC, "d", "w1", [a], [ga], "acme", None, 100, 3, 60)
        assert rows[0]["completed"] == [True]
        assert len([r for r in rows if r["run_id"] is not None]) == 1
        assert await admin.fetchval(LIVE, "d") == 1


    async def test_a_rate_limit_holds_the_claim_back_and_the_completion_still_lands(
            self, login, admin):
        worker = await login("worker")
        await admin.execute("SELECT zeroth.set_rate_limit(name => 'rl', max_starts => 1, "
                            "period_seconds => 3600)")
        await admin.execute("""INSERT INTO zeroth.scope_limits (tenant_id, workspace_id,
                                   deployment_ref, rate_limit) VALUES ('acme', NULL, 'd', 'rl')""")
        a, ga = await held(admin, worker)  # the one start of the hour
        b = await admin.fetchval(ENQUEUE, "d", "acme", None)
        rows = await worker.fetch(
            CAC.replace("(claimed).concurrency_saturated AS saturated",
                        "(claimed).retry_after AS retry_after"),
            "d", "w1", [a], [ga], "acme", None, None, 1, 60)
        assert rows[0]["completed"] == [True]
        assert [r["run_id"] for r in rows] == [None]
        assert rows[0]["retry_after"] > 3000
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    b) == "pending"

    @pytest.mark.parametrize("stale", [False, True])
    async def test_a_thread_never_has_two_active_runs_through_a_claim_along(self, login, admin,
                                                                            stale):
        """The completion of a thread's active run promotes its queue head, which the claim in
        the same call may take; a refused (stale) completion promotes nothing, so the claim
        cannot start the thread's second run beside the first."""
        worker = await login("worker")
        enqueue = ("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', "
                   "tenant_id => 'acme', thread_id => 't')")
        first = await admin.fetchval(enqueue)
        second = await admin.fetchval(enqueue)
        (claimed,) = await worker.fetch(CLAIM, "d", "w1", "acme", None, None, 60)
        assert claimed["run_id"] == first
        gen = claimed["lease_generation"]
        if stale:
            await expire(admin, first)
            (taken,) = await worker.fetch(ORPHANED, "d", "w2", "acme", None)
            assert taken["run_id"] == first
        rows = await worker.fetch(CAC, "d", "w1", [first], [gen], "acme", None, None, 2, 60)
        assert rows[0]["completed"] == [not stale]
        assert [r["run_id"] for r in rows] == [None if stale else second]
        active = await admin.fetchval(
            """SELECT count(*) FROM zeroth.runs WHERE thread_id = 't'
                  AND status IN ('pending', 'running')""")
        assert active == 1


class TestCompleteAndClaimBadInput:
    @pytest.mark.parametrize(("run_ids", "generations", "extra"), [
        ("two", [1], {}),  # length mismatch
        ("one", [None], {}),  # a NULL generation
        ("null", [1], {}),  # a NULL run id
        ("dup", [1, 1], {}),  # the same run twice
        ("one", [1], {"batch_size": 0}),
        ("one", [1], {"batch_size": 1001}),
        ("one", [1], {"max_concurrency": 0}),
        ("one", [1], {"lease_seconds": float("nan")}),
        ("one", [1], {"lease_seconds": -1.0}),
        ("one", [1], {"deployment": ""}),
        ("one", [1], {"worker_id": None}),
        ("one", [1], {"tenant": None, "workspace": "w", "max_concurrency": 2}),
    ])
    async def test_bad_input_raises_zp_and_the_completion_does_not_stand(
            self, login, admin, run_ids, generations, extra):
        """Promise 5: the completion comes first in the call; a bad claim argument must still
        leave it undone (one transaction), with a ZP error."""
        worker = await login("worker")
        a, gen = await held(admin, worker)
        await admin.fetchval(ENQUEUE, "d", "acme", None)
        ids = {"one": [a], "two": [a, uuid4()], "null": [None], "dup": [a, a]}[run_ids]
        gens = [gen if g == 1 else g for g in generations]
        before = await everything(admin)
        with pytest.raises(asyncpg.PostgresError) as raised:
            await worker.fetch(CAC, extra.get("deployment", "d"), extra.get("worker_id", "w1"),
                               ids, gens, extra.get("tenant", "acme"),
                               extra.get("workspace"), extra.get("max_concurrency"),
                               extra.get("batch_size", 1), extra.get("lease_seconds", 60))
        assert raised.value.sqlstate.startswith("ZP"), raised.value
        assert await everything(admin) == before

    async def test_more_than_a_thousand_runs_is_refused(self, login, admin):
        worker = await login("worker")
        with pytest.raises(asyncpg.PostgresError) as raised:
            await worker.fetch(CAC, "d", "w1", [uuid4() for _ in range(1001)], [1] * 1001,
                               "acme", None, None, 1, 60)
        assert raised.value.sqlstate == "ZP008"

    async def test_an_output_array_of_another_length_is_refused(self, login, admin):
        worker = await login("worker")
        a, gen = await held(admin, worker)
        before = await everything(admin)
        with pytest.raises(asyncpg.PostgresError) as raised:
            await worker.fetch(
                """SELECT * FROM zeroth.complete_and_claim(deployment_ref => 'd',
                       worker_id => 'w1', run_ids => $1::uuid[], generations => $2::bigint[],
                       outputs => '{1,2}'::jsonb[], tenant_id => 'acme')""", [a], [gen])
        assert raised.value.sqlstate == "ZP008"
        assert await everything(admin) == before


class TestCompleteAndClaimRoles:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_no_grant_and_reader_cannot_call_it(self, login, admin, kind):
        worker = await login("worker")
        a, gen = await held(admin, worker)
        before = await everything(admin)
        outsider = await login(kind)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await outsider.fetch(CAC, "d", "w1", [a], [gen], "acme", None, None, 1, 60)
        assert await everything(admin) == before


class TestCompleteAndClaimCrash:
    async def test_runs_claimed_by_a_session_that_dies_after_commit_are_recovered(
            self, login, admin):
        """Promise 5: the worker process dies between the commit of its complete_and_claim and
        starting the claimed runs (its connection is terminated right after). The claimed run is
        not lost: once its lease lapses, claim_orphaned re-leases it, counting the attempt."""
        worker = await login("worker")
        a, gen = await held(admin, worker)
        b = await admin.fetchval(ENQUEUE, "d", "acme", None)
        rows = await worker.fetch(CAC, "d", "w1", [a], [gen], "acme", None, None, 1, 60)
        assert [r["run_id"] for r in rows] == [b]
        await admin.execute("SELECT pg_terminate_backend($1)", worker.get_server_pid())
        await expire(admin, b)
        sweeper = await login("worker")
        (taken,) = await sweeper.fetch(ORPHANED, "d", "w2", "acme", None)
        assert (taken["run_id"], taken["lease_generation"]) == (b, rows[0]["lease_generation"] + 1)
        assert await admin.fetchval("SELECT attempts FROM zeroth.runs WHERE run_id = $1", b) == 2


class _Gauge:
    """Handlers executing at once (all workers of the test process), and the most seen."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.runs: list[UUID] = []

    async def handler(self, run: Any) -> dict[str, Any]:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            for _ in range(3):
                await asyncio.sleep(0)  # let other handlers and the claim loop interleave
            self.runs.append(run.run_id)
            return {"n": run.payload["n"]}
        finally:
            self.now -= 1


def _spy_claim_along(worker: RunWorker) -> list[int]:
    """Counts the runs each complete_and_claim of ``worker`` asked for (a spy: the real call
    goes out), so a test can tell the path it attacks was taken."""
    asked: list[int] = []
    real = worker.lease_manager.complete_and_claim

    async def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["batch_size"])
        return await real(*args, **kwargs)

    worker.lease_manager.complete_and_claim = spy  # type: ignore[method-assign]
    return asked


async def _all_completed(pool: asyncpg.Pool, deployment: str, count: int) -> bool:
    return await pool.fetchval(
        "SELECT count(*) FILTER (WHERE status = 'completed') = $2 AND count(*) = $2 "
        "FROM zeroth.runs WHERE deployment_ref = $1", deployment, count)


class TestClaimAlongWorkers:
    async def test_continuous_load_never_exceeds_the_limits_and_never_stalls(self, pool):
        """Promises 2 and 5: two workers of one scope (local 3 each, fleet 2) under a producer
        that keeps enqueueing: never more than 2 handlers at once, every run completed exactly
        once (one attempt), and the claims carried by completions were really made."""
        lm = LeaseManager(pool)
        gauge = _Gauge()
        workers = [RunWorker(pool, "load", gauge.handler, tenant_id="acme", max_concurrency=3,
                             fleet_max_concurrency=2, poll_interval=0.05,
                             orphan_sweep_interval=30, lease_duration=30)
                   for _ in range(2)]
        asked = [_spy_claim_along(w) for w in workers]
        for worker in workers:
            await worker.start()
        try:
            total = 0
            for _ in range(12):  # the producer, running beside the workers
                await lm.enqueue_runs("load", [{"payload": {"n": total + i}} for i in range(10)],
                                      tenant_id="acme")
                total += 10
                await asyncio.sleep(0.01)
            await wait_until(lambda: _all_completed(pool, "load", total),
                             "every run completed", within=60)
        finally:
            for worker in workers:
                await worker.graceful_shutdown()
        assert gauge.most <= 2
        assert sorted(gauge.runs) == sorted(set(gauge.runs))  # each handler ran once
        assert len(gauge.runs) == total
        assert await pool.fetchval("SELECT max(attempts) FROM zeroth.runs") == 1
        assert sum(map(len, asked)) > 0

    async def test_a_stale_completion_carrying_a_claim_takes_no_slot_and_stalls_nothing(
            self, pool):
        """Promises 1 and 5: the first run's lease is taken over (by "thief") while its handler
        runs, and the handler returns. Its completion — carrying a claim — is refused; the claim
        finds the only fleet slot held by the thief. Once the thief completes, the worker goes on
        and completes the rest; the first run's accepted outcome is the thief's."""
        lm = LeaseManager(pool, lease_duration_seconds=30)
        gauge = _Gauge()
        stolen: list[int] = []

        async def handler(run: Any) -> dict[str, Any]:
            if run.payload.get("steal"):
                await pool.execute("UPDATE zeroth.runs SET lease_expires_at = clock_timestamp()"
                                   " - interval '1 s' WHERE run_id = $1", run.run_id)
                taken = await lm.claim_orphaned_result("steal", "thief", tenant_id="acme",
                                                       max_concurrency=1, grace_seconds=0)
                stolen.extend(r.lease_generation for r in taken.runs)
                return {"by": "the stale holder"}
            return await gauge.handler(run)

        first = (await lm.enqueue_run("steal", {"steal": True, "n": -1}, tenant_id="acme",
                                      priority=10)).run_id
        await lm.enqueue_runs("steal", [{"payload": {"n": i}} for i in range(5)],
                              tenant_id="acme")
        worker = RunWorker(pool, "steal", handler, tenant_id="acme", max_concurrency=1,
                           fleet_max_concurrency=1, poll_interval=0.05,
                           orphan_sweep_interval=30, lease_duration=30)
        asked = _spy_claim_along(worker)
        await worker.start()
        try:
            await wait_until(lambda: stolen, "the takeover", within=30)
            await wait_until(lambda: asked, "the completion carrying a claim", within=30)
            row = await pool.fetchrow("SELECT status::text, lease_worker_id FROM zeroth.runs "
                                      "WHERE run_id = $1", first)
            assert tuple(row) == ("running", "thief")
            assert await pool.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE status = 'running'") == 1
            assert await lm.complete_run(first, "thief", generation=stolen[0],
                                         output={"by": "thief"}, tenant_id="acme") is True
            await wait_until(lambda: _all_completed(pool, "steal", 6), "every run completed",
                             within=60)
        finally:
            await worker.graceful_shutdown()
        assert json.loads(await pool.fetchval(
            "SELECT output::text FROM zeroth.runs WHERE run_id = $1", first)) == {"by": "thief"}
        assert gauge.most == 1
        assert len(gauge.runs) == 5
