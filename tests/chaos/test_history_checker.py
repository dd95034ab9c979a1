"""The chaos soak's history checker fails on every kind of history it exists to reject.

A checker that never fails proves nothing, so each invariant gets a hand-made history that
breaks it. The base history is a clean takeover: worker w1 claims run A, checkpoints step 1 and
freezes; its lease lapses; w2 claims generation 2, resumes at step 1 and completes; w1 wakes up
and its stale checkpoint is refused. Run B, of a tenant under max_concurrency 1, holds slot 1.
Two snapshots of the live leases were taken meanwhile: one while w1 held A and w3 held B in
slot 1 (which names B's generation 1), one while w2 held A.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from chaos_history import check_history

LEASE = 3.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUN_A, RUN_B, RUN_C = UUID(int=0xA), UUID(int=0xB), UUID(int=0xC)
WRITE_1, WRITE_2, STALE = UUID(int=1), UUID(int=2), UUID(int=3)

Scenario = dict[str, list[dict[str, Any]]]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def history_row(kind: str, run_id: UUID, when: float, *, old_gen: int, old_worker: str | None,
                old_expires: float | None, claim: tuple[int, str, float] | None = None,
                cleared: bool = False, new_expires: float | None = None, slot: int | None = None,
                writer: tuple[int, str, UUID] | None = None, new_status: str = "running",
                tenant: str = "t1", data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A chaos_history row. ``claim`` = (generation, worker, expiry) of a claim; ``cleared``: the
    write dropped the lease; otherwise the lease is kept (``new_expires`` for a renewal)."""
    if claim is not None:
        new_gen, new_worker, expires = claim
        acquired: datetime | None = at(when)
    else:
        new_gen, new_worker, acquired = old_gen, None if cleared else old_worker, None
        expires = None if cleared else (old_expires if new_expires is None else new_expires)
    return {
        "kind": kind, "run_id": run_id, "tenant_id": tenant,
        "old_status": "running", "new_status": new_status,
        "old_generation": old_gen, "new_generation": new_gen,
        "old_worker": old_worker, "new_worker": new_worker,
        "old_expires": None if old_expires is None else at(old_expires),
        "new_expires": None if expires is None else at(expires),
        "acquired_at": acquired, "slot": slot, "fn_now": at(when), "at": at(when + 0.001),
        "writer_generation": None if writer is None else writer[0],
        "writer_worker": None if writer is None else writer[1],
        "writer_event": None if writer is None else writer[2],
        "data": data,
    }


def event(kind: str, run_id: UUID | None, generation: int | None, worker: str | None,
          when: float, *, write_id: UUID | None = None, source: str = "handler",
          data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"event_id": uuid4(), "source": source, "kind": kind, "run_id": run_id,
            "worker_id": worker, "generation": generation, "write_id": write_id,
            "data": data or {}, "at": at(when)}


def slot_sample(sample: int, when: float, run_id: UUID, generation: int, worker: str,
                expires: float, *, tenant: str = "t1", slot: int | None = None,
                named: tuple[UUID | None, int | None] | None = None,
                slot_exists: bool = True) -> dict[str, Any]:
    """A SLOTS_QUERY row of snapshot ``sample``: a live lease, held in ``slot`` (if any), whose
    row names ``named`` (by default this very lease)."""
    slot_run, slot_generation = (run_id, generation) if named is None else named
    in_slot = slot is not None and slot_exists
    return {
        "sample": sample, "at": at(when), "tenant_id": tenant, "workspace_key": "",
        "deployment_ref": "chaos", "run_id": run_id, "lease_worker_id": worker,
        "lease_generation": generation, "lease_expires_at": at(expires), "slot_no": slot,
        "slot_exists": in_slot, "slot_run_id": slot_run if in_slot else None,
        "slot_generation": slot_generation if in_slot else None,
    }


