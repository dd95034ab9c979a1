"""Rate limits with real workers (issue 15): three RunWorkers share one key of 50 starts per
second over 2,000 runs — no rolling one-second window of the recorded start times (runs.started_at,
the database clock) holds more than 50, and no held-back fleet waits for its poll — and a worker
held back by a limit sleeps until the time the claim reported instead of polling, while NOTIFYs
for the held-back scope do not wake it.

The figures are saved (tests/helpers.save_report: build/test-reports/rate_limit_*.json): the
largest count seen in any window against the limit, and the rate achieved against the limit.
How close to the limit the fleet comes is a speed goal, measured by bench/rate_limit.py
(target ≥ 90%), not asserted here: on a loaded machine it fell to 85% with nothing wrong.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from typing import Any

import asyncpg
import pytest
from helpers import save_report, unique_deployment, wait_until

from bench.rate_limit import max_in_window
from zeroth_pg.worker import RunContext, RunWorker

LIMIT, PERIOD, RUNS = 50, 1.0, 2000
#: The fleet's poll interval: far longer than any gap between starts a working limiter leaves
#: (about one period: a window's 50 starts go at once, then the next frees one period later).
POLL = 30.0


async def limit_scope(pool: asyncpg.Pool, deployment: str, key: str, max_starts: int,
                      period: float, *, max_concurrency: int | None = None) -> None:
    await pool.execute("SELECT zeroth.set_rate_limit(name => $1, max_starts => $2, "
                       "period_seconds => $3)", key, max_starts, period)
    await pool.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, rate_limit, "
                       "max_concurrency) VALUES ('default', $1, $2, $3)",
                       deployment, key, max_concurrency)


async def done(pool: asyncpg.Pool, deployment: str) -> int:
    return int(await pool.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'completed'",
        deployment))


async def start_times(pool: asyncpg.Pool, deployment: str) -> list[datetime]:
    return [r["started_at"] for r in await pool.fetch(
        "SELECT started_at FROM zeroth.runs WHERE deployment_ref = $1 ORDER BY started_at",
        deployment)]


async def handler(ctx: RunContext) -> dict[str, Any]:
    return {}


@pytest.mark.slow
async def test_three_workers_hold_50_per_second_over_2000_runs(pool, database_dsn):
    deployment = unique_deployment("rate")
    await limit_scope(pool, deployment, f"{deployment}-key", LIMIT, PERIOD)
    await pool.execute(
        """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
               runs => (SELECT jsonb_agg(jsonb_build_object('payload', jsonb_build_object('i', i)))
                          FROM generate_series(1, $2) AS i))""", deployment, RUNS)
    workers = [RunWorker(pool, deployment, handler, dsn=database_dsn, max_concurrency=25,
                         poll_interval=POLL, shutdown_timeout=5.0) for _ in range(3)]
    for worker in workers:
        await worker.start()
    try:
        await wait_until(lambda: done(pool, deployment), "the first run", within=30)
        await wait_until(lambda: _all_done(pool, deployment), f"{RUNS} runs", within=240,
                         interval=0.5)
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)

    starts = await start_times(pool, deployment)
    assert len(starts) == RUNS
    most = max_in_window(starts, PERIOD)
    span = (starts[-1] - starts[0]).total_seconds()
    longest_gap = max((b - a).total_seconds() for a, b in itertools.pairwise(starts))
    # n starts over a span S fill at most S / period + 1 windows: the rate achieved is
    # n / (S + period) (what a perfect limiter reaches is the limit itself).
    rate = RUNS / (span + PERIOD)
    save_report("rate_limit_three_workers", {
        "limit_per_second": LIMIT, "runs": RUNS, "workers": 3,
        "max_starts_in_any_1s_window": most, "span_seconds": round(span, 3),
        "achieved_rate_per_second": round(rate, 2),
        "achieved_over_limit": round(rate / (LIMIT / PERIOD), 4),
        "naive_rate_n_over_span": round(RUNS / span, 2),
        "longest_gap_between_starts_s": round(longest_gap, 3)})
    assert most <= LIMIT
    # A held-back worker sleeps until the time its claim reported, when the window frees a
    # start: the fleet never sat idle for a poll interval with runs pending. (A working limiter
    # leaves gaps of about one period, 1.04 s at most in a quiet run; one that slept to its
    # poll would leave POLL.)
    assert longest_gap < POLL


async def _all_done(pool: asyncpg.Pool, deployment: str) -> bool:
    return await done(pool, deployment) == RUNS


@pytest.mark.parametrize("poll_interval", [0.05, 60.0])
async def test_a_held_back_worker_sleeps_until_the_reported_time(pool, database_dsn,
                                                                 poll_interval):
    deployment = unique_deployment("rate-sleep")
    await limit_scope(pool, deployment, f"{deployment}-key", 1, 2.0)
    await pool.execute("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, "
                       "payload => '{}')", deployment)
    # poll_interval 60: the second run, started within the deadline below, was started by the
    # wake-up at the reported retry time, not by a poll. 0.05: the worker does not poll while
    # held back (40 polls in the 2 s window otherwise).
    worker = RunWorker(pool, deployment, handler, dsn=database_dsn, poll_interval=poll_interval,
                       orphan_sweep_interval=60.0, shutdown_timeout=5.0)
    answers: list[Any] = []  # every claim's answer, in order
    claim_and_start = worker.lease_manager.claim_and_start

    async def counted(*args: Any, **kwargs: Any) -> Any:
        answer = await claim_and_start(*args, **kwargs)
        answers.append(answer)
        return answer

    worker.lease_manager.claim_and_start = counted  # type: ignore[method-assign]
    await worker.start()
    try:
        await wait_until(lambda: done(pool, deployment), "the first run", within=30)
        # Held back now (1 per 2 s): more runs arrive, each with a NOTIFY for this very scope.
        for _ in range(5):
            await pool.execute("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, "
                               "payload => '{}')", deployment)
            await asyncio.sleep(0.05)
        await wait_until(lambda: _done_at_least(pool, deployment, 2), "the second run",
                         within=20)
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
    # The claims from the first one held back (no run, a retry time) to the one that started
    # the second run. Counted from when the test saw the first run done, they also took in
    # claims made before the worker was held back, which found nothing pending (the one after
    # the first completion, a poll before the first enqueue landed): how many of those fall
    # after that moment depends on the machine's speed, and a starved run (six CPU hogs beside
    # it, nice 10) failed with 4 > 3.
    held = next(i for i, answer in enumerate(answers)
                if not answer.runs and answer.retry_after is not None)
    second = next(i for i in range(held, len(answers)) if answers[i].runs)
    between = second - held + 1
    starts = await start_times(pool, deployment)
    gap = (starts[1] - starts[0]).total_seconds()
    save_report(f"rate_limit_held_back_worker_poll_{poll_interval}", {
                "claims_while_held_back": between,
                                                "gap_between_starts_s": round(gap, 4)})
    assert gap >= 2.0  # the database clock: the second start waited for the window
    # While held back the worker neither polled nor answered the five NOTIFYs: at most the
    # claim that was held back, the one at the reported time (and, should that one have met
    # another session on the key row, its retry 10 ms later).
    assert between <= 3


async def _done_at_least(pool: asyncpg.Pool, deployment: str, n: int) -> bool:
    return await done(pool, deployment) >= n


async def test_a_fleet_worker_serves_other_scopes_while_one_is_held_back(pool, database_dsn):
    limited, free = unique_deployment("rate-fleet-held"), unique_deployment("rate-fleet-free")
    await limit_scope(pool, limited, f"{limited}-key", 1, 3600.0)
    for deployment, n in ((limited, 3), (free, 20)):
        await pool.execute(
            """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
                   runs => (SELECT jsonb_agg(jsonb_build_object('payload', '{}'::jsonb))
                              FROM generate_series(1, $2)))""", deployment, n)
    worker = RunWorker(pool, {limited: handler, free: handler}, dsn=database_dsn,
                       max_concurrency=4, poll_interval=0.2, shutdown_timeout=5.0)
    await worker.start()
    try:
        await wait_until(lambda: _done_at_least(pool, free, 20), "the free scope's runs",
                         within=60)
        # More work for the free scope while the other is still held back: the NOTIFY is heard.
        await pool.execute("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, "
                           "payload => '{}')", free)
        await wait_until(lambda: _done_at_least(pool, free, 21), "the late run", within=30)
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
    assert await done(pool, limited) == 1  # one start per hour


async def test_an_orphan_held_back_by_a_full_window_is_recovered_when_a_start_frees(
        pool, database_dsn):
    """Orphans and pending runs draw starts from the same key. A worker whose sweep was held
    back sweeps again at the reported retry time (and a claim pass sweeps before it claims), so
    the orphan takes the next start instead of waiting a whole sweep interval — 60 s here, by
    when the worker's own claims would have taken every start (with a saturated key an orphan
    must not wait unleased for as long as the backlog lasts)."""
    deployment = unique_deployment("rate-orphan")
    await limit_scope(pool, deployment, f"{deployment}-key", 3, 2.0)
    orphan = await pool.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, priority => 100)",
        deployment)
    await pool.execute(
        """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
               runs => (SELECT jsonb_agg(jsonb_build_object('payload', jsonb_build_object('i', i)))
                          FROM generate_series(1, 50) AS i))""", deployment)
    # The orphan's first holder dies with a short lease; two long leases fill the window.
    assert await pool.fetchval(
        """SELECT run_id FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'dead',
               lease_seconds => 0.3)""", deployment) == orphan
    assert len(await pool.fetch(
        """SELECT run_id FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'filler',
               batch_size => 2, lease_seconds => 600) WHERE run_id IS NOT NULL""",
        deployment)) == 2
    await wait_until(lambda: pool.fetchval(
        "SELECT lease_expires_at < clock_timestamp() FROM zeroth.runs WHERE run_id = $1",
        orphan), "the orphan's lease to expire", within=10)
    worker = RunWorker(pool, deployment, handler, dsn=database_dsn, max_concurrency=4,
                       poll_interval=0.05, orphan_sweep_interval=60.0, shutdown_timeout=5.0)
    await worker.start()
    try:
        await wait_until(lambda: pool.fetchval(
            """SELECT attempts >= 2 FROM zeroth.runs WHERE run_id = $1""", orphan),
            "the orphan to be re-leased", within=20, interval=0.05)
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
    starts = await start_times(pool, deployment)
    assert max_in_window([s for s in starts if s is not None], 2.0) <= 3
