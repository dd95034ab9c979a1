"""The per-run lifecycle (zeroth_pg.worker._run.ActiveRun): legal transitions, refused ones, and
stop requests. Pure state; the database is exercised by the other modules of this folder."""

from __future__ import annotations

import pytest
from leased import active, unclaimed

from zeroth_pg.worker import RunState, StopReason


def entry_in(state: RunState):
    entry = active(unclaimed())
    path = {RunState.QUEUED: [], RunState.WAITING: [RunState.WAITING],
            RunState.EXECUTING: [RunState.EXECUTING],
            RunState.COMPLETING: [RunState.EXECUTING, RunState.COMPLETING],
            RunState.SETTLING: [RunState.SETTLING], RunState.DONE: [RunState.DONE]}[state]
    for step in path:
        entry.advance(step)
    return entry


class TestTransitions:
    def test_a_run_goes_from_queued_through_executing_and_completing_to_done(self):
        entry = active(unclaimed())
        assert entry.state is RunState.QUEUED
        for step in (RunState.EXECUTING, RunState.COMPLETING, RunState.DONE):
            entry.advance(step)
        assert entry.state is RunState.DONE

    @pytest.mark.parametrize(("start", "to"), [
        (RunState.QUEUED, RunState.COMPLETING),
        (RunState.COMPLETING, RunState.EXECUTING),
        (RunState.SETTLING, RunState.EXECUTING),
        (RunState.SETTLING, RunState.COMPLETING),
        (RunState.DONE, RunState.SETTLING),
        (RunState.DONE, RunState.DONE),
        (RunState.EXECUTING, RunState.EXECUTING),
        (RunState.EXECUTING, RunState.WAITING),
        (RunState.WAITING, RunState.COMPLETING),
        (RunState.WAITING, RunState.WAITING),
    ])
    def test_an_impossible_transition_is_refused_and_changes_nothing(self, start, to):
        entry = entry_in(start)
        with pytest.raises(RuntimeError, match=f"{start.value} -> {to.value}"):
            entry.advance(to)
        assert entry.state is start

    @pytest.mark.parametrize("state", list(RunState))
    def test_finish_ends_a_run_from_any_state_once(self, state):
        entry = entry_in(state)
        entry.finish()
        entry.finish()
        assert entry.state is RunState.DONE


class TestStopRequests:
    def test_only_an_executing_handler_or_a_wait_for_a_slot_is_cancelled(self):
        assert entry_in(RunState.EXECUTING).request_stop(StopReason.SHUTDOWN) is True
        assert entry_in(RunState.WAITING).request_stop(StopReason.SHUTDOWN) is True
        assert entry_in(RunState.QUEUED).request_stop(StopReason.SHUTDOWN) is False
        assert entry_in(RunState.COMPLETING).request_stop(StopReason.SHUTDOWN) is False

    def test_the_first_reason_wins(self):
        entry = entry_in(RunState.EXECUTING)
        assert entry.request_stop(StopReason.LEASE_LOST) is True
        assert entry.request_stop(StopReason.CANCEL) is False
        assert entry.stop_reason is StopReason.LEASE_LOST
        assert not entry.ctx.cancel_requested

    def test_a_cancel_is_visible_to_the_handler(self):
        entry = entry_in(RunState.EXECUTING)
        entry.request_stop(StopReason.CANCEL)
        assert entry.ctx.cancel_requested

    @pytest.mark.parametrize("state", [RunState.SETTLING, RunState.DONE])
    def test_a_settling_or_settled_run_takes_no_stop(self, state):
        entry = entry_in(state)
        assert entry.request_stop(StopReason.LEASE_LOST) is False
        assert entry.stop_reason is None

    def test_a_run_waiting_for_a_handler_slot_is_renewed_until_stopped(self):
        entry = entry_in(RunState.WAITING)
        assert entry.renewable
        entry.request_stop(StopReason.NO_SLOT)
        assert not entry.renewable

    def test_a_stopped_run_is_no_longer_renewed(self):
        entry = entry_in(RunState.EXECUTING)
        assert entry.renewable
        entry.request_stop(StopReason.SHUTDOWN)
        assert not entry.renewable

    @pytest.mark.parametrize("reason", list(StopReason))
    def test_only_a_stop_for_a_lost_lease_forbids_every_write(self, reason):
        entry = entry_in(RunState.EXECUTING)
        entry.request_stop(reason)
        lost = reason in (StopReason.LEASE_LOST, StopReason.DEADLINE, StopReason.SUPERSEDED)
        assert entry.lease_gone is lost
        assert entry.may_settle is not lost
