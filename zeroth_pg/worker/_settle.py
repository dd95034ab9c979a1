"""Settling: every outcome of an attempt written with one retry policy.

:class:`Settler` writes what the worker decided (:mod:`._outcome`): a completion, a failure (with
its error document, or a minimal one when the database refuses it), a cancel, a hand-back to
pending, a release. Every outcome but a release is queued to the :class:`CompletionBatcher`,
which sends the outcomes of runs that ended together as one ``settle_runs`` call (each row fenced
on its own; one call per scope and, for retries, per retry policy, as settle_runs takes one
policy), never waiting to fill a batch, with up to :data:`MAX_IN_FLIGHT` calls out at once. A
batch of completions that carries the next claim goes
out as ``complete_and_claim`` (one commit for both). A release is one ``release_lease`` call
(settle_runs has no release). Every write retries transient failures on the same
:class:`Backoff` until the lease deadline known when it began, and then gives up (the lease
expires and an orphan sweep recovers the run). A value PostgreSQL cannot store (an output, an
error document) fails that run's write and never its batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Counter

from zeroth_pg.errors import (
    ConnectionLostError,
    ErrorDescription,
    RetryableError,
    ZerothError,
    bounded_text,
    describe,
)
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.types import (
    ClaimedRun,
    RetryPolicy,
    RunSettled,
    Scope,
    SettleKind,
    Settlement,
    SettleOutcome,
)
from zeroth_pg.worker._failures import FailureStreak
from zeroth_pg.worker._run import ActiveRun, RunState, StopReason

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["Backoff", "ClaimAlong", "CompletionBatcher", "Leased", "Settler"]

log = logging.getLogger("zeroth_pg.worker")

#: Runs per settle_runs call at most.
MAX_BATCH = 1000

#: Settling calls out at once. With one, a run that ends while a call is out waits for that
#: call's answer and then for its own: at 4 slots, a large share of each run's cycle
#: (issue 30, the deep-queue cells). A second call goes out at once with what queued; a third
#: waits, so under load the batches still grow.
MAX_IN_FLIGHT = 2


class Leased(Protocol):
    """A run under a lease: :class:`zeroth_pg.worker._run.ActiveRun` is one."""

    @property
    def run(self) -> ClaimedRun: ...

    @property
    def deadline(self) -> float:
        """Monotonic instant before which the lease is known to be live."""
        ...

    @property
    def scope(self) -> Scope:
        """Where the run lives (settle_runs is called per tenant and workspace)."""
        ...

    #: Its completion carries a claim into the slot it frees (see :data:`ClaimAlong`).
    claims_next: bool
    #: Set by the batcher: a write of its outcome got no answer (a lost connection, the call
    #: bound) and no later try could confirm it, so whether it landed is unknown (a refused
    #: repeat most likely means it did). Counted as such, never as a lost lease.
    outcome_unknown: bool


#: Sends a batch's completions together with a claim into the slots of those entries whose
#: ``claims_next`` is set (``complete_and_claim``), hands the claimed runs over, and clears
#: those flags whatever happens: one completed-or-not per entry, in order, or None when no
#: claim can go out now (then, as on an error, the batch is completed the plain way).
ClaimAlong = Callable[[list[tuple[Leased, Any]]], Awaitable[list[bool] | None]]


@dataclass
class Backoff:
    """The one retry policy of the worker's transient failures: a settling write is retried
    after 50 ms, doubling up to 1 s, while the lease is known to be live (and a starting
    worker's first connection and schedules for STARTUP_SECONDS, ._startup)."""

    delay: float = 0.05

    def gives_up(self, give_up_at: float) -> bool:
        """The next retry would come at or after ``give_up_at``."""
        return time.monotonic() + self.delay >= give_up_at

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(1.0, self.delay * 2)


@dataclass
class _Completion:
    """One run's outcome waiting in the batcher (a completion, or any other settle_runs kind)."""

    entry: Leased
    output: Any
    # A completion: True completed, False refused by the fence, None no answer before the lease
    # deadline. Another kind: the SettleOutcome, or None (refused, or no answer). An exception
    # when the database refused this run's write itself (a value it cannot store).
    result: asyncio.Future[Any]
    # Retries stop here: the lease deadline known when the completion was submitted. Not the
    # entry's own deadline, which its renewals keep moving: a completion that can never land
    # was retried for ever while the lease stayed alive.
    give_up_at: float
    kind: SettleKind = SettleKind.COMPLETE
    # A retry's policy (None: the deployment's registered one); one per settle_runs call.
    policy: RetryPolicy | None = None
    # A try of it lost its connection (CallTimeoutError included) after it may have been sent:
    # it may have committed, so a refusal of a later try says nothing about the lease.
    unanswered: bool = False

    def settlement(self) -> Settlement:
        run = self.entry.run
        if self.kind is SettleKind.COMPLETE:
            return Settlement(run.run_id, run.lease_generation, self.kind, output=self.output)
        if self.kind in (SettleKind.RETRY, SettleKind.FAIL):
            return Settlement(run.run_id, run.lease_generation, self.kind, error=self.output)
        return Settlement(run.run_id, run.lease_generation, self.kind)

    def answer(self, row: RunSettled) -> None:
        if self.unanswered and not row.settled:
            self.entry.outcome_unknown = True
        _settle(self.result, row.settled if self.kind is SettleKind.COMPLETE else row.outcome)

    def no_answer(self) -> None:
        """Given up before the lease deadline: unanswered for good."""
        if self.unanswered:
            self.entry.outcome_unknown = True
        _settle(self.result, None)


class CompletionBatcher:
    """Queues the outcomes of runs and sends them in batches (``settle_runs``) from
    :meth:`run`."""

    def __init__(
        self,
        lease_manager: LeaseManager,
        worker_id: str,
        *,
        others_may_join: Callable[[], bool] = lambda: False,
        on_batch_refused: Callable[[], None] = lambda: None,
        on_retry: Callable[[], None] = lambda: None,
        claim_along: ClaimAlong | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        """``others_may_join``: True when a handler could finish in this same turn of the event
        loop (one more turn is worth waiting); ``on_batch_refused``: counts a batch the database
        refused as a whole (then completed run by run); ``on_retry``: counts a call that failed
        transiently and is tried again; ``claim_along``: sends a batch that
        carries claims (one commit for both), tried once before the plain path;
        ``max_in_flight``: calls out at once (:data:`MAX_IN_FLIGHT`)."""
        self.max_in_flight = MAX_IN_FLIGHT if max_in_flight is None else max_in_flight
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._claim_along = claim_along
        self.lease_manager = lease_manager
        self.worker_id = worker_id
        self._others_may_join = others_may_join
        self._on_batch_refused = on_batch_refused
        self._on_retry = on_retry
        self._queue: list[_Completion] = []
        self._queued = asyncio.Event()
        # Single completions split off a batch that met a held row: they retry on their own,
        # so the loop goes on with the next batch instead of waiting behind one busy row.
        self._retrying: dict[asyncio.Task[None], _Completion] = {}

    def submit(self, entry: Leased, output: Any) -> asyncio.Future[bool | None]:
        """Queue ``entry``'s completion; the future answers True completed, False refused by
        the fence, None no answer before the lease deadline (or raises what refused it)."""
        completion = _Completion(entry, output, asyncio.get_running_loop().create_future(),
                                 entry.deadline)
        self._queue.append(completion)
        self._queued.set()
        return completion.result

    async def complete(self, entry: Leased, output: Any) -> bool | None:
        """:meth:`submit`, and wait for the answer."""
        return await self.submit(entry, output)

    def submit_outcome(self, entry: Leased, kind: SettleKind, *, error: Any = None,
                       policy: RetryPolicy | None = None) -> asyncio.Future[SettleOutcome | None]:
        """Queue another outcome than a completion (``error``: the document of a retry or a
        fail; ``policy``: a retry's backoff, None the registered one); the future answers the
        outcome settled, None when refused or unanswered before the lease deadline (or raises
        what refused this one run's write, such as an error document the database cannot
        hold)."""
        completion = _Completion(entry, error, asyncio.get_running_loop().create_future(),
                                 entry.deadline, kind,
                                 policy if kind is SettleKind.RETRY else None)
        self._queue.append(completion)
        self._queued.set()
        return completion.result

    async def run(self) -> None:
        """Send the queued completions until cancelled: a batch goes out as soon as one is
        queued and fewer than :attr:`max_in_flight` calls are out; what queues meanwhile is the
        next batch. A batch's call that raises (a bug: _send answers every failure it knows)
        ends the loop with that error, as with one call out at a time, so the worker's loop
        supervision sees it."""
        in_flight: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []

        def ended(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            if not task.cancelled() and (error := task.exception()) is not None:
                failed.append(error)
                self._queued.set()  # wake the loop to raise it

        try:
            while True:
                await self._queued.wait()
                if failed:
                    raise failed[0]
                if len(in_flight) >= self.max_in_flight:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if self._others_may_join():
                    # Handlers that finish in this same turn of the event loop join the batch.
                    await asyncio.sleep(0)
                self._queued.clear()
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                if self._queue:
                    self._queued.set()
                if self.max_in_flight == 1:
                    await self._send_batch(batch)
                    continue
                task = asyncio.create_task(self._send_batch(batch))
                in_flight.add(task)
                task.add_done_callback(ended)
        finally:
            for task in in_flight:
                task.cancel()
            if in_flight:  # each answers its batch on its way out (_send_batch)
                await asyncio.wait(in_flight)
            self._stop_retrying()

    async def _send_batch(self, batch: list[_Completion]) -> None:
        try:
            # settle_runs is scoped and takes one retry policy: one call per (tenant,
            # workspace, policy of its retries) of the batch.
            for group in _by_scope(batch):
                await self._send(group)
        finally:
            # Whatever happened, no run task is left waiting for an answer that never comes
            # (the ones retrying on their own are answered there, or at exit).
            retrying = {id(c) for c in self._retrying.values()}
            for completion in batch:
                if not completion.result.done() and id(completion) not in retrying:
                    completion.result.set_exception(
                        RuntimeError("the completion loop stopped before answering"))

    def _stop_retrying(self) -> None:
        for task, completion in list(self._retrying.items()):
            task.cancel()
            _settle(completion.result, None)  # no answer: the lease expires, the run is re-run
        self._retrying.clear()

    async def _send(self, batch: list[_Completion], *, on_its_own: bool = False) -> None:
        """One settle_runs call for the batch, retried on transient failures while some
        run's lease is still known to be live; a run past its deadline gets None. When the
        database refuses the batch itself, each run is settled on its own, so one bad value
        fails its run's write and never the others. The retries of this batch are a streak of
        its own (:class:`FailureStreak`: a WARNING line when it begins, a line of repeats at
        most every 30 s, an INFO line when the batch is answered), each counted
        (``on_retry``): never silent while its runs wait, and never mixed with the batches in
        flight beside it."""
        if self._claim_along is not None and not on_its_own:
            complete = SettleKind.COMPLETE  # once, not per completion (not free on 3.11)
            completions = [c for c in batch if c.kind is complete]
            if (any(c.entry.claims_next for c in completions)
                    and await self._send_with_claims(completions)):
                batch = [c for c in batch if c.kind is not complete]
        backoff = Backoff()
        scope = batch[0].entry.scope if batch else None
        policy = next((c.policy for c in batch if c.kind is SettleKind.RETRY), None)
        streak: FailureStreak | None = None  # made at the batch's first transient failure
        try:
            while batch:
                assert scope is not None
                try:
                    rows = await self.lease_manager.settle_runs(
                        self.worker_id, [c.settlement() for c in batch],
                        retry_base_seconds=None if policy is None else policy.base_seconds,
                        retry_max_seconds=None if policy is None else policy.max_seconds,
                        tenant_id=scope.tenant_id, workspace_id=scope.workspace_id)
                except RetryableError as exc:
                    if isinstance(exc, ConnectionLostError):
                        # It may have committed before its connection was lost.
                        for completion in batch:
                            completion.unanswered = True
                    held = getattr(exc, "code", None) == "55P03"
                    if held and not on_its_own:
                        # A run's row is held by another session (settle_runs waits 2 s for a
                        # row): each run of the batch retries on its own, so only that run
                        # waits, and the loop goes on with later completions.
                        log.warning("settle_runs waited for a row another session holds; "
                                    "the batch of %d retries run by run", len(batch))
                        self._on_retry()
                        for completion in batch:
                            task = asyncio.create_task(self._send([completion], on_its_own=True))
                            self._retrying[task] = completion
                            task.add_done_callback(lambda done: self._retrying.pop(done, None))
                        return
                    giving_up = [c for c in batch if backoff.gives_up(c.give_up_at)]
                    if streak is not None and len(giving_up) == len(batch):
                        streak.stopped()  # its repeats, before the lines that end them
                        streak = None
                    for completion in giving_up:
                        log.error("run %s: giving up its %s after %s; the lease will expire",
                                  completion.entry.run.run_id, completion.kind.value, exc)
                        completion.no_answer()
                    batch = [c for c in batch if not c.result.done()]
                    if batch:
                        self._on_retry()
                        if not held:  # (a held row split off its batch was said there)
                            streak = streak or _retry_streak(batch)
                            streak.failed(exc, backoff.delay, "its leases are live")
                        await backoff.wait()
                    continue
                except Exception as exc:
                    if streak is not None:
                        streak.answered()  # with a refusal, said below
                        streak = None
                    if len(batch) == 1:
                        if not batch[0].result.done():  # its waiter may have been cancelled
                            batch[0].result.set_exception(exc)
                        return
                    log.warning("settle_runs refused a batch of %d (%s: %s); settling them one "
                                "by one", len(batch), type(exc).__name__, exc)
                    self._on_batch_refused()
                    for completion in batch:
                        await self._send([completion])
                    return
                if streak is not None:
                    streak.answered()
                    streak = None
                for completion, row in zip(batch, rows, strict=True):
                    completion.answer(row)
                return
        finally:
            if streak is not None:
                streak.stopped()  # its repeats not reported yet are

    async def _send_with_claims(self, batch: list[_Completion]) -> bool:
        """One try of the batch's completions with its claims: True when it was answered. Any
        failure leaves them to the plain path (settle_runs, with its retries and its run-by-run
        fallback), and the claim to the claim loop: the call was one transaction, so nothing of
        it stands."""
        assert self._claim_along is not None
        try:
            completed = await self._claim_along([(c.entry, c.output) for c in batch])
        except Exception as exc:
            log.info("complete_and_claim failed (%s: %s); completing the batch of %d without "
                     "a claim", type(exc).__name__, exc, len(batch))
            if isinstance(exc, ConnectionLostError):
                # Its commit may have happened (then the plain path's repeat is refused).
                for completion in batch:
                    completion.unanswered = True
            return False
        if completed is None:
            return False
        for completion, done in zip(batch, completed, strict=True):
            _settle(completion.result, done)
        return True


def _by_scope(batch: list[_Completion]) -> list[list[_Completion]]:
    """The batch split by (tenant, workspace) and, for its retries, by retry policy (settle_runs
    takes one), each group in the batch's order, the groups in order of first appearance. The
    other outcomes join the group of their scope's first retry policy: a batch whose retries
    share one policy is one call per scope."""
    retry = SettleKind.RETRY  # an enum member's lookup costs a few hundred ns on Python 3.11
    if batch:
        # The common batch (a worker of one scope: every entry shares its Scope object) with no
        # retry in it is one group, found in one pass.
        first = batch[0].entry.scope
        if all(c.kind is not retry and c.entry.scope is first for c in batch):
            return [batch]
    home: dict[tuple[str, str | None], RetryPolicy | None] = {}
    for completion in batch:
        scope = completion.entry.scope
        if completion.kind is retry:
            home.setdefault((scope.tenant_id, scope.workspace_id), completion.policy)
    groups: dict[tuple[str, str | None, RetryPolicy | None], list[_Completion]] = {}
    for completion in batch:
        where = (completion.entry.scope.tenant_id, completion.entry.scope.workspace_id)
        policy = completion.policy if completion.kind is retry else home.get(where)
        groups.setdefault((*where, policy), []).append(completion)
    return list(groups.values())


def _retry_streak(batch: list[_Completion]) -> FailureStreak:
    """The failures of one settling batch's retries, named by its first run (a WARNING when
    they begin: one retried failure is expected now and then, a deadlock say)."""
    first, more = batch[0], len(batch) - 1
    return FailureStreak(
        f"settle_runs (run {first.entry.run.run_id}'s {first.kind.value}"
        f"{f' and {more} more run' + ('' if more == 1 else 's') if more else ''})",
        log, first_level=logging.WARNING)


def _settle(result: asyncio.Future[Any], value: Any) -> None:
    """Answer a waiting run task, unless it is gone (its task was cancelled with the loop)."""
    if not result.done():
        result.set_result(value)


#: zeroth_runs_failed's outcome label of each failure outcome (a fixed set of three).
_FAILED_LABELS = {SettleOutcome.RETRY_SCHEDULED: "retried", SettleOutcome.FAILED: "failed",
                  SettleOutcome.DEAD_LETTERED: "dead_lettered"}


class Settler:
    """Writes the outcome of each attempt, fenced by its exact lease, and counts what the
    database answered (failed, dead-lettered, lease lost)."""

    def __init__(self, lm: LeaseManager, worker_id: str, metrics: WorkerMetrics,
                 retries: Mapping[str, RetryPolicy | None], *,
                 count_scope: Callable[[Counter, Scope], None],
                 completions: CompletionBatcher) -> None:
        self.lease_manager = lm
        self.worker_id = worker_id
        self.metrics = metrics
        self._retries = retries
        self._count_scope = count_scope
        self.completions = completions

    def complete(self, entry: ActiveRun, output: Any) -> asyncio.Future[bool | None]:
        """Queue the run's completion for the next settle_runs call; the future answers True
        completed, False refused by the fence, None no answer before the lease deadline (or
        raises what refused this one run's completion)."""
        entry.advance(RunState.COMPLETING)
        return self.completions.submit(entry, output)

    async def stopped(self, entry: ActiveRun) -> None:
        """The outcome of a run stopped before its handler finished, by the stop's reason."""
        run, lm = entry.run, self.lease_manager
        reason = entry.stop_reason
        entry.advance(RunState.SETTLING)
        if reason is StopReason.CANCEL:
            if await self.completions.submit_outcome(entry, SettleKind.CANCEL) is not None:
                log.info("run %s cancelled on request", run.run_id)
            else:
                self.lease_lost(entry, fenced=True)
        elif reason in (StopReason.SHUTDOWN, StopReason.NO_SLOT):
            # Every claimed run is running (claim_and_start), started handler or not: the
            # hand-back gives its attempt back.
            handed = await self.completions.submit_outcome(entry, SettleKind.HAND_BACK)
            if handed == SettleOutcome.DEAD_LETTERED:
                # Its hand-backs were spent (this worker's or others'): the database ended it.
                self._count_failure(entry, handed)
                log.warning("run %s dead-lettered by its hand-back: its hand-backs are spent",
                            run.run_id)
            else:
                log.info("run %s handed back to pending: %s", run.run_id, handed is not None)
            if handed is None:
                self.lease_lost(entry, fenced=True)
        elif reason is StopReason.TIMEOUT:
            # The attempt's deadline: the database retries it (backoff, max_attempts) or, past
            # the run's deadline, fails it for good. Refused (the lease lapsed first): the
            # orphan sweep ends it the same way.
            settled = await self.completions.submit_outcome(entry, SettleKind.TIMEOUT)
            if settled is not None:
                self._count_failure(entry, settled)
                log.info("run %s stopped at its deadline: %s", run.run_id, settled.value)
            else:
                self.lease_lost(entry, fenced=True)
        elif reason is StopReason.INTERRUPT:
            # settle_runs has no release: one release_lease call.
            await self._write(entry, self._fenced(entry, lm.release_lease))
        else:  # the lease is gone: nothing may be written
            self.lease_lost(entry, fenced=False)

    async def fail(self, entry: ActiveRun, exc: BaseException | ErrorDescription, *,
                   retryable: bool) -> None:
        """Write the attempt's failure with its error document (``exc`` bounded by
        :func:`~zeroth_pg.errors.describe`, unless described already)."""
        run = entry.run
        # Described before the state moves: nothing about the exception may raise past here.
        described = exc if isinstance(exc, ErrorDescription) else describe(exc)
        error = described.document(worker_id=self.worker_id,
                                   lease_generation=run.lease_generation)
        retry = self._retries[entry.scope.deployment_ref]
        kind = SettleKind.RETRY if retryable else SettleKind.FAIL
        entry.advance(RunState.SETTLING)
        try:
            outcome = await self.completions.submit_outcome(entry, kind, error=error,
                                                            policy=retry)
        except ZerothError as refused:  # never a RetryableError: the batcher retries those
            # The document itself was refused (above the database's bound, a value it cannot
            # hold): the same call would be refused every time, and a run left to its lease
            # would be charged an attempt by every recovery. A minimal document instead.
            why = describe(refused)
            code = getattr(refused, "code", None) or refused.sqlstate
            log.warning("run %s: the database refused its error document (%s: %s); writing a "
                        "shorter one", run.run_id, why.type, why.message)
            outcome = await self.completions.submit_outcome(entry, kind, policy=retry, error={
                "type": bounded_text(described.type, 200),
                "message": bounded_text(described.message, 1000),
                "refused": bounded_text(f"{why.type} ({code}): {why.message}", 1000),
                "worker_id": self.worker_id, "lease_generation": run.lease_generation})
        if outcome is None:
            self.lease_lost(entry, fenced=True)
            return
        self._count_failure(entry, outcome)
        if outcome == SettleOutcome.DEAD_LETTERED:
            log.warning("run %s dead-lettered after %d attempts", run.run_id, entry.ctx.attempt)

    def _count_failure(self, entry: ActiveRun, outcome: SettleOutcome) -> None:
        """An attempt's failure the database answered for this worker (a failure it wrote, its
        timeout, a hand-back with the run's hand-backs spent), by outcome: retried, failed or
        dead-lettered; a dead letter in zeroth_runs_dead_lettered too, which counts the same
        runs as outcome="dead_lettered". (The orphan sweep's ends are no worker's attempt.)"""
        deployment = entry.scope.deployment_ref
        self._count_scope(self.metrics.scope_runs_failed, entry.scope)
        self.metrics.runs_failed.labels(deployment, _FAILED_LABELS.get(outcome, "failed")).inc()
        if outcome == SettleOutcome.DEAD_LETTERED:
            self.metrics.runs_dead_lettered.labels(deployment).inc()

    async def fail_quietly(self, entry: ActiveRun, exc: BaseException) -> None:
        """Last resort after a worker error: a retryable failure with a minimal error document
        (the deployment's registered retry policy). If even that cannot be written, the lease
        expires and claim_orphaned recovers the run, counting the attempt, so a worker bug that
        always hits ends in a dead letter."""
        if not entry.may_settle:
            return
        entry.advance(RunState.SETTLING)
        described = describe(exc)
        try:
            await self.completions.submit_outcome(entry, SettleKind.RETRY, error={
                "type": "WorkerError",
                "message": bounded_text(f"{described.type}: {described.message}", 1000),
                "worker_id": self.worker_id})
        except Exception as broken:
            log.error("run %s: could not record the worker error; its lease will expire\n%s",
                      entry.run.run_id, describe(broken).traceback)

    def lease_lost(self, entry: ActiveRun, *, fenced: bool) -> None:
        """Nothing more is written for ``entry``: count it and say why. A refusal that follows
        a try with no answer is not a lost lease but an unknown outcome (:meth:`unknown`)."""
        if entry.outcome_unknown:
            self.unknown(entry)
            return
        deployment = entry.scope.deployment_ref
        self.metrics.lease_lost.labels(deployment).inc()
        if fenced:
            self.metrics.fencing_rejected.labels(deployment).inc()
        log.warning("run %s: lease generation %d lost (%s); nothing more is written",
                    entry.run.run_id, entry.run.lease_generation,
                    "write refused" if fenced or entry.stop_reason is None
                    else entry.stop_reason.value)

    def unknown(self, entry: ActiveRun) -> None:
        """A write of ``entry``'s outcome got no answer (the call bound, a lost connection) and
        no later try confirmed it: most likely the first landed (a repeat the fence refused),
        else the lease runs out and the run is recovered. The database holds one outcome
        either way; counted apart from lost leases (``zeroth_outcomes_unknown``)."""
        self.metrics.outcomes_unknown.labels(entry.scope.deployment_ref).inc()
        log.warning("run %s: generation %d's outcome got no answer in time and was not "
                    "confirmed by a repeat: whether it landed is unknown (the database holds "
                    "one outcome); nothing more is written", entry.run.run_id,
                    entry.run.lease_generation)

    def _fenced(self, entry: ActiveRun, method: Callable[..., Awaitable[Any]],
                **extra: Any) -> Callable[[], Awaitable[Any]]:
        """A repeatable call of a LeaseManager write carrying this run's exact lease."""
        run, scope = entry.run, entry.scope
        return lambda: method(run.run_id, self.worker_id, generation=run.lease_generation,
                              tenant_id=scope.tenant_id, workspace_id=scope.workspace_id, **extra)

    async def _write(self, entry: ActiveRun, call: Callable[[], Awaitable[Any]]) -> Any:
        """Make one fenced write, retried on the :class:`Backoff` until the lease deadline known
        when it began (a settling run's lease is no longer renewed).

        Returns the call's result, or None when the deadline passed without an answer (the lease
        then expires by itself and the run is recovered elsewhere).
        """
        backoff, give_up_at = Backoff(), entry.deadline
        while True:
            try:
                return await call()
            except RetryableError as exc:
                if backoff.gives_up(give_up_at):
                    log.error("run %s: giving up a write after %s; the lease will expire",
                              entry.run.run_id, exc)
                    return None
                await backoff.wait()
