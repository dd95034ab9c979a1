"""Model-based test of the run protocol: a hypothesis state machine drives the real SQL functions
and checks every step against a small pure-Python model of the documented semantics
(sql/README.md, the functions' header comments, docs/state-machine.md).

Three workers act in three scopes (two tenants; a null and a named workspace, the named one in
both tenants) and two deployments, sometimes under max_concurrency, sometimes with a stale,
forged or misdirected lease. Time is the test clock of the test databases
(``zeroth_test.<function>(..., now_override)``), moved only by the ``advance_clock`` rule, so a
lease expires exactly when the model says it does. The rules are the public transitions
(MODELLED at the end; test_every_public_function_is_modelled_or_excluded keeps that list equal to
the public functions of schema zeroth minus NOT_MODELLED, each excluded with its reason): the
claims (claim_pending, claim_and_start, claim_orphaned, complete_and_claim, admit_run's
admit-and-own, claim_for_takeover), the holder's ends (complete_run, complete_runs — batches of
live and stale tickets —, settle_runs — mixed batches of completes, retries, fails, cancels and
hand-backs —, fail_run, pause_run, cancel_run, sleep_run, hand_back, release, the
waits), events (wait_for_event with a deadline, emit_event, wake_due_waits), child runs
(start_child_run, wait_for_children; a child's end wakes its waiting parent and a cancel
cascades to the children, as the triggers do: Model.settle), the admin calls and the clock.
After every step the database (runs, admission slots, checkpoints, and the attempt history: one
row per lease generation with its holder, attempt number, outcome and end time, the outcome as
docs/state-machine.md's edge table gives it) must equal the model, and these invariants are
checked on the database itself, independently of the model:

* the slot never disagrees with the run: a slot names (run, generation) and is live exactly while
  that run holds that generation's live lease in it; every live lease claimed under a limit is
  named by its slot, so no run holds two live slots and no lease outlives (or survives) its slot;
* lease_generation never decreases and moves by exactly one on a claim, and never otherwise;
* terminal states absorb: nothing leaves completed, only redrive_run leaves failed/cancelled;
* a running run has a lease, a waiting or terminal one none, and attempts never exceed
  max_attempts;
* the live slots of a (tenant, workspace, deployment) never outnumber the largest
  max_concurrency used there;
* scope isolation: a step leaves every row of every scope it had no business in byte-identical
  (a checksum of whole rows), so a refused or failing step changes nothing anywhere;
* a fenced write is accepted iff the model says the caller holds a live lease.

Each example runs in one transaction on a fresh database and is rolled back at the end;
``setseed`` makes fail_run's backoff jitter reproducible. CI runs a few hundred examples;
ZEROTH_PG_HYPOTHESIS_EXAMPLES asks for more.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, ClassVar
from uuid import UUID

import asyncpg
import pytest
from helpers import T0, BlockingConnection, clock_schema, property_settings, save_report
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

TERMINAL = frozenset({"completed", "failed", "cancelled"})
MICROSECOND = timedelta(microseconds=1)
RETRY_BASE, RETRY_MAX = 1.0, 300.0  # fail_run's defaults
ORPHAN_GRACE = timedelta(seconds=10)  # claim_orphaned's and admit_run's grace_seconds default


@dataclass(frozen=True)
class Scope:
    tenant_id: str
    workspace_id: str | None

    @property
    def key(self) -> tuple[str, str]:
        """(tenant_id, workspace_key) as stored in every table."""
        return self.tenant_id, "" if self.workspace_id is None else f"w:{self.workspace_id}"


SCOPES = (Scope("t1", None), Scope("t1", "w1"), Scope("t2", "w1"))
DEPLOYMENTS = ("d1", "d2")
WORKERS = ("wa", "wb", "wc")


@dataclass(frozen=True)
class RunRef:
    scope: Scope
    run_id: UUID


@dataclass(frozen=True)
class Ticket:
    """A lease as a worker believes it holds it; it may be stale by now."""

    scope: Scope
    run_id: UUID
    worker_id: str
    generation: int


# ---------------------------------------------------------------------------------------------
# The reference model


@dataclass
class Run:
    """One run as the model sees it; the attribute names are the column aliases of RUNS_SQL."""

    scope: Scope
    run_id: UUID
    deployment_ref: str
    priority: int
    run_after: datetime
    created_at: datetime
    max_attempts: int
    status: str = "pending"
    attempts: int = 0
    hand_backs: int = 0
    started_at: datetime | None = None
    finished: bool = False
    generation: int = 0
    holder: str | None = None
    acquired: datetime | None = None
    expires: datetime | None = None
    slot: int | None = None
    recovery: UUID | None = None
    checkpoint_seq: int = 0
    cancel_requested: bool = False
    cancel_action: str | None = None
    dead_lettered: bool = False
    wait_reason: str | None = None
    output: str | None = None  # jsonb as text; None is SQL NULL
    error: Any = None  # parsed JSON (stop reasons without their message text); None is NULL
    progress: str | None = None
    resume_input: str | None = None
    thread_id: str | None = None
    resumable: bool = True
    parent: UUID | None = None  # parent_run_id: a child run (start_child_run)
    idempotency_key: str | None = None  # not compared: only enqueue's duplicate check reads it
    # The ended attempts (compared with zeroth.attempt_history, not with the run row).
    history: list[Attempt] = field(default_factory=list)

    def projection(self) -> dict[str, Any]:
        """The run as RUNS_SQL reads it from the database."""
        tenant_id, workspace_key = self.scope.key
        return {"tenant_id": tenant_id, "workspace_key": workspace_key,
                **{f.name: getattr(self, f.name) for f in fields(self)
                   if f.name not in ("scope", "idempotency_key", "history")}}

    def open_attempt(self) -> Attempt | None:
        """The open attempt as zeroth.attempt_history shows it (from the run row), if any."""
        if self.holder is None:
            return None
        return Attempt(self.generation, self.holder, None, self.attempt_number(), None)

    def attempt_number(self) -> int:
        """The attempt's number: counted once running; a claim not started would be the next."""
        return self.attempts if self.status == "running" else self.attempts + 1

    def clear_lease(self) -> None:
        self.holder = self.acquired = self.expires = None
        self.slot = self.recovery = None


@dataclass(frozen=True)
class Attempt:
    """One row of zeroth.attempt_history: a lease generation of a run and how it ended (outcome
    and ended_at None while open). The outcomes are docs/state-machine.md's edge table."""

    generation: int
    worker_id: str
    outcome: str | None
    attempt: int
    ended_at: datetime | None


@dataclass(frozen=True)
class SlotName:
    """What an admission slot row holds: the lease it names. Holder and expiry live on the run."""

    run_id: UUID
    generation: int


@dataclass
class Checkpoint:
    scope: Scope
    run_id: UUID
    order: int
    generation: int
    data: str


@dataclass(frozen=True)
class Raises:
    sqlstate: str


@dataclass
class ClaimPlan:
    """What a claim may do: lease up to ``want`` of ``candidates`` (best first) into ``slots``."""

    scope: Scope
    worker_id: str
    lease: timedelta
    limit: int | None
    active: int
    slots: list[int]
    candidates: list[Run]
    want: int | None
    sort_key: Any
    marker: tuple[int, bool, int | None] | None = None  # a run_id-NULL row and nothing else
    # Pending runs whose last claim lapsed before start_run with no attempt left after counting
    # it: the claim dead-letters those it meets before its batch is full (ended), and maybe
    # those tied in claim order with its last claimed run (maybe_ended: the database decides).
    ended: list[Run] = field(default_factory=list)
    maybe_ended: list[Run] = field(default_factory=list)
    start: bool = False  # claim_and_start: the claimed runs are made running


@dataclass
class Link:
    """A row of zeroth.child_runs: the child a parent's step started, and the copy of its
    outcome (status, dead-lettered) the trigger runs_child_run_finished keeps (None until it
    ends; cleared when it is redriven)."""

    child: UUID
    deployment_ref: str
    detached: bool
    ended: tuple[str, bool] | None = None


@dataclass
class ChildWait:
    """A row of zeroth.child_waits: a parent's wait for some of its children."""

    mode: str
    children: list[UUID]
    remaining: int
    met: bool = False


@dataclass(frozen=True)
class EventWait:
    """A row of zeroth.event_waits: the event a step waits for, and its deadline."""

    name: str
    timeout_at: datetime | None


SlotKey = tuple[str, str, str]  # tenant_id, workspace_key, deployment_ref
StepKey = tuple[Scope, UUID, str]  # scope, run (the parent for links and child waits), step key


