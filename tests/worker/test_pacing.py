"""Claim pacing (zeroth_pg.worker._pacing.ClaimPacer): when the claim loop claims again, sweeps,
sleeps and lets a wakeup through. Pure decisions on a given monotonic time; the claim loop that
feeds them is exercised against the database in tests/integration."""

from __future__ import annotations

import pytest

from zeroth_pg.worker._pacing import FAILED_RETRY_FIRST, FAILED_RETRY_MAX, ClaimPacer, GateMode

POLL = 0.5
SWEEP = 5.0


def after_pass(pacer: ClaimPacer, *, limit: int, got: int, now: float = 100.0,
               deployments: tuple[str, ...] | None = None, fleet_full: bool = False,
               retry_after: float | None = None, all_held_back: bool = False) -> None:
    """One claim pass of a single claim."""
    pacer.pass_begins()
    pacer.claimed(now, deployments, limit, got, fleet_full=fleet_full, retry_after=retry_after,
                  all_held_back=all_held_back)
    pacer.pass_ends(got, limit)


def swept(now: float = 100.0) -> ClaimPacer:
    """A pacer whose first sweep is done and whose next one is an interval away."""
    pacer = ClaimPacer()
    pacer.swept(now, SWEEP, more=False, held_until=None)
    return pacer


class TestBacklog:
    def test_a_full_batch_claims_again_as_soon_as_a_slot_is_free(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=4)
        assert pacer.gate_mode(4, 100.0) is GateMode.BUSY
        assert pacer.claim_at_once(1, dict)
        assert not pacer.claim_at_once(0, dict)
        assert pacer.slot_freed_wakes(fleet=False)

    def test_a_short_batch_sleeps_and_a_freed_slot_does_not_wake_the_loop(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=2)
        assert pacer.gate_mode(2, 100.0) is GateMode.FLOWING
        assert not pacer.claim_at_once(3, dict)
        assert not pacer.slot_freed_wakes(fleet=True)

    def test_an_empty_claim_lets_the_worker_wait_for_a_notify(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=0)
        assert pacer.gate_mode(0, 100.0) is GateMode.IDLE

    def test_no_claim_made_keeps_writers_quiet(self):
        assert swept().gate_mode(None, 100.0) is GateMode.BUSY

    def test_a_failed_pass_forgets_the_backlog(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=4)
        pacer.pass_failed(100.0, POLL)
        assert not pacer.claim_at_once(4, dict)


class TestAFailedPass:
    """A pass that raised (a connection lost to a failover, no writable server yet) is retried
    on a short backoff, not a poll interval later; the retries slow down while it keeps failing,
    up to a bound, so a server that is down is not hammered (issue 35)."""

    def test_the_next_pass_comes_after_the_first_retry_not_the_poll_interval(self):
        pacer = swept()
        assert pacer.pass_failed(100.0, 60.0) == FAILED_RETRY_FIRST
        assert pacer.sleep_for(100.0, 60.0) == pytest.approx(FAILED_RETRY_FIRST)

    def test_failures_in_a_row_double_the_wait_up_to_its_bound(self):
        pacer = swept(200.0)  # no sweep due meanwhile
        waits = [pacer.pass_failed(100.0 + n, 60.0) for n in range(8)]
        assert waits[:3] == pytest.approx([FAILED_RETRY_FIRST, 2 * FAILED_RETRY_FIRST,
                                           4 * FAILED_RETRY_FIRST])
        assert waits == sorted(waits)
        assert waits[-1] == FAILED_RETRY_MAX
        assert pacer.sleep_for(107.0, 60.0) == pytest.approx(FAILED_RETRY_MAX)

    def test_never_longer_than_the_poll_interval(self):
        pacer = swept()
        for n in range(8):
            assert pacer.pass_failed(100.0 + n, 0.2) <= 0.2

    def test_a_pass_that_gets_through_starts_the_backoff_over(self):
        pacer = swept()
        for n in range(5):
            pacer.pass_failed(100.0 + n, 60.0)
        after_pass(pacer, limit=4, got=0, now=106.0)
        pacer.swept(106.0, SWEEP, more=False, held_until=None)
        assert pacer.sleep_for(106.0, 60.0) == pytest.approx(SWEEP)  # the poll, or the sweep
        assert pacer.failed_retry_at is None
        assert pacer.pass_failed(107.0, 60.0) == FAILED_RETRY_FIRST

    def test_every_deployment_at_its_limit_forgets_the_backlog(self):
        # A stale backlog flag here once spun the loop without ever yielding.
        pacer = swept()
        after_pass(pacer, limit=4, got=4)
        pacer.nothing_to_claim_for()
        assert not pacer.claim_at_once(4, dict)


