"""The worker's slot accounting (zeroth_pg.worker._slots.HeldRuns) with and without claiming
ahead: how many runs a claim may ask for, and the handler slots the runs claimed ahead wait for.
Pure state; the database side is tests/integration/test_worker_claim_ahead.py."""

from __future__ import annotations

import pytest
from leased import active, unclaimed

from zeroth_pg.worker import RunState, StopReason
from zeroth_pg.worker._ahead import AHEAD_EVIDENCE, AHEAD_HANDLER_LIMIT, ClaimAhead
from zeroth_pg.worker._run import ActiveRun
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
    assert runs.ahead_gate is None
    assert runs.ahead() == 0
    _held(runs, RunState.EXECUTING, RunState.EXECUTING, RunState.QUEUED)
    assert runs.free() == 1


def _proved_short(runs: HeldRuns) -> None:
    """As many short handlers returned as the worker has slots (at least AHEAD_EVIDENCE): it
    may claim ahead."""
    assert runs.ahead_gate is not None
    for _ in range(max(runs.max_concurrency, AHEAD_EVIDENCE)):
        runs.ahead_gate.returned(active(unclaimed()), 0.001)


def test_a_worker_claims_ahead_once_its_last_handlers_were_all_short():
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    assert runs.ahead() == 0  # no handler returned yet
    assert runs.free() == 4
    _proved_short(runs)
    assert runs.ahead() == 2
    assert runs.free() == 6
    _held(runs, *[RunState.EXECUTING] * 4, RunState.WAITING)
    assert runs.free() == 1


def test_one_long_handler_among_the_last_stops_claiming_ahead_until_it_is_forgotten():
    runs = HeldRuns(2, None, on_linger_end=lambda: None, claim_ahead=2)
    assert runs.ahead_gate is not None
    _proved_short(runs)
    runs.ahead_gate.returned(active(unclaimed()), AHEAD_HANDLER_LIMIT)
    assert runs.ahead() == 0
    for _ in range(AHEAD_EVIDENCE - 1):
        runs.ahead_gate.returned(active(unclaimed()), 0.001)
        assert runs.ahead() == 0  # still among the last AHEAD_EVIDENCE
    runs.ahead_gate.returned(active(unclaimed()), 0.001)
    assert runs.ahead() == 2


async def _executing_in_a_slot(runs: HeldRuns) -> tuple[ClaimAhead, ActiveRun]:
    """One run whose handler took one of the worker's handler slots."""
    gate = runs.ahead_gate
    assert gate is not None
    [entry] = _held(runs, RunState.EXECUTING)
    await gate.slots.acquire()
    gate.took(entry)
    return gate, entry


async def test_a_handler_running_longer_than_the_limit_stops_claiming_ahead(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("zeroth_pg.worker._ahead.time.monotonic", lambda: now[0])
    runs = HeldRuns(2, None, on_linger_end=lambda: None, claim_ahead=2)
    _proved_short(runs)
    gate, entry = await _executing_in_a_slot(runs)
    assert runs.ahead() == 2
    now[0] += AHEAD_HANDLER_LIMIT
    assert runs.ahead() == 0  # it has not returned, and it is long already
    gate.returned(entry, AHEAD_HANDLER_LIMIT)
    assert runs.ahead() == 0  # and now it is among the last handlers


def test_a_run_that_found_no_slot_makes_the_worker_prove_its_handlers_short_again():
    runs = HeldRuns(2, None, on_linger_end=lambda: None, claim_ahead=2)
    assert runs.ahead_gate is not None
    _proved_short(runs)
    runs.ahead_gate.no_slot()
    assert runs.ahead() == 0
    _proved_short(runs)
    assert runs.ahead() == 2


async def test_a_handler_slot_is_given_back_once_however_often_it_is_returned():
    runs = HeldRuns(1, None, on_linger_end=lambda: None, claim_ahead=1)
    gate, entry = await _executing_in_a_slot(runs)
    assert gate.slots.locked()
    gate.returned(entry, 0.001)
    gate.returned(entry, None)  # the handler returned, then its task ended: one release
    assert not gate.slots.locked()
    await gate.slots.acquire()
    assert gate.slots.locked()


async def test_a_slot_held_by_a_run_no_longer_counted_held_is_not_free():
    runs = HeldRuns(1, None, on_linger_end=lambda: None, claim_ahead=1)
    _proved_short(runs)
    _, stuck = await _executing_in_a_slot(runs)
    assert runs.free() == 1  # one ahead
    stuck.request_stop(StopReason.LEASE_LOST)  # its handler ignores the cancellation
    assert runs.held() == []
    assert runs.free() == 1  # its slot is still taken: one ahead, none more


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.WAITING, RunState.EXECUTING])
def test_a_run_waiting_for_a_slot_counts_against_its_deployments_local_limit(state):
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    _held(runs, state)
    assert runs.executing_by_deployment()["unit"] == 1


def test_a_claim_out_counts_as_held_while_claiming_ahead():
    runs = HeldRuns(4, None, on_linger_end=lambda: None, claim_ahead=2)
    _proved_short(runs)
    with runs.claiming(5):
        assert runs.free() == 1  # the claim loop and a completion's top-up never share room
    assert runs.free() == 6


def test_without_claiming_ahead_a_claim_out_changes_nothing():
    runs = HeldRuns(4, None, on_linger_end=lambda: None)
    with runs.claiming(3):
        assert runs.free() == 4