def clean() -> Scenario:
    history = [
        history_row("claim", RUN_A, 0.0, old_gen=0, old_worker=None, old_expires=None,
                    claim=(1, "w1", 3.0)),
        history_row("start", RUN_A, 0.1, old_gen=1, old_worker="w1", old_expires=3.0),
        history_row("checkpoint", RUN_A, 0.5, old_gen=1, old_worker="w1", old_expires=3.0,
                    writer=(1, "w1", WRITE_1), data={"step": 1}),
        history_row("claim", RUN_A, 3.5, old_gen=1, old_worker="w1", old_expires=3.0,
                    claim=(2, "w2", 6.5)),
        history_row("checkpoint", RUN_A, 3.8, old_gen=2, old_worker="w2", old_expires=6.5,
                    writer=(2, "w2", WRITE_2), data={"step": 2}),
        history_row("complete", RUN_A, 4.0, old_gen=2, old_worker="w2", old_expires=6.5,
                    cleared=True, new_status="completed", writer=(2, "w2", UUID(int=4))),
        history_row("claim", RUN_B, 0.0, old_gen=0, old_worker=None, old_expires=None,
                    claim=(1, "w3", 3.0), slot=1, tenant="t3"),
        history_row("complete", RUN_B, 1.0, old_gen=1, old_worker="w3", old_expires=3.0,
                    cleared=True, new_status="completed", tenant="t3", slot=1),
    ]
    for number, row in enumerate(history, 1):
        row["id"] = number
    history.sort(key=lambda row: (row["run_id"], row["id"]))
    events = [
        event("handler_start", RUN_A, 1, "w1", 0.2, data={"resumed_step": 0}),
        event("attempt", RUN_A, 1, "w1", 0.4, write_id=WRITE_1),
        event("accepted", RUN_A, 1, "w1", 0.6, write_id=WRITE_1),
        event("stop", None, None, "w1", 0.7, source="harness",
              data={"leases": [[str(RUN_A), 1]]}),
        event("handler_start", RUN_A, 2, "w2", 3.6, data={"resumed_step": 1}),
        event("attempt", RUN_A, 2, "w2", 3.7, write_id=WRITE_2),
        event("accepted", RUN_A, 2, "w2", 3.9, write_id=WRITE_2),
        event("attempt", RUN_A, 1, "w1", 4.5, write_id=STALE),
        event("refused", RUN_A, 1, "w1", 4.6, write_id=STALE),
    ]
    runs = [{"run_id": run_id, "tenant_id": tenant, "status": "completed",
             "lease_worker_id": None, "lease_generation": generation, "created_at": at(-1.0)}
            for run_id, tenant, generation in
            ((RUN_A, "t1", 2), (RUN_B, "t3", 1))]
    slot_samples = [
        slot_sample(1, 0.6, RUN_A, 1, "w1", 3.0),
        slot_sample(1, 0.6, RUN_B, 1, "w3", 3.0, tenant="t3", slot=1),
        slot_sample(2, 3.9, RUN_A, 2, "w2", 6.5),
    ]
    return {"history": history, "events": events, "runs": runs, "slot_samples": slot_samples}


def check(scenario: Scenario) -> dict[str, list[str]]:
    return check_history(scenario["history"], scenario["events"], scenario["runs"],
                         lease_seconds=LEASE, fleet_limits={"t3": 1},
                         slot_samples=scenario["slot_samples"], min_stale_refused=1).violations


def row_of(scenario: Scenario, kind: str, run_id: UUID = RUN_A, nth: int = 0) -> dict[str, Any]:
    return [row for row in scenario["history"]
            if row["kind"] == kind and row["run_id"] == run_id][nth]


def stale_generation_wrote(s: Scenario) -> None:
    row_of(s, "checkpoint", nth=1)["writer_generation"] = 1


def write_on_expired_lease(s: Scenario) -> None:
    row_of(s, "checkpoint")["fn_now"] = at(3.2)


def renewal_of_expired_lease(s: Scenario) -> None:
    s["history"].insert(3, history_row("renew", RUN_A, 3.2, old_gen=1, old_worker="w1",
                                       old_expires=3.0, new_expires=6.2) | {"id": 99})


SWEEP_CALLS = ["_settle", "_take_over", "_claim_orphaned", "claim_orphaned"]
HOLDER_CALLS = ["_settle", "_settle_one", "fail_run"]


def holder_failed_after_its_expiry(s: Scenario) -> None:
    # The holder's own fail (fail_run on the call stack) is fenced on its live lease, whatever
    # the run's new status says.
    s["history"].append(history_row("fail", RUN_A, 7.0, old_gen=2, old_worker="w2",
                                    old_expires=6.5, cleared=True, new_status="failed",
                                    writer=(2, "w2", UUID(int=5))) | {"id": 103,
                                                                      "writer_calls": HOLDER_CALLS})


