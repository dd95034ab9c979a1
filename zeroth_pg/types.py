"""Typed results of the zeroth_pg client: frozen dataclasses and enums mirroring the SQL types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

__all__ = [
    "CancelOutcome",
    "ChildOutcome",
    "ChildStart",
    "ChildWait",
    "ChildWaitOutcome",
    "ClaimedRun",
    "DeploymentDefaults",
    "DeploymentRegistration",
    "EmitResult",
    "EnqueuedRun",
    "EventWait",
    "EventWaitOutcome",
    "FailOutcome",
    "LeaseClaimResult",
    "LeaseRenewal",
    "OrphanClaimResult",
    "PinnedRuns",
    "RateLimited",
    "RetiredVersion",
    "RetryPolicy",
    "RunEvent",
    "RunEventKind",
    "RunSettled",
    "RunStatus",
    "Schedule",
    "ScheduleFire",
    "ScheduleFiring",
    "ScheduleRegistration",
    "Scope",
    "ScopeLimits",
    "ScopedRun",
    "ScopesClaimResult",
    "SettleKind",
    "SettleOutcome",
    "Settlement",
    "SleepOutcome",
    "SleepResult",
    "StepResult",
    "VersionPolicy",
]


class RunStatus(StrEnum):
    """Mirror of the SQL enum ``zeroth.run_status`` (a test compares the two)."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class FailOutcome(StrEnum):
    """What ``zeroth.fail_run`` did with a failed attempt."""

    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"


class SettleKind(StrEnum):
    """How ``zeroth.settle_runs`` is asked to end one run (its ``outcomes[i]``)."""

    COMPLETE = "complete"  # complete_run
    RETRY = "retry"  # fail_run retryable: backoff, or dead-lettered when attempts are used up
    FAIL = "fail"  # fail_run not retryable
    CANCEL = "cancel"  # cancel_run
    HAND_BACK = "hand_back"  # hand_back_to_pending
    #: The attempt's deadline came (its handler was stopped): retried as RETRY, stop_reason
    #: attempt_timeout; past the run's deadline the run fails for good (run_timed_out).
    TIMEOUT = "timeout"


class SettleOutcome(StrEnum):
    """What ``zeroth.settle_runs`` did with one run it settled."""

    COMPLETED = "completed"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    HANDED_BACK = "handed_back"
    TIMED_OUT = "timed_out"  # the attempt's deadline: retried with backoff
    RUN_TIMED_OUT = "run_timed_out"  # the run's deadline: failed for good


@dataclass(frozen=True, slots=True)
class Settlement:
    """One run to end with ``zeroth.settle_runs``: its lease (run_id, generation), how to end
    it, the output of a completion (None keeps the committed output) and the error document of
    a failure (``retry`` or ``fail``)."""

    run_id: UUID | str
    generation: int
    kind: SettleKind
    output: Any = None
    error: Any = None


@dataclass(frozen=True, slots=True)
class RunSettled:
    """One row of ``zeroth.settle_runs``: the outcome settled, or None with the SQLSTATE that
    says why not (``ZP002``: fenced out; ``ZP012``: the run's status has no such edge)."""

    run_id: UUID
    outcome: SettleOutcome | None
    sqlstate: str | None

    @property
    def settled(self) -> bool:
        """Whether this run was settled."""
        return self.outcome is not None


class CancelOutcome(StrEnum):
    """What ``zeroth.request_cancel`` / ``zeroth.request_cancel_v2`` did (only v2 reports
    TAKEN_OVER: a running run past its owner's lease + grace, cancelled by the caller)."""

    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"
    TAKEN_OVER = "taken_over"
    NOT_CANCELLABLE = "not_cancellable"
    UNKNOWN = "unknown"


