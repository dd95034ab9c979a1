"""first_claimable (first_claimable.py) finds when a new primary first held a run a claim could
take, from hand-made histories (its input is the soak's rows; no cluster needed): at once with a
pending run of an unlimited scope, a pending run of a limited scope with a free slot, or an
orphan; else at the first lease that runs out, the first completion that frees a slot, or the
first run enqueued after the failover; never when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from first_claimable import first_claimable

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COMMITTED = T0 + timedelta(seconds=10)  # the new primary's first commit
LIMITS = {"t3": 2}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(number: int, tenant: str, created: float = 0.0) -> dict[str, Any]:
    return {"run_id": UUID(int=number), "tenant_id": tenant, "created_at": at(created)}


def row(number: int, kind: str, when: float, status: str = "running",
        expires: float | None = None) -> dict[str, Any]:
    return {"run_id": UUID(int=number), "kind": kind, "at": at(when), "new_status": status,
            "new_expires": None if expires is None else at(expires)}


# Two t3 runs hold both t3 slots on leases granted before the failover, running out at 11 s and
# 12 s; a third t3 run waits for a slot.
HELD = [row(1, "claim", 8.0, expires=11.0), row(2, "claim", 9.0, expires=12.0)]
T3_RUNS = [run(1, "t3"), run(2, "t3"), run(3, "t3")]


def test_a_pending_run_of_an_unlimited_scope_is_claimable_at_the_first_commit() -> None:
    assert first_claimable(HELD, [*T3_RUNS, run(4, "t1")], COMMITTED, LIMITS) == COMMITTED


def test_a_limited_scope_with_a_slot_free_is_claimable_at_the_first_commit() -> None:
    history = [HELD[0], row(2, "claim", 5.0, expires=9.5)]  # run 2's lease ran out at 9.5 s
    assert first_claimable(history, T3_RUNS, COMMITTED, LIMITS) == COMMITTED


def test_an_orphan_is_claimable_at_the_first_commit() -> None:
    history = [row(1, "claim", 5.0, expires=9.0)]
    assert first_claimable(history, [run(1, "t1")], COMMITTED, LIMITS) == COMMITTED


def test_every_slot_held_waits_for_the_first_lease_to_run_out() -> None:
    assert first_claimable(HELD, T3_RUNS, COMMITTED, LIMITS) == at(11.0)


def test_a_completion_after_the_failover_frees_a_slot_sooner() -> None:
    history = [*HELD, row(2, "complete", 10.4, status="completed")]
    assert first_claimable(history, T3_RUNS, COMMITTED, LIMITS) == at(10.4)


def test_a_run_enqueued_after_the_failover_counts_from_its_enqueue() -> None:
    held = [row(1, "claim", 8.0, expires=15.0)]
    runs = [run(1, "t1"), run(5, "t1", created=10.7)]
    assert first_claimable(held, runs, COMMITTED, LIMITS) == at(10.7)


def test_nothing_claimable_and_nothing_changing_is_none() -> None:
    history = [row(1, "claim", 5.0), row(1, "complete", 6.0, status="completed")]
    assert first_claimable(history, [run(1, "t1")], COMMITTED, LIMITS) is None


def test_a_completion_counts_from_its_commit_not_its_trigger() -> None:
    # The completion's trigger ran at 10.4 s, its transaction committed at 10.8 s: the slot was
    # free for other sessions only then.
    completion = {**row(2, "complete", 10.4, status="completed"), "committed_at": at(10.8)}
    assert first_claimable([*HELD, completion], T3_RUNS, COMMITTED, LIMITS) == at(10.8)
