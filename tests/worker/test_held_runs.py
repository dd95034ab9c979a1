"""The worker's slot accounting (zeroth_pg.worker._slots.HeldRuns) with and without claiming
ahead: how many runs a claim may ask for, and the handler slots the runs claimed ahead wait for.
Pure state; the database side is tests/integration/test_worker_claim_ahead.py."""

from __future__ import annotations

import pytest
from leased import active, unclaimed

from zeroth_pg.worker import RunState
from zeroth_pg.worker._slots import HeldRuns


def _held(runs: HeldRuns, *states: RunState) -> list:
    entries = []
    for state in states:
        entry = active(unclaimed())
        if state is not RunState.QUEUED:
            entry.advance(state)
        runs.add(entry)
        entries.append(entry)
    return entries


def test_without_claiming_ahead_a_worker_claims_up_to_its_handlers():
    runs = HeldRuns(4, None, on_linger_end=lambda: None)
    assert runs.handler_slots is None
    assert runs.ahead() == 0
    _held(runs, RunState.EXECUTING, RunState.EXECUTING, RunState.QUEUED)
    assert runs.free() == 1


def test_claiming_ahead_adds_its_runs_to_what_a_claim_may_ask_for():
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    assert runs.free() == 6
    _held(runs, *[RunState.EXECUTING] * 4, RunState.WAITING)
    assert runs.free() == 1


def test_a_paused_worker_claims_nothing_ahead():
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    runs.pause_ahead()
    assert runs.ahead() == 0
    _held(runs, *[RunState.EXECUTING] * 4)
    assert runs.free() == 0


async def test_a_handler_slot_is_given_back_once_however_often_it_is_returned():
    runs = HeldRuns(1, None, on_linger_end=lambda: None, claim_ahead=1)
    assert runs.handler_slots is not None
    [entry] = _held(runs, RunState.EXECUTING)
    await runs.handler_slots.acquire()
    runs.take_handler_slot(entry)
    assert runs.handler_slots.locked()
    runs.return_handler_slot(entry)
    runs.return_handler_slot(entry)  # the handler returned, then its task ended: one release
    assert not runs.handler_slots.locked()
    await runs.handler_slots.acquire()
    assert runs.handler_slots.locked()


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.WAITING, RunState.EXECUTING])
def test_a_run_waiting_for_a_slot_counts_against_its_deployments_local_limit(state):
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    _held(runs, state)
    assert runs.executing_by_deployment()["unit"] == 1


def test_a_claim_out_counts_as_held_while_claiming_ahead():
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    with runs.claiming(5):
        assert runs.free() == 1  # the claim loop and a completion's top-up never share room
    assert runs.free() == 6


def test_without_claiming_ahead_a_claim_out_changes_nothing():
    runs = HeldRuns(4, None, on_linger_end=lambda: None)
    with runs.claiming(3):
        assert runs.free() == 4