class SleepOutcome(StrEnum):
    """What ``zeroth.sleep_run`` did with the holder's run."""

    SLEEPING = "sleeping"  # pending until run_after; the attempt was given back
    CANCELLED = "cancelled"  # a cancel request was pending: cancelled instead of sleeping
    WAITING = "waiting"  # wait_for_event: waiting for an event; run_after is the wait's deadline


@dataclass(frozen=True, slots=True)
class SleepResult:
    """The row of ``zeroth.sleep_run`` that was not fenced out: the outcome, the instant the run
    resumes (``None`` when cancelled) and the checkpoint saved with the sleep (if one was)."""

    outcome: SleepOutcome
    run_after: datetime | None
    checkpoint_id: UUID | None


@dataclass(frozen=True, slots=True)
class StepResult:
    """A step's row (``zeroth.get_step`` / ``zeroth.record_step``) for the live holder:
    ``recorded`` says whether a result is recorded (get_step) or whether this call recorded it
    (record_step: False when an earlier result won, which is the ``result`` returned)."""

    recorded: bool
    result: Any


class EventWaitOutcome(StrEnum):
    """What ``zeroth.wait_for_event`` did."""

    RECEIVED = "received"  # the event was there (now, or recorded by an earlier attempt)
    TIMED_OUT = "timed_out"  # the wait's deadline passed first (recorded)
    WAITING = "waiting"  # the run left its worker: status waiting until the event or deadline
    CANCELLED = "cancelled"  # a cancel request was pending: cancelled instead of waiting


@dataclass(frozen=True, slots=True)
class EventWait:
    """The row of ``zeroth.wait_for_event`` that was not fenced out."""

    outcome: EventWaitOutcome
    payload: Any
    timeout_at: datetime | None


@dataclass(frozen=True, slots=True)
class EmitResult:
    """The row of ``zeroth.emit_event``: ``emitted`` False for a repeat (first write wins);
    ``woken`` runs made pending."""

    emitted: bool
    woken: int


