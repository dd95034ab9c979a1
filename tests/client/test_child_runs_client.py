"""LeaseManager.start_child_run / wait_for_children over a real pool: the typed results
(ChildStart, ChildWait, ChildOutcome), None when fenced out, and the SQLSTATE mapping (ZP010 →
ChildRunConflictError, ZP008 → InvalidArgumentError). The transitions are covered by
tests/sql/test_child_runs.py.
"""

from __future__ import annotations

from uuid import UUID

import pytest

from zeroth_pg import (
    ChildOutcome,
    ChildRunConflictError,
    ChildStart,
    ChildWait,
    ChildWaitOutcome,
    InvalidArgumentError,
    LeaseManager,
    RunStatus,
)

PARENT = "client-parent"
KID = "client-kid"
W1 = "worker-1"


async def running(lm: LeaseManager, deployment: str) -> tuple[UUID, int]:
    (run,) = (await lm.claim_and_start(deployment, W1)).runs
    return run.run_id, run.lease_generation


async def test_start_wait_and_outcomes_are_typed(pool):
    lm = LeaseManager(pool)
    await lm.enqueue_run(PARENT, {})
    parent, generation = await running(lm, PARENT)
    started = await lm.start_child_run(parent, W1, "c1", KID, {"n": 2}, generation=generation)
    assert isinstance(started, ChildStart)
    assert started.created is True
    again = await lm.start_child_run(parent, W1, "c1", KID, {"n": 2}, generation=generation)
    assert again == ChildStart(child_run_id=started.child_run_id, created=False)
    with pytest.raises(ChildRunConflictError):
        await lm.start_child_run(parent, W1, "c1", KID, {"n": 3}, generation=generation)

    waited = await lm.wait_for_children(parent, W1, "#children", [started.child_run_id],
                                        generation=generation)
    assert waited == ChildWait(outcome=ChildWaitOutcome.WAITING, children=None)

    child, child_generation = await running(lm, KID)
    assert child == started.child_run_id
    assert await lm.complete_run(child, W1, generation=child_generation, output={"sq": 4})
    parent_again, generation_again = await running(lm, PARENT)
    assert parent_again == parent
    ready = await lm.wait_for_children(parent, W1, "#children", [child],
                                       generation=generation_again)
    assert ready is not None
    assert ready.outcome is ChildWaitOutcome.READY
    (outcome,) = ready.children or ()
    assert isinstance(outcome, ChildOutcome)
    assert (outcome.run_id, outcome.status, outcome.output, outcome.error,
            outcome.dead_lettered) == (child, RunStatus.COMPLETED, {"sq": 4}, None, False)
    assert outcome.succeeded
    assert outcome.finished
    assert outcome.finished_at is not None


async def test_fenced_out_is_none_and_bad_arguments_raise(pool):
    lm = LeaseManager(pool)
    await lm.enqueue_run(PARENT, {})
    parent, generation = await running(lm, PARENT)
    assert await lm.start_child_run(parent, "someone-else", "c1", KID,
                                    generation=generation) is None
    assert await lm.wait_for_children(parent, W1, "#children", [parent],
                                      generation=generation + 1) is None
    with pytest.raises(InvalidArgumentError):  # not a child of this run (ZP008)
        await lm.wait_for_children(parent, W1, "#children", [parent], generation=generation)
    with pytest.raises(InvalidArgumentError):
        await lm.wait_for_children(parent, W1, "#children", "not-a-list", generation=generation)
    with pytest.raises(InvalidArgumentError):
        await lm.wait_for_children(parent, W1, "#children", [parent], generation=generation,
                                   mode="some")
