"""RunWorker: claims runs, executes a handler under a renewed lease, recovers orphans, drains.

One worker is a handful of asyncio tasks around the SQL functions:

* the **claim loop** (:meth:`RunWorker.poll_loop`) claims *and starts* pending runs in batches
  up to the free local slots (``claim_and_start``: one round trip per batch), sweeps for orphans
  on start and every ``orphan_sweep_interval`` (claiming at most as many as it has free slots),
  and sleeps until a NOTIFY, a freed slot after a full batch, or ``poll_interval``. It is the
  only task that claims, so local slot accounting needs no lock; a wakeup only sets an event
  and never blocks;
* one **renewal task** renews every lease of the worker with one ``renew_leases`` call every
  ``lease_duration / 3``. A refused renewal stops that run's handler at once and nothing more is
  written for it. A renewal that *fails* (connection lost) is retried until the last confirmed
  lease deadline, measured on the local monotonic clock from the moment the confirmed call was
  sent; past it the handler is stopped (fail-stop). The run is neither failed nor released: its
  lease simply expires, so it is never stranded and claim_orphaned recovers it;
* the **notifier** (:class:`zeroth_pg.notify.Notifier`) turns NOTIFYs into "poll now" and cancel
  requests into handler cancellation, and triggers a claim pass after every reconnect;
* one task per run executes ``handler(ctx)``: a returned value completes the run, an exception
  fails it (retry with backoff until ``max_attempts``, then dead letter);
* one **completion task** sends the completions of runs that finished together as one
  ``complete_runs`` call (each row fenced on its own). It never waits to fill a batch: it sends
  what has queued up by the time the previous call came back, so a lone run is acknowledged as
  fast as with ``complete_run`` and a burst takes one round trip instead of one per run.

Every write for a run carries its lease generation and is fenced in SQL; the worker keeps no
state that safety depends on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
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

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import LeaseLostError, RetryableError
from zeroth_pg.metrics import WorkerMetrics, default_metrics
from zeroth_pg.notify import CONTROL_CHANNEL, WAKEUP_CHANNEL, Notifier
from zeroth_pg.types import ClaimedRun, FailOutcome

__all__ = ["Handler", "RunContext", "RunWorker", "main", "orchestrator_handler", "skip_reset"]

log = logging.getLogger("zeroth_pg.worker")

Handler = Callable[["RunContext"], Awaitable[Any]]


class StopReason:
    """Why the worker cancelled a handler (set before the cancel, read by the run's task)."""

    LEASE_LOST = "lease_lost"  # renewal refused: another worker owns the run
    DEADLINE = "deadline"  # renewals failed until the last confirmed lease deadline
    CANCEL = "cancel"  # a cancel request reached the owner
    SHUTDOWN = "shutdown"  # graceful shutdown ran out of time: hand back to pending
    INTERRUPT = "interrupt"  # operator interrupt: stop without changing the status


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
        """True once a cancel request for this run reached the worker."""
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
    run: ClaimedRun
    ctx: RunContext
    # Monotonic instant before which the lease is known to be live: the send time of the last
    # call that confirmed it plus the lease duration (the server added it to a later instant).
    deadline: float
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None
    # Set by the task's first step. A task cancelled before that step never runs its body (no
    # try/finally), so _stop only cancels a started task; an unstarted one settles on start.
    started: bool = False
    # Set once the handler returned and its completion is queued: a stop from then on lets the
    # completion go out (the fence in SQL decides it) instead of cancelling the task.
    finishing: bool = False


@dataclass
class _Completion:
    entry: _Active
    output: Any
    result: asyncio.Future[bool | None]


class RunWorker:
    """A worker of one deployment in one tenant/workspace scope.

    ``max_concurrency`` is the local cap (runs executing in this process);
    ``fleet_max_concurrency``, when set, is passed to every claim and bounds live leases of the
    deployment across all workers, atomically in SQL. ``dsn`` enables LISTEN/NOTIFY wakeups on a
    dedicated connection; without it the worker polls.
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

        self._active: dict[UUID, _Active] = {}
        self._wake = asyncio.Event()
        self._backlog = False  # the last claim filled every free slot: more work is likely
        # The last claim left no fleet slot (fleet_max_concurrency) free: claim again as soon as
        # one of this worker's runs gives its slot back, not when that run's NOTIFY comes round.
        self._fleet_full = False
        self._sweep_due = True  # orphans are looked for on start
        self._next_sweep = 0.0
        self._stopping = False
        self._stopped = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._claim_task: asyncio.Task[None] | None = None
        self._completions: list[_Completion] = []
        self._completion_queued = asyncio.Event()
        self._finishing = 0  # runs whose handler returned, waiting for complete_runs' answer

    # -- public surface ------------------------------------------------------------------------

    @property
    def active_run_ids(self) -> list[UUID]:
        return list(self._active)

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
                self.dsn, on_notification=self._on_notification, on_connect=self.handle_wakeup,
                connect=lambda dsn: asyncpg.connect(dsn, server_settings=settings))
            self.notifier.start()
        self._tasks.append(asyncio.create_task(self._renew_loop(), name="zeroth-renew"))
        self._tasks.append(asyncio.create_task(self._queue_depth_loop(), name="zeroth-depth"))
        self._tasks.append(asyncio.create_task(self._completion_loop(), name="zeroth-complete"))
        self._claim_task = asyncio.create_task(self.poll_loop(), name="zeroth-claim")
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
                self._backlog = False
            if self._stopping:
                break
            await self._sleep_until_work()

    async def interrupt_active_run(self, run_id: UUID) -> None:
        """Stop this worker's execution of a run without changing its persisted status; its
        lease is released (a running run's lease is expired in place and stays recoverable)."""
        entry = self._active.get(run_id)
        if entry is None or entry.task is None:
            return
        self._stop(entry, StopReason.INTERRUPT)
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
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
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

    # -- claiming ------------------------------------------------------------------------------

    def _free_slots(self) -> int:
        # A run whose handler has returned no longer occupies a local slot while its completion
        # is in flight (its lease is still renewed until the answer): the next claim overlaps
        # the completion call instead of waiting for it. At most max_concurrency runs wait like
        # that, so this worker never holds more than twice max_concurrency leases. Its admission
        # slot (fleet_max_concurrency) is only freed by the completion itself, so under a fleet
        # limit every lease of this worker counts: a claim only they would saturate is a wasted
        # round trip.
        executing = len(self._active) - self._finishing
        free = min(self.max_concurrency - executing, 2 * self.max_concurrency - len(self._active))
        if self.fleet_max_concurrency is not None:
            free = min(free, self.fleet_max_concurrency - len(self._active))
        return free

    async def _claim_pass(self) -> None:
        if self._sweep_due or time.monotonic() >= self._next_sweep:
            await self._sweep_orphans()
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
            claim_limit=free)
        self._observe_saturation(result.concurrency_saturated, result.active_count,
                                 result.max_concurrency)
        for run in result.runs:
            log.info("recovered orphan %s at generation %d (checkpoint %s)", run.run_id,
                     run.lease_generation, run.recovery_checkpoint_id)
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

    def _on_notification(self, channel: str, payload: dict[str, Any]) -> None:
        if channel == WAKEUP_CHANNEL:
            if self._wakeup_is_for_me(payload):
                self.handle_wakeup(payload.get("run_id"))
        elif channel == CONTROL_CHANNEL and payload.get("type") == "cancel":
            self._on_cancel_request(payload)

    def _wakeup_is_for_me(self, payload: dict[str, Any]) -> bool:
        if payload.get("deployment_ref", self.deployment_ref) != self.deployment_ref:
            return False
        tenant = self.tenant_id if self.tenant_id is not None else "default"
        if payload.get("tenant_id", tenant) != tenant:
            return False
        return "workspace_id" not in payload or payload["workspace_id"] == self.workspace_id

    def _on_cancel_request(self, payload: dict[str, Any]) -> None:
        if payload.get("worker_id") != self.worker_id:
            return
        try:
            run_id = UUID(str(payload.get("run_id")))
        except ValueError:
            return
        entry = self._active.get(run_id)
        if entry is not None and entry.run.lease_generation == payload.get("lease_generation"):
            self._stop(entry, StopReason.CANCEL)

    # -- lease upkeep --------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        interval = self.renew_interval
        while True:
            await asyncio.sleep(interval)
            interval = self.renew_interval
            leases = {run_id: entry.run.lease_generation for run_id, entry in self._active.items()
                      if entry.stop_reason is None}
            if not leases:
                continue
            sent = time.monotonic()
            nearest = min(self._active[run_id].deadline for run_id in leases)
            try:
                renewals = await asyncio.wait_for(
                    self.lease_manager.renew_leases(
                        self.worker_id, leases, tenant_id=self.tenant_id,
                        workspace_id=self.workspace_id),
                    timeout=max(0.05, nearest - sent))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("lease renewal failed (%s: %s); retrying", type(exc).__name__, exc)
                self._enforce_deadlines()
                # Retry soon, and no later than the next deadline, so fail-stop is punctual.
                deadlines = [e.deadline for e in self._active.values() if e.stop_reason is None]
                interval = min(self.renew_interval, 1.0,
                               *(max(0.01, d - time.monotonic()) for d in deadlines))
                continue
            for renewal in renewals:
                entry = self._active.get(renewal.run_id)
                if entry is None or entry.run.lease_generation != leases[renewal.run_id]:
                    continue
                if not renewal.renewed:
                    log.warning("lease of run %s (generation %d) lost", renewal.run_id,
                                entry.run.lease_generation)
                    self._stop(entry, StopReason.LEASE_LOST)
                elif renewal.cancel_requested:
                    entry.deadline = sent + self.lease_duration
                    self._stop(entry, StopReason.CANCEL)
                else:
                    entry.deadline = sent + self.lease_duration

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for entry in list(self._active.values()):
            if entry.stop_reason is None and now >= entry.deadline:
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

    def _stop(self, entry: _Active, reason: str) -> None:
        if entry.stop_reason is not None:
            return
        entry.stop_reason = reason
        if reason == StopReason.CANCEL:
            entry.ctx.cancelled.set()
        if (entry.started and not entry.finishing and entry.task is not None
                and not entry.task.done()):
            entry.task.cancel()

    def _spawn(self, run: ClaimedRun, *, deadline: float, recovered: bool) -> None:
        ctx = RunContext(
            run_id=run.run_id, payload=run.payload,
            # claim_and_start already counted this attempt; a recovered run keeps its count.
            attempt=run.attempts,
            max_attempts=run.max_attempts,
            metadata=run.metadata, thread_id=run.thread_id, idempotency_key=run.idempotency_key,
            lease_generation=run.lease_generation, worker_id=self.worker_id, recovered=recovered,
            recovery_checkpoint_id=run.recovery_checkpoint_id, checkpoint_data=run.checkpoint_data,
            cancelled=asyncio.Event(), _worker=self)
        entry = _Active(run=run, ctx=ctx, deadline=deadline)
        self._active[run.run_id] = entry
        entry.task = asyncio.create_task(self._execute(entry), name=f"run-{run.run_id}")
        if run.cancel_requested:
            self._stop(entry, StopReason.CANCEL)

    async def _execute(self, entry: _Active) -> None:
        run = entry.run
        entry.started = True
        try:
            if entry.stop_reason is not None:  # stopped before this task ran (a claimed orphan
                await self._after_stop(entry)  # with a pending cancel): settle, never start it
                return
            await self._execute_leased(entry)
        except asyncio.CancelledError:
            if entry.stop_reason is None:
                raise  # not ours (the loop is shutting down): propagate
            # Stopped before the handler ran (e.g. during start_run): settle it the same way.
            await self._after_stop(entry)
        except Exception:
            log.exception("run %s: worker error outside the handler", run.run_id)
        finally:
            self._active.pop(run.run_id, None)
            if entry.finishing:
                self._finishing -= 1
            self._slot_freed(fleet=True)

    async def _execute_leased(self, entry: _Active) -> None:
        # Both claim paths (claim_and_start, claim_orphaned) hand over runs already running.
        run, ctx, m, dep = entry.run, entry.ctx, self.metrics, self.deployment_ref
        self._runs_started.inc()
        started = time.monotonic()
        try:
            output = await self.handler(ctx)
        except asyncio.CancelledError:
            await self._after_stop(entry)
            return
        except LeaseLostError:
            self._lease_lost(entry, fenced=True)
            return
        except Exception as exc:
            m.worker_crashes.labels(dep).inc()
            log.info("run %s attempt %d failed: %s: %s", run.run_id, ctx.attempt,
                        type(exc).__name__, exc)
            await self._fail(entry, exc, retryable=True)
            return
        finally:
            self._run_duration.observe(time.monotonic() - started)
        if entry.stop_reason in (StopReason.LEASE_LOST, StopReason.DEADLINE):
            self._lease_lost(entry, fenced=False)
            return
        try:
            json.dumps(output, allow_nan=False)  # what the client will send
        except (TypeError, ValueError) as exc:  # retrying cannot make the output JSON
            await self._fail(entry, exc, retryable=False)
            return
        completed = await self._complete(entry, output)
        if completed:
            self._runs_completed.inc()
        elif completed is False:
            self._lease_lost(entry, fenced=True)

    async def _complete(self, entry: _Active, output: Any) -> bool | None:
        """Queue the run's completion for the next complete_runs call and wait for its row:
        True completed, False refused by the fence, None no answer before the lease deadline."""
        completion = _Completion(entry, output, asyncio.get_running_loop().create_future())
        entry.finishing = True
        self._finishing += 1
        self._completions.append(completion)
        self._completion_queued.set()
        self._slot_freed()
        return await completion.result

    async def _completion_loop(self) -> None:
        while True:
            await self._completion_queued.wait()
            if len(self._active) > self._finishing:
                # Handlers that finish in this same turn of the event loop join the batch.
                await asyncio.sleep(0)
            self._completion_queued.clear()
            batch, self._completions = self._completions[:1000], self._completions[1000:]
            if self._completions:
                self._completion_queued.set()
            try:
                await self._send_completions(batch)
            except asyncio.CancelledError:
                for completion in batch:
                    if not completion.result.done():
                        completion.result.cancel()
                raise
            except Exception as exc:
                for completion in batch:
                    if not completion.result.done():
                        completion.result.set_exception(exc)

    async def _send_completions(self, batch: list[_Completion]) -> None:
        """One complete_runs call for the batch, retried on transient failures while some
        run's lease is still known to be live; a run past its deadline gets None."""
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
            for completion, row in zip(batch, rows, strict=True):
                _settle(completion.result, row.completed)
            return

    async def _after_stop(self, entry: _Active) -> None:
        run, lm = entry.run, self.lease_manager
        reason = entry.stop_reason
        if reason == StopReason.CANCEL:
            if await self._write(entry, self._fenced(entry, lm.cancel_run)):
                log.info("run %s cancelled on request", run.run_id)
            else:
                self._lease_lost(entry, fenced=True)
        elif reason == StopReason.SHUTDOWN:
            # Every claimed run is running (claim_and_start), started handler or not.
            handed = await self._write(entry, self._fenced(entry, lm.hand_back_to_pending))
            log.info("run %s handed back to pending: %s", run.run_id, handed)
        elif reason == StopReason.INTERRUPT:
            await self._write(entry, self._fenced(entry, lm.release_lease))
        elif reason in (StopReason.LEASE_LOST, StopReason.DEADLINE):
            self._lease_lost(entry, fenced=False)

    async def _fail(self, entry: _Active, exc: BaseException, *, retryable: bool) -> None:
        run = entry.run
        error = {"type": type(exc).__name__, "message": str(exc),
                 "traceback": "".join(traceback.format_exception(exc))[-4000:],
                 "worker_id": self.worker_id, "lease_generation": run.lease_generation}
        outcome = await self._write(entry, self._fenced(
            entry, self.lease_manager.fail_run, error=error, retryable=retryable,
            retry_base_seconds=self.retry_base_seconds, retry_max_seconds=self.retry_max_seconds))
        if outcome is None:
            self._lease_lost(entry, fenced=True)
        elif outcome == FailOutcome.DEAD_LETTERED:
            self.metrics.runs_dead_lettered.labels(self.deployment_ref).inc()
            log.warning("run %s dead-lettered after %d attempts", run.run_id, entry.ctx.attempt)

    def _lease_lost(self, entry: _Active, *, fenced: bool) -> None:
        self.metrics.lease_lost.labels(self.deployment_ref).inc()
        if fenced:
            self.metrics.fencing_rejected.labels(self.deployment_ref).inc()
        log.warning("run %s: lease generation %d lost (%s); nothing more is written",
                    entry.run.run_id, entry.run.lease_generation,
                    "write refused" if fenced else entry.stop_reason)

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
