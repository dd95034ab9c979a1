"""Executing a run: one task per claimed run calls its handler, has its outcome decided
(:mod:`._outcome`), reports it (metrics, trace, log) and hands it to the :class:`~._settle.
Settler`. :class:`RunExecutor` is the :class:`~._run.RunHost` of every RunContext it makes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from zeroth_pg import tracing
from zeroth_pg.errors import (
    DatabaseError,
    ErrorDescription,
    InvalidPayloadError,
    RetryableError,
    describe,
)
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.types import ClaimedRun, Scope, SleepOutcome
from zeroth_pg.worker._ahead import AHEAD_WAIT, ClaimAhead
from zeroth_pg.worker._outcome import Outcome, OutcomeKind, decide
from zeroth_pg.worker._run import (
    ActiveRun,
    Handler,
    RunContext,
    RunSlept,
    RunState,
    StopReason,
)
from zeroth_pg.worker._settle import Settler
from zeroth_pg.worker._slots import HeldRuns

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["RunExecutor", "scope_counter"]

log = logging.getLogger("zeroth_pg.worker")

#: Looked up once: on Python 3.11 an enum member's lookup costs a few hundred ns, and every run
#: makes these two.
_COMPLETED, _PROPAGATE = OutcomeKind.COMPLETED, OutcomeKind.PROPAGATE

#: The share of an attempt's time limit (at most a second) before its deadline at which the
#: worker stops the handler, so that the timeout's settle lands while the lease lives.
DEADLINE_MARGIN = 0.05

#: Seconds before its attempt's deadline (at most half the attempt's time) at which a run claimed
#: ahead that still waits for a handler slot is handed back. It never ran, so nothing is lost by
#: giving it back early; but a hand-back that lands after the lease is refused, and the sweep then
#: times the attempt out: charged, or on its last attempt dead-lettered, for a run whose handler
#: never ran. DEADLINE_MARGIN's 5% was 0.15 s for a 3 s attempt: less than a loaded machine
#: may take to write it.
UNSTARTED_MARGIN = 1.0


def _unstarted_hand_back_at(entry: ActiveRun) -> float | None:
    """When a run claimed ahead that still waits for a handler slot is handed back: its
    attempt's deadline less UNSTARTED_MARGIN (or half its time); None without a deadline."""
    if entry.attempt_deadline is None or entry.run.deadline_in is None:
        return None
    return entry.attempt_deadline - min(UNSTARTED_MARGIN, entry.run.deadline_in / 2)