def sweep_ended_a_live_lease(s: Scenario) -> None:
    # The orphan sweep may end only a lapsed lease: its stop error names the holder, so the
    # writer fields agree, and only the time gives it away.
    s["history"].append(history_row("fail", RUN_A, 5.0, old_gen=2, old_worker="w2",
                                    old_expires=6.5, cleared=True, new_status="failed",
                                    writer=(2, "w2", UUID(int=5))) | {"id": 104,
                                                                      "writer_calls": SWEEP_CALLS})


def stale_holders_completion_under_a_sweeps_call_stack(s: Scenario) -> None:
    # The sweep ends a lapsed lease (fail, cancel, requeue), never completes a run nor writes
    # the holder's progress: a completion of the stale holder is flagged whatever call stack it
    # was recorded under.
    s["history"].append(history_row("complete", RUN_A, 7.0, old_gen=2, old_worker="w2",
                                    old_expires=6.5, cleared=True, new_status="completed",
                                    writer=(2, "w2", UUID(int=5))) | {"id": 107,
                                                                      "writer_calls": SWEEP_CALLS})


def stale_holders_commit_under_a_sweeps_call_stack(s: Scenario) -> None:
    s["history"].append(history_row("commit", RUN_A, 7.0, old_gen=2, old_worker="w2",
                                    old_expires=6.5, writer=(2, "w2", UUID(int=5)),
                                    data={"step": 9}) | {"id": 108,
                                                         "writer_calls": SWEEP_CALLS})


def refused_write_landed(s: Scenario) -> None:
    row_of(s, "checkpoint", nth=1)["writer_event"] = STALE


def two_terminal_outcomes(s: Scenario) -> None:
    s["history"].append(history_row("complete", RUN_A, 4.1, old_gen=1, old_worker="w1",
                                    old_expires=4.5, cleared=True,
                                    new_status="completed") | {"id": 100})


def claim_over_live_lease(s: Scenario) -> None:
    claim = row_of(s, "claim", nth=1)
    claim["old_expires"] = at(4.0)


def generation_skipped(s: Scenario) -> None:
    claim = row_of(s, "claim", nth=1)
    claim["new_generation"] = 3


def run_left_running(s: Scenario) -> None:
    s["runs"][0].update(status="running", lease_worker_id="w2")


def handler_ran_unclaimed_generation(s: Scenario) -> None:
    s["events"].append(event("handler_start", RUN_A, 2, "w1", 3.7,
                             data={"resumed_step": 1}))


def resumed_from_the_wrong_step(s: Scenario) -> None:
    s["events"][4]["data"]["resumed_step"] = 0


def accepted_write_missing(s: Scenario) -> None:
    s["history"].remove(row_of(s, "checkpoint"))


def fence_never_exercised(s: Scenario) -> None:
    s["events"] = [e for e in s["events"] if e["kind"] != "refused"]


def slot_shared_by_two_live_leases(s: Scenario) -> None:
    other = RUN_C
    s["history"] += [
        history_row("claim", other, 0.5, old_gen=0, old_worker=None, old_expires=None,
                    claim=(1, "w4", 3.5), slot=1, tenant="t3") | {"id": 101},
        history_row("complete", other, 1.5, old_gen=1, old_worker="w4", old_expires=3.5,
                    cleared=True, new_status="completed", tenant="t3") | {"id": 102},
    ]
    s["runs"].append({**s["runs"][1], "run_id": other})


def sampled_slot_row(s: Scenario) -> dict[str, Any]:
    return next(row for row in s["slot_samples"] if row["slot_no"] is not None)


def live_slotted_lease_missing_from_its_slot(s: Scenario) -> None:
    sampled_slot_row(s).update(slot_run_id=None, slot_generation=None)


def slot_names_another_run_while_the_lease_is_live(s: Scenario) -> None:
    sampled_slot_row(s).update(slot_run_id=RUN_C, slot_generation=1)


def slot_names_another_generation_of_the_run(s: Scenario) -> None:
    sampled_slot_row(s)["slot_generation"] = 2