@dataclass
class Model:
    now: datetime = T0
    runs: dict[tuple[Scope, UUID], Run] = field(default_factory=dict)
    slots: dict[SlotKey, dict[int, SlotName | None]] = field(default_factory=dict)
    max_limit: dict[SlotKey, int] = field(default_factory=dict)
    # Keyed by scope and id, as the table is (its primary key): a checkpoint id is unique within
    # a scope, and another scope's use of the same id is neither seen nor refused (a refusal would
    # tell a caller that the id exists elsewhere).
    checkpoints: dict[tuple[Scope, UUID], Checkpoint] = field(default_factory=dict)
    # Events of a scope by name: (emitted_at, payload), or None for a channel a wait created.
    events: dict[tuple[Scope, str], tuple[datetime, str] | None] = field(default_factory=dict)
    event_waits: dict[StepKey, EventWait] = field(default_factory=dict)
    steps: dict[StepKey, dict[str, Any]] = field(default_factory=dict)  # recorded step results
    links: dict[StepKey, Link] = field(default_factory=dict)
    child_waits: dict[StepKey, ChildWait] = field(default_factory=dict)
    cascaded: set[tuple[Scope, UUID]] = field(default_factory=set)  # cancelled, children seen to
    next_id: int = 0

    def new_id(self) -> UUID:
        self.next_id += 1
        return UUID(int=self.next_id)

    def run(self, scope: Scope, run_id: UUID) -> Run | None:
        return self.runs.get((scope, run_id))

    def live(self, ticket: Ticket) -> Run | None:
        """The run if ``ticket`` is its live lease (the fence of every holder write)."""
        run = self.holds(ticket)
        live = run is not None and run.expires is not None and run.expires >= self.now
        return run if live else None

    def holds(self, ticket: Ticket) -> Run | None:
        """The run if ``ticket`` names its lease exactly, live or not (release, hand back)."""
        run = self.run(ticket.scope, ticket.run_id)
        if run is None or run.holder != ticket.worker_id or run.generation != ticket.generation:
            return None
        return run

    def fingerprint(self, scope: Scope) -> str:
        """Everything the model knows about one scope, to tell which scopes a step touched."""
        parts: list[Any] = [sorted((str(k[1]), sorted(r.projection().items(), key=str))
                                   for k, r in self.runs.items() if k[0] == scope)]
        parts.append(sorted((str(k), sorted(v.items(), key=str))
                            for k, v in self.slots.items() if k[:2] == scope.key))
        parts.append(sorted((str(k[1]), repr(c)) for k, c in self.checkpoints.items()
                            if c.scope == scope))
        return repr(parts)

    # -- admission slots -------------------------------------------------------------------

    def _slot_rows(self, scope: Scope) -> Iterable[dict[int, SlotName | None]]:
        return [rows for key, rows in self.slots.items() if key[:2] == scope.key]

    def named_by(self, scope: Scope, number: int, name: SlotName | None) -> Run | None:
        """The run when it still holds the lease the slot names, in that slot (live or not)."""
        run = None if name is None else self.run(scope, name.run_id)
        if run is None or run.generation != name.generation or run.slot != number:
            return None
        return run

    def slot_live(self, scope: Scope, number: int, name: SlotName | None) -> bool:
        run = self.named_by(scope, number, name)
        return run is not None and run.expires is not None and run.expires >= self.now

    def free_slot(self, ticket: Ticket) -> None:
        """zeroth._free_slot: the slot naming exactly (run, generation)."""
        for rows in self._slot_rows(ticket.scope):
            for number, name in rows.items():
                if name == SlotName(ticket.run_id, ticket.generation):
                    rows[number] = None

    def free_all_slots(self, scope: Scope, run_id: UUID) -> None:
        for rows in self._slot_rows(scope):
            for number, name in rows.items():
                if name is not None and name.run_id == run_id:
                    rows[number] = None

    def take_slots(self, scope: Scope, deployment_ref: str, limit: int,
                   wanted: int) -> tuple[list[int], int]:
        """zeroth._take_slots: the free slots numbered up to ``limit``, lowest first, no more
        than ``limit`` minus the live slots (of any number); creates slots 1..limit on first
        use of a limit. A taken slot whose run still names it (an expired lease) is retired
        from that run first."""
        key = (*scope.key, deployment_ref)
        rows = self.slots.setdefault(key, {})
        self.max_limit[key] = max(self.max_limit.get(key, 0), limit)
        if limit not in rows:
            for number in range(1, limit + 1):
                rows.setdefault(number, None)
        active = sum(1 for n, name in rows.items() if self.slot_live(scope, n, name))
        free = sorted(n for n, name in rows.items()
                      if n <= limit and not self.slot_live(scope, n, name))
        take = free[:max(min(wanted, limit - active), 0)]
        for number in take:
            named = self.named_by(scope, number, rows[number])
            if named is not None:
                named.slot = None
        return take, active

    # -- transitions -----------------------------------------------------------------------

    def enqueue(self, scope: Scope, run_id: UUID, deployment_ref: str, priority: int,
                run_after: datetime | None, max_attempts: int,
                idempotency_key: str | None) -> tuple[UUID, bool, str]:
        same_id = self.run(scope, run_id)
        same_key = next((r for r in self.runs.values()
                         if idempotency_key is not None and r.scope == scope
                         and r.deployment_ref == deployment_ref
                         and r.idempotency_key == idempotency_key), None)
        if same_id is not None or same_key is not None:
            existing = same_id or same_key
            assert existing is not None
            return existing.run_id, False, existing.status
        run = Run(scope, run_id, deployment_ref, priority, run_after or self.now, self.now,
                  max_attempts, idempotency_key=idempotency_key)
        self.runs[(scope, run_id)] = run
        return run_id, True, "pending"

    def plan_claim_pending(self, scope: Scope, deployment_ref: str, worker_id: str,
                           limit: int | None, batch_size: int, lease: timedelta) -> ClaimPlan:
        candidates = sorted(
            (r for r in self.runs.values()
             if r.scope == scope and r.deployment_ref == deployment_ref and r.status == "pending"
             and r.run_after <= self.now and (r.expires is None or r.expires < self.now)),
            key=_pending_order)
        plan = ClaimPlan(scope, worker_id, lease, limit, 0, [], candidates, batch_size,
                         _pending_order)
        if limit is not None:
            plan.slots, plan.active = self.take_slots(scope, deployment_ref, limit, batch_size)
            if not plan.slots:
                plan.marker = (plan.active, True, limit)
            plan.want = len(plan.slots)
        if plan.marker is None:
            def spent(run: Run) -> bool:
                return run.holder is not None and run.attempts + 1 >= run.max_attempts
            want = plan.want or 0
            claimable = [r for r in candidates if not spent(r)]
            last = _pending_order(claimable[want - 1]) if len(claimable) >= want > 0 else None
            for run in filter(spent, candidates):
                if last is None or _pending_order(run) < last:
                    plan.ended.append(run)
                elif _pending_order(run) == last:
                    plan.maybe_ended.append(run)
            plan.candidates = claimable
        return plan

    # Preconditions of the rules that only matter in some states (hypothesis picks among the
    # rules it may run uniformly: without them most steps would find nothing to do).

    def any_running(self) -> bool:
        return any(r.status == "running" and r.expires is not None and r.expires >= self.now
                   for r in self.runs.values())

    def any_leased(self) -> bool:
        """A live lease, of a running run or a claim not started."""
        return any(r.holder is not None and r.expires is not None and r.expires >= self.now
                   for r in self.runs.values())

    def any_lapsed(self) -> bool:
        return any(r.expires is not None and r.expires < self.now for r in self.runs.values())

    def any_waiting(self) -> bool:
        return any(r.status == "waiting" for r in self.runs.values())

    def end_attempt(self, run: Run, outcome: str) -> None:
        """The run's open attempt ends with ``outcome`` (docs/state-machine.md, "Attempt
        history"); called before the transition changes the run."""
        assert run.holder is not None, run
        run.history.append(Attempt(run.generation, run.holder, outcome, run.attempt_number(),
                                   self.now))

    def take_over(self, run: Run, stop_reason: str = "orphan_recovered") -> str:
        """zeroth._take_over of a run whose lease expired (past the caller's grace): a requested
        cancel → cancelled; a lapsed unstarted claim with no attempt left once its own is
        counted → dead-lettered; not resumable → failed; running and out of attempts →
        dead-lettered; else requeued (pending). The interrupted attempt stays counted (a lapsed
        claim's is counted here). Returns the outcome."""
        if run.cancel_action is not None:
            outcome = "cancelled"
        elif run.status == "pending" and run.attempts + 1 >= run.max_attempts:
            outcome = "dead_lettered"
        elif not run.resumable:
            outcome = "failed"
        elif run.status == "running" and run.attempts >= run.max_attempts:
            outcome = "dead_lettered"
        else:
            outcome = "requeued"
        self.end_attempt(run, outcome if outcome in ("cancelled", "dead_lettered") else
                         "recovered" if run.status == "running" else "expired")
        if outcome != "requeued":
            previous = {"previous_error": run.error} if run.error is not None else {}
            run.error = {"stop_reason": "attempts_exhausted" if outcome == "dead_lettered"
                         else stop_reason, "worker_id": run.holder,
                         "lease_generation": run.generation, **previous}
        if run.status == "pending":
            run.attempts += 1
        run.status = {"cancelled": "cancelled", "requeued": "pending"}.get(outcome, "failed")
        run.finished = outcome != "requeued"
        run.dead_lettered = run.dead_lettered or outcome == "dead_lettered"
        self.free_slot(Ticket(run.scope, run.run_id, run.holder or "", run.generation))
        run.clear_lease()
        return outcome

    def end_lapsed_claim(self, run: Run) -> None:
        """A claim's _take_over of a run whose last claim lapsed before start_run and that has
        no attempt left once that one is counted: dead-lettered (cancelled if one was asked)."""
        assert self.take_over(run) in ("cancelled", "dead_lettered"), run

    def end_unresumable_orphans(self, scope: Scope, deployment_ref: str,
                                claim_limit: int | None, grace: timedelta) -> None:
        """claim_orphaned's first step: the orphans nobody may resume end as _take_over ends
        them: resumable ones out of attempts (dead-lettered), non-resumable ones (admit-and-own)
        whose lease expired more than ``grace`` ago (failed); cancelled when a cancel was
        requested."""
        ended = sorted(
            (r for r in self.runs.values()
             if r.scope == scope and r.deployment_ref == deployment_ref and r.status == "running"
             and r.expires is not None
             and ((r.resumable and r.attempts >= r.max_attempts and r.expires < self.now)
                  or (not r.resumable and r.expires + grace < self.now))),
            key=lambda r: r.expires or self.now)[:claim_limit or 100]
        for run in ended:
            self.take_over(run)

    def cancel(self, run: Run, action: str, grace: timedelta = timedelta(0)) -> str:
        """zeroth._cancel (request_cancel, request_cancel_v2, the cascade to children): pending
        or waiting → cancelled at once; running within its owner's lease + grace → cancel
        requested (first action wins); running past it → taken_over (cancelled, stop reason
        kept). Returns the outcome."""
        if run.status in TERMINAL:
            return "not_cancellable"
        run.cancel_requested = True
        run.cancel_action = run.cancel_action or action
        if run.status == "running" and run.expires is not None and run.expires + grace >= self.now:
            return "cancel_requested"
        outcome = "taken_over" if run.status == "running" else "cancelled"
        if run.holder is not None:
            self.end_attempt(run, "cancelled")
        if outcome == "taken_over":  # the owner stopped renewing: the stop reason is kept
            run.error = {"stop_reason": "taken_over", "worker_id": run.holder,
                         "lease_generation": run.generation,
                         **({"previous_error": run.error} if run.error is not None else {})}
        self.free_all_slots(run.scope, run.run_id)
        run.status, run.wait_reason, run.finished = "cancelled", None, True
        run.clear_lease()
        return outcome

    def plan_claim_orphaned(self, scope: Scope, deployment_ref: str, worker_id: str,
                            limit: int | None, claim_limit: int | None,
                            lease: timedelta) -> ClaimPlan:
        self.end_unresumable_orphans(scope, deployment_ref, claim_limit, ORPHAN_GRACE)
        candidates = sorted(
            (r for r in self.runs.values()
             if r.scope == scope and r.deployment_ref == deployment_ref and r.status == "running"
             and r.expires is not None and r.expires < self.now
             and r.resumable and r.attempts < r.max_attempts),
            key=_orphan_order)
        plan = ClaimPlan(scope, worker_id, lease, limit, 0, [], candidates, claim_limit,
                         _orphan_order)
        if limit is not None:
            wanted = min(limit if claim_limit is None else claim_limit, limit)
            plan.slots, plan.active = self.take_slots(scope, deployment_ref, limit, wanted)
            if not plan.slots:
                plan.marker = (plan.active, bool(candidates), limit)
            plan.want = len(plan.slots)
        return plan

    # -- what the triggers on zeroth.runs do (child runs) --------------------------------------

    def settle(self) -> None:
        """After a step, the triggers: a child that ended has its outcome copied into its link
        and counts down its waiting parent's waits (runs_child_run_finished: a met wait makes
        the parent pending, due now); a child redriven has its copy cleared and the waits
        recounted (runs_child_run_reopened); a run that became cancelled cancels its unfinished,
        non-detached children as request_cancel does, and theirs (runs_cancel_children)."""
        while True:
            for (scope, parent_id, _), link in sorted(self.links.items(), key=lambda i: str(i[0])):
                child = self.runs[(scope, link.child)]
                if link.ended is None and child.status in TERMINAL:
                    link.ended = (child.status, child.dead_lettered)
                    self._child_ended(scope, parent_id, link.child)
                elif link.ended is not None and child.status not in TERMINAL:
                    link.ended = None
                    self._child_reopened(scope, parent_id, link.child)
            self.cascaded = {k for k in self.cascaded if self.runs[k].status == "cancelled"}
            fresh = [r for k, r in self.runs.items()
                     if r.status == "cancelled" and k not in self.cascaded]
            if not fresh:
                return
            for run in fresh:
                self.cascaded.add((run.scope, run.run_id))
                for link in sorted((v for k, v in self.links.items()
                                    if k[:2] == (run.scope, run.run_id) and v.ended is None
                                    and not v.detached), key=lambda v: v.child):
                    self.cancel(self.runs[(run.scope, link.child)], "cancel")

    def _waits_listing(self, scope: Scope, parent_id: UUID,
                       child_id: UUID) -> list[tuple[str, ChildWait]]:
        parent = self.runs.get((scope, parent_id))
        if parent is None or parent.status != "waiting" or not (
                parent.wait_reason or "").startswith("children:"):
            return []  # only a parent waiting for children has a wait to count
        return sorted((k[2], w) for k, w in self.child_waits.items()
                      if k[:2] == (scope, parent_id) and child_id in w.children)

    def _child_ended(self, scope: Scope, parent_id: UUID, child_id: UUID) -> None:
        parent = self.runs[(scope, parent_id)]
        for step_key, wait in self._waits_listing(scope, parent_id, child_id):
            wait.remaining = max(wait.remaining - 1, 0)
            if not (wait.remaining == 0
                    or (wait.mode == "any" and wait.remaining < len(wait.children))):
                continue
            if parent.status == "waiting" and parent.wait_reason == f"children:{step_key}":
                parent.status, parent.wait_reason, parent.run_after = "pending", None, self.now
            else:
                wait.met = True

    def _child_reopened(self, scope: Scope, parent_id: UUID, child_id: UUID) -> None:
        for _, wait in self._waits_listing(scope, parent_id, child_id):
            wait.remaining = len(wait.children) - self.children_ended(scope, parent_id,
                                                                      wait.children)
            wait.met = wait.met and (wait.remaining == 0 or (
                wait.mode == "any" and wait.remaining < len(wait.children)))

    def children_ended(self, scope: Scope, parent_id: UUID, children: list[UUID]) -> int:
        return sum(1 for k, link in self.links.items()
                   if k[:2] == (scope, parent_id) and link.child in children
                   and link.ended is not None)

    def leave_for_wait(self, run: Run, ticket: Ticket, wait_reason: str) -> str:
        """zeroth._leave_for_wait (sleep_run alike): the holder's running run → waiting, the
        attempt given back; a pending cancel request → cancelled instead. Lease and slot go."""
        if run.cancel_requested:
            self.end_attempt(run, "cancelled")
            run.status, run.finished = "cancelled", True
        else:
            self.end_attempt(run, "waited")
            run.status, run.wait_reason = "waiting", wait_reason
            run.attempts = max(run.attempts - 1, 0)
        self.free_slot(ticket)
        run.clear_lease()
        return run.status

    def lease_run(self, plan: ClaimPlan, run: Run, position: int) -> Ticket:
        # An orphan (running): the attempt that died with its worker counts; a claim that
        # lapsed before start_run (pending, a holder) counts too. Either ends the old attempt.
        if run.holder is not None:
            self.end_attempt(run, "recovered" if run.status == "running" else "expired")
        if run.status == "running" or run.holder is not None:
            run.attempts += 1
        if plan.start:  # claim_and_start: pending → running, the attempt counted
            assert run.status == "pending", run
            run.status, run.attempts, run.started_at = "running", run.attempts + 1, self.now
        run.holder, run.acquired, run.expires = plan.worker_id, self.now, self.now + plan.lease
        run.generation += 1
        run.slot = plan.slots[position] if plan.limit is not None else None
        run.recovery = self.latest_checkpoint(run) if run.checkpoint_seq > 0 else None
        if run.slot is not None:
            self.slots[(*run.scope.key, run.deployment_ref)][run.slot] = SlotName(
                run.run_id, run.generation)
        return Ticket(run.scope, run.run_id, plan.worker_id, run.generation)

    def latest_checkpoint(self, run: Run) -> UUID | None:
        mine = [(c.order, k[1]) for k, c in self.checkpoints.items()
                if c.scope == run.scope and c.run_id == run.run_id]
        return max(mine)[1] if mine else None

    def renew(self, scope: Scope, worker_id: str, requested: list[tuple[UUID, int | None]],
              lease: timedelta) -> set[UUID]:
        """renew_lease(s): the live leases held by worker_id at the requested generations (slots
        are not touched: a slot is held through its run's lease)."""
        expires = self.now + lease
        renewed: set[UUID] = set()
        for run_id in dict.fromkeys(r for r, _ in requested):
            run = self.run(scope, run_id)
            if (run is not None and run.holder == worker_id and run.expires is not None
                    and run.expires >= self.now
                    and any(r == run_id and g in (None, run.generation) for r, g in requested)):
                run.expires = expires
                renewed.add(run_id)
        return renewed


def _pending_order(run: Run) -> tuple[Any, ...]:
    return -run.priority, run.run_after, run.created_at


def _orphan_order(run: Run) -> tuple[Any, ...]:
    return run.expires, run.started_at


RUNS_SQL = """
SELECT r.tenant_id, r.workspace_key, r.run_id, r.deployment_ref, r.priority, r.run_after,
       r.created_at, r.max_attempts, r.status::text AS status, r.attempts, r.hand_backs,
       r.started_at,
       r.finished_at IS NOT NULL AS finished, r.lease_generation AS generation,
       r.lease_worker_id AS holder, r.lease_acquired_at AS acquired,
       r.lease_expires_at AS expires, r.admission_slot AS slot,
       r.recovery_checkpoint_id AS recovery, r.checkpoint_seq,
       r.cancel_requested_at IS NOT NULL AS cancel_requested, r.cancel_action,
       r.dead_lettered_at IS NOT NULL AS dead_lettered, r.wait_reason, r.output::text AS output,
       r.error::text AS error, r.progress::text AS progress,
       (r.metadata -> 'resume_input')::text AS resume_input, r.thread_id, r.resumable,
       r.parent_run_id AS parent, r::text AS whole
  FROM zeroth.runs r"""
