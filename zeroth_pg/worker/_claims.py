"""The claim loop: orphan sweeps, claims into the free slots, and the sleep between passes.

It is the only task that claims, so the slot accounting (:mod:`._slots`) needs no lock; what it
remembers between passes and every decision about when to claim is the :class:`~._pacing.
ClaimPacer`'s. The runs it claims are handed to ``spawn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zeroth_pg import tracing
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.types import ClaimedRun, Scope
from zeroth_pg.worker._ahead import MAX_CLAIM_BATCH
from zeroth_pg.worker._failures import FailureStreak
from zeroth_pg.worker._gate import WakeupGate
from zeroth_pg.worker._pacing import ClaimPacer, GateMode
from zeroth_pg.worker._run import ActiveRun, StopReason
from zeroth_pg.worker._settle import Leased
from zeroth_pg.worker._slots import HeldRuns
from zeroth_pg.worker._sources import Claimed, ClaimSource, OneScope

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["ClaimLoop", "ClaimSettings", "check_options"]

log = logging.getLogger("zeroth_pg.worker")

#: Hands a claimed run over: (scope, run, lease deadline, recovered from an orphan).
Spawn = Callable[[Scope, ClaimedRun, float, bool], ActiveRun]


@dataclass(frozen=True, slots=True)
class ClaimSettings:
    worker_id: str
    fleet_max_concurrency: int | None
    lease_duration: float
    poll_interval: float
    orphan_sweep_interval: float
    orphan_grace: float
    #: The deployment whose series count worker-wide events (the first served).
    deployment_ref: str


class ClaimLoop:
    """Claims until ``stopping()``; wakes on :attr:`wake`."""

    def __init__(self, settings: ClaimSettings, lm: LeaseManager, source: ClaimSource,
                 runs: HeldRuns, pacer: ClaimPacer, gate: WakeupGate, metrics: WorkerMetrics, *,
                 spawn: Spawn, stopping: Callable[[], bool],
                 worker_error: Callable[[str], None]) -> None:
        self.settings = settings
        self._lm = lm
        self.source = source
        self.runs = runs
        self.pacer = pacer
        self.gate = gate
        self.metrics = metrics
        self._spawn = spawn
        self._stopping = stopping
        self._worker_error = worker_error
        #: Set to claim now: a NOTIFY, a freed slot the pacer wants filled, a drain, a stripe of
        #: the wakeup gate gained by a call that answered late (_gate).
        self.wake = asyncio.Event()
        gate.wake = self.wake.set
        #: One traceback per streak of failed passes or sweeps, not one per retry.
        self.pass_failures = FailureStreak("claim pass", log)
        self.sweep_failures = FailureStreak("orphan sweep", log)
        #: The wake of timed-out waits that begins each sweep fails with it (a missing grant, a
        #: database that is down), and is tried again at each of the sweep's retries.
        self.wake_failures = FailureStreak("waking timed-out event waits", log)

    async def run(self) -> None:
        """Claim until stopping: orphans when a sweep is due, then pending runs in batches."""
        try:
            await self._claim_until_stopping()
        finally:
            # A streak's repeats are reported every 30 s or when it ends: the ones since the
            # last line would be lost with a worker stopped (or a loop crashed) meanwhile.
            for streak in (self.pass_failures, self.sweep_failures, self.wake_failures):
                streak.stopped()

    async def _claim_until_stopping(self) -> None:
        while not self._stopping():
            # Cleared before the pass, not before the sleep: a wakeup that arrives while the pass
            # is talking to the database must still cut the next sleep short.
            self.wake.clear()
            claimed: int | None = None
            try:
                claimed = await self._claim_pass()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = self.pacer.pass_failed(time.monotonic(), self.settings.poll_interval)
                self.pass_failures.failed(exc, delay)
                self._worker_error("claim")
            else:
                if claimed is not None:  # None: no claim was sent, so none answered
                    self.pass_failures.answered()
            if self._stopping():
                break
            mode = self.pacer.gate_mode(claimed, time.monotonic())
            if mode is GateMode.BUSY:
                # Writers need not notify this worker until it waits again.
                await self.gate.busy()
            elif mode is GateMode.FLOWING:
                # Writers need not notify while work flows; the worker looks again every few
                # milliseconds instead.
                await self.gate.flowing()
            elif await self.gate.idle():
                # Nothing (for a few looks in a row): this worker waits for work and holds the
                # wakeup gate; it gained a stripe, so a writer that did not notify has committed
                # since: look once more before sleeping.
                continue
            await self._sleep_until_work()

    async def _claim_pass(self) -> int | None:
        """Sweep if due, then claim into the free slots: how many runs were claimed, or None
        when no claim was made (no free slot, or stopping)."""
        pacer, settings = self.pacer, self.settings
        if pacer.sweep_wanted(time.monotonic()):
            try:
                swept = await self._sweep_orphans()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = pacer.sweep_failed(time.monotonic(), settings.orphan_sweep_interval)
                self.sweep_failures.failed(exc, delay, "claiming goes on")
                self._worker_error("sweep")
            else:
                # A sweep with no slot to re-lease into calls the database once per interval
                # only: not having called is not having answered (the streak goes on).
                if swept:
                    self.sweep_failures.answered()
        free = self.runs.free()
        if free <= 0 or self._stopping():
            pacer.answered()
            return None
        groups = self._groups(free)
        if not groups:
            pacer.nothing_to_claim_for()
            pacer.answered()
            return None
        claimed = asked = 0
        pacer.pass_begins()
        for deployments, limit in groups:
            limit = min(limit, free - claimed)
            if limit <= 0:
                break
            asked += limit
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            with self.runs.claiming(limit):
                result = await self.source.claim(settings.worker_id, limit,
                                                 settings.fleet_max_concurrency, deployments)
                tracing.received(result.runs, sent_ns)
                self.observe_saturation(result)
                for scope, run in result.runs:
                    self._spawn(scope, run, sent + settings.lease_duration, False)
            claimed += len(result.runs)
            if result.retry_after is not None:
                self.metrics.guardrail_rejections.labels(settings.deployment_ref,
                                                         "rate_limit").inc()
            pacer.claimed(time.monotonic(), deployments, limit, len(result.runs),
                          fleet_full=result.fleet_full, retry_after=result.retry_after,
                          all_held_back=result.all_held_back)
        pacer.pass_ends(claimed, asked)
        return claimed

    def _groups(self, free: int) -> list[tuple[tuple[str, ...] | None, int]]:
        executing = (self.runs.executing_by_deployment() if self.pacer.deployment_limits
                     else {})
        return self.pacer.groups(free, self.source.deployments, executing)

    async def _wake_due_waits(self) -> None:
        """Runs past their run deadline that nobody holds (waiting, sleeping) → failed, then event
        waits past their deadline → pending (``zeroth.wake_due_waits``), in every scope of this
        worker's deployments, before each orphan sweep: no waiting run outlives its run deadline
        by much more than a sweep interval, and the replayed wait_for_event records the timeout.
        A failure is logged; the next sweep tries again."""
        try:
            for _ in range(10):  # at most 1,000 a sweep; the next sweep takes the rest
                if await self._lm.wake_due_waits(self.source.deployments, batch_size=100) < 100:
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.wake_failures.failed(exc, None, "the next sweep tries again")
            self._worker_error("wake_due_waits")
        else:
            self.wake_failures.answered()

    async def _sweep_orphans(self) -> bool:
        """Wake the timed-out waits, then re-lease orphans (or only end them, with no free slot,
        once per interval): whether a sweep was sent (and answered)."""
        settings, pacer = self.settings, self.pacer
        await self._wake_due_waits()
        free = self.runs.free()
        groups = self._groups(free) if free > 0 else []
        if not groups:
            # No slot to re-lease into (none free, or every deployment at its local limit), but
            # the orphans nobody may resume (out of attempts, not resumable past grace) need
            # none: end them, so their threads move on while every worker is busy (claim_limit
            # 0: end only), once per sweep interval. Re-leasing waits for a free slot.
            if pacer.sweep_without_room(time.monotonic(), settings.orphan_sweep_interval):
                await self.source.sweep(settings.worker_id, 0, settings.fleet_max_concurrency,
                                        settings.orphan_grace)
                return True
            return False
        more = asked = False
        claimed = 0
        held_until: float | None = None
        # A deployment at its local limit is left out; its orphans wait for its next sweep.
        for deployments, limit in groups:
            limit = min(limit, free - claimed)
            if limit <= 0:
                break
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            with self.runs.claiming(limit):
                result = await self.source.sweep(settings.worker_id, limit,
                                                 settings.fleet_max_concurrency,
                                                 settings.orphan_grace, deployments)
            asked = True
            tracing.received(result.runs, sent_ns)
            self.observe_saturation(result)
            for scope, run in result.runs:
                log.info("recovered orphan %s at generation %d, attempt %d (checkpoint %s)",
                         run.run_id, run.lease_generation, run.attempts,
                         run.recovery_checkpoint_id)
                # Its worker stopped renewing while it ran: a crash as the fleet sees it.
                self.metrics.worker_crashes.labels(scope.deployment_ref, "orphan").inc()
                self._spawn(scope, run, sent + settings.lease_duration, True)
            claimed += len(result.runs)
            # Saturated, or the limit was reached: there may be more orphans; look again soon.
            more = more or result.saturated or len(result.runs) == limit
            if result.retry_after is not None:
                # Orphans held back by a rate limit: sweep again when a start is possible (a
                # claim pass sweeps before it claims, so the orphan takes that start before this
                # worker's pending runs do), not a whole sweep interval later, by when claimers
                # sleeping until the same instant have taken every start.
                held = time.monotonic() + result.retry_after
                held_until = held if held_until is None else min(held_until, held)
        pacer.swept(time.monotonic(), settings.orphan_sweep_interval, more=more,
                    held_until=held_until)
        return asked

    def observe_saturation(self, result: Claimed) -> None:
        deployment = self.settings.deployment_ref
        if result.limit is not None:  # one scope: its utilisation
            self.metrics.utilization.labels(deployment, "concurrency").set(
                min(1.0, result.active_count / result.limit))
        if result.saturated:
            self.metrics.guardrail_rejections.labels(deployment, "concurrency").inc()

    async def _sleep_until_work(self) -> None:
        now = time.monotonic()
        if self.pacer.claim_at_once(self.runs.free(), self.runs.executing_by_deployment):
            return  # the last batch was full and a slot is already free: claim again now
        timeout = self.pacer.sleep_for(now, self.gate.poll_in(self.settings.poll_interval))
        # One event: a NOTIFY sets it, and so does a freed slot while a full batch or an orphan
        # sweep is waiting for one (slot_freed). No helper tasks: a wakeup resumes this loop in
        # the next turn of the event loop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.wake.wait()

    def slot_freed(self, *, fleet: bool = False) -> None:
        """A local slot was freed; with ``fleet``, the run's admission slot too (the run left
        the worker: its completion, failure or hand-back was answered)."""
        if self.pacer.slot_freed_wakes(fleet=fleet):
            self.wake.set()

    def rate_held(self) -> bool:
        """All the work this worker can see is held back by a rate limit: a NOTIFY now cannot
        announce anything claimable before then."""
        return self.pacer.rate_held(time.monotonic())

    async def sample_queue_depth(self, interval: float) -> None:
        """The ``zeroth_queue_depth`` gauge of each deployment served, every ``interval``."""
        while True:
            try:
                # Per deployment served, summed over the scopes served (one statement).
                for deployment, depth in (await self.source.queue_depth()).items():
                    self.metrics.queue_depth.labels(deployment).set(depth)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("queue depth sample failed: %s", exc)
            await asyncio.sleep(interval)

    # -- completions that carry the next claim ---------------------------------------------------

    def may_claim_along(self, entry: ActiveRun) -> bool:
        """The completion of ``entry`` may carry the claim of the next run into its slot: one
        commit for both (complete_and_claim). Only where a claim pass would do nothing else:
        one scope, no local deployment limits, no orphan sweep due (a claim pass sweeps first),
        no rate limit holding claims back, not stopping."""
        source = self.source
        return (isinstance(source, OneScope) and entry.scope == source.scope
                and not self._stopping() and not self.pacer.deployment_limits
                and self.pacer.may_claim_along(time.monotonic()))

    async def complete_and_claim(self, batch: list[tuple[Leased, Any]]) -> list[bool] | None:
        """The claim_along of the completion batcher: complete ``batch`` and claim one run per
        entry that carries a claim, in one call; the claimed runs start here. The flags are
        cleared whatever happens, so a failed call gives the slots back to the claim loop."""
        along = [entry for entry, _ in batch if entry.claims_next]
        source, settings = self.source, self.settings
        full = False
        try:
            if not along or self._stopping() or not isinstance(source, OneScope):
                return None
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            wanted = len(along)
            if self.runs.ahead_gate is not None:
                # A worker that claims ahead fills the room the completions free plus what
                # free() has besides (the runs ahead it may hold now): more than one run per
                # completion while its handlers are short, fewer when it holds more than it may
                # (runs waiting, claimed ahead before a handler turned long): the slot a
                # completion frees went to a waiting run. An entry of the batch no longer held
                # (its lease gone, or stopped and past its deadline) has its room counted by
                # free() already.
                held = {id(e) for e in self.runs.held()}
                wanted = max(0, min(len(along) + self.runs.free()
                                    - sum(isinstance(e, ActiveRun) and id(e) not in held
                                          for e in along), MAX_CLAIM_BATCH))
                if not wanted:
                    return None
            top_up = max(0, wanted - len(along))
            with self.runs.claiming(top_up):
                completions, result = await source.complete_and_claim(
                    settings.worker_id,
                    [(entry.run.run_id, entry.run.lease_generation, output)
                     for entry, output in batch],
                    wanted, settings.fleet_max_concurrency)
                tracing.received(result.runs, sent_ns)
                self.observe_saturation(result)
                for scope, run in result.runs:
                    spawned = self._spawn(scope, run, sent + settings.lease_duration, False)
                    if self._stopping():
                        # The drain began while this call was out: never start these; each is
                        # handed back with its exact generation.
                        spawned.stop(StopReason.SHUTDOWN)
            for entry in along[:len(result.runs)]:
                if isinstance(entry, ActiveRun):
                    entry.slot_passed_on = True
            full = len(result.runs) == wanted and result.retry_after is None
            return [row.completed for row in completions]
        finally:
            for entry in along:
                entry.claims_next = False
            if along and not full:
                # The claim came back short (no more work, a limit, a rate limit) or was not
                # made: the claim loop takes over, so the wakeup gate, the rate-limit sleep and
                # the saturation flags follow a claim pass of its own, as without this call.
                self.wake.set()


#: What a code version may be (zeroth._check_code_version): 1 to 128 characters, a letter or digit
#: first, then letters, digits and . _ - + : /.
CODE_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:/-]{0,127}")


def check_code_version(code_version: str | None) -> str | None:
    """A RunWorker's ``code_version`` (issue 34), checked before anything is built: None
    (unversioned) or what :data:`CODE_VERSION` matches, else ValueError."""
    if code_version is not None and (not isinstance(code_version, str)
                                     or CODE_VERSION.fullmatch(code_version) is None):
        raise ValueError("code_version must be None or 1 to 128 characters: a letter or digit, "
                         "then letters, digits and . _ - + : /")
    return code_version


#: The longest worker id the SQL API takes (zeroth._require_identifier).
MAX_WORKER_ID = 200


def check_worker_id(worker_id: str | None) -> str | None:
    """A RunWorker's ``worker_id``, checked before anything is built: None (a random one) or
    1 to :data:`MAX_WORKER_ID` characters that a PostgreSQL text can hold (no NUL; valid
    UTF-8: a non-UTF-8 ``--worker-id`` reaches Python as lone surrogates), else ValueError —
    every claim of a worker with any other would be refused (ZP008, or 22021 / an encoding
    error), and an empty one is not "no id"."""
    if worker_id is not None and (not isinstance(worker_id, str)
                                  or not 1 <= len(worker_id) <= MAX_WORKER_ID):
        raise ValueError(f"worker_id must be None (a random id) or 1 to {MAX_WORKER_ID} "
                         "characters")
    if worker_id is not None and ("\x00" in worker_id or not _utf8(worker_id)):
        raise ValueError(f"worker_id must be 1 to {MAX_WORKER_ID} characters of valid UTF-8, "
                         "no NUL")
    return worker_id


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_options(max_concurrency: int, poll_interval: float, orphan_sweep_interval: float,
                  lease_duration: float, renew_fraction: float,
                  call_timeout: float | None = None, worker_id: str | None = None) -> None:
    """A RunWorker's slots, timing and id (:func:`check_worker_id`), checked before anything
    is built."""
    check_worker_id(worker_id)
    if call_timeout is not None and not call_timeout > 0:
        raise ValueError("call_timeout must be None or > 0 seconds")
    if max_concurrency < 1:
        raise ValueError("max_concurrency must be at least 1")
    if poll_interval <= 0 or orphan_sweep_interval <= 0:
        raise ValueError("poll_interval and orphan_sweep_interval must be > 0")
    if lease_duration <= 0 or not 0 < renew_fraction < 1:
        raise ValueError("lease_duration must be > 0 and renew_fraction in (0, 1)")
