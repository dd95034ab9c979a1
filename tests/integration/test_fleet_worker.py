"""A fleet worker: one RunWorker serving several deployments in many scopes, on real sessions.

RunWorker(pool, {deployment: handler, …}) claims with zeroth.claim_and_start_scopes (every scope
of its deployments, or the listed ones), each run goes to its deployment's handler with its
scope in ``ctx.scope``, and every later write (renewal, checkpoint, completion, cancel,
hand-back) lands in that run's scope. Its wakeups come from each deployment's gate; orphans are
swept with zeroth.claim_orphaned_scopes; zeroth.scope_limits is honoured.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import unique_deployment, wait_until
from prometheus_client import CollectorRegistry

from zeroth_pg.client import LeaseManager
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.types import RetryPolicy, Scope
from zeroth_pg.worker import RunContext, RunWorker

IDLE = 60.0  # poll and sweep interval: a quick start was a NOTIFY's doing


@pytest.fixture
async def fleet(pool: asyncpg.Pool, database_dsn: str
                ) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    workers: list[RunWorker] = []

    async def start(handlers: dict[str, Any], **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("orphan_sweep_interval", 0.2)
        kwargs.setdefault("lease_duration", 30.0)
        kwargs.setdefault("shutdown_timeout", 2.0)
        worker = RunWorker(pool, handlers, **kwargs)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


class Seen:
    """A handler per deployment that records (deployment, scope, run) and completes."""

    def __init__(self) -> None:
        self.runs: dict[UUID, tuple[str, Scope]] = {}

    def handler(self, deployment: str) -> Callable[[RunContext], Awaitable[Any]]:
        async def handle(ctx: RunContext) -> dict[str, Any]:
            self.runs[ctx.run_id] = (deployment, ctx.scope)
            await ctx.progress({"seen": True})  # a fenced write in the run's own scope
            await ctx.checkpoint({"step": 1})
            return {"deployment": deployment, "tenant": ctx.scope.tenant_id}
        return handle


async def enqueue(lm: LeaseManager, deployment: str, tenant: str,
                  workspace: str | None = None, n: int = 1) -> list[UUID]:
    runs = await lm.enqueue_runs(deployment, [{"payload": {"i": i}} for i in range(n)],
                                 tenant_id=tenant, workspace_id=workspace)
    return [r.run_id for r in runs]


async def statuses(pool: asyncpg.Pool, run_ids: list[UUID]) -> collections.Counter[str]:
    rows = await pool.fetch("SELECT status::text FROM zeroth.runs WHERE run_id = ANY ($1)",
                            run_ids)
    return collections.Counter(r["status"] for r in rows)


async def test_one_worker_serves_every_scope_of_two_deployments(fleet, pool):
    a, b, other = (unique_deployment(x) for x in ("fleet-a", "fleet-b", "fleet-other"))
    lm = LeaseManager(pool)
    expected: dict[UUID, tuple[str, Scope]] = {}
    for deployment in (a, b):
        for tenant, workspace in (("acme", None), ("globex", "w1"), ("initech", None)):
            for run_id in await enqueue(lm, deployment, tenant, workspace, n=3):
                expected[run_id] = (deployment, Scope(deployment, tenant, workspace))
    untouched = await enqueue(lm, other, "acme", n=2)
    seen = Seen()
    await fleet({a: seen.handler(a), b: seen.handler(b)}, max_concurrency=4)

    async def all_completed() -> bool:
        return await statuses(pool, list(expected)) == {"completed": len(expected)}

    await wait_until(all_completed, "every run completed", within=30)
    assert seen.runs == expected  # each run went to its deployment's handler, with its scope
    rows = await pool.fetch(
        """SELECT r.run_id, r.output->>'tenant' AS tenant, r.progress,
                  (SELECT count(*) FROM zeroth.checkpoints k
                    WHERE k.tenant_id = r.tenant_id AND k.run_id = r.run_id) AS checkpoints
             FROM zeroth.runs r WHERE r.run_id = ANY ($1)""", list(expected))
    for row in rows:
        scope = expected[row["run_id"]][1]
        assert (row["tenant"], row["checkpoints"]) == (scope.tenant_id, 1)
        assert row["progress"] is not None
    assert (await statuses(pool, untouched)) == {"pending": 2}


async def test_every_run_ends_completed_in_its_own_scope(fleet, pool):
    a = unique_deployment("fleet-done")
    lm = LeaseManager(pool)
    run_ids = [*await enqueue(lm, a, "t1", n=5), *await enqueue(lm, a, "t2", "w", n=5)]
    seen = Seen()
    await fleet({a: seen.handler(a)})

    async def all_completed() -> bool:
        return await statuses(pool, run_ids) == {"completed": 10}

    await wait_until(all_completed, "every run completed", within=30)
    rows = await pool.fetch("SELECT tenant_id, workspace_id, output->>'tenant' AS said "
                            "FROM zeroth.runs WHERE run_id = ANY ($1)", run_ids)
    assert {(r["tenant_id"], r["workspace_id"], r["said"]) for r in rows} == {
        ("t1", None, "t1"), ("t2", "w", "t2")}


async def test_listed_scopes_only(fleet, pool):
    a = unique_deployment("fleet-list")
    lm = LeaseManager(pool)
    mine = [*await enqueue(lm, a, "t1", n=2), *await enqueue(lm, a, "t2", "w", n=2)]
    others = [*await enqueue(lm, a, "t2", n=2), *await enqueue(lm, a, "t3", n=2)]
    seen = Seen()
    await fleet({a: seen.handler(a)}, scopes=[("t1", None), ("t2", "w")])

    async def mine_completed() -> bool:
        return await statuses(pool, mine) == {"completed": 4}

    await wait_until(mine_completed, "the listed scopes' runs", within=30)
    await asyncio.sleep(0.3)  # a few more claim passes
    assert await statuses(pool, others) == {"pending": 4}


async def test_an_idle_fleet_worker_is_woken_by_a_new_tenants_enqueue(fleet, pool):
    a = unique_deployment("fleet-wake")
    seen = Seen()
    worker = await fleet({a: seen.handler(a)}, poll_interval=IDLE, orphan_sweep_interval=IDLE)
    assert worker.notifier is not None
    await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    await asyncio.sleep(0.5)  # the first passes are over: the loop waits on the gate
    (run_id,) = await enqueue(LeaseManager(pool), a, "brand-new-tenant")
    # Without the deployment's gate nobody would notify, and the next poll is 60 s away.
    await wait_until(lambda: run_id in seen.runs, "the NOTIFY to wake the worker", within=10)
    assert seen.runs[run_id][1] == Scope(a, "brand-new-tenant", None)


async def test_a_paused_scope_is_left_and_a_fleet_limit_holds_per_scope(fleet, pool):
    a = unique_deployment("fleet-limits")
    lm = LeaseManager(pool)
    paused = await enqueue(lm, a, "paused", n=3)
    busy = [*await enqueue(lm, a, "t1", n=6), *await enqueue(lm, a, "t2", n=6)]
    await pool.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, paused) "
                       "VALUES ('paused', $1, true)", a)
    live: collections.Counter[str] = collections.Counter()
    worst: collections.Counter[str] = collections.Counter()

    async def slow(ctx: RunContext) -> None:
        live[ctx.scope.tenant_id] += 1
        worst[ctx.scope.tenant_id] = max(worst[ctx.scope.tenant_id], live[ctx.scope.tenant_id])
        await asyncio.sleep(0.05)
        live[ctx.scope.tenant_id] -= 1

    await fleet({a: slow}, max_concurrency=8, fleet_max_concurrency=2)

    async def busy_completed() -> bool:
        return await statuses(pool, busy) == {"completed": 12}

    await wait_until(busy_completed, "the unpaused scopes' runs", within=60)
    assert max(worst.values()) <= 2
    assert set(worst) == {"t1", "t2"}
    assert await statuses(pool, paused) == {"pending": 3}


async def test_orphans_of_any_scope_are_recovered(fleet, pool):
    a = unique_deployment("fleet-orphans")
    lm = LeaseManager(pool, lease_duration_seconds=0.2)
    run_ids = [*await enqueue(lm, a, "t1"), *await enqueue(lm, a, "t2", "w")]
    for tenant, workspace in (("t1", None), ("t2", "w")):
        claimed = await lm.claim_and_start(a, "crashed-worker", tenant_id=tenant,
                                           workspace_id=workspace)
        assert len(claimed.runs) == 1
    await asyncio.sleep(0.3)  # the crashed worker's leases have expired
    seen = Seen()
    await fleet({a: seen.handler(a)})
    await wait_until(lambda: set(seen.runs) == set(run_ids), "both orphans", within=30)
    attempts = await pool.fetch("SELECT attempts FROM zeroth.runs WHERE run_id = ANY ($1)",
                                run_ids)
    assert {r["attempts"] for r in attempts} == {2}


async def test_renewals_keep_runs_of_several_scopes_alive(fleet, pool):
    a = unique_deployment("fleet-renew")
    lm = LeaseManager(pool)
    run_ids = [*await enqueue(lm, a, "t1"), *await enqueue(lm, a, "t2"),
               *await enqueue(lm, a, "t3", "w")]

    async def outlives_its_lease(ctx: RunContext) -> dict[str, int]:
        # Until the database's clock is past the lease the handler started with: only renewals
        # keep the run (a 3 s lease renewed every 1 s: a renewal held up on a loaded machine
        # does not lose it, as one of a 1 s lease did).
        first = await pool.fetchval(
            "SELECT lease_expires_at FROM zeroth.runs WHERE run_id = $1", ctx.run_id)
        await wait_until(lambda: pool.fetchval("SELECT clock_timestamp() > $1::timestamptz",
                                               first), "the first lease to run out",
                         within=60, interval=0.1)
        await ctx.progress({"still": "mine"})  # fenced: refused if a renewal had failed
        return {"ok": 1}

    await fleet({a: outlives_its_lease}, lease_duration=3.0)

    async def all_completed() -> bool:
        return await statuses(pool, run_ids) == {"completed": 3}

    await wait_until(all_completed, "every run completed under renewed leases", within=30)
    generations = await pool.fetch(
        "SELECT lease_generation, attempts FROM zeroth.runs WHERE run_id = ANY ($1)", run_ids)
    assert {(r["lease_generation"], r["attempts"]) for r in generations} == {(1, 1)}


async def test_a_cancel_in_one_scope_stops_that_run_only(fleet, pool):
    a = unique_deployment("fleet-cancel")
    lm = LeaseManager(pool)
    (victim,) = await enqueue(lm, a, "t2", "w")
    (bystander,) = await enqueue(lm, a, "t1")
    started: set[UUID] = set()

    async def waits(ctx: RunContext) -> dict[str, int]:
        started.add(ctx.run_id)
        for _ in range(200):
            if ctx.cancel_requested:
                break
            await asyncio.sleep(0.05)
        return {"ok": 1}

    await fleet({a: waits})
    await wait_until(lambda: started == {victim, bystander}, "both runs started", within=10)
    outcome = await lm.request_cancel(victim, tenant_id="t2", workspace_id="w")
    assert outcome is not None

    async def cancelled() -> bool:
        return await statuses(pool, [victim]) == {"cancelled": 1}

    await wait_until(cancelled, "the cancel to land in the victim's scope", within=10)
    assert await statuses(pool, [bystander]) == {"running": 1}


async def test_graceful_shutdown_hands_back_the_runs_of_every_scope(pool, database_dsn):
    a = unique_deployment("fleet-drain")
    lm = LeaseManager(pool)
    run_ids = [*await enqueue(lm, a, "t1"), *await enqueue(lm, a, "t2", "w")]
    started: set[UUID] = set()

    async def forever(ctx: RunContext) -> None:
        started.add(ctx.run_id)
        await asyncio.sleep(3600)

    # The drain waits shutdown_timeout for the handlers, cancels them, and waits as long again
    # for their hand-backs: 2 s, so that on a loaded machine the hand-backs still land (with
    # 0.2 s they were now and then abandoned, "the completion loop stopped before answering").
    worker = RunWorker(pool, {a: forever}, dsn=database_dsn, poll_interval=0.05,
                       shutdown_timeout=2.0)
    await worker.start()
    await wait_until(lambda: started == set(run_ids), "both runs started", within=10)
    await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
    rows = await pool.fetch("SELECT status::text, attempts, lease_worker_id FROM zeroth.runs "
                            "WHERE run_id = ANY ($1)", run_ids)
    assert {(r["status"], r["attempts"], r["lease_worker_id"]) for r in rows} == {
        ("pending", 0, None)}


class TestConstruction:
    @pytest.mark.parametrize("kwargs", [
        {"tenant_id": "acme"}, {"workspace_id": "w"}, {"handler": object()},
    ])
    def test_a_fleet_worker_takes_no_single_scope_argument(self, pool, kwargs):
        with pytest.raises(ValueError, match="fleet worker"):
            RunWorker(pool, {"a": Seen().handler("a")}, **kwargs)

    def test_one_deployment_needs_its_handler_and_no_scopes(self, pool):
        with pytest.raises(ValueError, match="needs its handler"):
            RunWorker(pool, "a")
        with pytest.raises(ValueError, match="scopes needs a mapping"):
            RunWorker(pool, "a", Seen().handler("a"), scopes=[("t", None)])

    @pytest.mark.parametrize("handlers", [{}])
    def test_an_empty_fleet_is_refused(self, pool, handlers):
        with pytest.raises(ValueError, match="non-empty"):
            RunWorker(pool, handlers)

    def test_an_empty_scope_list_is_refused(self, pool):
        with pytest.raises(ValueError, match="non-empty list"):
            RunWorker(pool, {"a": Seen().handler("a")}, scopes=[])

    @pytest.mark.parametrize(("kwargs", "message"), [
        ({"deployment_concurrency": {"b": 1}}, "does not serve: b"),
        ({"retries": {"b": RetryPolicy()}}, "does not serve: b"),
        ({"deployment_concurrency": {"a": 0}}, "at least 1"),
        ({"deployment_concurrency": {"a": 1.5}}, "at least 1"),
    ])
    def test_per_deployment_settings_name_served_deployments(self, pool, kwargs, message):
        with pytest.raises(ValueError, match=message):
            RunWorker(pool, {"a": Seen().handler("a")}, **kwargs)

    def test_a_retry_policy_keeps_fail_runs_bounds(self):
        with pytest.raises(ValueError, match="30 days"):
            RetryPolicy(base_seconds=10, max_seconds=5)
        with pytest.raises(ValueError, match="30 days"):
            RetryPolicy(base_seconds=-1)


async def test_a_deployment_limit_holds_for_orphans_too(fleet, pool):
    """Three orphans of a deployment limited to one handler in this worker: recovered one at a
    time, every one of them, while another deployment's orphans are recovered beside them."""
    narrow, wide = unique_deployment("fleet-narrow"), unique_deployment("fleet-wide")
    lm = LeaseManager(pool, lease_duration_seconds=0.2)
    orphans = {}
    for deployment in (narrow, wide):
        ids = [*await enqueue(lm, deployment, "t1"), *await enqueue(lm, deployment, "t2"),
               *await enqueue(lm, deployment, "t3")]
        for tenant in ("t1", "t2", "t3"):
            claimed = await lm.claim_and_start(deployment, "crashed-worker", tenant_id=tenant)
            assert len(claimed.runs) == 1
        orphans[deployment] = ids
    await asyncio.sleep(0.3)  # the crashed worker's leases have expired
    running = collections.Counter[str]()
    peak = collections.Counter[str]()

    def limited(deployment: str) -> Callable[[RunContext], Awaitable[None]]:
        async def handle(ctx: RunContext) -> None:
            running[deployment] += 1
            peak[deployment] = max(peak[deployment], running[deployment])
            await asyncio.sleep(0.05)
            running[deployment] -= 1
        return handle

    await fleet({narrow: limited(narrow), wide: limited(wide)}, max_concurrency=8,
                deployment_concurrency={narrow: 1})
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 6 FROM zeroth.runs WHERE status = 'completed'"),
        "every orphan to complete", within=30)
    assert peak[narrow] == 1
    assert await pool.fetchval("SELECT count(*) FROM zeroth.runs WHERE attempts = 2") == 6


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_the_queue_depth_gauge_is_per_deployment_over_the_served_scopes(fleet, pool):
    a, b, idle = (unique_deployment(x) for x in ("depth-a", "depth-b", "depth-idle"))
    lm = LeaseManager(pool)
    later = [{"payload": {}, "run_after": datetime(2100, 1, 1, tzinfo=UTC)}]  # never claimed
    for deployment, tenant, workspace, n in ((a, "acme", None, 3), (a, "globex", "w1", 2),
                                             (a, "initech", None, 4), (b, "acme", None, 1)):
        await lm.enqueue_runs(deployment, later * n, tenant_id=tenant, workspace_id=workspace)
    await lm.enqueue_runs(a, later, tenant_id="globex")  # not the listed (globex, w1)
    registries = {kind: CollectorRegistry() for kind in ("every", "listed", "one")}
    seen = Seen()
    handlers = {d: seen.handler(d) for d in (a, b, idle)}
    await fleet(handlers, queue_depth_interval=0.05,
                metrics=WorkerMetrics.create(registries["every"]))
    await fleet(handlers, scopes=[("acme", None), ("globex", "w1")], queue_depth_interval=0.05,
                metrics=WorkerMetrics.create(registries["listed"]))
    one = RunWorker(pool, a, seen.handler(a), tenant_id="initech", queue_depth_interval=0.05,
                    poll_interval=IDLE, metrics=WorkerMetrics.create(registries["one"]))
    await one.start()
    try:
        expected = {"every": {a: 10, b: 1, idle: 0}, "listed": {a: 5, b: 1, idle: 0},
                    "one": {a: 4}}

        def gauges() -> dict[str, dict[str, float | None]]:
            return {kind: {d: sample(registries[kind], "zeroth_queue_depth", deployment=d)
                           for d in expected[kind]} for kind in expected}

        await wait_until(lambda: gauges() == expected, "every worker's gauges", within=30)
    finally:
        await asyncio.wait_for(one.graceful_shutdown(), timeout=30)
    assert seen.runs == {}
    assert sample(registries["one"], "zeroth_queue_depth", deployment=b) is None


