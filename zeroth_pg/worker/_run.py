"""One leased run inside the worker: what its handler sees (:class:`RunContext`), and its
lifecycle (:class:`RunState`, :class:`StopReason`), whose transitions all live in
:class:`ActiveRun`.

A run is spawned ``QUEUED`` when a claim hands it over, ``WAITING`` while a run claimed ahead
waits for a handler slot (``claim_ahead``), ``EXECUTING`` while its handler runs,
``COMPLETING`` while its completion is queued or in flight, ``SETTLING`` while another outcome is
written (failed, cancelled, handed back, released) and ``DONE`` when nothing more will be
written. Independently of the state, a *stop* may be requested once (the first reason wins): it
cancels an executing handler or a wait for a slot, makes a queued run settle without starting
it, and lets a completing run's completion go out (the fence in SQL decides it).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol
from uuid import UUID

from zeroth_pg import tracing
from zeroth_pg._jsonb import encode
from zeroth_pg.errors import (
    EventTimeoutError,
    InvalidArgumentError,
    InvalidNameError,
    LeaseLostError,
    StepResultError,
)
from zeroth_pg.types import (
    ChildOutcome,
    ChildWaitOutcome,
    ClaimedRun,
    EventWaitOutcome,
    Scope,
    SleepOutcome,
    SleepResult,
)

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = [
    "ActiveRun",
    "Handler",
    "Orchestrator",
    "RunContext",
    "RunHost",
    "RunSlept",
    "RunState",
    "StepCall",
    "StopReason",
    "orchestrator_handler",
]

Handler = Callable[["RunContext"], Awaitable[Any]]

#: The step key of the step whose function is running in this context (``run.step``), so
#: concurrent steps of one handler (asyncio.gather) each see their own.
_CURRENT_STEP: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "zeroth_current_step", default=None)

#: Waits are keyed "#event:<name>"; a step name may not hold "#", so the two never collide.
_EVENT_STEP_PREFIX = "#event:"


def _escape_step_name(name: str) -> str:
    """An event name as it stands in a step key: the n-th wait for "a" is keyed "#event:a#n",
    so a "#" of the name itself (and the "%" that escapes it) is percent-encoded, and a wait for
    "a#2" can never replay the second wait for "a". A name with neither is unchanged."""
    return name.replace("%", "%25").replace("#", "%23")
#: A child started without a key is the step "#child:<deployment>"; a wait for children is the
#: step "#children" (both numbered like run.step), so neither collides with a step name.
_CHILD_STEP_PREFIX = "#child:"
_CHILDREN_STEP = "#children"


class RunSlept(BaseException):
    """Raised by :meth:`RunContext.sleep` / :meth:`RunContext.sleep_until` once the database
    accepted the sleep: the attempt is over, and the handler must not go on. A BaseException, so
    a handler's ``except Exception`` lets it through; let it propagate. The worker takes it as
    "this attempt ended by sleeping" (no completion, no failure, no retry); it does so even when
    the handler swallows it, since the run's lease is gone. ``result`` says what the database
    did (``SleepOutcome.CANCELLED``: a cancel request was pending, the run is cancelled)."""

    def __init__(self, result: SleepResult) -> None:
        super().__init__(f"run {result.outcome.value} until {result.run_after}")
        self.result = result


class StopReason(enum.Enum):
    """Why the worker stops a run before its handler finished (set before the cancel)."""

    LEASE_LOST = "lease_lost"  # renewal refused: the lease expired, was taken or was cleared
    DEADLINE = "deadline"  # renewals failed until the last confirmed lease deadline
    SUPERSEDED = "superseded"  # this process re-claimed the run at a newer generation
    CANCEL = "cancel"  # the database reported a cancel request (renewal or claim)
    SHUTDOWN = "shutdown"  # graceful shutdown ran out of time: hand back to pending
    INTERRUPT = "interrupt"  # operator interrupt: stop without changing the status
    #: The attempt's (or run's) deadline, fixed by the claim on the database clock, came: the
    #: handler is stopped and the attempt settled as a timeout (retried or failed by the
    #: database, not a crash). The lease is still live: the database caps it at the deadline.
    TIMEOUT = "timeout"
    #: A run claimed ahead (``claim_ahead``) found no handler slot within AHEAD_WAIT, or before
    #: its deadline (its attempt's or its run's): handed back to pending (its attempt given
    #: back), never started.
    NO_SLOT = "no_slot"

    @property
    def lease_gone(self) -> bool:
        """After this stop nothing more may be written for the run: its lease is gone."""
        return self in _LEASE_GONE


_LEASE_GONE = frozenset({StopReason.LEASE_LOST, StopReason.DEADLINE, StopReason.SUPERSEDED})


class RunState(enum.Enum):
    """The life of one leased run inside the worker."""

    QUEUED = "queued"  # spawned; its task has not taken its first step
    WAITING = "waiting"  # claimed ahead: waits for a handler slot (claim_ahead)
    EXECUTING = "executing"  # the handler is running
    COMPLETING = "completing"  # the handler returned; its completion is queued or in flight
    SETTLING = "settling"  # writing its other outcome: failed, cancelled, handed back, released
    DONE = "done"  # nothing more will be written; the entry leaves the worker


_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.WAITING, RunState.EXECUTING, RunState.SETTLING,
                                RunState.DONE}),
    RunState.WAITING: frozenset({RunState.EXECUTING, RunState.SETTLING, RunState.DONE}),
    RunState.EXECUTING: frozenset({RunState.COMPLETING, RunState.SETTLING, RunState.DONE}),
    RunState.COMPLETING: frozenset({RunState.SETTLING, RunState.DONE}),
    RunState.SETTLING: frozenset({RunState.DONE}),
    RunState.DONE: frozenset(),
}


class RunHost(Protocol):
    """What a :class:`RunContext` needs of the worker that runs it (a RunWorker is one): the
    client its fenced writes go through, and two notices."""

    @property
    def lease_manager(self) -> LeaseManager: ...

    def run_slept(self, ctx: RunContext) -> None:
        """The database accepted ``ctx``'s sleep or wait: its lease is gone."""

    def linger(self, deployment_ref: str, done: asyncio.Future[Any]) -> None:
        """A handler of ``deployment_ref`` goes on running until ``done`` after its run left
        the worker."""