@dataclass(frozen=True, slots=True)
class ChildStart:
    """The row of ``zeroth.start_child_run`` that was not fenced out: the child's run id, and
    whether this call created it (False: the step started it before, in this or an earlier
    attempt)."""

    child_run_id: UUID
    created: bool


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """How one child run ended, as recorded by ``zeroth.wait_for_children``. ``status`` is None
    for a child that had not ended when a wait with ``mode="any"`` was met; ``dead_lettered``
    says a failed child ran out of attempts."""

    run_id: UUID
    status: RunStatus | None
    output: Any
    error: Any
    dead_lettered: bool
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether the child had ended (completed, failed or cancelled)."""
        return self.status is not None

    @property
    def succeeded(self) -> bool:
        """Whether the child completed."""
        return self.status is RunStatus.COMPLETED


class ChildWaitOutcome(StrEnum):
    """What ``zeroth.wait_for_children`` did."""

    READY = "ready"  # the wait was met (now, or recorded by an earlier attempt): the outcomes
    WAITING = "waiting"  # the run left its worker: status waiting until the children end
    CANCELLED = "cancelled"  # a cancel request was pending: cancelled instead of waiting


@dataclass(frozen=True, slots=True)
class ChildWait:
    """The row of ``zeroth.wait_for_children`` that was not fenced out: the outcome and, when
    ready, one :class:`ChildOutcome` per awaited child in the order given."""

    outcome: ChildWaitOutcome
    children: tuple[ChildOutcome, ...] | None


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """One run leased by claim_pending or claim_orphaned (a row of ``zeroth.claimed_run``)."""

    run_id: UUID
    lease_generation: int
    lease_expires_at: datetime
    status: RunStatus
    attempts: int
    max_attempts: int
    priority: int
    thread_id: str | None
    idempotency_key: str | None
    payload: dict[str, Any]
    metadata: dict[str, Any]
    recovery_checkpoint_id: UUID | None
    checkpoint_data: Any
    cancel_requested: bool
    #: Why this client could not decode the run's payload, metadata or checkpoint (JSON that
    #: PostgreSQL stores but Python's decoder refuses: nested deeper than its recursion limit,
    #: an integer of more than 4,300 digits); those fields are then empty. None: all decoded.
    #: The worker fails such a run without a retry instead of losing its whole claim batch.
    undecodable: str | None = None
    #: The earlier of the attempt's and the run's deadline on the database clock (the
    #: deployment's or the run's attempt_timeout_seconds / run_timeout_seconds, fixed by the
    #: claim; the lease never runs past it), None without one. The worker stops the handler then.
    deadline_at: datetime | None = None
    #: Seconds from the claim's database time to ``deadline_at`` (None without one): what a
    #: worker measures on its own monotonic clock.
    deadline_in: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseClaimResult:
    """Result of one claim_pending call: what it claimed and the saturation it observed.

    ``run_id`` is the first claimed run (the seed's single-run field); ``runs`` holds all of them
    when a batch was asked for.
    """

    run_id: UUID | None
    concurrency_saturated: bool
    active_count: int
    max_concurrency: int | None
    runs: tuple[ClaimedRun, ...] = field(default=())
    #: The scope's rate limit (``zeroth.rate_limits``) held this claim back (nothing claimed)
    #: or cut its batch short: no start is possible before ``retry_at`` (database time),
    #: ``retry_after`` seconds after the claim (what to sleep: no local clock involved).
    #: None: the rate limit, if any, had room.
    retry_at: datetime | None = None
    retry_after: float | None = None

    @property
    def utilization(self) -> float:
        """active / max_concurrency capped at 1, or 0.0 when no limit was given."""
        if not self.max_concurrency:
            return 0.0
        return min(1.0, self.active_count / self.max_concurrency)


@dataclass(frozen=True, slots=True)
class OrphanClaimResult:
    """Result of one claim_orphaned call.

    An empty ``run_ids`` with ``concurrency_saturated`` false is a definitive empty scan; with it
    true, an orphan is waiting for a free concurrency slot. ``generations`` lets the caller name
    each lease even if a later read fails.
    """

    run_ids: tuple[UUID, ...]
    concurrency_saturated: bool
    generations: dict[UUID, int]
    active_count: int = 0
    max_concurrency: int | None = None
    runs: tuple[ClaimedRun, ...] = field(default=())
    #: The scope's rate limit held the re-leases back: none possible before then (see
    #: :class:`LeaseClaimResult`).
    retry_at: datetime | None = None
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Scope:
    """One (deployment, tenant, workspace): where a run lives and what its limits are set on."""

    deployment_ref: str
    tenant_id: str = "default"
    workspace_id: str | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The backoff of a failed attempt that will be retried (``zeroth.fail_run``): about
    ``base_seconds * 2 ** (attempt - 1)`` with jitter, at most ``max_seconds``."""

    base_seconds: float = 1.0
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        # zeroth.fail_run's own bounds, checked here so a bad policy fails at start-up.
        if not 0 <= self.base_seconds <= self.max_seconds <= 30 * 86400:
            raise ValueError("a retry policy needs 0 <= base_seconds <= max_seconds <= 30 days")


@dataclass(frozen=True, slots=True)
class ScopedRun:
    """A run claimed by a multi-scope claim, with its scope."""

    scope: Scope
    run: ClaimedRun


@dataclass(frozen=True, slots=True)
class RateLimited:
    """A scope a multi-scope claim could not start (more) runs in because of its rate limit:
    no start is possible before ``retry_at`` (database time), ``retry_after`` seconds after
    the claim."""

    scope: Scope
    retry_at: datetime
    retry_after: float


@dataclass(frozen=True, slots=True)
class ScopesClaimResult:
    """Result of one ``zeroth.claim_and_start_scopes`` call: the runs claimed (each running, its
    attempt counted), the scopes that had due work but no free concurrency slot, and the scopes
    their rate limit held back or cut short (``rate_limited``, one entry per scope)."""

    runs: tuple[ScopedRun, ...]
    saturated: tuple[Scope, ...] = ()
    rate_limited: tuple[RateLimited, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """One row of renew_leases: whether the lease was renewed and whether a cancel is pending.

    ``renewed`` is None when another session held the run's row: not renewed this time, but not
    lost either (renew_leases skips locked rows); try again."""

    run_id: UUID
    renewed: bool | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    #: ``ZP013`` (DeadlinePassedError.sqlstate) when not renewed because the attempt's or the
    #: run's deadline passed; None otherwise.
    sqlstate: str | None = None


@dataclass(frozen=True, slots=True)
class RunCompletion:
    """One row of complete_runs: whether that run was completed (false: fenced out or not
    running)."""

    run_id: UUID
    completed: bool


@dataclass(frozen=True, slots=True)
class CompleteAndClaimResult:
    """Result of complete_and_claim: one completion per requested run, in order, and the claim
    made in the same transaction (into the slots those completions freed)."""

    completions: tuple[RunCompletion, ...]
    claim: LeaseClaimResult


@dataclass(frozen=True, slots=True)
class EnqueuedRun:
    """Result of enqueue_run(s): ``created`` is false when an existing run was returned."""

    run_id: UUID
    created: bool
    status: RunStatus


@dataclass(frozen=True, slots=True)
class Schedule:
    """A row of ``zeroth.schedules`` (create_schedule, alter_schedule, pause_schedule,
    resume_schedule, list_schedules): exactly one of ``cron`` and ``interval_seconds`` is set;
    ``last_error`` says why its last fire failed (fire_due_schedules then paused it)."""

    schedule_id: UUID
    tenant_id: str
    workspace_id: str | None
    name: str
    deployment_ref: str
    cron: str | None
    interval_seconds: int | None
    time_zone: str
    anchor_at: datetime
    payload: dict[str, Any]
    metadata: dict[str, Any]
    priority: int
    max_attempts: int
    missed_fire_policy: str
    catch_up_limit: int | None
    misfire_grace_seconds: int
    paused: bool
    managed_by: str
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    fire_count: int
    skipped_count: int
    created_at: datetime
    updated_at: datetime
    last_error: str | None
    last_error_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeploymentDefaults:
    """A row of the registry of deployments ``zeroth.deployments`` (list_deployments): what
    ``enqueue_run`` / ``enqueue_runs`` give a run of the deployment that names no
    ``max_attempts`` / ``priority``. ``managed_by``: ``app`` (the last application registration
    decides) or ``sql`` (a DBA set it; registrations keep it); ``version`` counts its changes
    (``zeroth.deployment_changes``); ``updated_by``: the session user of the last change.
    ``retry_base_seconds`` / ``retry_max_seconds``: the backoff ``fail_run`` applies when its
    caller passes none (read at each failure); ``lease_seconds``: the lease of a claim that
    names none; ``attempt_timeout_seconds`` / ``run_timeout_seconds``: the bound on an attempt's
    wall time and on a run's total time from its first claim, for runs that carry none (the
    claims fix them as deadlines); None: not set (1 / 300 s, 60 s, no bound)."""

    deployment_ref: str
    max_attempts: int
    priority: int
    managed_by: str
    version: int
    created_at: datetime
    updated_at: datetime
    updated_by: str
    retry_base_seconds: float | None = None
    retry_max_seconds: float | None = None
    lease_seconds: float | None = None
    attempt_timeout_seconds: float | None = None
    run_timeout_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class DeploymentRegistration:
    """Result of register_deployment / set_deployment_defaults: ``outcome`` is created,
    updated, unchanged or kept (a DBA set the deployment's defaults: left as they are), with the
    defaults as they now are (``retry_base_seconds``, ``retry_max_seconds``, ``lease_seconds``,
    ``attempt_timeout_seconds``, ``run_timeout_seconds``: None when not set); ``previous``:
    the values an update replaced (``max_attempts``, ``priority``, ``managed_by``, and each
    policy value that was set), else None."""

    outcome: str
    deployment_ref: str
    max_attempts: int
    priority: int
    managed_by: str
    version: int
    previous: dict[str, Any] | None
    retry_base_seconds: float | None = None
    retry_max_seconds: float | None = None
    lease_seconds: float | None = None
    attempt_timeout_seconds: float | None = None
    run_timeout_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ScheduleRegistration:
    """Result of register_schedule: ``outcome`` is created, updated, unchanged or kept (a DBA
    created or changed it: left as it is)."""

    schedule_id: UUID
    outcome: str
    next_fire_at: datetime | None
    paused: bool


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """A scope's ``zeroth.scope_limits`` row as ``set_scope_limits`` left it: ``paused`` (nothing
    in the scope is leased), ``max_concurrency`` (None: the claimer's own), ``weight``,
    ``rate_limit`` (the key its starts count against; None: none) and ``note``."""

    tenant_id: str
    workspace_id: str | None
    deployment_ref: str
    paused: bool
    max_concurrency: int | None
    weight: int
    rate_limit: str | None
    note: str | None


@dataclass(frozen=True, slots=True)
class ScheduleFire:
    """One fire time that became a run (fire_due_schedules); ``created`` is false when the run
    already existed under the fire time's idempotency key; ``skipped`` counts the fire times of
    the schedule its missed-fire policy passed over in that call."""

    schedule_id: UUID
    tenant_id: str
    workspace_id: str | None
    name: str
    deployment_ref: str
    fire_at: datetime
    run_id: UUID
    created: bool
    skipped: int


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    """Result of fire_due_schedules: what fired, and the earliest next fire time of the schedules
    served (None: none will fire), for the caller to sleep until."""

    fires: tuple[ScheduleFire, ...]
    next_due_at: datetime | None


class RunEventKind(StrEnum):
    """The kind of a run's stream event (``zeroth.run_events.kind``)."""

    EVENT = "event"  # appended by the run's handler (append_run_event)
    END = "end"  # the run ended: data holds its status and outcome; nothing follows


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run's stream (``zeroth.read_run_events``): numbered 1, 2, 3… per run.

    END (:attr:`is_end`) carries ``{"status": …, "outcome": …}`` in ``data``: the run's terminal
    status and how it ended (``dead_lettered`` for a dead letter), or status None and outcome
    ``not_found`` for a run this scope cannot see (never created, another scope's, pruned)."""

    event_id: int
    kind: RunEventKind
    name: str
    data: Any
    lease_generation: int | None
    created_at: datetime | None

    @property
    def is_end(self) -> bool:
        return self.kind is RunEventKind.END


# -- code versions (issue 34, item 3) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """Result of set_version_policy: ``outcome`` updated or unchanged; ``version_policy`` any,
    same or compatible; ``compatible_versions`` the set (sorted) under compatible, else None."""

    outcome: str
    version_policy: str
    compatible_versions: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class RetiredVersion:
    """Result of retire_code_version: ``runs_changed`` moved or ended; ``runs_left`` the active
    runs that still record the retired version (a live lease, waiting runs under fail, rows
    another session held)."""

    runs_changed: int
    runs_left: int


@dataclass(frozen=True, slots=True)
class PinnedRuns:
    """A row of ``zeroth.pinned_runs``: the active started runs of one scope and deployment that
    recorded ``code_version``, under a ``version_policy`` other than any (only a worker of an
    allowed version resumes them). ``waiting_for_version``: due pending runs nobody holds and
    running runs whose lease expired."""

    tenant_id: str
    workspace_id: str | None
    deployment_ref: str
    code_version: str
    version_policy: str
    pending: int
    running: int
    waiting: int
    waiting_for_version: int
    oldest_pending_at: datetime | None
