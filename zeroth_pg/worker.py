"""RunWorker: claims runs, executes a handler under a renewed lease, recovers orphans, drains.

One worker is a handful of asyncio tasks around the SQL functions:

* the **claim loop** (:meth:`RunWorker.poll_loop`) claims *and starts* pending runs in batches
  up to the free local slots (``claim_and_start``: one round trip per batch), sweeps for orphans
  on start and every ``orphan_sweep_interval`` (``claim_orphaned``, which also ends the orphans
  nobody may resume), and sleeps until a NOTIFY, a freed slot after a full batch, or
  ``poll_interval``. It is the only task that claims, so local slot accounting needs no lock; a
  wakeup only sets an event and never blocks. A failing sweep is logged and claiming goes on;
* one **renewal task** renews every lease of the worker with one ``renew_leases`` call every
  ``lease_duration / 3``, and at once when a ``zeroth_control`` notification carries this
  worker's key. A refused renewal stops that run's handler at once and nothing more is written
  for it; a renewal that reports ``cancel_requested`` stops it as cancelled. The database is the
  only source of a stop: a notification (which anyone can send) only makes the worker ask. A
  renewal that *fails* (connection lost) is retried until the last confirmed lease deadline,
  measured on the local monotonic clock from the moment the confirmed call was sent; past it the
  handler is stopped (fail-stop). The run is neither failed nor released: its lease simply
  expires, so it is never stranded and claim_orphaned recovers it;
* the **notifier** (:class:`zeroth_pg.notify.Notifier`) turns NOTIFYs that carry this worker's
  opaque keys into "poll now" and "renew now", and triggers a claim pass after every reconnect;
* one task per run executes ``handler(ctx)``: a returned value completes the run, an exception
  fails it (retry with backoff until ``max_attempts``, then dead letter). Its lifecycle is
  :class:`RunState`, its transitions in :meth:`_Active.advance`;
* one **completion task** sends the completions of runs that finished together as one
  ``complete_runs`` call (each row fenced on its own). It never waits to fill a batch: it sends
  what has queued up by the time the previous call came back, so a lone run is acknowledged as
  fast as with ``complete_run`` and a burst takes one round trip instead of one per run. An
  output PostgreSQL cannot store fails that run (not retryable) and never its batch.

Every background task is supervised: a crash is logged, counted (``zeroth_worker_errors``) and
the task restarted. Every path that stops a run ends in a fenced outcome (completed, failed,
cancelled, handed back) or leaves a lease that expires by itself; none drops a run silently.
Every write for a run carries its lease generation and is fenced in SQL; the worker keeps no
state that safety depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import importlib
import json
import logging
import os
import re
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

import asyncpg

from zeroth_pg.client import LeaseManager, unstorable
from zeroth_pg.errors import DatabaseError, LeaseLostError, RetryableError
from zeroth_pg.metrics import WorkerMetrics, default_metrics
from zeroth_pg.notify import CONTROL_CHANNEL, WAKEUP_CHANNEL, Notifier
from zeroth_pg.types import ClaimedRun, FailOutcome

__all__ = [
    "Handler",
    "RunContext",
    "RunState",
    "RunWorker",
    "StopReason",
    "main",
    "orchestrator_handler",
    "skip_reset",
]

log = logging.getLogger("zeroth_pg.worker")

Handler = Callable[["RunContext"], Awaitable[Any]]


class StopReason(enum.Enum):
    """Why the worker stops a run before its handler finished (set before the cancel)."""

    LEASE_LOST = "lease_lost"  # renewal refused: the lease expired, was taken or was cleared
    DEADLINE = "deadline"  # renewals failed until the last confirmed lease deadline
    SUPERSEDED = "superseded"  # this process re-claimed the run at a newer generation
    CANCEL = "cancel"  # the database reported a cancel request (renewal or claim)
    SHUTDOWN = "shutdown"  # graceful shutdown ran out of time: hand back to pending
    INTERRUPT = "interrupt"  # operator interrupt: stop without changing the status


#: Stops after which nothing more may be written for the run: its lease is gone.
_LOST = frozenset({StopReason.LEASE_LOST, StopReason.DEADLINE, StopReason.SUPERSEDED})


class RunState(enum.Enum):
    """The life of one leased run inside the worker."""

    QUEUED = "queued"  # spawned; its task has not taken its first step
    EXECUTING = "executing"  # the handler is running
    COMPLETING = "completing"  # the handler returned; its completion is queued or in flight
    SETTLING = "settling"  # writing its other outcome: failed, cancelled, handed back, released
    DONE = "done"  # nothing more will be written; the entry leaves the worker


_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.EXECUTING, RunState.SETTLING, RunState.DONE}),
    RunState.EXECUTING: frozenset({RunState.COMPLETING, RunState.SETTLING, RunState.DONE}),
    RunState.COMPLETING: frozenset({RunState.SETTLING, RunState.DONE}),
    RunState.SETTLING: frozenset({RunState.DONE}),
    RunState.DONE: frozenset(),
}


@dataclass(eq=False)
class RunContext:
    """What a handler sees of its run. Every write is fenced by the lease generation."""

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
    _worker: RunWorker = field(repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once the database reported a cancel request for this run."""
        return self.cancelled.is_set()

    async def commit(self, **columns: Any) -> None:
        """Write output / error / metadata / progress, fenced; raises LeaseLostError if refused."""
        ok = await self._worker.lease_manager.commit_fenced(
            self.run_id, self.worker_id, generation=self.lease_generation,
            tenant_id=self._worker.tenant_id, workspace_id=self._worker.workspace_id, **columns)
        if not ok:
            raise LeaseLostError("commit refused: lease lost", run_id=self.run_id,
                                 worker_id=self.worker_id, generation=self.lease_generation)

    async def checkpoint(self, data: Any, *, checkpoint_id: UUID | None = None) -> UUID:
        """Save a checkpoint, fenced; raises LeaseLostError if refused. Returns its id."""
        saved = await self._worker.lease_manager.save_checkpoint(
            self.run_id, self.worker_id, data, generation=self.lease_generation,
            checkpoint_id=checkpoint_id, tenant_id=self._worker.tenant_id,
            workspace_id=self._worker.workspace_id)
        if saved is None:
            raise LeaseLostError("checkpoint refused: lease lost", run_id=self.run_id,
                                 worker_id=self.worker_id, generation=self.lease_generation)
        return saved

    async def progress(self, value: Any) -> None:
        """Record progress (any JSON value), fenced."""
        await self.commit(progress=value)


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
class _Active:
    """One leased run inside the worker: its lease, its task and its :class:`RunState`."""

    run: ClaimedRun
    ctx: RunContext
    # Monotonic instant before which the lease is known to be live: the send time of the last
    # call that confirmed it plus the lease duration (the server added it to a later instant).
    deadline: float
    task: asyncio.Task[None] | None = None
    state: RunState = RunState.QUEUED
    stop_reason: StopReason | None = None

    @property
    def key(self) -> tuple[UUID, int]:
        return self.run.run_id, self.run.lease_generation

    def advance(self, to: RunState) -> None:
        """The one place a run changes state; an impossible transition is a worker bug."""
        if to not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"run {self.run.run_id}: {self.state.value} -> {to.value}")
        self.state = to

    def request_stop(self, reason: StopReason) -> bool:
        """Record why the run must stop (the first reason wins); True when its running handler
        must be cancelled. A queued run settles on its first step without starting the handler;
        a completing run lets its completion go out (the fence in SQL decides it)."""
        if self.stop_reason is not None or self.state in (RunState.SETTLING, RunState.DONE):
            return False
        self.stop_reason = reason
        if reason is StopReason.CANCEL:
            self.ctx.cancelled.set()
        return self.state is RunState.EXECUTING

    @property
    def renewable(self) -> bool:
        """Its lease is still renewed: not stopping, not settled."""
        return self.stop_reason is None and self.state in (
            RunState.QUEUED, RunState.EXECUTING, RunState.COMPLETING)