SLOTS_SQL = """
SELECT s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no, s.run_id, s.lease_generation,
       s::text AS whole
  FROM zeroth.admission_slots s"""
# The attempt history (view zeroth.attempt_history: the ended attempts, written by the trigger
# runs_attempt_history, and the open one from zeroth.runs), keyed like the other tables.
HISTORY_SQL = """
SELECT a.tenant_id, coalesce('w:' || a.workspace_id, '') AS workspace_key, a.run_id,
       a.lease_generation, a.worker_id, a.outcome, a.attempt, a.ended_at
  FROM zeroth.attempt_history a
 ORDER BY 1, 2, a.run_id, a.lease_generation, a.claimed_at NULLS FIRST, a.ended_at NULLS LAST"""
CHECKPOINTS_SQL = """
SELECT k.checkpoint_id, k.tenant_id, k.workspace_key, k.run_id, k.checkpoint_order,
       k.lease_generation, k.data::text AS data, k::text AS whole
  FROM zeroth.checkpoints k"""
CLAIM_FIELDS = ("run_id", "lease_generation", "lease_expires_at", "status::text", "attempts",
                "recovery_checkpoint_id", "checkpoint_data::text", "cancel_requested",
                "active_count", "concurrency_saturated", "concurrency_limit")


def claim_columns(composite: str | None = None) -> str:
    """The claimed_run columns the model checks, of the result row (or of a composite column)."""
    def column(spec: str) -> str:
        name, _, cast = spec.partition("::")
        source = f"({composite}).{name}" if composite else name
        return f"{source}{'::' + cast if cast else ''} AS {name}"
    return ", ".join(column(spec) for spec in CLAIM_FIELDS)


CLAIM_COLUMNS = claim_columns()
CLAIMED = [spec.partition("::")[0] for spec in CLAIM_FIELDS]


@dataclass(frozen=True)
class Snapshot:
    """The database as the invariants see it."""

    runs: dict[tuple[str, str, UUID], dict[str, Any]]
    slots: dict[tuple[str, str, str, int], SlotName | None]
    checkpoints: dict[tuple[str, str, UUID], tuple[Any, ...]]
    checksums: dict[tuple[str, str], str]


# ---------------------------------------------------------------------------------------------
# The database side


class Database(BlockingConnection):
    """The state machine's connection: one transaction per example, a savepoint per call."""

    _transaction: Any = None
    called: set[str]  # every zeroth function called, over all examples

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.called = set()

    def begin(self) -> None:
        self._transaction = self.conn.transaction()
        self.run(self._transaction.start())
        self.run(self.conn.execute("SELECT setseed(0.25)"))

    def rollback(self) -> None:
        self.run(self._transaction.rollback())

    def call(self, function: str, select: str = "*", **kwargs: Any) -> list[Any] | Raises:
        """``SELECT select FROM zeroth.function(name => $n, …)`` in a savepoint; a database
        error comes back as Raises(sqlstate)."""
        args = ", ".join(f"{name} => ${i}" for i, name in enumerate(kwargs, start=1))
        sql = f"SELECT {select} FROM {clock_schema(kwargs)}.{function}({args})"
        self.called.add(function)

        async def call() -> list[Any]:
            async with self.conn.transaction():
                return list(await self.conn.fetch(sql, *kwargs.values()))

        try:
            return self.run(call())
        except asyncpg.PostgresError as exc:
            return Raises(exc.sqlstate)

    def snapshot(self) -> Snapshot:
        runs = self.run(self.conn.fetch(RUNS_SQL))
        slots = self.run(self.conn.fetch(SLOTS_SQL))
        checkpoints = self.run(self.conn.fetch(CHECKPOINTS_SQL))
        wholes: dict[tuple[str, str], list[str]] = {}
        for row in [*runs, *slots, *checkpoints]:
            wholes.setdefault((row["tenant_id"], row["workspace_key"]), []).append(row["whole"])
        return Snapshot(
            runs={(r["tenant_id"], r["workspace_key"], r["run_id"]):
                  {k: comparable_error(v) if k == "error" else v
                   for k, v in dict(r).items() if k != "whole"} for r in runs},
            slots={(s["tenant_id"], s["workspace_key"], s["deployment_ref"], s["slot_no"]):
                   None if s["run_id"] is None else SlotName(s["run_id"], s["lease_generation"])
                   for s in slots},
            checkpoints={(k["tenant_id"], k["workspace_key"], k["checkpoint_id"]):
                         (k["tenant_id"], k["workspace_key"], k["run_id"],
                                              k["checkpoint_order"], k["lease_generation"],
                                              k["data"]) for k in checkpoints},
            checksums={scope: hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()
                       for scope, rows in wholes.items()},
        )


def comparable_error(text: str | None) -> Any:
    """A run's error as the model keeps it: parsed, a stop reason without its message (the
    message formats a timestamp in the session's time zone)."""
    error = None if text is None else json.loads(text)
    if isinstance(error, dict) and "stop_reason" in error:
        error.pop("message", None)
    return error


def scalar(result: list[Any] | Raises) -> Any:
    """The value of a scalar function's single row, or the Raises."""
    return result if isinstance(result, Raises) else result[0][0]


# ---------------------------------------------------------------------------------------------
# The state machine

SCOPE = st.sampled_from(SCOPES)
DEPLOYMENT = st.sampled_from(DEPLOYMENTS)
WORKER = st.sampled_from(WORKERS)
LEASE = st.sampled_from([10, 30])
LIMIT = st.sampled_from([None, None, 1, 2])
# How a lease is presented: by its current holder, as the worker got it (maybe stale by now),
# or forged/misdirected on purpose.
TAMPER = st.sampled_from(["current", "current", "current", None, None, "older", "newer",
                          "worker", "scope"])
# Admin calls name the run's own scope, or (sometimes) another one.
ELSEWHERE = st.sampled_from([None, None, None, *SCOPES])


def tampered(ticket: Ticket, how: str | None, model: Model) -> Ticket:
    if how == "current":
        run = model.run(ticket.scope, ticket.run_id)
        if run is not None and run.holder is not None:
            return Ticket(ticket.scope, ticket.run_id, run.holder, run.generation)
    elif how in ("older", "newer"):
        step = -1 if how == "older" else 1
        return Ticket(ticket.scope, ticket.run_id, ticket.worker_id, ticket.generation + step)
    elif how == "worker":
        other = WORKERS[(WORKERS.index(ticket.worker_id) + 1) % len(WORKERS)]
        return Ticket(ticket.scope, ticket.run_id, other, ticket.generation)
    elif how == "scope":
        other_scope = SCOPES[(SCOPES.index(ticket.scope) + 1) % len(SCOPES)]
        return Ticket(other_scope, ticket.run_id, ticket.worker_id, ticket.generation)
    return ticket


@dataclass
class Effect:
    """What the last step was allowed to change, for the database-side invariants."""

    scope: Scope | None = None  # the step's scope, when the step reported success
    claimed: set[tuple[str, str, UUID]] = field(default_factory=set)
    redriven: set[tuple[str, str, UUID]] = field(default_factory=set)