class TestFleetLimit:
    def test_a_full_fleet_is_claimed_into_when_a_run_gives_its_admission_slot_back(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=1, fleet_full=True)
        assert not pacer.slot_freed_wakes(fleet=False)  # a local slot only: still full
        assert pacer.slot_freed_wakes(fleet=True)

    def test_the_next_pass_starts_with_the_fleet_not_full(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=1, fleet_full=True)
        after_pass(pacer, limit=4, got=1)
        assert not pacer.slot_freed_wakes(fleet=True)


class TestRateLimit:
    def test_a_held_back_claim_sleeps_until_retry_after_and_not_at_the_poll(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=0, retry_after=2.0, all_held_back=True)
        assert pacer.rate_held(100.5)
        assert pacer.sleep_for(100.5, POLL) == pytest.approx(1.5)
        assert not pacer.rate_held(102.0)

    def test_all_held_back_ignores_notifications_until_then(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=0, retry_after=2.0, all_held_back=True)
        assert pacer.gate_mode(0, 101.0) is GateMode.BUSY

    def test_some_work_not_held_back_still_polls(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=2, retry_after=2.0, all_held_back=False)
        assert not pacer.rate_held(100.5)
        assert pacer.sleep_for(100.5, POLL) == pytest.approx(POLL)

    def test_a_cut_short_batch_is_no_backlog(self):
        pacer = swept()
        after_pass(pacer, limit=4, got=4, retry_after=1.0)
        assert not pacer.claim_at_once(4, dict)

    def test_the_earliest_retry_of_a_pass_wins(self):
        pacer = swept()
        pacer.pass_begins()
        for retry_after in (3.0, 1.0, 2.0):
            pacer.claimed(100.0, None, 4, 0, fleet_full=False, retry_after=retry_after,
                          all_held_back=True)
        pacer.pass_ends(0, 12)
        assert pacer.rate_retry_at == pytest.approx(101.0)

    def test_a_rate_limit_keeps_the_claim_out_of_a_completion(self):
        pacer = swept()
        assert pacer.may_claim_along(101.0)
        after_pass(pacer, limit=4, got=0, retry_after=1.0)
        assert not pacer.may_claim_along(101.0)


class TestOrphanSweep:
    def test_the_first_pass_sweeps(self):
        pacer = ClaimPacer()
        assert pacer.sweep_wanted(0.0)
        assert not pacer.may_claim_along(0.0)  # a claim pass sweeps first

    def test_the_next_sweep_comes_after_the_interval(self):
        pacer = swept(100.0)
        assert not pacer.sweep_wanted(104.9)
        assert pacer.sweep_wanted(105.0)
        assert pacer.sleep_for(104.8, POLL) == pytest.approx(0.2)  # woken for the sweep

    def test_more_orphans_are_looked_for_at_once(self):
        pacer = ClaimPacer()
        pacer.swept(100.0, SWEEP, more=True, held_until=None)
        assert pacer.sweep_wanted(100.0)
        assert pacer.slot_freed_wakes(fleet=False)

    def test_orphans_held_back_by_a_rate_limit_are_swept_when_a_start_is_possible(self):
        pacer = ClaimPacer()
        pacer.swept(100.0, SWEEP, more=False, held_until=101.0)
        assert pacer.next_sweep == pytest.approx(101.0)

    def test_a_failed_sweep_is_retried_on_the_failure_backoff_not_an_interval_later(self):
        # After a failover the sweep is what re-leases the dead worker's runs first (issue 35).
        pacer = ClaimPacer()
        assert pacer.sweep_failed(100.0, SWEEP) == FAILED_RETRY_FIRST
        assert not pacer.sweep_wanted(100.0)  # not in a loop: claiming goes on meanwhile
        assert pacer.sweep_wanted(100.0 + FAILED_RETRY_FIRST)
        assert pacer.sleep_for(100.0, 60.0) == pytest.approx(FAILED_RETRY_FIRST)  # woken for it

    def test_failed_sweeps_in_a_row_double_the_wait_up_to_its_bound(self):
        pacer = ClaimPacer()
        waits = [pacer.sweep_failed(100.0 + n, SWEEP) for n in range(8)]
        assert waits[:3] == pytest.approx([FAILED_RETRY_FIRST, 2 * FAILED_RETRY_FIRST,
                                           4 * FAILED_RETRY_FIRST])
        assert waits == sorted(waits)
        assert waits[-1] == FAILED_RETRY_MAX

    def test_a_failed_sweep_never_waits_longer_than_the_sweep_interval(self):
        pacer = ClaimPacer()
        for n in range(8):
            assert pacer.sweep_failed(100.0 + n, 0.2) <= 0.2

    def test_a_sweep_that_answers_starts_the_backoff_over(self):
        pacer = ClaimPacer()
        for n in range(5):
            pacer.sweep_failed(100.0 + n, SWEEP)
        pacer.swept(106.0, SWEEP, more=False, held_until=None)
        assert not pacer.sweep_wanted(110.9)  # the interval again after a sweep that answered
        assert pacer.sweep_failed(111.0, SWEEP) == FAILED_RETRY_FIRST

    def test_a_failed_sweep_and_a_failed_pass_keep_their_own_backoffs(self):
        pacer = ClaimPacer()
        for n in range(4):
            pacer.sweep_failed(100.0 + n, SWEEP)
        assert pacer.pass_failed(104.0, 60.0) == FAILED_RETRY_FIRST
        after_pass(pacer, limit=4, got=0, now=105.0)  # the claim answered; the sweep did not
        assert pacer.sweep_failed(105.0, SWEEP) == pytest.approx(16 * FAILED_RETRY_FIRST)

    def test_without_room_the_end_only_sweep_runs_once_per_interval(self):
        pacer = swept(100.0)
        assert pacer.sweep_without_room(105.0, SWEEP)
        assert not pacer.sweep_without_room(106.0, SWEEP)
        assert pacer.sweep_without_room(110.0, SWEEP)
        assert pacer.sweep_due  # re-leasing waits for a free slot, then sweeps at once
        assert pacer.slot_freed_wakes(fleet=False)