@dataclass
class _Completion:
    entry: _Active
    output: Any
    # True completed, False refused by the fence, None no answer before the lease deadline; an
    # exception when the database refused this run's completion itself (a value it cannot store).
    result: asyncio.Future[bool | None]


class RunWorker:
    """A worker of one deployment in one tenant/workspace scope.

    ``max_concurrency`` is the local cap (runs executing in this process);
    ``fleet_max_concurrency``, when set, is passed to every claim and bounds live leases of the
    deployment across all workers, atomically in SQL. ``dsn`` enables LISTEN/NOTIFY wakeups on a
    dedicated connection; without it the worker polls. The orphan sweep also ends the runs no
    worker may resume (out of attempts; not resumable and expired more than ``orphan_grace``
    seconds ago), so their threads move on.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        deployment_ref: str,
        handler: Handler,
        *,
        dsn: str | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int = 8,
        fleet_max_concurrency: int | None = None,
        poll_interval: float = 0.5,
        orphan_sweep_interval: float = 5.0,
        orphan_grace: float = 10.0,
        worker_id: str | None = None,
        shutdown_timeout: float = 30.0,
        lease_duration: float = 60.0,
        renew_fraction: float = 1 / 3,
        retry_base_seconds: float = 1.0,
        retry_max_seconds: float = 300.0,
        queue_depth_interval: float = 10.0,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if poll_interval <= 0 or orphan_sweep_interval <= 0:
            raise ValueError("poll_interval and orphan_sweep_interval must be > 0")
        if lease_duration <= 0 or not 0 < renew_fraction < 1:
            raise ValueError("lease_duration must be > 0 and renew_fraction in (0, 1)")
        self.pool = pool
        self.deployment_ref = deployment_ref
        self.handler = handler
        self.dsn = dsn
        self.tenant_id = tenant_id
        self.workspace_id = workspace_id
        self.max_concurrency = max_concurrency
        self.fleet_max_concurrency = fleet_max_concurrency
        self.poll_interval = poll_interval
        self.orphan_sweep_interval = orphan_sweep_interval
        self.orphan_grace = orphan_grace
        self.worker_id = worker_id or uuid.uuid4().hex
        self.shutdown_timeout = shutdown_timeout
        self.lease_duration = lease_duration
        self.renew_interval = lease_duration * renew_fraction
        self.retry_base_seconds = retry_base_seconds
        self.retry_max_seconds = retry_max_seconds
        self.queue_depth_interval = queue_depth_interval
        self.metrics = metrics or default_metrics()
        # The per-run series, looked up once (labels() takes a lock and builds a key each time).
        self._runs_started = self.metrics.runs_started.labels(deployment_ref)
        self._runs_completed = self.metrics.runs_completed.labels(deployment_ref)
        self._run_duration = self.metrics.run_duration.labels(deployment_ref)
        self.lease_manager = LeaseManager(pool, lease_duration_seconds=lease_duration)
        self.notifier: Notifier | None = None

        # Keyed by (run_id, generation): after a stall longer than its lease, this process may
        # re-claim its own orphan and hold both generations until the old task has stopped.
        self._active: dict[tuple[UUID, int], _Active] = {}
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()
        # The opaque NOTIFY payloads meant for this worker; None until fetched (then every
        # notification on the channel is taken as a hint: a wasted look, never a wrong action).
        self._wakeup_key: str | None = None
        self._control_key: str | None = None
        self._backlog = False  # the last claim filled every free slot: more work is likely
        # The last claim left no fleet slot (fleet_max_concurrency) free: claim again as soon as
        # one of this worker's runs gives its slot back, not when that run's NOTIFY comes round.
        self._fleet_full = False
        self._sweep_due = True  # orphans are looked for on start
        self._next_sweep = 0.0
        self._stopping = False
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._key_tasks: set[asyncio.Task[None]] = set()
        self._claim_task: asyncio.Task[None] | None = None
        self._completions: list[_Completion] = []
        self._completion_queued = asyncio.Event()

    # -- public surface ------------------------------------------------------------------------

    @property
    def active_run_ids(self) -> list[UUID]:
        return list(dict.fromkeys(run_id for run_id, _ in self._active))

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def start(self) -> None:
        """Start the notifier, the renewal task and the claim loop (orphans are swept first)."""
        if self._claim_task is not None:
            return
        if self.dsn is not None:
            # Named so operators (and the chaos soak) can tell the listener in pg_stat_activity.
            settings = {"application_name": f"zeroth-listener:{self.worker_id}"}
            self.notifier = Notifier(
                self.dsn, on_notification=self._on_notification, on_connect=self._on_listen,
                connect=lambda dsn: asyncpg.connect(dsn, server_settings=settings))
            self.notifier.start()
        for name, loop in (("renew", self._renew_loop), ("complete", self._completion_loop),
                           ("depth", self._queue_depth_loop)):
            self._tasks.append(asyncio.create_task(self._supervised(name, loop),
                                                   name=f"zeroth-{name}"))
        self._claim_task = asyncio.create_task(self._supervised("claim", self.poll_loop),
                                               name="zeroth-claim")
        log.info("worker %s started for deployment %s (local %d, fleet %s)", self.worker_id,
                 self.deployment_ref, self.max_concurrency, self.fleet_max_concurrency)

    def handle_wakeup(self, run_id: object = None) -> None:
        """A hint that work may be claimable: the claim loop polls now. Never blocks."""
        self._wake.set()

    async def poll_loop(self) -> None:
        """Claim until stopping: orphans when a sweep is due, then pending runs in batches."""
        while not self._stopping:
            # Cleared before the pass, not before the sleep: a wakeup that arrives while the pass
            # is talking to the database must still cut the next sleep short.
            self._wake.clear()
            try:
                await self._claim_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claim pass failed; retrying after the poll interval")
                self._worker_error("claim")
                self._backlog = False
            if self._stopping:
                break
            await self._sleep_until_work()

    async def interrupt_active_run(self, run_id: UUID) -> None:
        """Stop this worker's execution of a run without changing its persisted status; its
        lease is released (a running run's lease is expired in place and stays recoverable)."""
        entries = [e for (rid, _), e in self._active.items() if rid == run_id]
        for entry in entries:
            self._stop(entry, StopReason.INTERRUPT)
        for entry in entries:
            if entry.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await entry.task

    async def graceful_shutdown(self) -> None:
        """Stop claiming, let running handlers finish for up to ``shutdown_timeout``, then
        cancel the rest and hand each back to pending with its exact generation."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._wake.set()
        log.info("worker %s draining %d run(s)", self.worker_id, len(self._active))
        if self._claim_task is not None:
            # Not cancelled: a claim cut off after it committed would strand its runs until
            # their leases expire. The loop ends after its current pass.
            with contextlib.suppress(asyncio.CancelledError):
                await self._claim_task
        running = [entry.task for entry in self._active.values() if entry.task is not None]
        if running:
            await asyncio.wait(running, timeout=self.shutdown_timeout)
        leftovers = [entry for entry in self._active.values() if entry.task is not None]
        for entry in leftovers:
            self._stop(entry, StopReason.SHUTDOWN)
        for entry in leftovers:
            assert entry.task is not None
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
        background = [*self._tasks, *self._key_tasks]
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.notifier is not None:
            await self.notifier.stop()
        self._stopped.set()
        log.info("worker %s stopped", self.worker_id)

    async def run_until_stopped(self, *, install_signal_handlers: bool = True) -> None:
        """Start, then run until SIGTERM/SIGINT (or :meth:`graceful_shutdown`), and drain."""
        await self.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        try:
            waiter = asyncio.create_task(stop.wait())
            await asyncio.wait([waiter, asyncio.create_task(self._stopped.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        finally:
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.graceful_shutdown()

    # -- supervision ---------------------------------------------------------------------------

    async def _supervised(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a background loop until the worker stops; a crash is logged, counted and the
        loop restarted after a backoff, so one bug cannot silently stop renewals or claims."""
        delay = 0.1
        while not self._stopping:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %s: the %s loop crashed; restarting it in %.1fs",
                              self.worker_id, name, delay)
                self._worker_error(f"{name}_loop")
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    def _worker_error(self, kind: str) -> None:
        self.metrics.worker_errors.labels(self.deployment_ref, kind).inc()

    # -- claiming ------------------------------------------------------------------------------

    def _free_slots(self) -> int:
        # A run whose handler has returned no longer occupies a local slot while its completion
        # is in flight (its lease is still renewed until the answer): the next claim overlaps
        # the completion call instead of waiting for it. At most max_concurrency runs wait like
        # that, so this worker never holds more than twice max_concurrency leases. Its admission
        # slot (fleet_max_concurrency) is only freed by the completion itself, so under a fleet
        # limit every lease of this worker counts: a claim only they would saturate is a wasted
        # round trip.
        completing = sum(1 for e in self._active.values() if e.state is RunState.COMPLETING)
        executing = len(self._active) - completing
        free = min(self.max_concurrency - executing, 2 * self.max_concurrency - len(self._active))
        if self.fleet_max_concurrency is not None:
            free = min(free, self.fleet_max_concurrency - len(self._active))
        return free

    async def _claim_pass(self) -> None:
        if self._sweep_due or time.monotonic() >= self._next_sweep:
            try:
                await self._sweep_orphans()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A broken sweep must not stop claiming: the next sweep is due in the interval.
                log.exception("orphan sweep failed; claiming goes on")
                self._worker_error("sweep")
                self._sweep_due = False
                self._next_sweep = time.monotonic() + self.orphan_sweep_interval
        free = self._free_slots()
        if free <= 0 or self._stopping:
            return
        sent = time.monotonic()
        result = await self.lease_manager.claim_and_start(
            self.deployment_ref, self.worker_id, tenant_id=self.tenant_id,
            workspace_id=self.workspace_id, max_concurrency=self.fleet_max_concurrency,
            batch_size=free)
        self._observe_saturation(result.concurrency_saturated, result.active_count,
                                 result.max_concurrency)
        for run in result.runs:
            self._spawn(run, deadline=sent + self.lease_duration, recovered=False)
        self._backlog = len(result.runs) == free
        self._fleet_full = result.max_concurrency is not None and (
            result.concurrency_saturated
            or result.active_count + len(result.runs) >= result.max_concurrency)

    async def _sweep_orphans(self) -> None:
        free = self._free_slots()
        if free <= 0:
            self._sweep_due = True  # retried as soon as a slot frees
            return
        sent = time.monotonic()
        result = await self.lease_manager.claim_orphaned_result(
            self.deployment_ref, self.worker_id, tenant_id=self.tenant_id,
            workspace_id=self.workspace_id, max_concurrency=self.fleet_max_concurrency,
            claim_limit=free, grace_seconds=self.orphan_grace)
        self._observe_saturation(result.concurrency_saturated, result.active_count,
                                 result.max_concurrency)
        for run in result.runs:
            log.info("recovered orphan %s at generation %d, attempt %d (checkpoint %s)",
                     run.run_id, run.lease_generation, run.attempts, run.recovery_checkpoint_id)
            self._spawn(run, deadline=sent + self.lease_duration, recovered=True)
        # Saturated, or the limit was reached: there may be more orphans; look again soon.
        self._sweep_due = result.concurrency_saturated or len(result.runs) == free
        self._next_sweep = time.monotonic() + self.orphan_sweep_interval

    def _observe_saturation(self, saturated: bool, active: int, limit: int | None) -> None:
        if limit is None:
            return
        self.metrics.utilization.labels(self.deployment_ref, "concurrency").set(
            min(1.0, active / limit))
        if saturated:
            self.metrics.guardrail_rejections.labels(self.deployment_ref, "concurrency").inc()

    async def _sleep_until_work(self) -> None:
        if self._backlog and self._free_slots() > 0:
            return  # the last batch was full and a slot is already free: claim again now
        timeout = self.poll_interval
        if not self._sweep_due:
            timeout = min(timeout, max(0.0, self._next_sweep - time.monotonic()))
        # One event: a NOTIFY sets it, and so does a freed slot while a full batch or an orphan
        # sweep is waiting for one (_slot_freed). No helper tasks: a wakeup resumes this loop in
        # the next turn of the event loop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    def _slot_freed(self, *, fleet: bool = False) -> None:
        """A local slot was freed; with ``fleet``, the run's admission slot too (the run left
        the worker: its completion, failure or hand-back was answered)."""
        if self._backlog or self._sweep_due or (fleet and self._fleet_full):
            self._wake.set()

    # -- notifications: hints, never the truth -------------------------------------------------

    def _on_listen(self) -> None:
        """After every LISTEN (re)connect: look for work (notifications sent meanwhile are
        gone) and fetch the keys again (the secret they come from may have been rotated)."""
        self.handle_wakeup()
        self._renew_now.set()
        task = asyncio.get_running_loop().create_task(self._fetch_keys())
        self._key_tasks.add(task)
        task.add_done_callback(self._key_tasks.discard)

    async def _fetch_keys(self) -> None:
        try:
            lm = self.lease_manager
            self._wakeup_key = await lm.wakeup_key(
                self.deployment_ref, tenant_id=self.tenant_id, workspace_id=self.workspace_id)
            self._control_key = await lm.control_key(self.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # until the next connect every notification is a hint for us
            log.warning("could not fetch this worker's notification keys (%s: %s)",
                        type(exc).__name__, exc)

    def _on_notification(self, channel: str, payload: str) -> None:
        if channel == WAKEUP_CHANNEL:
            if self._wakeup_key is None or payload == self._wakeup_key:
                self.handle_wakeup()
        elif channel == CONTROL_CHANNEL and self._active and (
                self._control_key is None or payload == self._control_key):
            # Someone asked for a cancel of a run held by this worker id, or pretends to: ask
            # the database (the renewal reports cancel_requested) before stopping anything.
            self._renew_now.set()

    # -- lease upkeep --------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        interval = self.renew_interval
        # A notification can ask for a renewal at any time: at most one every 50 ms, so a flood
        # of forged notifications costs one cheap statement per 50 ms and nothing else.
        spacing = min(0.05, self.renew_interval)
        last = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._renew_now.wait()
            if (wait := last + spacing - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            self._renew_now.clear()
            interval = self.renew_interval
            entries = {entry.run.run_id: entry for entry in self._active.values()
                       if entry.renewable}
            if not entries:
                continue
            last = sent = time.monotonic()
            nearest = min(entry.deadline for entry in entries.values())
            try:
                renewals = await asyncio.wait_for(
                    self.lease_manager.renew_leases(
                        self.worker_id,
                        {run_id: entry.run.lease_generation for run_id, entry in entries.items()},
                        tenant_id=self.tenant_id, workspace_id=self.workspace_id),
                    timeout=max(0.05, nearest - sent))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease renewal failed (%s: %s); retrying", type(exc).__name__, exc)
                self._enforce_deadlines()
                # Retry soon, and no later than the next deadline, so fail-stop is punctual.
                deadlines = [e.deadline for e in self._active.values() if e.renewable]
                interval = min(self.renew_interval, 1.0,
                               *(max(0.01, d - time.monotonic()) for d in deadlines))
                continue
            for renewal in renewals:
                entry = entries[renewal.run_id]
                if renewal.renewed:
                    entry.deadline = sent + self.lease_duration
                    if renewal.cancel_requested:
                        self._stop(entry, StopReason.CANCEL)
                elif entry.state is RunState.COMPLETING:
                    # Its completion raced this renewal and cleared the lease; the completion's
                    # own answer says what happened.
                    continue
                elif entry.renewable:
                    log.warning("lease of run %s (generation %d) lost", renewal.run_id,
                                entry.run.lease_generation)
                    self._stop(entry, StopReason.LEASE_LOST)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for entry in list(self._active.values()):
            if entry.renewable and now >= entry.deadline:
                log.error("run %s: no confirmed lease since its deadline; stopping the handler",
                          entry.run.run_id)
                self._stop(entry, StopReason.DEADLINE)

    async def _queue_depth_loop(self) -> None:
        while True:
            try:
                depth = await self.lease_manager.count_pending(
                    self.deployment_ref, tenant_id=self.tenant_id, workspace_id=self.workspace_id)
                self.metrics.queue_depth.labels(self.deployment_ref).set(depth)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("queue depth sample failed: %s", exc)
            await asyncio.sleep(self.queue_depth_interval)

    # -- executing a run -----------------------------------------------------------------------

    def _stop(self, entry: _Active, reason: StopReason) -> None:
        if entry.request_stop(reason) and entry.task is not None and not entry.task.done():
            entry.task.cancel()

    def _spawn(self, run: ClaimedRun, *, deadline: float, recovered: bool) -> None:
        # This process may have recovered its own orphan (its event loop stalled past the
        # lease): the older generation's lease is gone, so stop that task; it writes nothing.
        for older in [e for (rid, _), e in self._active.items() if rid == run.run_id]:
            log.warning("run %s: re-claimed at generation %d while generation %d still ran here;"
                        " stopping the older one", run.run_id, run.lease_generation,
                        older.run.lease_generation)
            self._stop(older, StopReason.SUPERSEDED)
        ctx = RunContext(
            run_id=run.run_id, payload=run.payload,
            # claim_and_start counted this attempt; so did claim_orphaned for a recovered run.
            attempt=run.attempts,
            max_attempts=run.max_attempts,
            metadata=run.metadata, thread_id=run.thread_id, idempotency_key=run.idempotency_key,
            lease_generation=run.lease_generation, worker_id=self.worker_id, recovered=recovered,
            recovery_checkpoint_id=run.recovery_checkpoint_id, checkpoint_data=run.checkpoint_data,
            cancelled=asyncio.Event(), _worker=self)
        entry = _Active(run=run, ctx=ctx, deadline=deadline)
        self._active[entry.key] = entry
        entry.task = asyncio.create_task(self._execute(entry), name=f"run-{run.run_id}")
        if run.cancel_requested:  # the claim itself reported the cancel: the database said so
            self._stop(entry, StopReason.CANCEL)

    async def _execute(self, entry: _Active) -> None:
        run = entry.run
        try:
            if entry.stop_reason is not None:  # stopped before this task ran (a claimed orphan
                await self._settle_stopped(entry)  # with a pending cancel): never start it
                return
            entry.advance(RunState.EXECUTING)
            await self._execute_leased(entry)
        except asyncio.CancelledError:
            if entry.stop_reason is None or entry.state is not RunState.EXECUTING:
                raise  # not ours (the loop is shutting down): propagate
            # Stopped while outside the handler (between steps): settle it the same way.
            await self._settle_stopped(entry)
        except Exception as exc:
            # A bug or a refusal in the worker's own steps: give the run an explicit outcome
            # (a retryable failure, so a bug that always hits ends in a dead letter) and count it.
            log.exception("run %s: worker error outside the handler", run.run_id)
            self._worker_error("settle")
            await self._fail_quietly(entry, exc)
        finally:
            if entry.state is not RunState.DONE:
                entry.advance(RunState.DONE)
            if self._active.get(entry.key) is entry:
                del self._active[entry.key]
            self._slot_freed(fleet=True)

    async def _execute_leased(self, entry: _Active) -> None:
        # Both claim paths (claim_and_start, claim_orphaned) hand over runs already running.
        run, ctx = entry.run, entry.ctx
        self._runs_started.inc()
        started = time.monotonic()
        try:
            output = await self.handler(ctx)
        except asyncio.CancelledError as exc:
            if entry.stop_reason is not None:
                await self._settle_stopped(entry)
                return
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the loop is cancelling this task: not the handler's doing
            # The handler raised CancelledError itself (a cancelled inner task it let escape):
            # a failure like any other, never a run dropped without an outcome.
            self.metrics.worker_crashes.labels(self.deployment_ref).inc()
            log.warning("run %s attempt %d: the handler raised CancelledError itself",
                        run.run_id, ctx.attempt)
            await self._fail(entry, exc, retryable=True)
            return
        except LeaseLostError:
            self._lease_lost(entry, fenced=True)
            return
        except (KeyboardInterrupt, SystemExit):
            raise  # the process is going down: its leases expire and count the attempt
        except BaseException as exc:
            # Exception, and whatever else a handler may raise (GeneratorExit, a BaseException
            # subclass of its own): a failure of this attempt, never a run left to its lease.
            self.metrics.worker_crashes.labels(self.deployment_ref).inc()
            log.info("run %s attempt %d failed: %s: %s", run.run_id, ctx.attempt,
                     type(exc).__name__, _message(exc))
            await self._fail(entry, exc, retryable=True)
            return
        finally:
            self._run_duration.observe(time.monotonic() - started)
        if entry.stop_reason in _LOST:
            self._lease_lost(entry, fenced=False)
            return
        # Retrying cannot make an output JSON, nor storable: fail that run, never its batch.
        try:
            json.dumps(output, allow_nan=False)  # what the client will send
        except (TypeError, ValueError) as exc:
            await self._fail(entry, exc, retryable=False)
            return
        if (why := unstorable(output)) is not None:
            log.warning("run %s: PostgreSQL cannot store its output (%s); failing it",
                        run.run_id, why)
            await self._fail(entry, ValueError(f"PostgreSQL cannot store the output: {why}"),
                             retryable=False)
            return
        try:
            completed = await self._complete(entry, output)
        except Exception as exc:
            # The database refused this one run's completion (a value it cannot take): retrying
            # cannot help. Anything else (the completion machinery broke) may pass next time.
            refused = isinstance(exc, DatabaseError)
            log.warning("run %s: its completion failed (%s: %s); failing it", run.run_id,
                        type(exc).__name__, exc)
            self._worker_error("completion_refused" if refused else "completion_lost")
            await self._fail(entry, exc, retryable=not refused)
            return
        if completed:
            self._runs_completed.inc()
        elif completed is False:
            self._lease_lost(entry, fenced=True)

    async def _complete(self, entry: _Active, output: Any) -> bool | None:
        """Queue the run's completion for the next complete_runs call and wait for its row:
        True completed, False refused by the fence, None no answer before the lease deadline."""
        completion = _Completion(entry, output, asyncio.get_running_loop().create_future())
        entry.advance(RunState.COMPLETING)
        self._completions.append(completion)
        self._completion_queued.set()
        self._slot_freed()
        return await completion.result

    async def _completion_loop(self) -> None:
        while True:
            await self._completion_queued.wait()
            if any(e.state is RunState.EXECUTING for e in self._active.values()):
                # Handlers that finish in this same turn of the event loop join the batch.
                await asyncio.sleep(0)
            self._completion_queued.clear()
            batch, self._completions = self._completions[:1000], self._completions[1000:]
            if self._completions:
                self._completion_queued.set()
            try:
                await self._send_completions(batch)
            finally:
                # Whatever happened, no run task is left waiting for an answer that never comes.
                for completion in batch:
                    if not completion.result.done():
                        completion.result.set_exception(
                            RuntimeError("the completion loop stopped before answering"))

    async def _send_completions(self, batch: list[_Completion]) -> None:
        """One complete_runs call for the batch, retried on transient failures while some
        run's lease is still known to be live; a run past its deadline gets None. When the
        database refuses the batch itself, each run is completed on its own, so one bad value
        fails its run and never the others."""
        delay = 0.05
        while batch:
            try:
                rows = await self.lease_manager.complete_runs(
                    self.worker_id,
                    [(c.entry.run.run_id, c.entry.run.lease_generation, c.output) for c in batch],
                    tenant_id=self.tenant_id, workspace_id=self.workspace_id)
            except RetryableError as exc:
                now = time.monotonic()
                for completion in [c for c in batch if now + delay >= c.entry.deadline]:
                    log.error("run %s: giving up its completion after %s; the lease will expire",
                              completion.entry.run.run_id, exc)
                    _settle(completion.result, None)
                batch = [c for c in batch if not c.result.done()]
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].result.set_exception(exc)
                    return
                log.warning("complete_runs refused a batch of %d (%s: %s); completing them one "
                            "by one", len(batch), type(exc).__name__, exc)
                self._worker_error("completion_batch")
                for completion in batch:
                    await self._send_completions([completion])
                return
            for completion, row in zip(batch, rows, strict=True):
                _settle(completion.result, row.completed)
            return

    async def _settle_stopped(self, entry: _Active) -> None:
        """The outcome of a run stopped before its handler finished, by the stop's reason."""
        run, lm = entry.run, self.lease_manager
        reason = entry.stop_reason
        entry.advance(RunState.SETTLING)
        if reason is StopReason.CANCEL:
            if await self._write(entry, self._fenced(entry, lm.cancel_run)):
                log.info("run %s cancelled on request", run.run_id)
            else:
                self._lease_lost(entry, fenced=True)
        elif reason is StopReason.SHUTDOWN:
            # Every claimed run is running (claim_and_start), started handler or not.
            handed = await self._write(entry, self._fenced(entry, lm.hand_back_to_pending))
            log.info("run %s handed back to pending: %s", run.run_id, handed)
        elif reason is StopReason.INTERRUPT:
            await self._write(entry, self._fenced(entry, lm.release_lease))
        else:  # the lease is gone: nothing may be written
            self._lease_lost(entry, fenced=False)

    async def _fail(self, entry: _Active, exc: BaseException, *, retryable: bool) -> None:
        run = entry.run
        # Described before the state moves: nothing about the exception may raise past here.
        error = {"type": type(exc).__name__, "message": _message(exc),
                 "traceback": _traceback(exc),
                 "worker_id": self.worker_id, "lease_generation": run.lease_generation}
        entry.advance(RunState.SETTLING)
        outcome = await self._write(entry, self._fenced(
            entry, self.lease_manager.fail_run, error=error, retryable=retryable,
            retry_base_seconds=self.retry_base_seconds, retry_max_seconds=self.retry_max_seconds))
        if outcome is None:
            self._lease_lost(entry, fenced=True)
        elif outcome == FailOutcome.DEAD_LETTERED:
            self.metrics.runs_dead_lettered.labels(self.deployment_ref).inc()
            log.warning("run %s dead-lettered after %d attempts", run.run_id, entry.ctx.attempt)

    async def _fail_quietly(self, entry: _Active, exc: BaseException) -> None:
        """Last resort after a worker error: a retryable failure with a minimal error document.
        If even that cannot be written, the lease expires and claim_orphaned recovers the run,
        counting the attempt, so a worker bug that always hits ends in a dead letter."""
        if entry.state in (RunState.SETTLING, RunState.DONE) or entry.stop_reason in _LOST:
            return
        entry.advance(RunState.SETTLING)
        try:
            await self._write(entry, self._fenced(
                entry, self.lease_manager.fail_run, retryable=True,
                error={"type": "WorkerError",
                       "message": f"{type(exc).__name__}: {_message(exc)}"[:1000],
                       "worker_id": self.worker_id}))
        except Exception:
            log.exception("run %s: could not record the worker error; its lease will expire",
                          entry.run.run_id)

    def _lease_lost(self, entry: _Active, *, fenced: bool) -> None:
        self.metrics.lease_lost.labels(self.deployment_ref).inc()
        if fenced:
            self.metrics.fencing_rejected.labels(self.deployment_ref).inc()
        log.warning("run %s: lease generation %d lost (%s); nothing more is written",
                    entry.run.run_id, entry.run.lease_generation,
                    "write refused" if fenced or entry.stop_reason is None
                    else entry.stop_reason.value)

    def _fenced(self, entry: _Active, method: Callable[..., Awaitable[Any]],
                **extra: Any) -> Callable[[], Awaitable[Any]]:
        """A repeatable call of a LeaseManager write carrying this run's exact lease."""
        run = entry.run
        return lambda: method(run.run_id, self.worker_id, generation=run.lease_generation,
                              tenant_id=self.tenant_id, workspace_id=self.workspace_id, **extra)

    async def _write(self, entry: _Active, call: Callable[[], Awaitable[Any]]) -> Any:
        """Make one fenced write, retrying transient failures until the lease deadline.

        Returns the call's result, or None when the deadline passed without an answer (the lease
        then expires by itself and the run is recovered elsewhere).
        """
        delay = 0.05
        while True:
            try:
                return await call()
            except RetryableError as exc:
                if time.monotonic() + delay >= entry.deadline:
                    log.error("run %s: giving up a write after %s; the lease will expire",
                              entry.run.run_id, exc)
                    return None
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)