def live_lease_held_in_a_slot_that_does_not_exist(s: Scenario) -> None:
    sampled_slot_row(s).update(slot_no=2, slot_exists=False, slot_run_id=None,
                               slot_generation=None)


def more_live_slotted_leases_than_max_concurrency(s: Scenario) -> None:
    # Each in a slot that names it, so only the count gives it away.
    s["slot_samples"].append(slot_sample(1, 0.6, RUN_C, 1, "w4", 3.5, tenant="t3", slot=2))


def live_lease_without_a_slot_under_max_concurrency(s: Scenario) -> None:
    s["slot_samples"].append(slot_sample(1, 0.6, RUN_C, 1, "w4", 3.5, tenant="t3"))


def slots_never_seen_live(s: Scenario) -> None:
    s["slot_samples"] = [row for row in s["slot_samples"] if row["tenant_id"] != "t3"]


BROKEN: list[tuple[Callable[[Scenario], None], str]] = [
    (stale_generation_wrote, "no_stale_accepted_write"),
    (write_on_expired_lease, "no_stale_accepted_write"),
    (renewal_of_expired_lease, "no_stale_accepted_write"),
    (refused_write_landed, "no_stale_accepted_write"),
    (holder_failed_after_its_expiry, "no_stale_accepted_write"),
    (sweep_ended_a_live_lease, "no_stale_accepted_write"),
    (stale_holders_completion_under_a_sweeps_call_stack, "no_stale_accepted_write"),
    (stale_holders_commit_under_a_sweeps_call_stack, "no_stale_accepted_write"),
    (two_terminal_outcomes, "one_terminal_outcome_per_run"),
    (claim_over_live_lease, "lease_windows_disjoint"),
    (generation_skipped, "generations_increase"),
    (run_left_running, "all_runs_terminal"),
    (handler_ran_unclaimed_generation, "handler_log_agrees"),
    (resumed_from_the_wrong_step, "resumes_from_last_checkpoint"),
    (accepted_write_missing, "handler_log_agrees"),
    (fence_never_exercised, "fence_exercised"),
    (slot_shared_by_two_live_leases, "fleet_limit"),
    (live_slotted_lease_missing_from_its_slot, "live_lease_named_by_its_slot"),
    (slot_names_another_run_while_the_lease_is_live, "live_lease_named_by_its_slot"),
    (slot_names_another_generation_of_the_run, "live_lease_named_by_its_slot"),
    (live_lease_held_in_a_slot_that_does_not_exist, "live_lease_named_by_its_slot"),
    (more_live_slotted_leases_than_max_concurrency, "live_slotted_leases_within_limit"),
    (live_lease_without_a_slot_under_max_concurrency, "live_slotted_leases_within_limit"),
    (slots_never_seen_live, "admission_slots_sampled"),
]


def test_a_clean_takeover_passes() -> None:
    assert check(clean()) == {}


def test_the_sweeps_end_of_a_lapsed_lease_passes() -> None:
    """claim_orphaned dead-letters a run out of attempts after its holder's lease lapsed: a
    `fail` by its new status, 94 ms past the expiry, and no stale write (the holder made none)."""
    scenario = clean()
    scenario["history"].append(history_row(
        "fail", RUN_C, 3.094, old_gen=1, old_worker="w4", old_expires=3.0, cleared=True,
        new_status="failed", writer=(1, "w4", UUID(int=6)),
        data={"stop_reason": "attempts_exhausted"}) | {"id": 105, "writer_calls": SWEEP_CALLS})
    scenario["history"].insert(0, history_row(
        "claim", RUN_C, 0.0, old_gen=0, old_worker=None, old_expires=None,
        claim=(1, "w4", 3.0)) | {"id": 106})
    scenario["runs"].append({**scenario["runs"][0], "run_id": RUN_C, "status": "failed",
                             "lease_generation": 1})
    assert check(scenario) == {}


@pytest.mark.parametrize(("breakage", "violated"), BROKEN, ids=[b.__name__ for b, _ in BROKEN])
def test_each_broken_history_is_caught(breakage: Callable[[Scenario], None], violated: str
                                       ) -> None:
    scenario = clean()
    breakage(scenario)
    assert violated in check(scenario)