class RunExecutor:
    """Spawns a task per claimed run and sees each through to its settled outcome."""

    def __init__(self, lm: LeaseManager, worker_id: str, handlers: Mapping[str, Handler],
                 runs: HeldRuns, settler: Settler, metrics: WorkerMetrics, *,
                 count_scope: Callable[[Counter, Scope], None],
                 worker_error: Callable[[str, str | None], None],
                 drain_soon: Callable[[], None]) -> None:
        # The client of the handlers' own writes (RunHost): without the worker's call bound.
        # A handler told that a checkpoint, a step or an event timed out would believe it
        # unwritten, yet the abandoned call may commit; the handler's calls are its own to
        # bound, and a hung server ends them with the lease (the renewals are bounded).
        self.lease_manager = dataclasses.replace(lm, call_timeout=None)
        self.worker_id = worker_id
        self._handlers = handlers
        self.runs = runs
        self.settler = settler
        self.metrics = metrics
        self._count_scope = count_scope
        self._worker_error = worker_error
        self._drain_soon = drain_soon
        # Set by the claim loop once it exists: whether a completion may carry the next claim,
        # and the notice of a freed slot.
        self.may_claim_along: Callable[[ActiveRun], bool] = lambda entry: False
        self.slot_freed: Callable[..., None] = lambda **_: None
        # Set by the worker: whether it is draining (a run claimed ahead then waits for a slot).
        self.stopping: Callable[[], bool] = lambda: False
        # The per-run series, looked up once per deployment (labels() takes a lock and builds a
        # key each time).
        self._series = {d: (metrics.runs_started.labels(d), metrics.runs_completed.labels(d),
                            metrics.run_duration.labels(d)) for d in handlers}

    # -- RunHost ---------------------------------------------------------------------------------

    def run_slept(self, ctx: RunContext) -> None:
        """The database accepted ``ctx``'s sleep (RunContext.sleep_until): its lease is gone.
        Settled now, so neither a renewal nor a stop touches it while the handler unwinds."""
        entry = self.runs.active.get((ctx.run_id, ctx.lease_generation))
        if entry is not None and entry.ctx is ctx and entry.state is RunState.EXECUTING:
            entry.advance(RunState.SETTLING)

    def linger(self, deployment_ref: str, done: asyncio.Future[Any]) -> None:
        self.runs.linger(deployment_ref, done)

    # -- a run's task ----------------------------------------------------------------------------

    def spawn(self, scope: Scope, run: ClaimedRun, deadline: float,
              recovered: bool) -> ActiveRun:
        # When the claim's answer arrived, as this worker saw it: a claim's commit may wait (a
        # synchronous standby) after the statement's own timestamps were taken, so this line
        # is what tells when a claim really took effect (tests/ha reads it).
        log.debug("run %s claimed at generation %d (%s)", run.run_id, run.lease_generation,
                  "orphan" if recovered else "pending")
        # This process may have recovered its own orphan (its event loop stalled past the
        # lease): the older generation's lease is gone, so stop that task; it writes nothing.
        for older in self.runs.older(run.run_id):
            log.warning("run %s: re-claimed at generation %d while generation %d still ran here;"
                        " stopping the older one", run.run_id, run.lease_generation,
                        older.run.lease_generation)
            older.stop(StopReason.SUPERSEDED)
        ctx = RunContext(
            run_id=run.run_id, payload=run.payload,
            # claim_and_start counted this attempt; so did claim_orphaned for a recovered run.
            attempt=run.attempts,
            max_attempts=run.max_attempts,
            metadata=run.metadata, thread_id=run.thread_id, idempotency_key=run.idempotency_key,
            lease_generation=run.lease_generation, worker_id=self.worker_id, recovered=recovered,
            recovery_checkpoint_id=run.recovery_checkpoint_id, checkpoint_data=run.checkpoint_data,
            cancelled=asyncio.Event(), scope=scope, _worker=self)
        entry = ActiveRun(run=run, ctx=ctx, deadline=deadline)
        if run.deadline_in is not None:
            self._arm_deadline(entry, deadline - self.lease_manager.lease_duration_seconds)
        self.runs.add(entry)
        entry.task = asyncio.create_task(self._execute(entry), name=f"run-{run.run_id}")
        if time.monotonic() >= entry.deadline:
            # The claim's answer came after the lease it granted had run out: the database fixed
            # the lease from its clock when the call began (before any lock wait), later than
            # the send time ``deadline`` counts from, so the database may still hold it a
            # moment, but this worker cannot know it does: never start the handler (fail-stop;
            # the lease runs out and the orphan sweep recovers the run at a new generation).
            log.warning("run %s: its claim was answered after the lease it granted ran out "
                        "(a claim held up on the server); not starting it", run.run_id)
            entry.stop(StopReason.DEADLINE)
        elif run.cancel_requested:  # the claim itself reported the cancel: the database said so
            entry.stop(StopReason.CANCEL)
        return entry

    def _arm_deadline(self, entry: ActiveRun, sent: float) -> None:
        """The attempt's deadline on this process's monotonic clock: ``deadline_in`` seconds
        after the claim was sent (the database fixed it after that, so this is never late). The
        lease ends there, whatever the renewals; the handler is stopped a little before it
        (:data:`DEADLINE_MARGIN` of it, at most a second) so the timeout's settle reaches the
        database while the lease still lives. If it does not, the orphan sweep ends the attempt
        the same way."""
        assert entry.run.deadline_in is not None
        entry.attempt_deadline = sent + entry.run.deadline_in
        entry.deadline = min(entry.deadline, entry.attempt_deadline)
        stop_at = entry.attempt_deadline - min(1.0, DEADLINE_MARGIN * entry.run.deadline_in)
        entry.deadline_timer = asyncio.get_running_loop().call_at(
            asyncio.get_running_loop().time() + max(0.0, stop_at - time.monotonic()),
            self._deadline_came, entry)

    def _deadline_came(self, entry: ActiveRun) -> None:
        """The deadline (the earlier of the attempt's and the run's, less its margin) came: the
        handler is stopped, a timeout. A run claimed ahead that still waits for a handler slot
        never ran, so it is handed back instead, as when it finds no slot in time (an attempt
        timeout of a second comes before AHEAD_WAIT), drain or not: it could not run in the
        time left (it is handed back earlier still, :meth:`_deadline_near`). The claim does not
        say which deadline it was: past its run deadline, the handed-back run is failed for
        good by the next claim or orphan sweep that meets it (zeroth.wake_due_waits), as any
        pending run past its run deadline is."""
        gate = self.runs.ahead_gate
        if gate is not None and entry.state is RunState.WAITING and entry.stop_reason is None:
            self._hand_back_unstarted(entry, gate, "its deadline came before a handler slot")
        else:
            entry.stop(StopReason.TIMEOUT)

    def _deadline_near(self, entry: ActiveRun, gate: ClaimAhead) -> None:
        """A run claimed ahead still waits for a handler slot UNSTARTED_MARGIN (or half its
        attempt's time) before its deadline: handed back now, drain or not, last attempt or
        not, so that the hand-back lands while its lease lives."""
        if entry.state is RunState.WAITING and entry.stop_reason is None:
            self._hand_back_unstarted(entry, gate, "its deadline is near and no handler slot "
                                      "came")

    async def _execute(self, entry: ActiveRun) -> None:
        run = entry.run
        try:
            if entry.stop_reason is not None:  # stopped before this task ran (a claimed orphan
                await self.settler.stopped(entry)  # with a pending cancel): never start it
                return
            if run.undecodable is not None:
                # JSON the database holds but Python cannot decode: no handler could run it, and
                # no retry can change that.
                log.warning("run %s: cannot decode its JSON (%s); failing it", run.run_id,
                            run.undecodable)
                await self.settler.fail(entry, InvalidPayloadError(
                    f"this worker cannot decode the run's JSON: {run.undecodable}"),
                    retryable=False)
                return
            gate = self.runs.ahead_gate
            if gate is not None:
                await self._take_handler_slot(entry, gate)
            if self._too_late_to_start(entry, gate):
                await self.settler.stopped(entry)
                return
            entry.advance(RunState.EXECUTING)
            # Both claim paths (claim_and_start, claim_orphaned) hand over runs already running.
            with tracing.process(entry.scope, entry.run, attempt=entry.ctx.attempt,
                                 worker_id=self.worker_id, recovered=entry.ctx.recovered) as span:
                await self._attempt(entry, span)
        except asyncio.CancelledError:
            if entry.stop_reason is None or entry.state not in (RunState.EXECUTING,
                                                                RunState.WAITING):
                raise  # not ours (the loop is shutting down): propagate
            # Stopped while outside the handler (between steps, or waiting for a slot): settle
            # it the same way.
            await self.settler.stopped(entry)
        except Exception as exc:
            # A bug or a refusal in the worker's own steps: give the run an explicit outcome
            # (a retryable failure, so a bug that always hits ends in a dead letter) and count it.
            # Not log.exception: the chain may hold the handler's exception, whose message is
            # unbounded; describe() bounds it.
            log.error("run %s: worker error outside the handler\n%s", run.run_id,
                      describe(exc).traceback)
            self._worker_error("settle", None)
            await self.settler.fail_quietly(entry, exc)
        finally:
            if entry.deadline_timer is not None:
                entry.deadline_timer.cancel()
            if self.runs.ahead_gate is not None:
                self.runs.ahead_gate.returned(entry, None)
            entry.finish()
            self.runs.remove(entry)
            if not entry.slot_passed_on:
                self.slot_freed(fleet=True)

    async def _take_handler_slot(self, entry: ActiveRun, gate: ClaimAhead) -> None:
        """A worker that claims ahead: one of its max_concurrency handler slots, before the
        handler starts. A run claimed ahead waits for one (WAITING) at most AHEAD_WAIT, and
        never closer to its attempt's deadline than UNSTARTED_MARGIN (half its time, if less);
        a stop meanwhile (a cancel request, a lost lease, the deadline, the wait's bound)
        cancels the wait and the run is settled without starting (_execute)."""
        if gate.slots.locked():
            entry.advance(RunState.WAITING)
            began = time.monotonic()
            loop = asyncio.get_running_loop()
            timers = [loop.call_later(AHEAD_WAIT, self._no_slot, entry, gate)]
            if (hand_back_at := _unstarted_hand_back_at(entry)) is not None:
                timers.append(loop.call_later(max(0.0, hand_back_at - began),
                                              self._deadline_near, entry, gate))
            try:
                await gate.slots.acquire()
            finally:
                for timer in timers:
                    timer.cancel()
                self.metrics.slot_wait.labels(entry.scope.deployment_ref).observe(
                    time.monotonic() - began)
        else:
            await gate.slots.acquire()  # a free slot: returns at once
        gate.took(entry)

    def _too_late_to_start(self, entry: ActiveRun, gate: ClaimAhead | None) -> bool:
        """Just before the handler starts, after an event loop that may have stalled (a
        blocking handler) since the claim: a wakeup that was ready runs before the timers that
        came due meanwhile (a slot's, for a run claimed ahead; the run's task itself, else).
        Past the lease this worker knows it holds, the run is not started (fail-stop, as
        :meth:`spawn`: another worker may hold it by now; the lease runs out and the sweep
        recovers it); a run claimed ahead that waited for its slot past the point where a
        waiting run is handed back is handed back. True when it must not start (its stop
        recorded: the caller settles it)."""
        now = time.monotonic()
        if now >= entry.deadline:
            log.warning("run %s: its handler would start after the lease it knows of ran out "
                        "(the event loop stalled); not starting it", entry.run.run_id)
            entry.request_stop(StopReason.DEADLINE)
            return True
        # Only a run that waited for its slot: one that found a free slot at once starts as a
        # worker that does not claim ahead would start it.
        waited = gate is not None and entry.state is RunState.WAITING
        hand_back_at = _unstarted_hand_back_at(entry) if waited else None
        if gate is not None and hand_back_at is not None and now >= hand_back_at:
            self._hand_back_unstarted(entry, gate, "its deadline is near and its handler slot "
                                      "came too late", cancel=False)
            return True
        return False

    def _no_slot(self, entry: ActiveRun, gate: ClaimAhead) -> None:
        """A run claimed ahead waited AHEAD_WAIT for a slot: the handlers are not short. It is
        handed back (the database gives the attempt back, within the run's hand-backs) and the
        worker claims nothing more ahead until its handlers are short again. Not during a drain:
        then it waits for a handler as every held run does (handed back after
        shutdown_timeout). Not on the run's last attempt either: once its hand-backs are spent
        (other workers may have handed it back before), a hand-back there dead-letters it, and
        a run must not end without its handler having run because handlers turned long; it
        waits for a handler (its deadline, a cancel or a drain still stop it)."""
        if entry.state is not RunState.WAITING or entry.stop_reason is not None \
                or self.stopping():
            return
        if entry.run.attempts >= entry.run.max_attempts:
            log.info("run %s: claimed ahead, no handler slot within %g s; on its last attempt, "
                     "it waits for one", entry.run.run_id, AHEAD_WAIT)
            gate.no_slot()
            return
        self._hand_back_unstarted(entry, gate, f"no handler slot within {AHEAD_WAIT:g} s")

    def _hand_back_unstarted(self, entry: ActiveRun, gate: ClaimAhead, why: str, *,
                             cancel: bool = True) -> None:
        """Stop a waiting run claimed ahead (NO_SLOT: handed back, its attempt given back) and
        claim nothing more ahead until the handlers are short again (``cancel``: cancel its
        wait; not from the run's own task, which settles it next)."""
        log.info("run %s: claimed ahead, %s; handing it back", entry.run.run_id, why)
        self.metrics.runs_not_started_ahead.labels(entry.scope.deployment_ref).inc()
        gate.no_slot()
        if cancel:
            entry.stop(StopReason.NO_SLOT)
        else:
            entry.request_stop(StopReason.NO_SLOT)

    async def _attempt(self, entry: ActiveRun, span: Any) -> None:
        """Run the handler, decide the outcome, report it, settle it (``span``: its trace)."""
        ctx = entry.ctx
        deployment = entry.scope.deployment_ref
        runs_started, _, run_duration = self._series[deployment]
        runs_started.inc()
        self._count_scope(self.metrics.scope_runs_started, entry.scope)
        started = time.monotonic()
        output: Any = None
        raised: BaseException | None = None
        try:
            output = await self._handlers[deployment](ctx)
        except BaseException as exc:
            raised = exc
        finally:
            took = time.monotonic() - started
            run_duration.observe(took)
            if self.runs.ahead_gate is not None:
                # The next run claimed ahead starts now, while this one's outcome is written.
                self.runs.ahead_gate.returned(entry, took)
        task = asyncio.current_task()
        cancelling = task is not None and task.cancelling() > 0
        try:
            outcome = decide(output=output, raised=raised, slept=ctx.slept is not None,
                             stop_reason=entry.stop_reason, lease_gone=entry.lease_gone,
                             cancelling=cancelling)
        except Exception:
            raise  # a worker error: _execute writes a retryable failure (fail_quietly)
        except BaseException as exc:
            # The output's own code raised it while it was encoded (a mapping's items(), called
            # by json.dumps): the handler's doing, so the attempt's failure, as if the handler
            # had raised it. It escaped the run's task, where SystemExit ended the event loop.
            raised = exc
            outcome = decide(raised=exc, slept=ctx.slept is not None,
                             stop_reason=entry.stop_reason, lease_gone=entry.lease_gone,
                             cancelling=cancelling)
        if outcome.kind is _PROPAGATE:
            assert raised is not None
            raise raised  # the loop is cancelling this task: not the handler's doing
        try:
            await self._settle(entry, outcome, span, raised)
        finally:
            raised = None  # its traceback holds this frame: no cycle left for the collector

    async def _settle(self, entry: ActiveRun, outcome: Outcome, span: Any,
                      raised: BaseException | None) -> None:
        kind, settler = outcome.kind, self.settler
        if kind is _COMPLETED:  # the common case first (an enum member's lookup is not free)
            await self._complete(entry, outcome.output, span)
        elif kind is OutcomeKind.SLEPT:
            self._after_sleep(entry, span)
        elif kind is OutcomeKind.STOPPED:
            tracing.failed(span, None, outcome.why)
            await settler.stopped(entry)
        elif kind is OutcomeKind.LEASE_LOST:
            tracing.failed(span, outcome.traced, outcome.why)
            settler.lease_lost(entry, fenced=outcome.fenced)
        elif kind is OutcomeKind.FAILED:
            assert outcome.error is not None
            self._report_failure(entry, outcome, span, raised)
            if outcome.interrupt and _interrupts_raise_here():
                # Where SIGINT raises KeyboardInterrupt in this thread (no run_until_stopped nor
                # asyncio.run handling it), this may be the operator's Ctrl-C: drain.
                log.warning("run %s: KeyboardInterrupt while SIGINT raises it here; the worker "
                            "drains", entry.run.run_id)
                self._drain_soon()
            await settler.fail(entry, outcome.error, retryable=outcome.retryable)
        else:  # PROPAGATE never gets here: _attempt raises it
            raise RuntimeError(f"run {entry.run.run_id}: no settle for outcome {kind.value}")

    def _report_failure(self, entry: ActiveRun, outcome: Outcome, span: Any,
                        raised: BaseException | None) -> None:
        run_id, attempt = entry.run.run_id, entry.ctx.attempt
        self.metrics.handler_errors.labels(entry.scope.deployment_ref).inc()
        tracing.failed(span, outcome.traced, outcome.why)
        if raised is None:  # the output cannot be stored
            if outcome.traced is None:
                log.warning("run %s: PostgreSQL cannot store its output (%s); failing it",
                            run_id, outcome.error)
        elif isinstance(raised, RunSlept | asyncio.CancelledError):
            log.warning("run %s attempt %d: the handler raised %s %s", run_id, attempt,
                        type(raised).__name__,
                        "without sleeping" if isinstance(raised, RunSlept) else "itself")
        elif isinstance(described := outcome.error, ErrorDescription):
            log.info("run %s attempt %d failed%s: %s: %s", run_id, attempt,
                     "" if outcome.retryable else " for good", described.type, described.message)

    async def _complete(self, entry: ActiveRun, output: Any, span: Any) -> None:
        """Queue the completion (with the next claim when it may carry one) and wait for its
        row: True completed, False refused by the fence, None no answer before the deadline."""
        run, deployment = entry.run, entry.scope.deployment_ref
        answer = self.settler.complete(entry, output)
        entry.claims_next = self.may_claim_along(entry)
        if not entry.claims_next:
            self.slot_freed()
        try:
            with tracing.step("complete", deployment, run.run_id):
                completed = await answer
        except Exception as exc:
            # The database refused this one run's completion for its value (a data exception,
            # a program limit, a zeroth argument error): retrying cannot help. Anything else
            # (a cancelled statement, the completion machinery broke) may pass next time.
            refused = _refused(exc)
            refusal = describe(exc)
            log.warning("run %s: its completion failed (%s: %s); failing it", run.run_id,
                        refusal.type, refusal.message)
            self._worker_error("completion_refused" if refused else "completion_lost",
                               deployment)
            tracing.failed(span, refusal, "completion refused" if refused else "completion lost")
            await self.settler.fail(entry, refusal, retryable=not refused)
            return
        if completed:
            self._series[deployment][1].inc()
            # The acknowledgement, in the log: what a failover soak compares with what the new
            # primary holds (tests/failover).
            log.debug("run %s completed at generation %d", run.run_id, run.lease_generation)
            self._count_scope(self.metrics.scope_runs_completed, entry.scope)
            tracing.outcome(span, "completed")
        elif entry.outcome_unknown:  # refused or unanswered after a try with no answer
            tracing.failed(span, None, "outcome unknown")
            self.settler.unknown(entry)
        elif completed is False:
            tracing.failed(span, None, "lease lost")
            self.settler.lease_lost(entry, fenced=True)
        else:
            tracing.failed(span, None, "no answer before the lease deadline")

    def _after_sleep(self, entry: ActiveRun, span: Any) -> None:
        """The attempt ended in a durable sleep: nothing is written; its slot frees when its
        task ends."""
        slept = entry.ctx.slept
        if slept is not None and slept.outcome is SleepOutcome.CANCELLED:
            log.info("run %s cancelled on request instead of sleeping", entry.run.run_id)
            tracing.outcome(span, "cancelled")
            return
        self.metrics.runs_slept.labels(entry.scope.deployment_ref).inc()  # event waits too
        if slept is not None and slept.outcome is SleepOutcome.WAITING:
            log.info("run %s attempt %d waits for an event (deadline %s)", entry.run.run_id,
                     entry.ctx.attempt, slept.run_after)
        else:
            log.info("run %s attempt %d sleeps until %s", entry.run.run_id, entry.ctx.attempt,
                     None if slept is None else slept.run_after)
        tracing.outcome(span, "slept")


def scope_counter(enabled: Callable[[], bool]) -> Callable[[Counter, Scope], None]:
    """One more in a per-scope counter, while ``enabled()`` (``scope_metrics``; None labels:
    "")."""

    def count(counter: Counter, scope: Scope) -> None:
        if enabled():
            counter.labels(scope.deployment_ref, scope.tenant_id or "",
                           scope.workspace_id or "").inc()

    return count


def _refused(exc: Exception) -> bool:
    """The database refused the value itself (class 22, 54 or ZP, not retryable)."""
    return isinstance(exc, DatabaseError) and not isinstance(exc, RetryableError) and (
        (exc.code or getattr(exc, "sqlstate", None) or "")[:2] in ("22", "54", "ZP"))


def _interrupts_raise_here() -> bool:
    """SIGINT raises KeyboardInterrupt in this thread: Python's default handler is installed and
    this is the main thread (neither :meth:`RunWorker.run_until_stopped` nor ``asyncio.run``
    took SIGINT over), so a KeyboardInterrupt out of a handler may be the operator's Ctrl-C."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