def _settle(result: asyncio.Future[bool | None], value: bool | None) -> None:
    """Answer a waiting run task, unless it is gone (its task was cancelled with the loop)."""
    if not result.done():
        result.set_result(value)


_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def _storable_text(text: str) -> str:
    """``text`` with what jsonb cannot hold (U+0000, lone surrogates) replaced by U+FFFD, so an
    error document about a poisonous value can always be written."""
    return _UNSTORABLE_TEXT.sub("\ufffd", text)


def _message(exc: BaseException) -> str:
    """``str(exc)``, storable, even when the exception's own ``__str__`` raises."""
    try:
        return _storable_text(str(exc))
    except Exception as broken:
        return f"<str() of the exception raised {type(broken).__name__}>"


def _traceback(exc: BaseException) -> str:
    """The last 4000 characters of the formatted traceback, storable, never raising."""
    try:
        return _storable_text("".join(traceback.format_exception(exc))[-4000:])
    except Exception as broken:
        return f"<the traceback could not be formatted: {type(broken).__name__}>"


# -- command line ---------------------------------------------------------------------------------


def load_handler(spec: str) -> Handler:
    """``module:attr`` → an async handler; an object with drive/resume is adapted."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--app must look like module:handler, got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if hasattr(target, "drive") and hasattr(target, "resume"):
        return orchestrator_handler(target)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


class JsonFormatter(logging.Formatter):
    """One JSON object per log line (structured logging for collectors)."""

    def format(self, record: logging.LogRecord) -> str:
        data = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


def _parser(prog: str) -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog=prog, description=(
        "Run a zeroth_pg worker. Every option falls back to a ZEROTH_PG_* environment variable."))
    p.add_argument("--dsn", default=env("ZEROTH_PG_DSN"),
                   help="database URL [ZEROTH_PG_DSN]; none: the embedded server")
    p.add_argument("--deployment", default=env("ZEROTH_PG_DEPLOYMENT"), required=not env(
        "ZEROTH_PG_DEPLOYMENT"), help="deployment_ref to serve [ZEROTH_PG_DEPLOYMENT]")
    p.add_argument("--app", default=env("ZEROTH_PG_APP"), required=not env("ZEROTH_PG_APP"),
                   help="handler as module:attr [ZEROTH_PG_APP]")
    p.add_argument("--tenant", default=env("ZEROTH_PG_TENANT"), help="[ZEROTH_PG_TENANT]")
    p.add_argument("--workspace", default=env("ZEROTH_PG_WORKSPACE"), help="[ZEROTH_PG_WORKSPACE]")
    p.add_argument("--concurrency", type=int, default=int(env("ZEROTH_PG_CONCURRENCY", "8")),
                   help="local slots [ZEROTH_PG_CONCURRENCY=8]")
    p.add_argument("--fleet-concurrency", type=int,
                   default=int(env("ZEROTH_PG_FLEET_CONCURRENCY", "0")) or None,
                   help="fleet-wide max_concurrency [ZEROTH_PG_FLEET_CONCURRENCY]")
    p.add_argument("--poll-interval", type=float,
                   default=float(env("ZEROTH_PG_POLL_INTERVAL", "0.5")),
                   help="[ZEROTH_PG_POLL_INTERVAL=0.5]")
    p.add_argument("--orphan-sweep-interval", type=float,
                   default=float(env("ZEROTH_PG_ORPHAN_SWEEP_INTERVAL", "5")),
                   help="[ZEROTH_PG_ORPHAN_SWEEP_INTERVAL=5]")
    p.add_argument("--lease", type=float, default=float(env("ZEROTH_PG_LEASE_SECONDS", "60")),
                   help="lease duration in seconds [ZEROTH_PG_LEASE_SECONDS=60]")
    p.add_argument("--shutdown-timeout", type=float,
                   default=float(env("ZEROTH_PG_SHUTDOWN_TIMEOUT", "30")),
                   help="[ZEROTH_PG_SHUTDOWN_TIMEOUT=30]")
    p.add_argument("--retry-base", type=float,
                   default=float(env("ZEROTH_PG_RETRY_BASE_SECONDS", "1")),
                   help="first retry delay in seconds, doubled per attempt "
                   "[ZEROTH_PG_RETRY_BASE_SECONDS=1]")
    p.add_argument("--worker-id", default=env("ZEROTH_PG_WORKER_ID"),
                   help="[ZEROTH_PG_WORKER_ID]; default: random")
    p.add_argument("--metrics-port", type=int, default=int(env("ZEROTH_PG_METRICS_PORT", "0")),
                   help="serve /metrics on this port [ZEROTH_PG_METRICS_PORT]; 0: off")
    p.add_argument("--log-format", choices=("text", "json"),
                   default=env("ZEROTH_PG_LOG_FORMAT", "text"), help="[ZEROTH_PG_LOG_FORMAT]")
    p.add_argument("--log-level", default=env("ZEROTH_PG_LOG_LEVEL", "INFO"),
                   help="[ZEROTH_PG_LOG_LEVEL=INFO]")
    return p


async def skip_reset(_conn: asyncpg.Connection) -> None:
    """``reset=`` for a worker's asyncpg pool: keep the session as it is on release.

    asyncpg's default reset sends ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release, one more round trip per SQL call; bench/ measured a worker 25-60%
    faster without it. A pool that only runs zeroth.* calls needs no reset: each call is its own
    transaction and leaves no session state (no SET, no LISTEN, no session advisory lock), and
    asyncpg still rolls back a transaction left open. Do not use it for a pool shared with code
    that changes session state.
    """


async def _serve(args: argparse.Namespace) -> None:
    from zeroth_pg.embedded import resolve_dsn
    from zeroth_pg.metrics import start_http_server

    dsn = args.dsn or resolve_dsn()
    handler = load_handler(args.app)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    worker_id = args.worker_id or uuid.uuid4().hex
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=max(4, args.concurrency + 2), reset=skip_reset,
        server_settings={"application_name": f"zeroth-worker:{worker_id}"})
    try:
        worker = RunWorker(
            pool, args.deployment, handler, dsn=dsn, tenant_id=args.tenant,
            workspace_id=args.workspace, max_concurrency=args.concurrency,
            fleet_max_concurrency=args.fleet_concurrency, poll_interval=args.poll_interval,
            orphan_sweep_interval=args.orphan_sweep_interval, worker_id=worker_id,
            shutdown_timeout=args.shutdown_timeout, lease_duration=args.lease,
            retry_base_seconds=args.retry_base)
        await worker.run_until_stopped()
    finally:
        await pool.close()


def main(argv: list[str] | None = None, *, prog: str = "python -m zeroth_pg.worker") -> int:
    """The worker command line (also ``zeroth-pg worker``): serve until SIGTERM, then drain."""
    args = _parser(prog).parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
