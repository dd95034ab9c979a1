"""When a new primary first held a run that a claim could take (issue 35): the failover soak
(test_ha_soak.py) times the workers' first claim on a new primary from then, not only from its
first commit. A claim cannot come sooner however soon the workers reach the new primary: a run
running at the failover keeps the lease the old primary granted until it runs out (3 s in the
soak), and a run of a scope under ``max_concurrency`` waits for an admission slot that such a
lease holds. A switchover that promoted within 1.5 s could so leave nothing to claim for another
second (pg_auto_failover through PgBouncer, +0.95 and +1.27 s from the first commit)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["first_claimable"]


def first_claimable(history: list[dict[str, Any]], runs: list[dict[str, Any]],
                    committed: datetime, fleet_limits: dict[str, int]) -> datetime | None:
    """When the new primary, whose first commit (the harness's) is at ``committed``, first held
    a run that a claim could take: ``committed`` itself when a run was pending in a scope with
    room under its fleet limit (``fleet_limits``; a slot whose lease ran out is free), or
    running on a lease that had run out (an orphan); else the first moment after it that one
    became so — a lease running out (its run an orphan, its admission slot free), a run
    completed or sent back to pending (a slot freed), a run enqueued — None when nothing did.
    Before that moment no worker can claim on the new primary, however soon it reached it: the
    leases granted on the old primary hold until they run out (issue 35, where a switchover
    that promoted within 1.5 s found every run of the limited scope waiting for a slot).
    A run sent back to pending by a retry counts from then, its retry delay not modelled (a
    few runs per soak). Read from the new primary's accepted history (each row's
    ``committed_at``, its transaction's commit timestamp, when known: ``track_commit_timestamp``;
    else the trigger's time, up to a statement's length early), times on the database clock
    (one machine)."""
    state: dict[Any, tuple[str, datetime | None]] = {}
    later: list[datetime] = []
    for row in history:
        # Other sessions see a write from its commit; its trigger ran earlier, by the length of
        # the statement (0.4 s for a completion on a promoted, loaded server: issue 35).
        visible = row.get("committed_at") or row["at"]
        if visible < committed:
            state[row["run_id"]] = (row["new_status"], row["new_expires"])
        elif row["kind"] in ("complete", "retry") or row["new_status"] == "pending":
            later.append(visible)
    pending: dict[str, int] = {}
    live: dict[str, int] = {}
    for run in runs:
        if run["created_at"] >= committed:
            if run["tenant_id"] not in fleet_limits:
                later.append(run["created_at"])
            continue
        status, expires = state.get(run["run_id"], ("pending", None))
        if status == "pending":
            pending[run["tenant_id"]] = pending.get(run["tenant_id"], 0) + 1
        elif status == "running" and expires is not None:
            if expires < committed:
                return committed  # an orphan: a sweep may take it over at once
            live[run["tenant_id"]] = live.get(run["tenant_id"], 0) + 1
            later.append(expires)
    for tenant in pending:
        limit = fleet_limits.get(tenant)
        if limit is None or live.get(tenant, 0) < limit:
            return committed  # a claim pass takes it at once
    return min(later, default=None)
