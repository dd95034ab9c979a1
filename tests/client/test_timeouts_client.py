"""LeaseManager and attempt / run timeouts (issue 34, item 2): the registry's and a run's own
timeouts go in typed, the claim's deadline comes back (ClaimedRun.deadline_at / deadline_in), a
renewal past a deadline is DeadlinePassedError / LeaseRenewal.sqlstate, and a holder settles a
timeout with SettleKind.TIMEOUT."""

from __future__ import annotations

from uuid import uuid4

import pytest

from zeroth_pg import (
    DeadlinePassedError,
    InvalidArgumentError,
    LeaseLostError,
    LeaseManager,
    SettleKind,
    Settlement,
    SettleOutcome,
)

W1 = "worker-1"


def deployment() -> str:
    return f"deploy-timeouts-{uuid4().hex[:8]}"


class TestRegistry:
    async def test_timeouts_are_registered_listed_and_unset(self, pool):
        lm, dep = LeaseManager(pool), deployment()
        registered = await lm.register_deployment(dep, attempt_timeout_seconds=30,
                                                  run_timeout_seconds=600)
        assert (registered.attempt_timeout_seconds, registered.run_timeout_seconds) == (30, 600)
        [listed] = await lm.list_deployments(dep)
        assert (listed.attempt_timeout_seconds, listed.run_timeout_seconds) == (30, 600)
        cleared = await lm.set_deployment_defaults(dep, unset=["run_timeout_seconds"])
        assert (cleared.attempt_timeout_seconds, cleared.run_timeout_seconds) == (30, None)


class TestClaimAndRenew:
    async def test_the_claim_returns_the_deadline_and_caps_the_lease(self, pool):
        lm, dep = LeaseManager(pool, lease_duration_seconds=60), deployment()
        await lm.enqueue_run(dep, attempt_timeout_seconds=20)
        untimed = (await lm.enqueue_run(dep)).run_id
        runs = {r.run_id: r for r in (await lm.claim_and_start(dep, W1, batch_size=2)).runs}
        timed = next(r for r in runs.values() if r.run_id != untimed)
        assert timed.deadline_at == timed.lease_expires_at
        assert timed.deadline_in == pytest.approx(20)
        assert (runs[untimed].deadline_at, runs[untimed].deadline_in) == (None, None)

    async def test_a_renewal_past_the_deadline_is_deadline_passed(self, pool):
        lm, dep = LeaseManager(pool), deployment()
        run_id = (await lm.enqueue_run(dep, attempt_timeout_seconds=20)).run_id
        [run] = (await lm.claim_and_start(dep, W1)).runs
        # A DBA's manual UPDATE puts the deadline a moment in the past.
        await pool.execute(
            """UPDATE zeroth.runs SET attempt_deadline_at = clock_timestamp() - interval '1 ms',
                   lease_expires_at = clock_timestamp() - interval '1 ms' WHERE run_id = $1""",
            run_id)
        with pytest.raises(DeadlinePassedError) as raised:
            await lm.renew_lease(run_id, W1, generation=run.lease_generation)
        assert isinstance(raised.value, LeaseLostError)
        [renewal] = await lm.renew_leases(W1, {run_id: run.lease_generation})
        assert (renewal.renewed, renewal.sqlstate) == (False, DeadlinePassedError.sqlstate)

    async def test_a_runs_own_timeout_must_be_whole_seconds(self, pool):
        lm, dep = LeaseManager(pool), deployment()
        with pytest.raises(InvalidArgumentError):
            await lm.enqueue_run(dep, attempt_timeout_seconds=1.5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await lm.enqueue_run(dep, run_timeout_seconds=True)
        assert await pool.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1", dep) == 0


class TestSettle:
    async def test_a_holder_settles_its_timeout(self, pool):
        lm, dep = LeaseManager(pool), deployment()
        await lm.enqueue_run(dep, attempt_timeout_seconds=30, max_attempts=3)
        [run] = (await lm.claim_and_start(dep, W1)).runs
        [settled] = await lm.settle_runs(W1, [Settlement(run.run_id, run.lease_generation,
                                                         SettleKind.TIMEOUT)])
        assert (settled.outcome, settled.sqlstate) == (SettleOutcome.TIMED_OUT, None)
        row = await pool.fetchrow(
            "SELECT status::text, error->>'stop_reason' AS stop FROM zeroth.runs "
            "WHERE run_id = $1", run.run_id)
        assert tuple(row) == ("pending", "attempt_timeout")