@dataclass(eq=False)
class RunContext:
    """What a handler sees of its run. Every write is fenced by the lease generation.
    ``scope`` is where the run lives: its deployment, tenant and workspace."""

    run_id: UUID
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    metadata: dict[str, Any]
    thread_id: str | None
    idempotency_key: str | None
    lease_generation: int
    worker_id: str
    recovered: bool
    recovery_checkpoint_id: UUID | None
    checkpoint_data: Any
    cancelled: asyncio.Event
    scope: Scope
    _worker: RunHost = field(repr=False)
    #: What the database did with this attempt's accepted sleep; None while it has not slept.
    slept: SleepResult | None = field(default=None, init=False)
    #: How many times each step name was used in this attempt (deterministic numbering).
    _step_counts: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once the database reported a cancel request for this run."""
        return self.cancelled.is_set()

    async def commit(self, **columns: Any) -> None:
        """Write output / error / metadata / progress, fenced; raises LeaseLostError if refused."""
        ok = await self._worker.lease_manager.commit_fenced(
            self.run_id, self.worker_id, generation=self.lease_generation,
            tenant_id=self.scope.tenant_id, workspace_id=self.scope.workspace_id, **columns)
        if not ok:
            raise LeaseLostError("commit refused: lease lost", run_id=self.run_id,
                                 worker_id=self.worker_id, generation=self.lease_generation)

    async def checkpoint(self, data: Any, *, checkpoint_id: UUID | None = None) -> UUID:
        """Save a checkpoint, fenced; raises LeaseLostError if refused. Returns its id."""
        with tracing.step("checkpoint", self.scope.deployment_ref, self.run_id):
            saved = await self._worker.lease_manager.save_checkpoint(
                self.run_id, self.worker_id, data, generation=self.lease_generation,
                checkpoint_id=checkpoint_id, tenant_id=self.scope.tenant_id,
                workspace_id=self.scope.workspace_id)
        if saved is None:
            raise LeaseLostError("checkpoint refused: lease lost", run_id=self.run_id,
                                 worker_id=self.worker_id, generation=self.lease_generation)
        return saved

    async def progress(self, value: Any) -> None:
        """Record progress (any JSON value), fenced."""
        await self.commit(progress=value)

    async def emit(self, name: str, data: Any = None) -> int:
        """Append an event (``name``, JSON ``data`` of at most 64 KiB) to this run's stream,
        fenced by this attempt's lease generation (``zeroth.append_run_event``); subscribers
        (``LeaseManager.stream``, the dashboard's SSE) receive it. Returns its id; raises
        LeaseLostError if refused, InvalidArgumentError for a bad name or data (bounded before
        it is encoded), RunEventLimitError (ZP014) once the run holds the most events its
        deployment allows (``max_run_events``: 10,000 unless a DBA set it; nothing stored)."""
        event_id = await self._worker.lease_manager.append_run_event(
            self.run_id, self.worker_id, name, data, generation=self.lease_generation,
            tenant_id=self.scope.tenant_id, workspace_id=self.scope.workspace_id)
        if event_id is None:
            raise self._lease_lost("emit")
        return event_id

    async def sleep(self, seconds: float, *, checkpoint: Any = None) -> NoReturn:
        """Durable sleep for ``seconds`` (counted on the database clock): see
        :meth:`sleep_until`."""
        await self._sleep(delay_seconds=seconds, checkpoint=checkpoint)

    async def sleep_until(self, when: datetime, *, checkpoint: Any = None) -> NoReturn:
        """Durable sleep until ``when`` (timezone-aware; a past instant resumes at once).

        Ends this attempt (``zeroth.sleep_run``, fenced): the run goes back to pending until
        ``when``, its attempt is given back (sleeping is not failing), its lease and slot are
        released, and ``checkpoint`` (if not None) is saved in the same call. Never returns: it
        raises :class:`RunSlept`, which ends the handler. At ``when`` any worker claims the run
        and calls the handler **again from the start**, with the latest checkpoint in
        ``recovery_checkpoint_id`` / ``checkpoint_data``; nothing in memory survives the sleep.
        Raises LeaseLostError when the lease was already lost (nothing was changed).
        """
        await self._sleep(resume_at=when, checkpoint=checkpoint)

    async def _sleep(self, *, resume_at: datetime | None = None,
                     delay_seconds: float | None = None, checkpoint: Any) -> NoReturn:
        if self.slept is not None:  # asleep already (a handler that swallowed RunSlept)
            raise RunSlept(self.slept)
        with tracing.step("sleep", self.scope.deployment_ref, self.run_id):
            result = await self._worker.lease_manager.sleep_run(
                self.run_id, self.worker_id, generation=self.lease_generation,
                resume_at=resume_at, delay_seconds=delay_seconds, checkpoint=checkpoint,
                tenant_id=self.scope.tenant_id, workspace_id=self.scope.workspace_id)
        if result is None:
            raise LeaseLostError("sleep refused: lease lost", run_id=self.run_id,
                                 worker_id=self.worker_id, generation=self.lease_generation)
        self.slept = result
        self._worker.run_slept(self)
        raise RunSlept(result)

    # -- steps and events ----------------------------------------------------------------------

    @property
    def step_key(self) -> str | None:
        """The key of the step whose function is running now (``name``, ``name#2``, …), None
        outside a step."""
        return _CURRENT_STEP.get()

    @property
    def step_idempotency_key(self) -> str | None:
        """``"<run_id>:<step key>"`` while a step's function runs (None outside one): the same
        in every attempt of the run. A step's *recorded result* is written once; its side
        effects happen at least once (an attempt may die between the side effect and the
        record), unless the external system deduplicates on this key."""
        key = _CURRENT_STEP.get()
        return None if key is None else f"{self.run_id}:{key}"

    def _next_step_key(self, name: str) -> str:
        if not isinstance(name, str) or not name or len(name) > 200 or "#" in name:
            # A mistake in the handler's code: every attempt would make it again.
            raise InvalidNameError(
                "a step name must be a non-empty string of at most 200 characters without '#', "
                f"got {name!r:.220}")
        return self._next_step_key_raw(name)

    def _lease_lost(self, what: str) -> LeaseLostError:
        return LeaseLostError(f"{what} refused: lease lost", run_id=self.run_id,
                              worker_id=self.worker_id, generation=self.lease_generation)

    def begin_step(self, name: str) -> StepCall:
        """The durable step ``name`` of this attempt (numbered like :meth:`step`), in parts: for
        an adapter that runs the step's function somewhere else (the App's synchronous
        handlers run it in their own thread). :meth:`step` is these parts in order."""
        return StepCall(self, self._next_step_key(name))

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name``, once per run.

        If this run recorded a result for the step in any earlier attempt, return it without
        calling ``fn``; otherwise call (and await, if it returns an awaitable) ``fn``, record
        its result fenced by the lease generation (``zeroth.record_step``: first recorded result
        wins; a stale attempt records nothing and gets LeaseLostError) and return the
        *recorded* value, decoded from JSON as a replay would see it (a tuple comes back as a
        list). The n-th use of one name in an attempt is the step ``name#n``, so keep the order
        of steps deterministic. The result must be JSON: anything else raises StepResultError
        and records nothing. While ``fn`` runs, :attr:`step_idempotency_key` names the step.
        After the attempt slept or left to wait (a handler that swallowed :class:`RunSlept`) it
        raises RunSlept again and calls nothing.
        """
        if self.slept is not None:  # left its worker already (a handler that swallowed it)
            raise RunSlept(self.slept)
        call = self.begin_step(name)
        with tracing.step("step", self.scope.deployment_ref, self.run_id):
            recorded, result = await call.read()
        if recorded:
            return result
        with call.running():
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        with tracing.step("record_step", self.scope.deployment_ref, self.run_id):
            return await call.record(value)

    # A durable deadline on the database clock, not a local timeout: asyncio.timeout cannot do it.
    async def wait_for_event(self, name: str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Wait for the event ``name`` of this run's scope and return its payload.

        A step (``#event:<name>``, numbered like :meth:`step`): an event already emitted is
        recorded as the step result and returned at once. Otherwise the attempt ends
        (``zeroth.wait_for_event``: status ``waiting``, lease and slot released, attempt given
        back) by raising :class:`RunSlept` (a BaseException: let it propagate); when
        ``zeroth.emit_event`` is called (from any service or psql) the run becomes pending, the
        handler is called again from the start, its recorded steps return at once, and this
        call returns the payload. ``timeout`` seconds (database clock, from the first wait; at
        most 366 days; None: no deadline): past it, the wait's recorded outcome is a timeout
        and this call raises :class:`~zeroth_pg.errors.EventTimeoutError`, in this attempt and
        every replay. Workers' orphan sweeps move runs whose deadline passed back to pending
        (``zeroth.wake_due_waits``), so a timeout is seen within about one sweep interval.
        ``name`` is any name ``zeroth.emit_event`` takes (``#`` included).
        """
        if self.slept is not None:  # left its worker already (a handler that swallowed it)
            raise RunSlept(self.slept)
        if not isinstance(name, str):
            raise InvalidNameError(f"an event name must be a string, got {name!r:.220}")
        escaped = _escape_step_name(name)
        if not name or len(name) > 200 or len(escaped) > 300:
            raise InvalidNameError(
                "an event name must be a non-empty string of at most 200 characters ('#' and "
                f"'%' count three), got {name!r:.220}")
        key = self._next_step_key_raw(_EVENT_STEP_PREFIX + escaped)
        with tracing.step("wait_for_event", self.scope.deployment_ref, self.run_id):
            waited = await self._worker.lease_manager.wait_for_event(
                self.run_id, self.worker_id, key, name, generation=self.lease_generation,
                timeout_seconds=timeout, tenant_id=self.scope.tenant_id,
                workspace_id=self.scope.workspace_id)
        if waited is None:
            raise self._lease_lost("wait_for_event")
        if waited.outcome is EventWaitOutcome.RECEIVED:
            return waited.payload
        if waited.outcome is EventWaitOutcome.TIMED_OUT:
            raise EventTimeoutError(name)
        outcome = (SleepOutcome.WAITING if waited.outcome is EventWaitOutcome.WAITING
                   else SleepOutcome.CANCELLED)
        self.slept = SleepResult(outcome=outcome, run_after=waited.timeout_at,
                                 checkpoint_id=None)
        self._worker.run_slept(self)
        raise RunSlept(self.slept)

    # -- child runs ------------------------------------------------------------------------------

    async def start_child(self, deployment: str, payload: Mapping[str, Any] | None = None, *,
                          key: str | None = None, priority: int | None = None,
                          max_attempts: int | None = None,
                          metadata: Mapping[str, Any] | None = None,
                          detached: bool = False) -> UUID:
        """Start a child run of ``deployment`` in this run's scope and return its run id
        (``priority`` / ``max_attempts`` None: the deployment's registered defaults, else 0 / 3).

        A step (``zeroth.start_child_run``, fenced): ``key`` names it (a step name, numbered
        like :meth:`step` when reused); without one it is ``#child:<deployment>``, numbered, so
        keep the order of starts deterministic. A replayed attempt gets the same child back
        and starts nothing; another deployment, payload or ``detached`` under the same key
        raises :class:`~zeroth_pg.errors.ChildRunConflictError`. The child is cancelled with
        this run (any cancel path) while it has not ended, unless ``detached``. Raises
        LeaseLostError when the lease was lost (nothing was started).
        """
        if self.slept is not None:  # left its worker already (a handler that swallowed it)
            raise RunSlept(self.slept)
        step_key = (self._next_step_key_raw(_CHILD_STEP_PREFIX + deployment)
                    if key is None else self._next_step_key(key))
        with tracing.step("start_child", self.scope.deployment_ref, self.run_id):
            started = await self._worker.lease_manager.start_child_run(
                self.run_id, self.worker_id, step_key, deployment, payload,
                generation=self.lease_generation, priority=priority, max_attempts=max_attempts,
                metadata=metadata, detached=detached, tenant_id=self.scope.tenant_id,
                workspace_id=self.scope.workspace_id)
        if started is None:
            raise self._lease_lost("start_child")
        return started.child_run_id

    async def wait_for_children(self, children: Sequence[UUID], *,
                                mode: str = "all") -> list[ChildOutcome]:
        """Wait until all (``mode="all"``) or any (``"any"``) of ``children`` (ids from
        :meth:`start_child`) ended, and return one :class:`~zeroth_pg.types.ChildOutcome` per
        child, in the order given (status, output, error, dead_lettered; status None for a
        child still running when an ``any`` wait was met).

        A step (``#children``, numbered like :meth:`step`; ``zeroth.wait_for_children``):
        children that ended already are recorded as the step result and returned at once.
        Otherwise the attempt ends (status ``waiting``, lease and slot released, attempt given
        back) by raising :class:`RunSlept` (a BaseException: let it propagate); when the wait
        is met the run becomes pending, the handler is called again from the start, and this
        call returns the recorded outcomes, the same in every later replay. A failed or
        dead-lettered child is an outcome, not an exception.
        """
        if self.slept is not None:  # left its worker already (a handler that swallowed it)
            raise RunSlept(self.slept)
        key = self._next_step_key_raw(_CHILDREN_STEP)
        with tracing.step("wait_for_children", self.scope.deployment_ref, self.run_id):
            waited = await self._worker.lease_manager.wait_for_children(
                self.run_id, self.worker_id, key, children, generation=self.lease_generation,
                mode=mode, tenant_id=self.scope.tenant_id, workspace_id=self.scope.workspace_id)
        if waited is None:
            raise self._lease_lost("wait_for_children")
        if waited.outcome is ChildWaitOutcome.READY:
            return list(waited.children or ())
        outcome = (SleepOutcome.WAITING if waited.outcome is ChildWaitOutcome.WAITING
                   else SleepOutcome.CANCELLED)
        self.slept = SleepResult(outcome=outcome, run_after=None, checkpoint_id=None)
        self._worker.run_slept(self)
        raise RunSlept(self.slept)

    def _next_step_key_raw(self, base: str) -> str:
        count = self._step_counts.get(base, 0) + 1
        self._step_counts[base] = count
        return base if count == 1 else f"{base}#{count}"

    def linger(self, done: asyncio.Future[Any]) -> None:
        """The handler goes on after the worker stopped waiting for it (a thread cannot be
        stopped): its deployment's local limit counts it until ``done``."""
        self._worker.linger(self.scope.deployment_ref, done)


@dataclass(frozen=True, slots=True)
class StepCall:
    """One durable step of an attempt (:meth:`RunContext.begin_step`): read its recorded
    result, run its function under its key, record the function's result."""

    ctx: RunContext
    #: The step's key (``name``, ``name#2``, …).
    key: str

    async def read(self) -> tuple[bool, Any]:
        """(recorded, result): the result an earlier attempt recorded, if any (fenced)."""
        ctx = self.ctx
        read = await ctx._worker.lease_manager.get_step(
            ctx.run_id, ctx.worker_id, self.key, generation=ctx.lease_generation,
            tenant_id=ctx.scope.tenant_id, workspace_id=ctx.scope.workspace_id)
        if read is None:
            raise ctx._lease_lost("step read")
        return read.recorded, read.result

    @contextmanager
    def running(self) -> Iterator[None]:
        """While the step's function runs: :attr:`RunContext.step_key` names the step."""
        token = _CURRENT_STEP.set(self.key)
        try:
            yield
        finally:
            _CURRENT_STEP.reset(token)

    async def record(self, value: Any) -> Any:
        """Record ``value`` (fenced; the first recorded result wins) and return the recorded
        value, decoded from JSON. Raises StepResultError for a value that is not JSON."""
        ctx = self.ctx
        try:
            encode(value)
        except InvalidArgumentError as exc:
            raise StepResultError(f"step {self.key!r} returned a value that cannot be "
                                  f"recorded: {exc}") from None
        recorded = await ctx._worker.lease_manager.record_step(
            ctx.run_id, ctx.worker_id, self.key, value, generation=ctx.lease_generation,
            tenant_id=ctx.scope.tenant_id, workspace_id=ctx.scope.workspace_id)
        if recorded is None:
            raise ctx._lease_lost("step record")
        return recorded.result


class Orchestrator(Protocol):
    async def drive(self, run: RunContext) -> Any: ...

    async def resume(self, run: RunContext, checkpoint: Any) -> Any: ...


def orchestrator_handler(orchestrator: Orchestrator) -> Handler:
    """Adapt an object with ``drive(run)`` / ``resume(run, checkpoint)`` (upstream's shape)."""

    async def handle(ctx: RunContext) -> Any:
        if ctx.recovery_checkpoint_id is not None:
            return await orchestrator.resume(ctx, ctx.checkpoint_data)
        return await orchestrator.drive(ctx)

    return handle


@dataclass(eq=False)
class ActiveRun:
    """One leased run inside the worker: its lease, its task, its :class:`RunState` and the
    reason it was asked to stop. Every change of either goes through a method of this class."""

    run: ClaimedRun
    ctx: RunContext
    # Monotonic instant before which the lease is known to be live: the send time of the last
    # call that confirmed it plus the lease duration (the server added it to a later instant).
    deadline: float
    # Monotonic instant of the attempt's deadline (ClaimedRun.deadline_in from the claim's send
    # time), None without one: no renewal moves the lease past it.
    attempt_deadline: float | None = None
    # The timer that stops the handler just before attempt_deadline.
    deadline_timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None
    state: RunState = RunState.QUEUED
    stop_reason: StopReason | None = None
    # Its completion goes out with a claim into the slot it frees (complete_and_claim): until
    # that call has answered, the slot is reserved for it and the claim loop does not fill it.
    claims_next: bool = False
    # That call claimed a run into its slot: the slot was passed on, so the end of this run frees
    # nothing the claim loop could fill (waking it would cost a claim that finds no slot).
    slot_passed_on: bool = False
    # A write of its outcome got no answer and no later try confirmed it (set by the completion
    # batcher, _settle.Leased): whether the outcome landed is unknown, not a lost lease.
    outcome_unknown: bool = False
    # It holds one of the handler slots of a worker that claims ahead (ClaimAhead.slots), from
    # before its handler starts until the handler returns.
    holds_handler_slot: bool = False

    @property
    def key(self) -> tuple[UUID, int]:
        return self.run.run_id, self.run.lease_generation

    @property
    def scope(self) -> Scope:
        return self.ctx.scope

    def advance(self, to: RunState) -> None:
        """The one place a run changes state; an impossible transition is a worker bug."""
        if to not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"run {self.run.run_id}: {self.state.value} -> {to.value}")
        self.state = to

    def finish(self) -> None:
        """``DONE``, from wherever the run stands (its task is ending)."""
        if self.state is not RunState.DONE:
            self.advance(RunState.DONE)

    def request_stop(self, reason: StopReason) -> bool:
        """Record why the run must stop (the first reason wins); True when its running handler
        must be cancelled (its handler, or its wait for a slot). A queued run settles on its
        first step without starting the handler; a completing run lets its completion go out
        (the fence in SQL decides it)."""
        if self.stop_reason is not None or self.state in (RunState.SETTLING, RunState.DONE):
            return False
        self.stop_reason = reason
        if reason is StopReason.CANCEL:
            self.ctx.cancelled.set()
        return self.state in (RunState.EXECUTING, RunState.WAITING)

    def stop(self, reason: StopReason) -> None:
        """:meth:`request_stop`, and cancel the handler's task when it must be cancelled."""
        if self.request_stop(reason) and self.task is not None and not self.task.done():
            self.task.cancel()

    @property
    def renewable(self) -> bool:
        """Its lease is still renewed: not stopping, not settled."""
        return self.stop_reason is None and self.state in (
            RunState.QUEUED, RunState.WAITING, RunState.EXECUTING, RunState.COMPLETING)

    @property
    def lease_gone(self) -> bool:
        """It was stopped because its lease is gone: nothing more may be written."""
        return self.stop_reason is not None and self.stop_reason.lease_gone

    @property
    def may_settle(self) -> bool:
        """An outcome may still be written for it: not settling or settled, lease not gone."""
        return self.state not in (RunState.SETTLING, RunState.DONE) and not self.lease_gone
