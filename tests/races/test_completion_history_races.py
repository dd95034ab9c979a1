"""Scripted interleavings of real sessions ending one lease: one end, one attempt history row.

* one lease completed from two sessions at once (complete_run, complete_runs,
  complete_and_claim, in either order): one completion, one history row;
* a completion and a fail_run / hand-back of the same lease from two sessions, either first:
  one end, one history row (the completion's own or the trigger's);
* a completion that waited for a takeover: refused, and the taken-over attempt has one row.
"""

from __future__ import annotations

import json

import pytest
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from interleave import assert_waits_for, finished, only
from test_child_run_races import (
    CLAIM_ORPHANED,
    COMPLETE,
)
from test_child_wait_races import ended

COMPLETE_RUNS = """SELECT completed FROM zeroth_test.complete_runs(worker_id => $2,
                       run_ids => ARRAY[$1]::uuid[], generations => ARRAY[$3]::bigint[],
                       now_override => $5) WHERE $4::text IS NULL OR $4::text IS NOT NULL"""

COMPLETE_AND_CLAIM = """SELECT completed[1] FROM zeroth_test.complete_and_claim(
                            deployment_ref => 'elsewhere', worker_id => $2,
                            run_ids => ARRAY[$1]::uuid[], generations => ARRAY[$3]::bigint[],
                            now_override => $5) WHERE $4::text IS NULL OR $4::text IS NOT NULL"""

COMPLETIONS = {"complete_run": COMPLETE, "complete_runs": COMPLETE_RUNS,
               "complete_and_claim": COMPLETE_AND_CLAIM}

@pytest.mark.parametrize(("first", "second"), [
    ("complete_run", "complete_runs"), ("complete_runs", "complete_run"),
    ("complete_and_claim", "complete_run"), ("complete_runs", "complete_and_claim")])
async def test_one_lease_completed_from_two_sessions_lands_once_with_one_row(
        sessions, first, second):
    """Two processes with the same worker id and lease (a duplicated deployment)."""
    a, b, db = sessions
    lease = await make_run(db, "running")
    await a.begin()
    assert (await a.call(COMPLETIONS[first], lease.run_id, WORKER, lease.generation,
                         json.dumps(1), at(1))).value is True
    late = b.spawn(COMPLETIONS[second], lease.run_id, WORKER, lease.generation, json.dumps(2),
                   at(1))
    await assert_waits_for(db, b, a, late)
    await a.commit()
    assert (await finished(late)).value is False
    # The first call's output (the batches here send none: the run keeps its own, NULL); never
    # the refused second call's.
    assert (await run_row(db, lease.run_id))["output"] == ("1" if first == "complete_run" else None)
    assert await ended(db, lease.run_id) == [(lease.generation, WORKER, "completed")]


@pytest.mark.parametrize("completion", sorted(COMPLETIONS))
async def test_a_completion_that_waited_for_a_takeover_lands_nothing(sessions, completion):
    holder, sweeper, db = sessions
    lease = await make_run(db, "running")
    await sweeper.begin()
    taken = only(await sweeper.rows(CLAIM_ORPHANED, DEPLOYMENT, "worker-b", at(61)))
    assert taken["lease_generation"] == lease.generation + 1
    stale = holder.spawn(COMPLETIONS[completion], lease.run_id, WORKER, lease.generation,
                         json.dumps(1), at(59))
    await assert_waits_for(db, holder, sweeper, stale)
    await sweeper.commit()
    assert (await finished(stale)).value is False
    assert await ended(db, lease.run_id) == [(lease.generation, WORKER, "recovered")]
    assert (await run_row(db, lease.run_id))["lease_worker_id"] == "worker-b"


OTHER_ENDS = {
    "fail_run": ("""SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                        error => $4::text::jsonb, retryable => false, now_override => $5)""",
                 "failed", "failed"),
    "hand_back": ("""SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                         generation => $3, now_override => $5)
                      WHERE $4::text IS NULL OR $4::text IS NOT NULL""",
                  True, "handed_back"),
}


@pytest.mark.parametrize("other", sorted(OTHER_ENDS))
@pytest.mark.parametrize("completion", ["complete_run", "complete_runs"])
@pytest.mark.parametrize("completion_first", [True, False])
async def test_a_completion_and_another_end_of_one_lease_write_one_row(
        sessions, other, completion, completion_first):
    """Two processes of one lease end it two ways at once: the first to lock wins, the other is
    refused, and the attempt has exactly one row (written by the completion's statement or by
    the trigger)."""
    a, b, db = sessions
    lease = await make_run(db, "running")
    query, accepted, outcome = OTHER_ENDS[other]
    calls = [(COMPLETIONS[completion], True, "completed"), (query, accepted, outcome)]
    if not completion_first:
        calls.reverse()
    (first, first_ok, first_outcome), (second, _ok, _outcome) = calls
    await a.begin()
    assert (await a.call(first, lease.run_id, WORKER, lease.generation, json.dumps(1),
                         at(1))).value == first_ok
    late = b.spawn(second, lease.run_id, WORKER, lease.generation, json.dumps(2), at(1))
    await assert_waits_for(db, b, a, late)
    await a.commit()
    refused = await finished(late)
    assert refused.value in (False, None) or (refused.sqlstate or "").startswith("ZP"), refused
    assert await ended(db, lease.run_id) == [(lease.generation, WORKER, first_outcome)]