class RunProtocol(RuleBasedStateMachine):
    db: ClassVar[Database]
    figures: ClassVar[Counter[str]]  # outcomes of every call, over all examples

    runs = Bundle("runs")
    tickets = Bundle("tickets")
    checkpoint_ids = Bundle("checkpoint_ids")
    AIM = st.one_of(runs, runs, runs, st.none())  # claims mostly look where a known run is
    # The holder's calls present a ticket from the bundle (mostly stale by now) or the live lease
    # of a running run (see present), so that chains of holder calls (start a child, wait for it,
    # wait for an event) happen within an example.
    HELD = st.one_of(tickets, st.integers(0, 7))

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.db.begin()
        self.effect = Effect()
        self.previous = self.db.snapshot()
        self.fingerprints = self._fingerprints()

    def teardown(self) -> None:
        self.db.rollback()
        self.figures["examples"] += 1

    def _fingerprints(self) -> dict[Scope, str]:
        return {scope: self.model.fingerprint(scope) for scope in SCOPES}

    def call(self, function: str, *, select: str = "*", scope: Scope | None = None,
             **kwargs: Any) -> list[Any] | Raises:
        """Call a zeroth function at the model's clock, in ``scope`` (tenant, workspace)."""
        if scope is not None:
            kwargs |= {"tenant_id": scope.tenant_id, "workspace_id": scope.workspace_id}
        return self.db.call(function, select, **kwargs, now_override=self.model.now)

    def present(self, ticket: Ticket | int, tamper: str | None, parents: bool = False) -> Ticket:
        """The lease a call presents: a ticket as a worker got it (maybe stale by now), or — an
        int n — the live lease of the model's n-th running run (as its holder would; with
        ``parents``, of one that started children), each maybe tampered with."""
        if isinstance(ticket, int):
            started = {k[:2] for k in self.model.links}
            running = sorted((r for r in self.model.runs.values() if r.status == "running"
                              and r.expires is not None and r.expires >= self.model.now
                              and (not parents or (r.scope, r.run_id) in started)),
                             key=lambda r: (r.scope.key, r.run_id))
            if not running:
                return Ticket(SCOPES[0], UUID(int=0), WORKERS[0], 1)
            run = running[ticket % len(running)]
            ticket = Ticket(run.scope, run.run_id, run.holder or "", run.generation)
        return tampered(ticket, tamper, self.model)

    def fenced(self, function: str, ticket: Ticket, **kwargs: Any) -> Any:
        return scalar(self.call(function, scope=ticket.scope, run_id=ticket.run_id,
                                worker_id=ticket.worker_id, generation=ticket.generation,
                                **kwargs))

    def succeeded(self, scope: Scope, outcome: object, function: str) -> None:
        self.figures[f"{function}:{outcome}"] += 1
        if outcome not in (None, False, "unknown", "not_cancellable") and not isinstance(
                outcome, Raises):
            self.effect.scope = scope

    # -- enqueue and claims ----------------------------------------------------------------

    @initialize(target=runs, per_scope=st.lists(st.sampled_from(DEPLOYMENTS), min_size=len(SCOPES),
                                                max_size=len(SCOPES) * 3))
    def some_runs(self, per_scope: list[str]) -> Any:
        """Work in every scope from the start, so claims find something early."""
        return multiple(*(self.enqueue(SCOPES[i % len(SCOPES)], deployment_ref, 0, 0, 2, None, None)
                          for i, deployment_ref in enumerate(per_scope)))

    @rule(target=runs, scope=SCOPE, deployment_ref=DEPLOYMENT,
          priority=st.sampled_from([0, 0, 1]), delay=st.sampled_from([0, 0, 0, 20]),
          max_attempts=st.sampled_from([1, 2, 3]),
          idempotency_key=st.sampled_from([None, None, "k1", "k2"]), twin=st.none() | runs)
    def enqueue(self, scope: Scope, deployment_ref: str, priority: int, delay: int,
                max_attempts: int, idempotency_key: str | None, twin: RunRef | None) -> RunRef:
        run_id = twin.run_id if twin is not None else self.model.new_id()
        run_after = self.model.now + timedelta(seconds=delay) if delay else None
        expected = self.model.enqueue(scope, run_id, deployment_ref, priority, run_after,
                                      max_attempts, idempotency_key)
        rows = self.call("enqueue_run", select="run_id, created, status::text", scope=scope,
                         deployment_ref=deployment_ref, priority=priority, run_after=run_after,
                         max_attempts=max_attempts, idempotency_key=idempotency_key,
                         run_id=run_id)
        assert not isinstance(rows, Raises), rows
        assert tuple(rows[0]) == expected
        self.succeeded(scope, expected[1], "enqueue_run")
        return RunRef(scope, expected[0])

    def _claim(self, function: str, plan: ClaimPlan, select: str = CLAIM_COLUMNS,
               **kwargs: Any) -> Any:
        rows = self.call(function, select=select, scope=plan.scope,
                         worker_id=plan.worker_id, max_concurrency=plan.limit,
                         lease_seconds=plan.lease.total_seconds(), **kwargs)
        assert not isinstance(rows, Raises), rows
        return self._check_claim(function, plan, rows)

    def _check_claim(self, function: str, plan: ClaimPlan, rows: list[Any]) -> Any:
        """A claim's rows against its plan; the model leases what it claimed."""
        claimed = [row for row in rows if row["run_id"] is not None]
        for run in plan.ended:
            self.model.end_lapsed_claim(run)
        for run in plan.maybe_ended:  # tied in claim order with the last claimed run
            if self.db.run(self.db.conn.fetchval(
                    "SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1",
                    run.run_id)) != "pending":
                self.model.end_lapsed_claim(run)
        if plan.ended or plan.maybe_ended:
            self.figures[f"{function}:dead-lettered a lapsed claim"] += 1
        if plan.marker is not None or not claimed:
            active, saturated, limit = plan.marker or (plan.active, False, plan.limit)
            wanted = plan.candidates[:plan.want] if plan.marker is None else []
            assert not wanted, f"{function} claimed nothing; the model expected {wanted}"
            assert [(row["active_count"], row["concurrency_saturated"], row["concurrency_limit"])
                    for row in rows] == [(active, saturated, limit)]
            why = "saturated" if plan.marker and plan.candidates else "empty"
            self.figures[f"{function}:none ({why})"] += 1
            return multiple()
        # Ties in the claim order may be broken either way: the claimed runs must be a best
        # prefix of the candidates, in order.
        take = plan.candidates[:plan.want]
        by_id = {run.run_id: run for run in plan.candidates}
        assert len(rows) == len(claimed) == len(take), (rows, take)
        chosen = [by_id.get(row["run_id"]) for row in claimed]
        assert None not in chosen, f"{function} claimed a run that is not claimable: {rows}"
        keys = [plan.sort_key(run) for run in chosen]
        assert keys == sorted(keys) == [plan.sort_key(run) for run in take], (rows, take)
        tickets = []
        for position, (row, run) in enumerate(zip(claimed, chosen, strict=True)):
            assert run is not None
            tickets.append(self.model.lease_run(plan, run, position))
            recovery = (self.model.checkpoints.get((run.scope, run.recovery)) if run.recovery
                        else None)
            assert {k: row[k] for k in CLAIMED} == {
                "run_id": run.run_id, "lease_generation": run.generation,
                "lease_expires_at": run.expires, "status": run.status,
                "attempts": run.attempts, "recovery_checkpoint_id": run.recovery,
                "checkpoint_data": recovery.data if recovery else None,
                "cancel_requested": run.cancel_requested, "active_count": plan.active,
                "concurrency_saturated": False, "concurrency_limit": plan.limit}
            self.effect.claimed.add((*run.scope.key, run.run_id))
        self.figures[f"{function}:{len(tickets)}"] += 1
        return multiple(*tickets)

    def _aim(self, ref: RunRef | None, scope: Scope, deployment_ref: str) -> tuple[Scope, str]:
        """Claims look where a known run is (when given one), else anywhere."""
        run = self.model.run(ref.scope, ref.run_id) if ref is not None else None
        return (run.scope, run.deployment_ref) if run is not None else (scope, deployment_ref)

    @rule(target=tickets, ref=AIM, scope=SCOPE, deployment_ref=DEPLOYMENT,
          worker_id=WORKER, limit=LIMIT, batch_size=st.sampled_from([1, 1, 2, 3]), lease=LEASE,
          start=st.booleans())
    def claim_pending(self, ref: RunRef | None, scope: Scope, deployment_ref: str,
                      worker_id: str, limit: int | None, batch_size: int, lease: int,
                      start: bool) -> Any:
        """claim_pending, and with ``start`` what a worker does next: start_run each claim."""
        scope, deployment_ref = self._aim(ref, scope, deployment_ref)
        plan = self.model.plan_claim_pending(scope, deployment_ref, worker_id, limit, batch_size,
                                             timedelta(seconds=lease))
        tickets = self._claim("claim_pending", plan, deployment_ref=deployment_ref,
                              batch_size=batch_size)
        for ticket in tickets.values if start else ():
            self.start_run(ticket, "current")
        return tickets

    @rule(target=tickets, held=st.one_of(tickets, tickets, st.none()), scope=SCOPE,
          deployment_ref=DEPLOYMENT, worker_id=WORKER, limit=LIMIT,
          claim_limit=st.sampled_from([None, 1, 2]), lease=LEASE)
    def claim_orphaned(self, held: Ticket | None, scope: Scope, deployment_ref: str,
                       worker_id: str, limit: int | None, claim_limit: int | None,
                       lease: int) -> Any:
        """Orphans are runs someone claimed: look where a known lease is (or anywhere)."""
        ref = RunRef(held.scope, held.run_id) if held is not None else None
        scope, deployment_ref = self._aim(ref, scope, deployment_ref)
        plan = self.model.plan_claim_orphaned(scope, deployment_ref, worker_id, limit,
                                              claim_limit, timedelta(seconds=lease))
        return self._claim("claim_orphaned", plan, deployment_ref=deployment_ref,
                           claim_limit=claim_limit)

    @rule(target=tickets, ref=AIM, scope=SCOPE, deployment_ref=DEPLOYMENT,
          worker_id=WORKER, limit=LIMIT, batch_size=st.sampled_from([1, 1, 2, 3]), lease=LEASE)
    def claim_and_start(self, ref: RunRef | None, scope: Scope, deployment_ref: str,
                        worker_id: str, limit: int | None, batch_size: int, lease: int) -> Any:
        """claim_pending and start_run in one UPDATE: the RunWorker's claim."""
        scope, deployment_ref = self._aim(ref, scope, deployment_ref)
        plan = self.model.plan_claim_pending(scope, deployment_ref, worker_id, limit, batch_size,
                                             timedelta(seconds=lease))
        plan.start = True
        return self._claim("claim_and_start", plan, deployment_ref=deployment_ref,
                           batch_size=batch_size)

    def _completions(self, presented: list[Ticket],
                     outputs: list[str | None] | None) -> tuple[list[Any], Scope, str]:
        """complete_runs' arguments for a batch named by ``presented`` (the first ticket's worker
        and scope; the others may be stale, another worker's or another scope's), and the model's
        answer: one boolean per run (the live lease of that exact generation, held by the worker,
        of a running run), or Raises when a run is named twice. Applies the completions."""
        worker_id, scope = presented[0].worker_id, presented[0].scope
        if len({t.run_id for t in presented}) < len(presented):
            return [Raises("ZP008")], scope, worker_id
        done: list[Any] = []
        for position, ticket in enumerate(presented):
            run = self.model.live(Ticket(scope, ticket.run_id, worker_id, ticket.generation))
            done.append(run is not None and run.status == "running")
            if run is None or run.status != "running":
                continue
            self.model.end_attempt(run, "completed")
            self.model.free_slot(Ticket(scope, run.run_id, worker_id, ticket.generation))
            run.clear_lease()
            run.status, run.finished = "completed", True
            output = outputs[position] if outputs is not None else None
            if output is not None:  # SQL NULL keeps the committed output, JSON null clears it
                run.output = None if output == "null" else output
        return done, scope, worker_id

    DISTINCT = st.lists(st.tuples(tickets, TAMPER), min_size=1, max_size=4,
                        unique_by=lambda t: t[0].run_id)
    # Mostly distinct runs; now and then one named twice (refused whole).
    BATCH = st.one_of(DISTINCT, DISTINCT, st.lists(st.tuples(tickets, TAMPER), min_size=2,
                                                   max_size=3))
    OUTPUTS = st.none() | st.lists(st.sampled_from([None, '{"done": 1}', "null"]), min_size=4,
                                   max_size=4)

    @rule(held=BATCH, outputs=OUTPUTS)
    def complete_runs(self, held: list[tuple[Ticket, str | None]],
                      outputs: list[str | None] | None) -> None:
        presented = [self.present(ticket, how) for ticket, how in held]
        outputs = outputs[:len(presented)] if outputs is not None else None
        expected, scope, worker_id = self._completions(presented, outputs)
        rows = self.call("complete_runs", select="run_id, completed", scope=scope,
                         worker_id=worker_id, run_ids=[t.run_id for t in presented],
                         generations=[t.generation for t in presented], outputs=outputs)
        if expected == [Raises("ZP008")]:
            assert rows == Raises("ZP008"), rows
            self.succeeded(scope, rows, "complete_runs")
            return
        assert not isinstance(rows, Raises), rows
        assert [(r["run_id"], r["completed"]) for r in rows] == [
            (t.run_id, ok) for t, ok in zip(presented, expected, strict=True)], (rows, presented)
        self.succeeded(scope, any(expected), "complete_runs")

    @rule(target=tickets, held=BATCH, outputs=OUTPUTS, deployment_ref=DEPLOYMENT, limit=LIMIT,
          batch_size=st.sampled_from([1, 1, 2]), lease=LEASE)
    def complete_and_claim(self, held: list[tuple[Ticket, str | None]],
                           outputs: list[str | None] | None, deployment_ref: str,
                           limit: int | None, batch_size: int, lease: int) -> Any:
        """complete_runs, then claim_and_start in the same scope (the worker's hot path): the
        claim sees what the completions did (a freed slot, a parent its child's end woke)."""
        presented = [self.present(ticket, how) for ticket, how in held]
        outputs = outputs[:len(presented)] if outputs is not None else None
        run = self.model.run(presented[0].scope, presented[0].run_id)
        deployment_ref = run.deployment_ref if run is not None else deployment_ref
        expected, scope, worker_id = self._completions(presented, outputs)
        arguments = {"run_ids": [t.run_id for t in presented],
                     "generations": [t.generation for t in presented], "outputs": outputs,
                     "deployment_ref": deployment_ref, "batch_size": batch_size}
        if expected == [Raises("ZP008")]:
            rows = self.call("complete_and_claim", scope=scope, worker_id=worker_id,
                             max_concurrency=limit, lease_seconds=lease, **arguments)
            assert rows == Raises("ZP008"), rows
            self.succeeded(scope, rows, "complete_and_claim")
            return multiple()
        self.model.settle()
        plan = self.model.plan_claim_pending(scope, deployment_ref, worker_id, limit, batch_size,
                                             timedelta(seconds=lease))
        plan.start = True
        rows = self.call("complete_and_claim", select="completed, " + claim_columns("claimed"),
                         scope=scope, worker_id=worker_id, max_concurrency=limit,
                         lease_seconds=lease, **arguments)
        assert not isinstance(rows, Raises), rows
        assert all(row["completed"] == expected for row in rows), (rows, expected)
        self.succeeded(scope, any(expected), "complete_and_claim")
        return self._check_claim("complete_and_claim", plan, rows)

    @precondition(lambda self: self.model.any_lapsed())
    @rule(ref=st.one_of(runs, st.integers(0, 7)), elsewhere=ELSEWHERE,
          grace=st.sampled_from([0, 10]))
    def claim_for_takeover(self, ref: RunRef | int, elsewhere: Scope | None, grace: int) -> None:
        """The takeover of one run whose owner's lease expired more than grace ago (``ref``: a
        run, or the n-th run whose lease lapsed)."""
        if isinstance(ref, int):
            lapsed = sorted((r for r in self.model.runs.values()
                             if r.expires is not None and r.expires < self.model.now),
                            key=lambda r: (r.scope.key, r.run_id))
            chosen = lapsed[ref % len(lapsed)]  # the precondition: there is one
            ref = RunRef(chosen.scope, chosen.run_id)
        scope = elsewhere or ref.scope
        run = self.model.run(scope, ref.run_id)
        taken = (run is not None and run.status in ("pending", "running") and run.holder is not None
                 and run.expires is not None and run.expires + timedelta(seconds=grace)
                 < self.model.now)
        previous = (run.holder, run.generation, run.thread_id) if run is not None else None
        expected = []
        if taken and run is not None and previous is not None:
            outcome = self.model.take_over(run)
            expected = [(ref.run_id, previous[2], outcome, run.status, previous[0], previous[1])]
        rows = self.call("claim_for_takeover", select="run_id, thread_id, outcome, status::text, "
                         "previous_worker_id, previous_generation", scope=scope,
                         run_id=ref.run_id, grace_seconds=grace)
        assert not isinstance(rows, Raises), rows
        assert [tuple(row) for row in rows] == expected, (rows, run)
        self.succeeded(scope, expected[0][2] if expected else None, "claim_for_takeover")

    @rule(target=tickets, scope=SCOPE, deployment_ref=DEPLOYMENT,
          thread_id=st.sampled_from(["th1", "th2"]), worker_id=st.none() | WORKER, lease=LEASE,
          max_attempts=st.sampled_from([1, 2, 3]))
    def admit_run(self, scope: Scope, deployment_ref: str, thread_id: str,
                  worker_id: str | None, lease: int, max_attempts: int) -> Any:
        """admit_run, strategy reject: busy while the thread has an active run; else a new
        thread run, leased at generation 1 to worker_id (admit-and-own: not resumable)."""
        active = next((r for r in self.model.runs.values()
                       if r.scope == scope and r.thread_id == thread_id
                       and r.status in ("pending", "running", "waiting")), None)
        run_id = self.model.new_id()
        rows = self.call("admit_run", select="outcome, run_id, status::text, lease_generation, "
                         "lease_expires_at, active_run_id, retry_after_s", scope=scope,
                         deployment_ref=deployment_ref, thread_id=thread_id, strategy="reject",
                         worker_id=worker_id, lease_seconds=lease, run_id=run_id,
                         max_attempts=max_attempts)
        assert not isinstance(rows, Raises), rows
        if active is not None:
            retry = None if active.expires is None else max(1, math.ceil(
                (active.expires + ORPHAN_GRACE - self.model.now).total_seconds()))
            assert tuple(rows[0]) == ("busy", None, None, None, None, active.run_id, retry)
            self.succeeded(scope, None, "admit_run:busy")
            return multiple()
        run = Run(scope, run_id, deployment_ref, 0, self.model.now, self.model.now, max_attempts,
                  thread_id=thread_id, resumable=worker_id is None)
        self.model.runs[(scope, run_id)] = run
        if worker_id is not None:
            run.holder, run.acquired = worker_id, self.model.now
            run.expires, run.generation = self.model.now + timedelta(seconds=lease), 1
            self.effect.claimed.add((*scope.key, run_id))
        assert tuple(rows[0]) == ("admitted", run_id, "pending", run.generation or None,
                                  run.expires, None, None), rows
        self.succeeded(scope, "admitted", "admit_run")
        if worker_id is None:
            return multiple()
        return Ticket(scope, run_id, worker_id, 1)

    # -- lease upkeep ----------------------------------------------------------------------

    @rule(ticket=tickets, tamper=TAMPER, lease=LEASE, owner_only=st.booleans())
    def renew_lease(self, ticket: Ticket, tamper: str | None, lease: int,
                    owner_only: bool) -> None:
        ticket = self.present(ticket, tamper)
        generation = None if owner_only else ticket.generation
        expected = bool(self.model.renew(ticket.scope, ticket.worker_id,
                                         [(ticket.run_id, generation)], timedelta(seconds=lease)))
        outcome = scalar(self.call("renew_lease", scope=ticket.scope, run_id=ticket.run_id,
                                   worker_id=ticket.worker_id, generation=generation,
                                   lease_seconds=lease))
        assert outcome is expected
        self.succeeded(ticket.scope, outcome, "renew_lease")

    # Mostly distinct runs; now and then a batch that names a run twice (refused whole).
    @rule(scope=SCOPE, worker_id=WORKER, lease=LEASE, held=st.one_of(
        st.lists(tickets, max_size=4, unique_by=lambda t: t.run_id),
        st.lists(tickets, max_size=4, unique_by=lambda t: t.run_id),
        st.lists(tickets, min_size=2, max_size=3)))
    def renew_leases(self, scope: Scope, worker_id: str, held: list[Ticket], lease: int) -> None:
        requested: list[tuple[UUID, int | None]] = [(t.run_id, t.generation) for t in held]
        runs = {r: self.model.run(scope, r) for r, _ in requested}
        repeated = len({r for r, _ in requested}) < len(requested)
        renewed = set() if repeated else self.model.renew(scope, worker_id, requested,
                                                           timedelta(seconds=lease))
        rows = self.call("renew_leases", select="run_id, renewed, lease_expires_at, "
                         "cancel_requested", scope=scope, worker_id=worker_id,
                         run_ids=[r for r, _ in requested], generations=[g for _, g in requested],
                         lease_seconds=lease)
        if repeated:  # a batch that names a run twice is refused whole (as complete_runs)
            assert rows == Raises("ZP008"), rows
            self.succeeded(scope, rows, "renew_leases")
            return
        assert not isinstance(rows, Raises), rows
        expected = []
        for run_id, generation in requested:
            run = runs[run_id]
            ok = run is not None and run_id in renewed and run.generation == generation
            expected.append((run_id, ok, run.expires if ok and run else None,
                             bool(ok and run and run.cancel_requested)))
        assert [tuple(row) for row in rows] == expected
        self.succeeded(scope, bool(renewed), "renew_leases")

    # -- fenced writes by the holder -------------------------------------------------------

    @rule(ticket=tickets, tamper=TAMPER)
    def start_run(self, ticket: Ticket, tamper: str | None) -> None:
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        expected = run is not None and run.status in ("pending", "running")
        outcome = self.fenced("start_run", ticket)
        assert outcome is expected, (ticket, run)
        if expected and run is not None and run.status == "pending":
            run.status, run.attempts, run.started_at = "running", run.attempts + 1, self.model.now
        self.succeeded(ticket.scope, outcome, "start_run")

    @rule(ticket=tickets, tamper=TAMPER, column=st.sampled_from(["output", "error", "progress"]),
          value=st.sampled_from(['{"n": 1}', '{"n": 2}', "null"]))
    def commit_fenced(self, ticket: Ticket, tamper: str | None, column: str, value: str) -> None:
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        outcome = self.fenced("commit_fenced", ticket, columns=f'{{"{column}": {value}}}')
        assert outcome is (run is not None), (ticket, run)
        if run is not None:
            stored = None if value == "null" else value
            setattr(run, column, json.loads(stored) if column == "error" and stored else stored)
        self.succeeded(ticket.scope, outcome, "commit_fenced")

    @rule(target=checkpoint_ids, ticket=tickets, tamper=TAMPER,
          reuse=st.none() | checkpoint_ids, fresh=st.booleans())
    def save_checkpoint(self, ticket: Ticket, tamper: str | None, reuse: UUID | None,
                        fresh: bool) -> Any:
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        # A caller-chosen id (new, or one already used), or none: the database picks one.
        checkpoint_id = reuse if reuse is not None else (self.model.new_id() if fresh else None)
        data = json.dumps({"seq": run.checkpoint_seq + 1 if run else 0})
        existing = (self.model.checkpoints.get((run.scope, checkpoint_id))
                    if checkpoint_id and run else None)
        outcome = self.fenced("save_checkpoint", ticket, data=data, checkpoint_id=checkpoint_id)
        if run is None:
            assert outcome is None, (ticket, outcome)
        elif run.status != "running":
            assert outcome == Raises("ZP003"), (ticket, run, outcome)
        elif existing is not None and (existing.scope, existing.run_id) != (run.scope, run.run_id):
            assert outcome == Raises("ZP007"), (ticket, run, outcome)
        elif checkpoint_id is None:
            assert isinstance(outcome, UUID), outcome
            assert (run.scope, outcome) not in self.model.checkpoints, outcome
        else:
            assert outcome == checkpoint_id, (ticket, run, outcome)
        self.succeeded(ticket.scope, "saved" if isinstance(outcome, UUID) else outcome,
                       "save_checkpoint")
        if run is None or isinstance(outcome, Raises):
            return multiple()
        run.checkpoint_seq += 1
        self.model.checkpoints[(run.scope, outcome)] = Checkpoint(
            run.scope, run.run_id, run.checkpoint_seq, ticket.generation, data)
        return outcome

    def _holder_ends(self, function: str, ticket: Ticket, done: Any, refused: Any,
                     ended: str, **kwargs: Any) -> Run | None:
        """complete_run / fail_run / pause_run: only the live holder of a running run ends it
        (returning ``done``); a live holder of a run that is not running gets ZP003; anyone
        else is refused (``refused``) and changes nothing. Returns the run when it ended, its
        lease and slot gone, its attempt ended with ``ended``."""
        run = self.model.live(ticket)
        expected = (refused if run is None else Raises("ZP003") if run.status != "running"
                    else done)
        outcome = self.fenced(function, ticket, **kwargs)
        assert outcome == expected, (ticket, run)
        self.succeeded(ticket.scope, outcome, function)
        if run is None or isinstance(outcome, Raises):
            return None
        self.model.end_attempt(run, ended)
        self.model.free_slot(ticket)
        run.clear_lease()
        return run

    @rule(ticket=HELD, tamper=TAMPER, output=st.sampled_from([None, '{"done": 1}', "null"]))
    def complete_run(self, ticket: Ticket | int, tamper: str | None, output: str | None) -> None:
        run = self._holder_ends("complete_run", self.present(ticket, tamper), True, False,
                                "completed", output=output)
        if run is not None:
            run.status, run.finished = "completed", True
            if output is not None:  # SQL NULL keeps the committed output, JSON null clears it
                run.output = None if output == "null" else output

    @rule(ticket=HELD, tamper=TAMPER, retryable=st.booleans(),
          error=st.sampled_from([None, '{"e": 1}']))
    def fail_run(self, ticket: Ticket | int, tamper: str | None, retryable: bool,
                 error: str | None) -> None:
        ticket = self.present(ticket, tamper)
        live = self.model.live(ticket)
        if live is None or not retryable:
            outcome = "failed"
        else:
            outcome = "retry_scheduled" if live.attempts < live.max_attempts else "dead_lettered"
        run = self._holder_ends("fail_run", ticket, outcome, None,
                                "dead_lettered" if outcome == "dead_lettered" else "failed",
                                error=error, retryable=retryable)
        if run is None:
            return
        run.error = json.loads(error) if error else None
        run.dead_lettered = outcome == "dead_lettered"
        if outcome != "retry_scheduled":
            run.status, run.finished = "failed", True
            return
        run.status = "pending"
        # The jitter is random(): read the new run_after back and check that it is in range.
        backoff = timedelta(seconds=min(RETRY_MAX, RETRY_BASE * 2 ** max(run.attempts - 1, 0)))
        run_after = self.db.run(self.db.conn.fetchval(
            """SELECT r.run_after FROM zeroth.runs r WHERE r.tenant_id = $1
                   AND r.workspace_key = $2 AND r.run_id = $3""", *run.scope.key, run.run_id))
        now = self.model.now
        assert now + backoff / 2 - MICROSECOND <= run_after <= now + backoff + MICROSECOND
        run.run_after = run_after

    @rule(ticket=HELD, tamper=TAMPER)
    def pause_run(self, ticket: Ticket | int, tamper: str | None) -> None:
        run = self._holder_ends("pause_run", self.present(ticket, tamper), True, False,
                                "paused", reason="approval")
        if run is not None:
            run.status, run.wait_reason = "waiting", "approval"
            run.attempts = max(run.attempts - 1, 0)  # waiting is not a failure

    @precondition(lambda self: self.model.any_running())
    @rule(ticket=HELD, tamper=TAMPER, delay=st.sampled_from([0, 5, 20]),
          checkpoint=st.booleans())
    def sleep_run(self, ticket: Ticket | int, tamper: str | None, delay: int,
                  checkpoint: bool) -> None:
        """Durable sleep: the live holder's running run → pending at now + delay, the attempt
        given back, a checkpoint saved in the same call; a pending cancel request → cancelled.
        The wake is the ordinary claim once run_after passed."""
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        data = json.dumps({"seq": run.checkpoint_seq + 1 if run else 0})
        rows = self.call("sleep_run", select="outcome, run_after, checkpoint_id",
                         scope=ticket.scope, run_id=ticket.run_id, worker_id=ticket.worker_id,
                         generation=ticket.generation, delay_seconds=delay,
                         checkpoint=data if checkpoint else None)
        if run is not None and run.status != "running":
            assert rows == Raises("ZP003"), (rows, run)
        else:
            assert not isinstance(rows, Raises), rows
        outcome = rows if isinstance(rows, Raises) else rows[0]["outcome"]
        self.succeeded(ticket.scope, outcome, "sleep_run")
        if run is None or isinstance(rows, Raises):
            assert isinstance(rows, Raises) or tuple(rows[0]) == (None, None, None), rows
            return
        if run.cancel_requested:
            assert tuple(rows[0]) == ("cancelled", None, None), rows
            self.model.end_attempt(run, "cancelled")
            run.status, run.finished = "cancelled", True
        else:
            saved = rows[0]["checkpoint_id"]
            assert tuple(rows[0]) == ("sleeping", self.model.now + timedelta(seconds=delay),
                                      saved), rows
            assert (saved is not None) is checkpoint, rows
            self.model.end_attempt(run, "slept")
            run.status, run.run_after = "pending", self.model.now + timedelta(seconds=delay)
            run.attempts = max(run.attempts - 1, 0)
            if saved is not None:
                run.checkpoint_seq += 1
                self.model.checkpoints[(run.scope, saved)] = Checkpoint(
                    run.scope, run.run_id, run.checkpoint_seq, ticket.generation, data)
        self.model.free_slot(ticket)
        run.clear_lease()

    # -- events ----------------------------------------------------------------------------

    @precondition(lambda self: self.model.any_running())
    @rule(ticket=HELD, tamper=TAMPER, step_key=st.sampled_from(["e1", "e2"]),
          name=st.sampled_from(["n1", "n2"]), timeout=st.sampled_from([None, 0, 5, 20]))
    def wait_for_event(self, ticket: Ticket | int, tamper: str | None, step_key: str, name: str,
                       timeout: int | None) -> None:
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        rows = self.call("wait_for_event", select="outcome, payload::text, timeout_at",
                         scope=ticket.scope, run_id=ticket.run_id, worker_id=ticket.worker_id,
                         generation=ticket.generation, step_key=step_key, name=name,
                         timeout_seconds=timeout)
        expected = self._wait_for_event(ticket, run, step_key, name, timeout)
        got = rows if isinstance(rows, Raises) else tuple(rows[0])
        assert got == expected, (got, expected, run)
        self.succeeded(ticket.scope, expected if isinstance(expected, Raises) else expected[0],
                       "wait_for_event")

    def _wait_for_event(self, ticket: Ticket, run: Run | None, step_key: str, name: str,
                        timeout: int | None) -> Any:
        """The model of wait_for_event (its header): fenced → NULL row; a recorded step → its
        outcome (ZP008 when it is another step's); the event emitted by the deadline → received;
        the deadline passed → timed_out; else the run leaves to wait (or is cancelled)."""
        model = self.model
        if run is None:
            return (None, None, None)
        if run.status != "running":
            return Raises("ZP003")
        key = (ticket.scope, ticket.run_id, step_key)
        step = model.steps.get(key)
        if step is not None:
            if step.get("event") != name or step.get("outcome") not in ("received", "timed_out"):
                return Raises("ZP008")
            return (step["outcome"], json.dumps(step["payload"]), None)
        event = model.events.setdefault((ticket.scope, name), None)  # a channel when missing
        wait = model.event_waits.get(key)
        deadline = (wait.timeout_at if wait is not None and wait.name == name else
                    None if timeout is None else model.now + timedelta(seconds=timeout))
        outcome = payload = None
        if event is not None and (deadline is None or event[0] <= deadline):
            outcome, payload = "received", event[1]
        elif deadline is not None and deadline <= model.now:
            outcome = "timed_out"
        if outcome is not None:
            model.steps[key] = {"outcome": outcome, "event": name,
                                "payload": None if payload is None else json.loads(payload)}
            model.event_waits.pop(key, None)
            return (outcome, payload, deadline)
        if model.leave_for_wait(run, ticket, f"event:{name}") == "waiting":
            model.event_waits[key] = EventWait(name, deadline)
            return ("waiting", None, deadline)
        return ("cancelled", None, deadline)

    @rule(scope=SCOPE, name=st.sampled_from(["n1", "n2"]),
          payload=st.sampled_from(['{"p": 1}', "null"]), aim=st.booleans())
    def emit_event(self, scope: Scope, name: str, payload: str, aim: bool) -> None:
        """The first emit of a name in a scope records it and makes every run of the scope
        waiting on it pending, due now; a repeat changes nothing. With ``aim``, the event a run
        waits for (when one does)."""
        model = self.model
        waiting = sorted((r.scope.key, r.run_id, r.scope, r.wait_reason)
                         for r in model.runs.values() if r.status == "waiting"
                         and (r.wait_reason or "").startswith("event:"))
        if aim and waiting:
            scope, name = waiting[0][2], (waiting[0][3] or "")[len("event:"):]
        emitted = model.events.get((scope, name)) is None
        woken = 0
        if emitted:
            model.events[(scope, name)] = (model.now, payload)
            for run in model.runs.values():
                if (run.scope == scope and run.status == "waiting"
                        and run.wait_reason == f"event:{name}"
                        and any(k[:2] == (scope, run.run_id) and w.name == name
                                for k, w in model.event_waits.items())):
                    run.status, run.wait_reason, run.run_after = "pending", None, model.now
                    woken += 1
        rows = self.call("emit_event", select="emitted, woken", scope=scope, name=name,
                         payload=payload)
        assert not isinstance(rows, Raises), rows
        assert tuple(rows[0]) == (emitted, woken), (rows, emitted, woken)
        self.succeeded(scope, emitted or None, "emit_event")
        self.figures[f"emit_event:woke {woken}"] += 1

    @precondition(lambda self: self.model.any_waiting())
    @rule(deployment_ref=st.none() | DEPLOYMENT)
    def wake_due_waits(self, deployment_ref: str | None) -> None:
        """The orphan sweep's wake-up: event waits past their deadline, and parents whose
        children's wait was met while they could not be woken, → pending, due now."""
        model = self.model
        woken = 0
        for run in model.runs.values():
            if run.status != "waiting" or deployment_ref not in (None, run.deployment_ref):
                continue
            mine = [(k[2], w) for k, w in model.event_waits.items()
                    if k[:2] == (run.scope, run.run_id)]
            due = any(run.wait_reason == f"event:{w.name}" and w.timeout_at is not None
                      and w.timeout_at <= model.now for _, w in mine)
            met = any(run.wait_reason == f"children:{k[2]}" and w.met
                      for k, w in model.child_waits.items() if k[:2] == (run.scope, run.run_id))
            if due or met:
                run.status, run.wait_reason, run.run_after = "pending", None, model.now
                woken += 1
        outcome = scalar(self.call(
            "wake_due_waits", deployment_refs=None if deployment_ref is None else [deployment_ref]))
        assert outcome == woken, (outcome, woken)
        self.figures[f"wake_due_waits:{woken}"] += 1

    # -- child runs ------------------------------------------------------------------------

    @precondition(lambda self: self.model.any_running())
    @rule(target=runs, ticket=HELD, tamper=TAMPER, step_key=st.sampled_from(["c1", "c2", "c3"]),
          deployment_ref=DEPLOYMENT, detached=st.sampled_from([False, False, True]),
          max_attempts=st.sampled_from([1, 2]), then_wait=st.booleans())
    def start_child_run(self, ticket: Ticket | int, tamper: str | None, step_key: str,
                        deployment_ref: str, detached: bool, max_attempts: int,
                        then_wait: bool) -> Any:
        """Start a child as a step; with ``then_wait`` the parent then waits for all its
        children (a parent that fans out and waits, in one step)."""
        ticket = self.present(ticket, tamper)
        model = self.model
        run = model.live(ticket)
        link = model.links.get((ticket.scope, ticket.run_id, step_key))
        rows = self.call("start_child_run", select="child_run_id, created", scope=ticket.scope,
                         run_id=ticket.run_id, worker_id=ticket.worker_id,
                         generation=ticket.generation, step_key=step_key,
                         deployment_ref=deployment_ref, detached=detached,
                         max_attempts=max_attempts)
        if run is None:
            expected: Any = (None, None)
        elif run.status != "running":
            expected = Raises("ZP003")
        elif link is not None:
            same = (link.deployment_ref, link.detached) == (deployment_ref, detached)
            expected = (link.child, False) if same else Raises("ZP010")
        else:
            assert not isinstance(rows, Raises), rows
            expected = (rows[0]["child_run_id"], True)
        got = rows if isinstance(rows, Raises) else tuple(rows[0])
        assert got == expected, (got, expected, run)
        created = not isinstance(expected, Raises) and expected[1] is True
        self.succeeded(ticket.scope, "created" if created else got, "start_child_run")
        if not created:
            return multiple()
        child = got[0]
        model.runs[(ticket.scope, child)] = Run(
            ticket.scope, child, deployment_ref, 0, model.now, model.now, max_attempts,
            parent=ticket.run_id)
        model.links[(ticket.scope, ticket.run_id, step_key)] = Link(child, deployment_ref, detached)
        model.steps[(ticket.scope, ticket.run_id, step_key)] = {
            "child_run_id": str(child), "deployment_ref": deployment_ref}
        if then_wait:
            self.wait_for_children(ticket, None, "w1", 7, "all", False)
        return RunRef(ticket.scope, child)

    @precondition(lambda self: bool(self.model.links))
    @rule(ticket=HELD, tamper=TAMPER, step_key=st.sampled_from(["w1", "w2"]),
          pick=st.integers(0, 7), mode=st.sampled_from(["all", "any"]),
          stranger=st.sampled_from([False, False, False, True]))
    def wait_for_children(self, ticket: Ticket | int, tamper: str | None, step_key: str, pick: int,
                          mode: str, stranger: bool) -> None:
        """Wait for some of the parent's children (``pick``: which, as bits of its links in step
        key order), now and then naming a run that is not its child (ZP008)."""
        ticket = self.present(ticket, tamper, parents=True)
        model = self.model
        mine = [link.child for k, link in sorted(model.links.items(), key=lambda i: i[0][2])
                if k[:2] == (ticket.scope, ticket.run_id)]
        chosen = [child for i, child in enumerate(mine) if pick >> i & 1] or mine[:1]
        if stranger:
            chosen.append(next((r.run_id for r in model.runs.values() if r.run_id not in mine
                                and r.run_id != ticket.run_id), UUID(int=0)))
        rows = self.call("wait_for_children", select="outcome, children::text",
                         scope=ticket.scope, run_id=ticket.run_id, worker_id=ticket.worker_id,
                         generation=ticket.generation, step_key=step_key, child_run_ids=chosen,
                         mode=mode)
        expected = self._wait_for_children(ticket, step_key, chosen, mine, mode)
        if isinstance(rows, Raises) or rows[0]["children"] is None:
            got: Any = rows if isinstance(rows, Raises) else tuple(rows[0])
        else:
            got = (rows[0]["outcome"], [(UUID(c["run_id"]), c["status"], c["dead_lettered"])
                                        for c in json.loads(rows[0]["children"])])
        assert got == expected, (got, expected)
        self.succeeded(ticket.scope, expected if isinstance(expected, Raises) else expected[0],
                       "wait_for_children")

    def _wait_for_children(self, ticket: Ticket, step_key: str, chosen: list[UUID],
                           mine: list[UUID], mode: str) -> Any:
        model = self.model
        if not chosen:
            return Raises("ZP008")
        run = model.live(ticket)
        if run is None:
            return (None, None)
        if run.status != "running":
            return Raises("ZP003")
        key = (ticket.scope, ticket.run_id, step_key)
        step = model.steps.get(key)
        if step is not None:
            return ("ready", step["children"]) if step.get("outcome") == "ready" else Raises(
                "ZP010")
        if any(child not in mine for child in chosen):
            return Raises("ZP008")
        ended = model.children_ended(ticket.scope, ticket.run_id, chosen)
        if ended == len(chosen) or (mode == "any" and ended >= 1):
            copies = {link.child: link.ended for k, link in model.links.items()
                      if k[:2] == (ticket.scope, ticket.run_id)}
            children = [(child, *(copies[child] or (None, False))) for child in chosen]
            model.steps[key] = {"outcome": "ready", "children": children}
            model.child_waits.pop(key, None)
            return ("ready", children)
        if model.leave_for_wait(run, ticket, f"children:{step_key}") == "waiting":
            model.child_waits[key] = ChildWait(mode, chosen, len(chosen) - ended)
            return ("waiting", None)
        return ("cancelled", None)

    @rule(ticket=tickets, tamper=TAMPER)
    def cancel_run(self, ticket: Ticket, tamper: str | None) -> None:
        ticket = self.present(ticket, tamper)
        run = self.model.live(ticket)
        outcome = self.fenced("cancel_run", ticket)
        assert outcome is (run is not None), (ticket, run)
        self.succeeded(ticket.scope, outcome, "cancel_run")
        if run is not None:
            self.model.end_attempt(run, "cancelled")
            self.model.free_slot(ticket)
            run.clear_lease()
            run.status, run.finished, run.cancel_requested = "cancelled", True, True
            run.cancel_action = run.cancel_action or "cancel"

    # -- giving a lease back (exact generation, live lease) --------------------------------

    def _give_back(self, function: str, ticket: Ticket, statuses: tuple[str, ...]) -> Run | None:
        """release_lease / hand_back_to_pending / expire_recovery_lease: exactly the ticket's
        live (worker, generation), of a run in one of ``statuses``. On success the ticket's slot
        is freed; a refused give-back changes nothing at all (an expired or cleared lease is no
        longer the caller's to move)."""
        run = self.model.live(ticket)
        expected = run is not None and run.status in statuses
        outcome = self.fenced(function, ticket)
        assert outcome is expected, (ticket, run)
        self.succeeded(ticket.scope, outcome, function)
        if expected:
            self.model.free_slot(ticket)
        return run if expected else None

    @rule(ticket=tickets, tamper=TAMPER)
    def release_lease(self, ticket: Ticket, tamper: str | None) -> None:
        run = self._give_back("release_lease", self.present(ticket, tamper), ("pending", "running"))
        if run is not None:
            self._expire_or_clear(run)

    def _expire_or_clear(self, run: Run) -> None:
        """A running run keeps its holder with a lease expired in place (never stranded: no
        attempt ends); a pending one loses the lease (its claim released, or expired)."""
        if run.status == "running" and run.expires is not None:
            run.expires = min(run.expires, self.model.now - MICROSECOND)
            run.slot = run.recovery = None
        else:
            lapsed = run.expires is not None and run.expires < self.model.now
            self.model.end_attempt(run, "expired" if lapsed else "released")
            run.clear_lease()

    @rule(ticket=tickets, tamper=TAMPER)
    def hand_back_to_pending(self, ticket: Ticket, tamper: str | None) -> None:
        run = self._give_back("hand_back_to_pending", self.present(ticket, tamper), ("running",))
        if run is None:
            return
        # The first max_attempts hand-backs give the attempt back; then it stays counted, and a
        # hand-back that finds no attempt left dead-letters the run.
        refund = run.hand_backs < run.max_attempts
        self.model.end_attempt(run, "handed_back" if refund or run.attempts < run.max_attempts
                               else "dead_lettered")
        run.hand_backs += 1
        if refund:
            run.status, run.attempts = "pending", max(run.attempts - 1, 0)
        elif run.attempts < run.max_attempts:
            run.status = "pending"
        else:
            previous = {"previous_error": run.error} if run.error is not None else {}
            run.error = {"stop_reason": "attempts_exhausted", "worker_id": run.holder,
                         "lease_generation": run.generation, **previous}
            run.status, run.finished, run.dead_lettered = "failed", True, True
        run.clear_lease()

    # -- settle_runs: a mixed batch of a worker's ends -------------------------------------

    SETTLE_KINDS = st.sampled_from(["complete", "retry", "fail", "cancel", "hand_back"])
    SETTLE_PAYLOADS = (st.sampled_from([None, '{"done": 1}', "null"]),
                       st.sampled_from([None, '{"e": 1}']))
    SETTLE_BATCH = st.lists(st.tuples(HELD, TAMPER, SETTLE_KINDS, *SETTLE_PAYLOADS),
                            min_size=1, max_size=4)
    # Kinds for more of the worker's own live leases in the batch's scope (see settle_runs).
    SETTLE_MINE = st.lists(st.tuples(SETTLE_KINDS, *SETTLE_PAYLOADS), max_size=3)

    def _settle_one(self, ticket: Ticket, kind: str, output: str | None, error: str | None,
                    policy: tuple[float, float]) -> tuple[str | None, str | None]:
        """One row of settle_runs in the model: the outcome (or None) and the sqlstate, applied
        as the single-run call of that kind applies it (complete_run, fail_run, cancel_run,
        hand_back_to_pending), from the edges of zeroth.run_transitions: a claim not started
        (pending) may only be cancelled (ZP012 otherwise); a lease that is not the worker's live
        one of that generation in the call's scope is fenced out (ZP002)."""
        run = self.model.live(ticket)
        if run is None:
            return None, "ZP002"
        if run.status != "running" and not (run.status == "pending" and kind == "cancel"):
            return None, "ZP012"
        if kind == "complete":
            outcome, ended = "completed", "completed"
        elif kind == "fail":
            outcome, ended = "failed", "failed"
        elif kind == "retry":
            outcome = "retry_scheduled" if run.attempts < run.max_attempts else "dead_lettered"
            ended = "failed" if outcome == "retry_scheduled" else "dead_lettered"
        elif kind == "cancel":
            outcome = ended = "cancelled"
        else:  # hand_back: hand_back_to_pending's rule (see that rule)
            spent = run.hand_backs >= run.max_attempts and run.attempts >= run.max_attempts
            outcome = ended = "dead_lettered" if spent else "handed_back"
        self.model.end_attempt(run, ended)
        self.model.free_slot(ticket)
        if kind in ("fail", "retry"):
            run.error = json.loads(error) if error else None
            run.dead_lettered = outcome == "dead_lettered"
        if outcome == "completed":
            run.status, run.finished = "completed", True
            if output is not None:  # SQL NULL keeps the committed output, JSON null clears it
                run.output = None if output == "null" else output
        elif outcome in ("failed", "dead_lettered") and kind != "hand_back":
            run.status, run.finished = "failed", True
        elif outcome == "retry_scheduled":
            run.status, run.finished = "pending", False
            base, most = policy
            backoff = timedelta(seconds=min(most, base * 2 ** max(run.attempts - 1, 0)))
            run_after = self.db.run(self.db.conn.fetchval(
                """SELECT r.run_after FROM zeroth.runs r WHERE r.tenant_id = $1
                       AND r.workspace_key = $2 AND r.run_id = $3""", *run.scope.key, run.run_id))
            now = self.model.now
            assert now + backoff / 2 - MICROSECOND <= run_after <= now + backoff + MICROSECOND
            run.run_after = run_after
        elif outcome == "cancelled":
            run.status, run.finished, run.cancel_requested = "cancelled", True, True
            run.cancel_action = run.cancel_action or "cancel"
        else:  # a hand-back
            run.hand_backs += 1
            if outcome == "dead_lettered":
                previous = {"previous_error": run.error} if run.error is not None else {}
                run.error = {"stop_reason": "attempts_exhausted", "worker_id": run.holder,
                             "lease_generation": run.generation, **previous}
                run.status, run.finished, run.dead_lettered = "failed", True, True
            else:  # the first max_attempts hand-backs give the attempt back
                run.status, run.finished = "pending", False
                if run.hand_backs <= run.max_attempts:  # counted before this one: < max
                    run.attempts = max(run.attempts - 1, 0)
        run.clear_lease()
        return outcome, None

    @precondition(lambda self: self.model.any_leased())
    @rule(held=SETTLE_BATCH, mine=SETTLE_MINE, repeat=st.sampled_from([False] * 7 + [True]),
          policy=st.sampled_from([None, None, (0.5, 2.0), (0.0, 0.0)]),
          misplaced=st.sampled_from([False] * 11 + [True]),
          lead=st.one_of(st.none(), st.integers(0, 7), st.integers(0, 7)))
    def settle_runs(self, held: list[tuple[Ticket | int, str | None, str, str | None, str | None]],
                    mine: list[tuple[str, str | None, str | None]], repeat: bool,
                    policy: tuple[float, float] | None, misplaced: bool,
                    lead: int | None) -> None:
        """settle_runs: a batch named by the worker and scope of the ``lead``-th live lease of the
        model (a claim or a running run), else of the first ticket (the tickets may be live,
        stale, another worker's or another scope's), then ``mine``: kinds for up to three
        more of the runs that worker holds a live lease on in that scope (claims not started
        among them), as a worker settles what it holds, each with its own kind; an output is
        given only to a completion and an error only to a retry or fail, unless ``misplaced``
        (ZP008, nothing changed), and a run named twice is refused whole (ZP008). Each row's
        outcome and sqlstate, and the runs, slots and attempt history afterwards, as the
        single-run calls of the same kinds leave them."""
        batch = [(self.present(ticket, how), kind, output if kind == "complete" else None,
                  error if kind in ("retry", "fail") else None)
                 for ticket, how, kind, output, error in held]
        if not repeat:  # mostly distinct runs; now and then one named twice
            firsts: dict[UUID, Any] = {}
            for entry in batch:
                firsts.setdefault(entry[0].run_id, entry)
            batch = list(firsts.values())
        worker_id, scope = batch[0][0].worker_id, batch[0][0].scope
        # The lead: a running run's holder when lead is even and there is one, else any lease's.
        leases = sorted((r for r in self.model.runs.values()
                         if r.holder is not None and r.expires is not None
                         and r.expires >= self.model.now), key=lambda r: (r.scope.key, r.run_id))
        running = [r for r in leases if r.status == "running"]
        pool = running if running and lead is not None and lead % 2 == 0 else leases
        if lead is not None and pool:
            first = pool[lead // 2 % len(pool)]
            worker_id, scope = first.holder or "", first.scope
        named = {t.run_id for t, _, _, _ in batch}
        held_live = sorted((r for r in self.model.runs.values()
                            if r.scope == scope and r.run_id not in named
                            and self.model.live(Ticket(scope, r.run_id, worker_id, r.generation))),
                           key=lambda r: r.run_id)
        batch += [(Ticket(scope, run.run_id, worker_id, run.generation), kind,
                   output if kind == "complete" else None,
                   error if kind in ("retry", "fail") else None)
                  for run, (kind, output, error) in zip(held_live, mine, strict=False)]
        outputs = [output for _, _, output, _ in batch]
        errors = [error for _, _, _, error in batch]
        if misplaced:  # an output for a kind other than complete, or an error for one that
            _, kind, _, _ = batch[-1]  # is neither retry nor fail
            if kind == "complete":
                errors[-1] = '{"e": 1}'
            else:
                outputs[-1] = '{"done": 1}'
        rows = self.call("settle_runs", select="run_id, outcome, sqlstate", scope=scope,
                         worker_id=worker_id, run_ids=[t.run_id for t, _, _, _ in batch],
                         generations=[t.generation for t, _, _, _ in batch],
                         outcomes=[kind for _, kind, _, _ in batch],
                         outputs=outputs if any(o is not None for o in outputs) else None,
                         errors=errors if any(e is not None for e in errors) else None,
                         retry_base_seconds=policy[0] if policy else None,
                         retry_max_seconds=policy[1] if policy else None)
        refused = misplaced or len({t.run_id for t, _, _, _ in batch}) < len(batch)
        if refused:
            assert rows == Raises("ZP008"), rows
            self.succeeded(scope, rows, "settle_runs")
            return
        assert not isinstance(rows, Raises), rows
        expected = []
        for ticket, kind, output, error in batch:
            outcome, sqlstate = self._settle_one(
                Ticket(scope, ticket.run_id, worker_id, ticket.generation), kind, output, error,
                policy or (RETRY_BASE, RETRY_MAX))
            expected.append((ticket.run_id, outcome, sqlstate))
            self.figures[f"settle_runs:{kind}:{outcome or sqlstate}"] += 1
        assert [(r["run_id"], r["outcome"], r["sqlstate"]) for r in rows] == expected, (
            rows, batch)
        self.succeeded(scope, any(o is not None for _, o, _ in expected), "settle_runs")

    @rule(ticket=tickets, tamper=TAMPER)
    def expire_recovery_lease(self, ticket: Ticket, tamper: str | None) -> None:
        run = self._give_back("expire_recovery_lease", self.present(ticket, tamper), ("running",))
        if run is not None and run.expires is not None:
            run.expires, run.slot = min(run.expires, self.model.now - MICROSECOND), None

    # -- admin and reads -------------------------------------------------------------------

    # One rule for the admin calls and reads, so that together they are no more frequent than
    # any holder call (hypothesis picks rules uniformly).
    @rule(ref=runs, elsewhere=ELSEWHERE, operation=st.sampled_from(
        ["clear_lease", "request_cancel", "request_cancel_v2", "resume_run", "redrive_run",
         "read_lease"]),
        action=st.sampled_from(["cancel", "cancel", "interrupt", "rollback"]),
        with_input=st.booleans())
    def admin(self, ref: RunRef, elsewhere: Scope | None, operation: str, action: str,
              with_input: bool) -> None:
        scope = elsewhere or ref.scope
        if operation.startswith("request_cancel"):
            self.request_cancel(ref, scope, action, operation.endswith("v2"))
        elif operation == "resume_run":
            self.resume_run(ref, scope, with_input)
        else:
            getattr(self, operation)(ref, scope)

    def clear_lease(self, ref: RunRef, scope: Scope) -> None:
        run = self.model.run(scope, ref.run_id)
        expected = Raises("ZP001") if run is None else run.holder is not None
        outcome = scalar(self.call("clear_lease", scope=scope, run_id=ref.run_id))
        assert outcome == expected, (ref, scope, run)
        self.succeeded(scope, outcome, "clear_lease")
        if run is not None:
            self.model.free_all_slots(scope, ref.run_id)
            if run.holder is not None:
                self._expire_or_clear(run)

    def request_cancel(self, ref: RunRef, scope: Scope, action: str, v2: bool) -> None:
        """request_cancel (no grace; taken_over reads cancelled) or request_cancel_v2 (the
        default grace, taken_over reported)."""
        run = self.model.run(scope, ref.run_id)
        grace = ORPHAN_GRACE if v2 else timedelta(0)
        expected = "unknown" if run is None else self.model.cancel(run, action, grace)
        if v2:
            rows = self.call("request_cancel_v2", select="outcome, status::text", scope=scope,
                             run_id=ref.run_id, action=action)
            assert not isinstance(rows, Raises), rows
            outcome = rows[0]["outcome"]
            assert rows[0]["status"] == (run.status if run else None), (rows, run)
        else:
            expected = "cancelled" if expected == "taken_over" else expected
            outcome = scalar(self.call("request_cancel", scope=scope, run_id=ref.run_id,
                                       action=action))
        assert outcome == expected, (ref, scope, run)
        self.succeeded(scope, outcome, "request_cancel_v2" if v2 else "request_cancel")

    def _admin_move(self, function: str, ref: RunRef, scope: Scope, allowed: tuple[str, ...],
                    **kwargs: Any) -> Run | None:
        run = self.model.run(scope, ref.run_id)
        expected = (Raises("ZP001") if run is None else True if run.status in allowed
                    else Raises("ZP003"))
        outcome = scalar(self.call(function, scope=scope, run_id=ref.run_id, **kwargs))
        assert outcome == expected, (ref, scope, run)
        self.succeeded(scope, outcome, function)
        if outcome is not True or run is None:
            return None
        run.status, run.run_after = "pending", self.model.now
        return run

    def resume_run(self, ref: RunRef, scope: Scope, with_input: bool) -> None:
        given = '{"approved": true}' if with_input else None
        run = self._admin_move("resume_run", ref, scope, ("waiting",), input=given)
        if run is not None:
            run.wait_reason = None
            run.resume_input = given or run.resume_input

    def redrive_run(self, ref: RunRef, scope: Scope) -> None:
        run = self._admin_move("redrive_run", ref, scope, ("failed", "cancelled"))
        if run is not None:
            run.attempts, run.error, run.output, run.finished = 0, None, None, False
            run.hand_backs = 0
            run.dead_lettered, run.cancel_requested, run.cancel_action = False, False, None
            self.effect.redriven.add((*run.scope.key, run.run_id))

    def read_lease(self, ref: RunRef, scope: Scope) -> None:
        run = self.model.run(scope, ref.run_id)
        for function, expected in (
                ("current_generation", run.generation if run else None),
                ("current_holder", run.holder if run else None),
                ("get_recovery_checkpoint_id", run.recovery if run else None)):
            outcome = scalar(self.db.call(function, run_id=ref.run_id, tenant_id=scope.tenant_id,
                                          workspace_id=scope.workspace_id))
            assert outcome == expected, (function, ref, scope)

    @rule(seconds=st.sampled_from([1, 5, 10, 31]))
    def advance_clock(self, seconds: int) -> None:
        self.model.now += timedelta(seconds=seconds)

    # -- checks after every step -----------------------------------------------------------

    @invariant()
    def database_matches_model_and_invariants(self) -> None:
        self.model.settle()
        current = self.db.snapshot()
        effect, self.effect = self.effect, Effect()
        model_runs = {(*r.scope.key, r.run_id): r.projection() for r in self.model.runs.values()}
        for key in model_runs.keys() | current.runs.keys():
            assert current.runs.get(key) == model_runs.get(key), f"run {key} differs from model"
        model_slots = {(*k, n): h for k, rows in self.model.slots.items() for n, h in rows.items()}
        assert current.slots == model_slots, "admission slots differ from the model"
        assert current.checkpoints == {
            (*c.scope.key, k[1]): (*c.scope.key, c.run_id, c.order, c.generation, c.data)
            for k, c in self.model.checkpoints.items()}, "checkpoints differ from the model"
        self._check_history()
        self._check_database(self.previous, current, effect)
        self.previous = current

    def _check_history(self) -> None:
        """The attempt history against the model: one row per claim of a run (each generation,
        1 to the run's), each ended one with the holder, attempt number, outcome and time the
        model gave it when it ended, then the open one (the model's live or expired holder,
        none without one); a run the model no longer has has no history."""
        rows: dict[tuple[str, str, UUID], list[Attempt]] = {}
        for row in self.db.run(self.db.conn.fetch(HISTORY_SQL)):
            rows.setdefault((row["tenant_id"], row["workspace_key"], row["run_id"]), []).append(
                Attempt(row["lease_generation"], row["worker_id"], row["outcome"], row["attempt"],
                        row["ended_at"]))
        model = {(*r.scope.key, r.run_id): r for r in self.model.runs.values()}
        assert rows.keys() <= model.keys(), "history of a run the model does not have"
        for key, run in model.items():
            history = rows.get(key, [])
            assert [h.generation for h in history] == list(range(1, run.generation + 1)), (
                f"run {key}: one history row per claim")
            opened = run.open_attempt()
            assert history == [*run.history, *([opened] if opened else [])], (
                f"run {key}: the attempt history differs from the model")

    def _check_database(self, before: Snapshot, after: Snapshot, effect: Effect) -> None:
        now = self.model.now
        for key, row in after.runs.items():
            old = before.runs.get(key)
            if row["status"] == "running":
                assert row["holder"] is not None, key
                assert row["expires"] is not None, key
            else:  # terminal runs hold no lease, nor do waiting ones (they left their worker)
                assert row["status"] == "pending" or row["holder"] is None, key
            # "Through the functions, attempts never exceeds max_attempts."
            assert row["attempts"] <= row["max_attempts"], key
            bump = 1 if key in effect.claimed else 0
            assert row["generation"] == (old["generation"] if old else 0) + bump, key
            if old is not None and old["status"] in TERMINAL:
                assert row["status"] == old["status"] or (
                    key in effect.redriven and old["status"] != "completed"), key
        assert before.runs.keys() <= after.runs.keys(), "a run disappeared"

        def holds(key: tuple[str, str, str, int], name: SlotName | None) -> bool:
            """The slot is live: its run holds the named generation's live lease in it."""
            row = None if name is None else after.runs.get((key[0], key[1], name.run_id))
            return (row is not None and row["generation"] == name.generation
                    and row["slot"] == key[3] and row["holder"] is not None
                    and row["expires"] is not None and row["expires"] >= now)

        live = {k: name for k, name in after.slots.items() if holds(k, name)}
        per_run = Counter((k[0], k[1], name.run_id) for k, name in live.items())
        assert max(per_run.values(), default=0) <= 1, "a run holds two live slots"
        # The slot never disagrees with the run: every live lease claimed under a limit is
        # named, with its generation, by the slot it says it holds.
        slotted = {k: r for k, r in after.runs.items()
                   if r["slot"] is not None and r["expires"] is not None and r["expires"] >= now}
        for (tenant_id, workspace_key, run_id), r in slotted.items():
            slot = (tenant_id, workspace_key, r["deployment_ref"], r["slot"])
            assert after.slots.get(slot) == SlotName(run_id, r["generation"]), (
                f"run {run_id} holds a live lease in slot {slot} that does not name it")
        # Admission: live slotted leases never outnumber the largest limit used in the scope.
        for key, count in Counter(k[:3] for k in live).items():
            assert count <= self.model.max_limit[key], f"{key}: {count} live leases"

        touched = {s for s in SCOPES if self.model.fingerprint(s) != self.fingerprints[s]}
        if effect.scope is not None:
            touched.add(effect.scope)
        self.fingerprints = self._fingerprints()
        for scope in SCOPES:
            if scope not in touched:
                assert before.checksums.get(scope.key) == after.checksums.get(scope.key), (
                    f"rows of {scope} changed by a step that had no business there")


# ---------------------------------------------------------------------------------------------
# Coverage: every public function of schema zeroth is a rule of the model or excluded here, with
# the reason. A new public function fails test_every_public_function_is_modelled_or_excluded until
# it is one or the other.

MODELLED = frozenset({
    "enqueue_run", "claim_pending", "claim_and_start", "claim_orphaned", "complete_and_claim",
    "start_run", "renew_lease", "renew_leases", "commit_fenced", "save_checkpoint",
    "complete_run", "complete_runs", "settle_runs", "fail_run", "pause_run", "cancel_run",
    "sleep_run",
    "release_lease", "hand_back_to_pending", "expire_recovery_lease", "clear_lease",
    "request_cancel", "request_cancel_v2", "resume_run", "redrive_run", "claim_for_takeover",
    "wait_for_event", "emit_event", "wake_due_waits", "start_child_run", "wait_for_children",
    "admit_run", "current_generation", "current_holder", "get_recovery_checkpoint_id",
})
NOT_MODELLED = {
    # Multi-scope and batch forms: the same internal bodies as modelled calls
    # (_claim_in_scope, _claim_orphaned, enqueue_run's insert), tested in tests/sql.
    "claim_and_start_scopes": "claim_and_start over several scopes (_claim_in_scope)",
    "claim_orphaned_scopes": "claim_orphaned over several scopes (_claim_orphaned)",
    "enqueue_runs": "enqueue_run for a batch",
    "reconcile_thread_runs": "claim_for_takeover's _take_over over a scope's thread runs",
    # Writes that change no status nor lease (tests/sql cover their fences).
    "get_step": "a step read (no status or lease change)",
    "record_step": "a step write (no status or lease change)",
    "update_run_progress": "a fenced progress write (commit_fenced models the fence)",
    # Not in the model's world: no scope_limits rows, no schedules, nothing pruned.
    "set_rate_limit": "scope limits (pause, max_concurrency, rate) are not modelled",
    "set_scope_limits": "scope limits (pause, max_concurrency, rate) are not modelled",
    # The registry of deployments: the defaults an enqueue without values gets (the model's
    # enqueues name theirs); tests/sql/test_deployments.py and its races and attacks cover it.
    "register_deployment": "deployment defaults (the model's enqueues name their values)",
    "set_deployment_defaults": "deployment defaults (the model's enqueues name their values)",
    "list_deployments": "deployment defaults (a read)",
    "prune_runs": "deletes ended runs; the model keeps every run",
    "create_schedule": "schedules", "alter_schedule": "schedules",
    "delete_schedule": "schedules", "pause_schedule": "schedules",
    "resume_schedule": "schedules", "register_schedule": "schedules",
    "list_schedules": "schedules (a read)",
    "fire_due_schedules": "schedules (enqueues through enqueue_run)",
    "fire_schedule_now": "schedules (enqueues through enqueue_run)",
    # Reads, notifications and channel keys: no state of a run.
    "count_pending": "a read", "count_pending_scopes": "a read",
    "get_thread_run": "a read", "list_thread_runs": "a read",
    "announce_busy": "NOTIFY only", "announce_busy_deployment": "NOTIFY only",
    "announce_idle": "NOTIFY only", "announce_idle_deployment": "NOTIFY only",
    "control_key": "a channel key", "deployment_wakeup_key": "a channel key",
    "wakeup_key": "a channel key", "run_finished_key": "a channel key",
    "run_events_key": "a channel key",
    # The run event stream (issue 34): a run's events, not its state (tests/sql/test_run_events.py
    # and the fenced conformance module cover append_run_event's fence).
    "read_run_events": "a read",
    "append_run_event": "a fenced write of a run's events, no state change "
                        "(the fenced conformance module)",
    # Code versions (issue 34): admin functions over the deployment's policy; retire's ends go
    # through the takeover and the edge table (tests/sql/test_code_versions.py).
    "set_version_policy": "a deployment's policy, no run's state",
    "retire_code_version": "admin: moves or ends a version's runs "
                           "(tests/sql/test_code_versions.py)",
}
PUBLIC_FUNCTIONS_SQL = """
SELECT DISTINCT p.proname::text
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'zeroth' AND p.proname NOT LIKE '\\_%' AND p.prokind = 'f'"""


async def test_every_public_function_is_modelled_or_excluded(conn) -> None:
    public = {row[0] for row in await conn.fetch(PUBLIC_FUNCTIONS_SQL)}
    assert not MODELLED & NOT_MODELLED.keys(), "a function both modelled and excluded"
    assert public - MODELLED - NOT_MODELLED.keys() == set(), (
        "public functions without a rule of the model (add one, or exclude them with a reason)")
    assert (MODELLED | NOT_MODELLED.keys()) - public == set(), "listed but no such function"


@pytest.mark.slow
def test_run_protocol_matches_model(database_dsn: str) -> None:
    db = RunProtocol.db = Database(database_dsn)
    RunProtocol.figures = Counter()
    try:
        # 200 examples of up to 40 steps, as before the new rules: an example costs about what
        # it did (measured side by side); the scripted walks below cover the long chains.
        run_state_machine_as_test(
            RunProtocol, settings=property_settings(ci_examples=200, stateful_step_count=40))
        # Every function the model claims to cover was called by its rules.
        assert MODELLED - db.called == set(), "modelled functions no rule called"
    finally:
        db.close()
        save_report("property_state_machine", dict(sorted(RunProtocol.figures.items())))


# ---------------------------------------------------------------------------------------------
# Scripted walks: chains of calls the random search reaches only now and then (a parent that
# waits for its children and is woken by their ends, an event wait that times out and is woken by
# the sweep, a cancel that cascades down a tree), run through the same rules and checks after
# every step, so CI checks them on every run whatever the examples drew.


class Walk:
    """Drives RunProtocol's rules in a fixed order, checking the database after every step."""

    def __init__(self, db: Database) -> None:
        RunProtocol.db = db
        RunProtocol.figures = Counter()
        self.state = RunProtocol()

    def __getattr__(self, rule: str) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            result = getattr(self.state, rule)(*args, **kwargs)
            self.state.database_matches_model_and_invariants()
            return result.values if hasattr(result, "values") else result
        return step

    def run(self, ref: RunRef) -> Run:
        run = self.state.model.run(ref.scope, ref.run_id)
        assert run is not None
        return run


def walk_claim(walk: Walk, ref: RunRef, worker_id: str = "wa") -> Ticket:
    """claim_and_start aimed at the run (its scope and deployment), which must be claimed."""
    (ticket,) = walk.claim_and_start(ref, ref.scope, "d1", worker_id, None, 1, 30)
    return ticket


@pytest.mark.slow
def test_scripted_walks_match_model(database_dsn: str) -> None:
    db = Database(database_dsn)
    try:
        # A parent fans out and waits for all; each child's end counts; the last wakes it, and
        # its replay of the wait records the children's outcomes.
        walk = Walk(db)
        parent = walk.enqueue(SCOPES[1], "d1", 1, 0, 2, None, None)
        held = walk_claim(walk, parent)
        first = walk.start_child_run(held, None, "c1", "d1", False, 2, False)
        walk.start_child_run(held, None, "c2", "d1", False, 2, True)
        assert walk.run(parent).status == "waiting"
        done = walk_claim(walk, first, "wb")
        walk.complete_run(done, None, '{"done": 1}')
        assert walk.run(parent).status == "waiting"
        second = next(k for k in walk.state.model.links if k[2] == "c2")
        other = RunRef(SCOPES[1], walk.state.model.links[second].child)
        walk.fail_run(walk_claim(walk, other, "wc"), None, False, '{"e": 1}')  # an end too
        assert walk.run(parent).status == "pending"
        held = walk_claim(walk, parent)
        walk.wait_for_children(held, None, "w1", 3, "all", False)
        assert walk.state.model.steps[(SCOPES[1], parent.run_id, "w1")]["outcome"] == "ready"
        walk.complete_runs([(held, None)], None)
        walk.state.teardown()

        # An event wait with a deadline: the sweep wakes it, the replay records timed_out; a
        # second wait for an event emitted in time receives it; the emit wakes a waiting run.
        walk = Walk(db)
        run = walk.enqueue(SCOPES[2], "d1", 0, 0, 3, None, None)
        walk.wait_for_event(walk_claim(walk, run), None, "e1", "n1", 5)
        walk.advance_clock(10)
        walk.wake_due_waits(None)
        assert walk.run(run).status == "pending"
        held = walk_claim(walk, run)
        walk.wait_for_event(held, None, "e1", "n1", 5)
        walk.wait_for_event(held, None, "e2", "n2", None)
        walk.emit_event(SCOPES[2], "n2", '{"p": 1}', False)
        assert walk.run(run).status == "pending"
        held = walk_claim(walk, run, "wb")
        walk.wait_for_event(held, None, "e2", "n2", None)
        walk.sleep_run(held, None, 5, True)
        walk.advance_clock(5)
        walk.complete_and_claim([(walk_claim(walk, run, "wc"), None)], None, "d1", 1, 1, 30)
        walk.state.teardown()

        # A cancel cascades down a tree (not to a detached child); a child asked to cancel while
        # it runs ends with cancel_run and takes its own children along.
        walk = Walk(db)
        root = walk.enqueue(SCOPES[0], "d1", 0, 0, 3, None, None)
        held = walk_claim(walk, root)
        kid = walk.start_child_run(held, None, "c1", "d1", False, 2, False)
        detached = walk.start_child_run(held, None, "c2", "d1", True, 2, False)
        kid_held = walk_claim(walk, kid, "wb")
        grandchild = walk.start_child_run(kid_held, None, "c1", "d2", False, 1, False)
        walk.admin(root, None, "request_cancel", "cancel", False)  # live: cancel requested
        walk.cancel_run(held, None)
        assert walk.run(kid).cancel_requested
        assert walk.run(kid).status == "running"
        walk.cancel_run(kid_held, None)
        assert walk.run(grandchild).status == "cancelled"
        assert walk.run(detached).status == "pending"
        walk.advance_clock(31)
        walk.claim_for_takeover(root, None, 0)
        walk.state.teardown()

        # The last child's completion wakes its parent and the same complete_and_claim claims
        # it; a wait for any child is ready at once when one has ended (the others not yet); a
        # sleeping child is cancelled with its parent.
        walk = Walk(db)
        parent = walk.enqueue(SCOPES[2], "d2", 0, 0, 2, None, None)
        held = walk_claim(walk, parent)
        only = walk.start_child_run(held, None, "c1", "d2", False, 2, True)
        child = walk_claim(walk, only, "wb")
        (again,) = walk.complete_and_claim([(child, None)], None, "d2", None, 1, 30)
        assert again.run_id == parent.run_id
        sleeper = walk.start_child_run(again, None, "c2", "d2", False, 2, False)
        walk.wait_for_children(again, None, "w2", 3, "any", False)
        assert walk.state.model.steps[(SCOPES[2], parent.run_id, "w2")]["outcome"] == "ready"
        walk.sleep_run(walk_claim(walk, sleeper, "wc"), None, 20, False)
        walk.cancel_run(again, None)
        assert walk.run(sleeper).status == "cancelled"
        walk.state.teardown()

        # Admit-and-own runs are not resumable: an orphan past the grace fails (claim_orphaned),
        # a takeover fails it too; a thread is busy while its run is active.
        walk = Walk(db)
        owned = walk.admit_run(SCOPES[0], "d1", "th1", "wa", 10, 2)
        assert walk.admit_run(SCOPES[0], "d1", "th1", None, 10, 2) == ()  # busy
        walk.start_run(owned, None)
        other = walk.admit_run(SCOPES[1], "d1", "th1", "wb", 10, 2)
        walk.advance_clock(31)
        walk.claim_orphaned(owned, SCOPES[0], "d1", "wc", None, None, 30)
        assert walk.run(RunRef(owned.scope, owned.run_id)).status == "failed"
        walk.claim_for_takeover(RunRef(other.scope, other.run_id), None, 10)
        assert walk.run(RunRef(other.scope, other.run_id)).status == "failed"
        walk.state.teardown()

        # settle_runs' rarer rows: a retry with no attempt left dead-letters; a hand-back gives
        # the attempt back, the next one with none left dead-letters; a claim not started only
        # cancels (ZP012 for the rest); a lease already settled is fenced out (ZP002).
        walk = Walk(db)
        spent = walk.enqueue(SCOPES[0], "d1", 0, 0, 1, None, None)
        handed = walk.enqueue(SCOPES[0], "d2", 0, 0, 1, None, None)
        retried = walk_claim(walk, spent)
        held = walk_claim(walk, handed)
        claimed = walk.enqueue(SCOPES[0], "d1", 0, 0, 2, None, None)
        (unstarted,) = walk.claim_pending(claimed, SCOPES[0], "d1", "wa", None, 1, 30, False)
        walk.settle_runs([(retried, None, "retry", None, '{"e": 1}'),
                          (held, None, "hand_back", None, None),
                          (unstarted, None, "complete", '{"done": 1}', None)],
                         [], False, None, False, None)
        assert (walk.run(spent).status, walk.run(spent).dead_lettered) == ("failed", True)
        assert walk.run(handed).status == walk.run(claimed).status == "pending"
        walk.settle_runs([(walk_claim(walk, handed), None, "hand_back", None, None),
                          (unstarted, None, "cancel", None, None),
                          (retried, None, "complete", None, None)],
                         [], False, (0.5, 2.0), False, None)
        assert (walk.run(handed).status, walk.run(handed).dead_lettered) == ("failed", True)
        assert walk.run(claimed).status == "cancelled"
        assert {k for k in RunProtocol.figures if k.startswith("settle_runs:")} >= {
            "settle_runs:retry:dead_lettered", "settle_runs:hand_back:handed_back",
            "settle_runs:complete:ZP012", "settle_runs:hand_back:dead_lettered",
            "settle_runs:cancel:cancelled", "settle_runs:complete:ZP002"}
        walk.state.teardown()
    finally:
        db.close()