class TestDeploymentLimits:
    def test_without_limits_one_claim_takes_every_free_slot(self):
        assert ClaimPacer().groups(5, ("a", "b"), {}) == [(None, 5)]

    def test_a_limited_deployment_gets_a_claim_of_its_room(self):
        pacer = ClaimPacer(deployment_limits={"a": 2})
        groups = pacer.groups(5, ("a", "b"), {"a": 0})
        assert sorted(groups, key=repr) == sorted([(("a",), 2), (("b",), 5)], key=repr)

    def test_a_deployment_at_its_limit_is_left_out(self):
        pacer = ClaimPacer(deployment_limits={"a": 2})
        assert pacer.groups(5, ("a", "b"), {"a": 2}) == [(("b",), 5)]
        assert pacer.groups(5, ("a",), {"a": 2}) == []

    def test_the_order_of_the_claims_rotates(self):
        pacer = ClaimPacer(deployment_limits={"a": 1, "b": 2})
        first = pacer.groups(5, ("a", "b", "c"), {})
        second = pacer.groups(5, ("a", "b", "c"), {})
        assert first != second
        assert sorted(first, key=repr) == sorted(second, key=repr)

    def test_a_deployment_that_filled_its_own_claim_is_claimed_into_when_it_has_room(self):
        pacer = ClaimPacer(deployment_limits={"a": 2})
        pacer.pass_begins()  # "a" filled its own claim; the shared one came back short
        pacer.claimed(100.0, ("a",), 2, 2, fleet_full=False, retry_after=None,
                      all_held_back=False)
        pacer.claimed(100.0, ("b",), 3, 1, fleet_full=False, retry_after=None,
                      all_held_back=False)
        pacer.pass_ends(3, 5)
        assert not pacer.backlog
        assert pacer.slot_freed_wakes(fleet=False)
        assert not pacer.claim_at_once(3, lambda: {"a": 2})
        assert pacer.claim_at_once(3, lambda: {"a": 1})

    def test_a_short_or_shared_claim_forgets_that_it_was_full(self):
        # A stale entry once kept an idle worker claiming.
        pacer = ClaimPacer(deployment_limits={"a": 2})
        after_pass(pacer, limit=2, got=2, deployments=("a",))
        after_pass(pacer, limit=2, got=1, deployments=("a",))
        assert not pacer.deployments_full
        after_pass(pacer, limit=2, got=2, deployments=("a",))
        after_pass(pacer, limit=5, got=5, deployments=None)
        assert not pacer.deployments_full