async def test_scope_metrics_count_per_tenant_only_when_asked_for(fleet, pool):
    counted, plain = unique_deployment("scoped"), unique_deployment("unscoped")
    lm = LeaseManager(pool)

    async def handle(ctx: RunContext) -> dict[str, int]:
        if ctx.payload.get("fail"):
            raise RuntimeError("this one fails")
        return {"ok": 1}

    for deployment in (counted, plain):
        await lm.enqueue_runs(deployment, [{"payload": {}}] * 3, tenant_id="t1")
        await lm.enqueue_runs(deployment, [{"payload": {}}, {"payload": {"fail": True},
                                                             "max_attempts": 1}],
                              tenant_id="t2", workspace_id="w")
    on, off = CollectorRegistry(), CollectorRegistry()
    await fleet({counted: handle}, scope_metrics=True, metrics=WorkerMetrics.create(on))
    await fleet({plain: handle}, metrics=WorkerMetrics.create(off))

    def finished(registry: CollectorRegistry, deployment: str) -> bool:
        return (sample(registry, "zeroth_runs_completed_total", deployment=deployment),
                sample(registry, "zeroth_runs_dead_lettered_total", deployment=deployment)
                ) == (4, 1)

    await wait_until(lambda: finished(on, counted) and finished(off, plain),
                     "both workers to finish their runs", within=30)
    t1 = {"deployment": counted, "tenant": "t1", "workspace": ""}  # the null workspace: ""
    t2 = {"deployment": counted, "tenant": "t2", "workspace": "w"}
    assert {(name, scope["tenant"]): on.get_sample_value(f"zeroth_scope_runs_{name}_total",
                                                         scope)
            for name in ("started", "completed", "failed") for scope in (t1, t2)} == {
        ("started", "t1"): 3, ("started", "t2"): 2, ("completed", "t1"): 3,
        ("completed", "t2"): 1, ("failed", "t1"): None, ("failed", "t2"): 1}
    # Off by default: the counters exist but have no series at all.
    for name in ("started", "completed", "failed"):
        families = [m for m in off.collect() if m.name == f"zeroth_scope_runs_{name}"]
        assert [family.samples for family in families] == [[]]
