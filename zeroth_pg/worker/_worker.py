"""RunWorker: claims runs, executes a handler under a renewed lease, recovers orphans, drains.

The claim loop, the run tasks, supervision and shutdown live here; a run's lifecycle is in
:mod:`zeroth_pg.worker._run`, the lease renewals in :mod:`zeroth_pg.worker._leases` and the
completion batching in :mod:`zeroth_pg.worker._completions` (the package docstring has the whole
picture).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

import asyncpg
from prometheus_client import Counter

from zeroth_pg import tracing
from zeroth_pg._libpq import asyncpg_dsn
from zeroth_pg.client import LeaseManager, unstorable
from zeroth_pg.errors import (
    DatabaseError,
    ErrorDescription,
    InvalidPayloadError,
    LeaseLostError,
    NonRetryableError,
    RetryableError,
    ZerothError,
    bounded_text,
    describe,
    handler_exit,
)
from zeroth_pg.metrics import WorkerMetrics, default_metrics
from zeroth_pg.notify import CONTROL_CHANNEL, WAKEUP_CHANNEL, Notifier
from zeroth_pg.types import ClaimedRun, FailOutcome, RetryPolicy, Scope, SleepOutcome
from zeroth_pg.worker._completions import CompletionBatcher, Leased
from zeroth_pg.worker._gate import WakeupGate
from zeroth_pg.worker._leases import LeaseUpkeep
from zeroth_pg.worker._run import (
    ActiveRun,
    Handler,
    RunContext,
    RunSlept,
    RunState,
    StopReason,
)
from zeroth_pg.worker._schedules import PeriodicSchedule, ScheduleFirer
from zeroth_pg.worker._sources import Claimed, ClaimSource, ManyScopes, OneScope

__all__ = ["RunWorker"]

log = logging.getLogger("zeroth_pg.worker")

#: jsonb holds at most 256 MB; an output whose JSON text is longer cannot be stored, and a
#: completion that can never land must fail its run rather than be retried.
MAX_OUTPUT_CHARACTERS = 255 * 2**20

class RunWorker:
    """A worker of one deployment in one tenant/workspace scope, or (a fleet worker) of several
    deployments in many scopes.

    ``RunWorker(pool, "send-email", handler, tenant_id=…)`` serves one scope.
    ``RunWorker(pool, {"send-email": h1, "resize": h2})`` serves every scope of those
    deployments, and with ``scopes=[(tenant_id, workspace_id), …]`` the listed ones; one claim
    loop (``zeroth.claim_and_start_scopes``: fair shares per scope, by the weights of
    ``zeroth.scope_limits``), one listener, one renewal task and one completion task for all of
    them, each run's handler chosen by its deployment.

    ``max_concurrency`` is the local cap (runs executing in this process), and
    ``deployment_concurrency`` (``{deployment: n}``) caps single deployments under it;
    ``retries`` (``{deployment: RetryPolicy}``) replaces ``retry_base_seconds`` /
    ``retry_max_seconds`` for some deployments; a deployment with neither (both None, the
    default) gets the retry policy registered in ``zeroth.deployments``, else 1 / 300 s;
    ``fleet_max_concurrency``, when set, is passed to every claim and bounds live leases of each
    scope across all workers, atomically in SQL (a scope's ``zeroth.scope_limits`` row, when it
    has one, replaces it). ``dsn`` enables LISTEN/NOTIFY wakeups on a
    dedicated connection; without it the worker polls. The orphan sweep also ends the runs no
    worker may resume (out of attempts; not resumable and expired more than ``orphan_grace``
    seconds ago), so their threads move on.

    ``scope_metrics=True`` also counts each run in the ``zeroth_scope_runs_started`` /
    ``_completed`` / ``_failed`` counters labelled by deployment, tenant and workspace. Off by
    default: a fleet worker of every scope makes a series per tenant it ever saw (unbounded
    cardinality for the metrics backend); turn it on for a bounded set of tenants.
    ``queue_depth_interval`` (seconds; default None, off) samples the ``zeroth_queue_depth``
    gauge of the deployments served: off by default, since every worker of a fleet would report
    the same number; ``zeroth-pg metrics`` (:mod:`zeroth_pg.fleet_metrics`) serves the
    database's gauges once per fleet.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        deployment_ref: str | Mapping[str, Handler],
        handler: Handler | None = None,
        *,
        scopes: Sequence[tuple[str | None, str | None]] | None = None,
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
        retry_base_seconds: float | None = None,
        retry_max_seconds: float | None = None,
        retries: Mapping[str, RetryPolicy] | None = None,
        deployment_concurrency: Mapping[str, int] | None = None,
        queue_depth_interval: float | None = None,
        metrics: WorkerMetrics | None = None,
        scope_metrics: bool = False,
        schedules: Sequence[PeriodicSchedule] = (),
        fire_schedules: bool | None = None,
        schedule_max_sleep: float = 1.0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if poll_interval <= 0 or orphan_sweep_interval <= 0:
            raise ValueError("poll_interval and orphan_sweep_interval must be > 0")
        if lease_duration <= 0 or not 0 < renew_fraction < 1:
            raise ValueError("lease_duration must be > 0 and renew_fraction in (0, 1)")
        self.pool = pool
        self.lease_manager = LeaseManager(pool, lease_duration_seconds=lease_duration)
        self._source: ClaimSource
        if isinstance(deployment_ref, str):
            if handler is None:
                raise ValueError("a worker of one deployment needs its handler")
            if scopes is not None:
                raise ValueError("scopes needs a mapping of deployments to handlers")
            self._handlers: dict[str, Handler] = {deployment_ref: handler}
            self._source = OneScope(self.lease_manager, deployment_ref, tenant_id, workspace_id)
        else:
            if handler is not None or tenant_id is not None or workspace_id is not None:
                raise ValueError("a fleet worker takes its handlers in the mapping and its "
                                 "scopes in scopes=, not handler, tenant_id or workspace_id")
            self._handlers = dict(deployment_ref)
            self._source = ManyScopes(self.lease_manager, list(self._handlers), scopes)
        #: The first (for a worker of one deployment, the only) deployment served.
        self.deployment_ref = self._source.deployments[0]
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
        # None: fail_run takes the deployment's registered policy (zeroth.deployments).
        default_retry = (None if retry_base_seconds is None and retry_max_seconds is None
                         else RetryPolicy(1.0 if retry_base_seconds is None else retry_base_seconds,
                                          300.0 if retry_max_seconds is None
                                          else retry_max_seconds))
        self._retries: dict[str, RetryPolicy | None] = {
            d: default_retry for d in self._source.deployments}
        self._retries.update(self._per_deployment(retries, "retries"))
        #: Local limits of single deployments (handlers running at once in this process), under
        #: the total ``max_concurrency``.
        self.deployment_concurrency = self._per_deployment(
            deployment_concurrency, "deployment_concurrency")
        if any(not isinstance(n, int) or n < 1 for n in self.deployment_concurrency.values()):
            raise ValueError("every deployment_concurrency limit must be an int of at least 1")
        self._claim_round = 0  # rotates the claims of a pass over deployment limits
        # Deployments whose last claim of their own filled their local room: they likely have
        # more work, so a slot they free is claimed into at once (like a full batch).
        self._deployments_full: set[str] = set()
        # Handlers still running after their runs left the worker (linger), per deployment.
        self._lingering: collections.defaultdict[str, set[asyncio.Future[Any]]] = (
            collections.defaultdict(set))
        self.queue_depth_interval = queue_depth_interval
        self.metrics = metrics or default_metrics()
        self.scope_metrics = scope_metrics
        # The per-run series, looked up once per deployment (labels() takes a lock and builds a
        # key each time).
        self._series = {d: (self.metrics.runs_started.labels(d),
                            self.metrics.runs_completed.labels(d),
                            self.metrics.run_duration.labels(d))
                        for d in self._source.deployments}
        self.notifier: Notifier | None = None
        # Schedules (worker/_schedules.py): registered on start, then fired for the deployments
        # and scopes served. Off unless the worker has schedules of its own or is asked to fire
        # (fire_schedules=True: a DBA's schedules of these deployments).
        self._firer: ScheduleFirer | None = None
        if fire_schedules or (fire_schedules is None and schedules):
            fire_scopes = (self._source.scopes if isinstance(self._source, ManyScopes)
                           else [(tenant_id, workspace_id)])
            self._firer = ScheduleFirer(self.lease_manager, self._source.deployments, fire_scopes,
                                        schedules, max_sleep=schedule_max_sleep)
        elif schedules:
            raise ValueError("schedules given with fire_schedules=False")

        # Keyed by (run_id, generation): after a stall longer than its lease, this process may
        # re-claim its own orphan and hold both generations until the old task has stopped.
        self._active: dict[tuple[UUID, int], ActiveRun] = {}
        # The generations of each run in _active: a claim looks up older ones of the same run
        # without walking every active run (that walk was O(active) per spawn: 6% of a
        # 100-slot worker's CPU in a profile).
        self._generations: dict[UUID, set[int]] = {}
        self._wake = asyncio.Event()
        self._leases = LeaseUpkeep(
            self.lease_manager, self.worker_id, runs=self._active.values, stop=self._stop,
            lease_duration=lease_duration, renew_interval=self.renew_interval)
        self._completions = CompletionBatcher(
            self.lease_manager, self.worker_id,
            # A handler that finishes in this same turn of the event loop joins the batch.
            others_may_join=lambda: any(
                e.state is RunState.EXECUTING for e in self._active.values()),
            on_batch_refused=lambda: self._worker_error("completion_batch"),
            claim_along=(self._complete_and_claim if isinstance(self._source, OneScope)
                         else None))
        # The opaque NOTIFY payloads meant for this worker; None until fetched (then every
        # notification on the channel is taken as a hint: a wasted look, never a wrong action).
        self._wakeup_keys: frozenset[str] | None = None
        self._control_key: str | None = None
        # Writers notify only while this worker holds their stripe of a wakeup gate it waits on
        # (its scope's, or each deployment's for a fleet worker), which it does only while it
        # waits for work (worker/_gate.py).
        self._gate = WakeupGate(self._source.gate_targets())
        self._backlog = False  # the last claim filled every free slot: more work is likely
        # The last claim left no fleet slot (fleet_max_concurrency) free: claim again as soon as
        # one of this worker's runs gives its slot back, not when that run's NOTIFY comes round.
        self._fleet_full = False
        # A rate limit (zeroth.rate_limits) held back or cut short the last claim: claim again
        # at this time.monotonic() (the claim's retry_after), not at once and not at the poll
        # interval; with _rate_all_held, a NOTIFY before then is ignored (one scope: nothing it
        # could announce is claimable before then).
        self._rate_retry_at: float | None = None
        self._rate_all_held = False
        self._sweep_due = True  # orphans are looked for on start
        self._next_sweep = 0.0
        self._next_end_only = 0.0  # the end-only sweep of a worker with no free slot
        self._stopping = False
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()  # hurry(): a drain hands everything back at once
        self._tasks: list[asyncio.Task[None]] = []
        self._key_tasks: set[asyncio.Task[None]] = set()
        self._claim_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None

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
        if self._firer is not None:
            # Before anything is served: a schedule the database refuses fails the start.
            await self._firer.register()
        if self.dsn is not None:
            # Named so operators (and the chaos soak) can tell the listener in pg_stat_activity.
            settings = {"application_name": f"zeroth-listener:{self.worker_id}"}
            self.notifier = Notifier(
                self.dsn, on_notification=self._on_notification, on_connect=self._on_listen,
                connect=lambda dsn: asyncpg.connect(asyncpg_dsn(dsn), server_settings=settings))
            self.notifier.start()
        loops: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("renew", self._renew_loop), ("complete", self._completion_loop)]
        if self.queue_depth_interval:
            # Opt-in: every worker of a fleet would report the same depth (a fleet of N, N
            # copies); one exporter per fleet serves the database's gauges (fleet_metrics).
            loops.append(("depth", self._queue_depth_loop))
        for name, loop in loops:
            self._tasks.append(asyncio.create_task(self._supervised(name, loop),
                                                   name=f"zeroth-{name}"))
        if self._firer is not None:
            firer = self._firer
            self._tasks.append(asyncio.create_task(
                self._supervised("schedules", lambda: firer.run(lambda: self._stopping)),
                name="zeroth-schedules"))
        self._claim_task = asyncio.create_task(self._supervised("claim", self.poll_loop),
                                               name="zeroth-claim")
        log.info("worker %s started for %s (local %d, fleet %s)", self.worker_id,
                 self._source.describe(), self.max_concurrency, self.fleet_max_concurrency)

    def handle_wakeup(self, run_id: object = None) -> None:
        """A hint that work may be claimable: the claim loop polls now. Never blocks."""
        self._wake.set()

    async def poll_loop(self) -> None:
        """Claim until stopping: orphans when a sweep is due, then pending runs in batches."""
        while not self._stopping:
            # Cleared before the pass, not before the sleep: a wakeup that arrives while the pass
            # is talking to the database must still cut the next sleep short.
            self._wake.clear()
            claimed: int | None = None
            try:
                claimed = await self._claim_pass()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("claim pass failed; retrying after the poll interval")
                self._worker_error("claim")
                self._backlog = False
            if self._stopping:
                break
            if claimed is None or self._backlog or self._rate_held():
                # No free slot, or a full batch (more is likely: it claims again at once):
                # writers need not notify this worker until it waits again.
                await self._gate.busy()
            elif claimed:
                # Some work, and room for more: work is flowing. Writers need not notify
                # while it flows; the worker looks again every few milliseconds instead.
                await self._gate.flowing()
            elif await self._gate.idle():
                # Nothing (for a few looks in a row): this worker waits for work and holds the
                # wakeup gate; it gained a stripe, so a writer that did not notify has
                # committed since: look once more before sleeping.
                continue
            await self._sleep_until_work()

    async def interrupt_active_run(self, run_id: UUID) -> None:
        """Stop this worker's execution of a run without changing its persisted status; its
        lease is released (a running run's lease is expired in place and stays recoverable)."""
        entries = [e for (rid, _), e in self._active.items() if rid == run_id]
        for entry in entries:
            self._stop(entry, StopReason.INTERRUPT)
        # Bounded: a handler that ignores its cancellation is left to itself after
        # shutdown_timeout (its lease is released or lapses; red-team pass 8).
        tasks = [entry.task for entry in entries if entry.task is not None]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.shutdown_timeout)
            if stuck:
                log.error("run %s: its handler ignored the interrupt; leaving it", run_id)

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
        if running and not self._hurry.is_set():
            # Until they finish, shutdown_timeout passes, or hurry() (a second SIGTERM).
            finished = asyncio.create_task(asyncio.wait(running))
            hurried = asyncio.create_task(self._hurry.wait())
            await asyncio.wait([finished, hurried], timeout=self.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            for waiter in (finished, hurried):  # cancelling a wait leaves its tasks running
                waiter.cancel()
            if self._hurry.is_set():
                log.info("worker %s: drain hurried; handing %d run(s) back", self.worker_id,
                         sum(1 for task in running if not task.done()))
        leftovers = [entry for entry in self._active.values() if entry.task is not None]
        for entry in leftovers:
            self._stop(entry, StopReason.SHUTDOWN)
        # A handler that swallows its cancellation would hold the shutdown for ever: wait one
        # more shutdown_timeout for the leftovers' hand-backs, then leave whatever still runs
        # (its lease expires and claim_orphaned recovers it, counting the attempt).
        pending = [entry.task for entry in leftovers if entry.task is not None]
        if pending:
            # Hurried, a handler that ignores its cancellation holds the exit no longer than a
            # lease (the hand-back writes of the others give up by their lease deadline too).
            bound = (min(self.shutdown_timeout, self.lease_duration) if self._hurry.is_set()
                     else self.shutdown_timeout)
            _, stuck = await asyncio.wait(pending, timeout=bound)
            for task in stuck:
                log.error("a handler ignored its cancellation at shutdown; abandoning it (%s)",
                          task.get_name())
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
        """Start, then run until SIGTERM/SIGINT (or :meth:`graceful_shutdown`), and drain.

        The handlers are installed before the start: a SIGTERM that arrives once the worker has
        said it started (its claim loop already running), or while it starts, drains it like
        any other, where it used to kill the process with runs in hand."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        signals = (signal.SIGTERM, signal.SIGINT)
        installed = False

        def on_signal(sig: signal.Signals) -> None:
            nonlocal installed
            if not stop.is_set() and not self._stopping:
                stop.set()  # the first: a graceful drain
                return
            # The second, while draining: drain faster (hand everything back now). A third one
            # finds the default action again and ends the process at once (the leases then
            # expire and an orphan sweep recovers the runs, counting their attempts).
            log.warning("worker %s: %s again while draining; handing every run back now",
                        self.worker_id, sig.name)
            self.hurry()
            for each in signals:
                loop.remove_signal_handler(each)
                signal.signal(each, signal.SIG_DFL)
            installed = False

        if install_signal_handlers:
            for sig in signals:
                loop.add_signal_handler(sig, on_signal, sig)
            installed = True
        started = False
        try:
            try:
                await self.start()
                started = True
                waiter = asyncio.create_task(stop.wait())
                await asyncio.wait([waiter, asyncio.create_task(self._stopped.wait())],
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
            finally:
                # With the handlers still installed: a second signal during the drain hurries
                # it, where it used to kill the process with runs in hand.
                if started:
                    await self.graceful_shutdown()
        finally:
            if installed:
                for sig in signals:
                    loop.remove_signal_handler(sig)

    def hurry(self) -> None:
        """Drain faster: a drain (:meth:`graceful_shutdown`, begun or to come) stops waiting
        for running handlers and cancels them at once; each run is handed back to pending with
        its exact generation and its checkpoints (its attempt given back), as after
        ``shutdown_timeout``. What a second SIGTERM or SIGINT does under
        :meth:`run_until_stopped`."""
        self._hurry.set()

    def _drain_soon(self) -> None:
        """Begin a graceful shutdown in a task of its own (a run's task cannot await it: the
        shutdown waits for that task)."""
        if not self._stopping and self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(
                self.graceful_shutdown(), name="zeroth-drain")

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
                self.metrics.worker_crashes.labels(self.deployment_ref, "loop").inc()
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

    def _worker_error(self, kind: str, deployment_ref: str | None = None) -> None:
        self.metrics.worker_errors.labels(deployment_ref or self.deployment_ref, kind).inc()

    def _count_scope(self, counter: Counter, scope: Scope) -> None:
        """One more in a per-scope counter, with ``scope_metrics`` only (None labels: "")."""
        if self.scope_metrics:
            counter.labels(scope.deployment_ref, scope.tenant_id or "",
                           scope.workspace_id or "").inc()

    # -- claiming ------------------------------------------------------------------------------

    def _per_deployment(self, values: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
        """A per-deployment setting, checked against the deployments this worker serves."""
        chosen = dict(values or {})
        unknown = sorted(set(chosen) - set(self._source.deployments))
        if unknown:
            raise ValueError(f"{what} names deployment(s) this worker does not serve: "
                             f"{', '.join(unknown)}")
        return chosen

    def _held(self) -> list[ActiveRun]:
        # A run whose lease is gone was cancelled and can write nothing, and a stopped run is no
        # longer renewed, so its lease is gone once its last confirmed deadline passed: a
        # handler that ignores its cancellation must not keep the slot for ever (red-team
        # passes 7 and 8), nor count against the fleet limit (its admission slot went with it).
        now = time.monotonic()
        return [e for e in self._active.values()
                if not e.lease_gone and not (e.stop_reason is not None and now >= e.deadline)]

    def _free_slots(self) -> int:
        # A run whose handler has returned no longer occupies a local slot while its completion
        # is in flight (its lease is still renewed until the answer): the next claim overlaps
        # the completion call instead of waiting for it. At most max_concurrency runs wait like
        # that, so this worker never holds more than twice max_concurrency leases. Its admission
        # slot (fleet_max_concurrency) is only freed by the completion itself, so under a fleet
        # limit every lease of this worker counts: a claim only they would saturate is a wasted
        # round trip.
        held = self._held()
        # A completion that carries a claim keeps its slot until that call answers: the claim
        # in it fills the slot (complete_and_claim).
        completing = sum(1 for e in held
                         if e.state is RunState.COMPLETING and not e.claims_next)
        executing = len(held) - completing
        free = min(self.max_concurrency - executing, 2 * self.max_concurrency - len(held))
        if self.fleet_max_concurrency is not None:
            free = min(free, self.fleet_max_concurrency - len(held))
        return free

    def _executing_by_deployment(self) -> collections.Counter[str]:
        """Handlers running per deployment, for the local deployment limits. Unlike the total
        (_held), a handler that ignores its stop counts until it returns, lease gone or not,
        and so does one still running after its run was settled (:meth:`linger`): the
        resource such a limit guards is still in use (red-team: a second run of a deployment
        limited to one started beside a sync handler's thread)."""
        running = collections.Counter(
            e.scope.deployment_ref for e in self._active.values()
            if e.state in (RunState.QUEUED, RunState.EXECUTING))
        for deployment, handlers in self._lingering.items():
            running[deployment] += len(handlers)
        return running

    def linger(self, deployment_ref: str, done: asyncio.Future[Any]) -> None:
        """A handler of ``deployment_ref`` goes on running after its run left the worker (a
        sync handler's thread, which Python cannot stop): it counts against the deployment's
        local limit until ``done``."""
        handlers = self._lingering[deployment_ref]
        handlers.add(done)

        def returned(future: asyncio.Future[Any]) -> None:
            handlers.discard(future)
            self._wake.set()  # rare: a claim pass costs less than a run waiting for the poll

        done.add_done_callback(returned)

    def _deployment_has_room(self) -> bool:
        """A deployment whose last own claim was full has room again under its local limit."""
        if not self._deployments_full:
            return False
        executing = self._executing_by_deployment()
        return any(executing[d] < self.deployment_concurrency[d] for d in self._deployments_full)

    def _note_fill(self, deployments: tuple[str, ...] | None, limit: int, got: int) -> None:
        """After a claim: a limited deployment that filled a claim of its own likely has more
        work; one claimed for in a shared claim (whose fill is the backlog's business) or that
        came back short has not (red-team: a stale entry kept an idle worker claiming)."""
        if deployments is not None and len(deployments) == 1 and got == limit and (
                deployments[0] in self.deployment_concurrency):
            self._deployments_full.add(deployments[0])
        else:
            self._deployments_full.difference_update(
                self.deployment_concurrency if deployments is None else deployments)

    def _claim_groups(self, free: int) -> list[tuple[tuple[str, ...] | None, int]]:
        """The claims of one pass, as (deployments, limit); deployments None: all of them.

        Without deployment limits that is one claim of ``free``. A deployment whose local limit
        leaves it less room than ``free`` gets a claim of its own, limited to its room (one
        claim over every deployment could otherwise hand it more than its limit); a deployment
        at its limit is left out. The order of the claims rotates every pass, so a deployment
        with a limit is not always served last.
        """
        if not self.deployment_concurrency:
            return [(None, free)]
        executing = self._executing_by_deployment()
        rooms = {d: limit - executing[d] for d, limit in self.deployment_concurrency.items()}
        shared = tuple(d for d in self._source.deployments if rooms.get(d, free) >= free)
        groups: list[tuple[tuple[str, ...] | None, int]] = [
            ((d,), room) for d, room in rooms.items() if 0 < room < free]
        if shared:
            whole = len(shared) == len(self._source.deployments)
            groups.append((None if whole else shared, free))
        self._claim_round += 1
        turn = self._claim_round % len(groups) if groups else 0
        return groups[turn:] + groups[:turn]

    async def _claim_pass(self) -> int | None:
        """Sweep if due, then claim into the free slots: how many runs were claimed, or None
        when no claim was made (no free slot, or stopping)."""
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
            return None
        groups = self._claim_groups(free)
        if not groups:
            # Every deployment is at its local limit: wait until one frees a slot (those whose
            # last own claim was full wake the loop then, _slot_freed), not claim again at once
            # (red-team: a stale backlog flag here spun the loop without ever yielding).
            self._backlog = False
            return None
        claimed = asked = 0
        self._fleet_full = False
        self._rate_retry_at, self._rate_all_held = None, True
        for deployments, limit in groups:
            limit = min(limit, free - claimed)
            if limit <= 0:
                break
            asked += limit
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            result = await self._source.claim(self.worker_id, limit, self.fleet_max_concurrency,
                                              deployments)
            tracing.received(result.runs, sent_ns)
            self._observe_saturation(result)
            for scope, run in result.runs:
                self._spawn(scope, run, deadline=sent + self.lease_duration, recovered=False)
            claimed += len(result.runs)
            self._fleet_full = self._fleet_full or result.fleet_full
            self._note_fill(deployments, limit, len(result.runs))
            self._note_rate(result)
        self._backlog = claimed == asked and self._rate_retry_at is None
        return claimed

    def _note_rate(self, result: Claimed) -> None:
        """After a claim: when its rate limit lets this worker start again (the earliest over
        the claims of the pass), and whether all it saw is held back. Counted from the answer's
        arrival, which is after the database time retry_after is counted from: never early (an
        early claim would only be held back again), late by the claim's own latency."""
        if result.retry_after is None:
            self._rate_all_held = False
            return
        self.metrics.guardrail_rejections.labels(self.deployment_ref, "rate_limit").inc()
        at = time.monotonic() + result.retry_after
        self._rate_retry_at = at if self._rate_retry_at is None else min(self._rate_retry_at, at)
        self._rate_all_held = self._rate_all_held and result.all_held_back

    def _rate_held(self) -> bool:
        """All the work this worker can see is held back by its rate limit right now."""
        return (self._rate_all_held and self._rate_retry_at is not None
                and time.monotonic() < self._rate_retry_at)

    async def _wake_due_waits(self) -> None:
        """Event waits past their deadline → pending (``zeroth.wake_due_waits``), in every scope
        of this worker's deployments, before each orphan sweep: the replayed wait_for_event then
        records the timeout. A failure is logged; the next sweep tries again."""
        try:
            for _ in range(10):  # at most 1,000 a sweep; the next sweep takes the rest
                if await self.lease_manager.wake_due_waits(self._source.deployments,
                                                           batch_size=100) < 100:
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("waking timed-out event waits failed; the next sweep tries again")
            self._worker_error("wake_due_waits")

    async def _sweep_orphans(self) -> None:
        await self._wake_due_waits()
        free = self._free_slots()
        groups = self._claim_groups(free) if free > 0 else []
        if not groups:
            # No slot to re-lease into (none free, or every deployment at its local limit), but
            # the orphans nobody may resume (out of attempts, not resumable past grace) need
            # none: end them, so their threads move on while every worker is busy (claim_limit
            # 0: end only), once per sweep interval. Re-leasing waits for a free slot.
            self._sweep_due = True  # retried as soon as a slot frees
            if time.monotonic() >= self._next_end_only:
                self._next_end_only = time.monotonic() + self.orphan_sweep_interval
                await self._source.sweep(self.worker_id, 0, self.fleet_max_concurrency,
                                         self.orphan_grace)
            return
        more = False
        claimed = 0
        next_sweep: float | None = None
        # A deployment at its local limit is left out; its orphans wait for its next sweep.
        for deployments, limit in groups:
            limit = min(limit, free - claimed)
            if limit <= 0:
                break
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            result = await self._source.sweep(self.worker_id, limit, self.fleet_max_concurrency,
                                              self.orphan_grace, deployments)
            tracing.received(result.runs, sent_ns)
            self._observe_saturation(result)
            for scope, run in result.runs:
                log.info("recovered orphan %s at generation %d, attempt %d (checkpoint %s)",
                         run.run_id, run.lease_generation, run.attempts,
                         run.recovery_checkpoint_id)
                # Its worker stopped renewing while it ran: a crash as the fleet sees it.
                self.metrics.worker_crashes.labels(scope.deployment_ref, "orphan").inc()
                self._spawn(scope, run, deadline=sent + self.lease_duration, recovered=True)
            claimed += len(result.runs)
            # Saturated, or the limit was reached: there may be more orphans; look again soon.
            more = more or result.saturated or len(result.runs) == limit
            if result.retry_after is not None:
                # Orphans held back by a rate limit: sweep again when a start is possible (a
                # claim pass sweeps before it claims, so the orphan takes that start before
                # this worker's pending runs do), not a whole sweep interval later, by when
                # claimers sleeping until the same instant have taken every start.
                held = time.monotonic() + result.retry_after
                next_sweep = held if next_sweep is None else min(next_sweep, held)
        self._sweep_due = more
        self._next_sweep = min(time.monotonic() + self.orphan_sweep_interval,
                               next_sweep if next_sweep is not None else float("inf"))

    def _observe_saturation(self, result: Claimed) -> None:
        if result.limit is not None:  # one scope: its utilisation
            self.metrics.utilization.labels(self.deployment_ref, "concurrency").set(
                min(1.0, result.active_count / result.limit))
        if result.saturated:
            self.metrics.guardrail_rejections.labels(self.deployment_ref, "concurrency").inc()

    async def _sleep_until_work(self) -> None:
        if self._free_slots() > 0 and (self._backlog or self._deployment_has_room()):
            return  # the last batch was full and a slot is already free: claim again now
        timeout = self._gate.poll_in(self.poll_interval)
        if self._rate_retry_at is not None:
            # Held back by a rate limit: look again right then. With all its work held back the
            # worker does not poll meanwhile (a poll could only be held back again); otherwise
            # the poll interval still serves the rest.
            wait = max(0.0, self._rate_retry_at - time.monotonic())
            timeout = wait if self._rate_all_held else min(timeout, wait)
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
        if (self._backlog or self._sweep_due or (fleet and self._fleet_full)
                or self._deployments_full):
            self._wake.set()

    # -- notifications: hints, never the truth -------------------------------------------------

    def _on_listen(self) -> None:
        """After every LISTEN (re)connect: look for work (notifications sent meanwhile are
        gone) and fetch the keys again (the secret they come from may have been rotated)."""
        if self.notifier is not None:
            self._gate.connected(self.notifier)
        self.handle_wakeup()
        self._leases.renew_now.set()
        task = asyncio.get_running_loop().create_task(self._fetch_keys())
        self._key_tasks.add(task)
        task.add_done_callback(self._key_tasks.discard)

    async def _fetch_keys(self) -> None:
        try:
            self._wakeup_keys = await self._source.wakeup_keys()
            self._control_key = await self.lease_manager.control_key(self.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # until the next connect every notification is a hint for us
            log.warning("could not fetch this worker's notification keys (%s: %s)",
                        type(exc).__name__, exc)

    def _on_notification(self, channel: str, payload: str) -> None:
        if channel == WAKEUP_CHANNEL:
            if (self._wakeup_keys is None or payload in self._wakeup_keys) and (
                    not self._rate_held()):
                self.handle_wakeup()
        elif channel == CONTROL_CHANNEL and self._active and (
                self._control_key is None or payload == self._control_key):
            # Someone asked for a cancel of a run held by this worker id, or pretends to: ask
            # the database (the renewal reports cancel_requested) before stopping anything.
            self._leases.renew_now.set()

    # -- lease upkeep --------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        await self._leases.run()

    async def _queue_depth_loop(self) -> None:
        while True:
            try:
                # Per deployment served, summed over the scopes served (one statement).
                for deployment, depth in (await self._source.queue_depth()).items():
                    self.metrics.queue_depth.labels(deployment).set(depth)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("queue depth sample failed: %s", exc)
            await asyncio.sleep(self.queue_depth_interval or 10.0)

    # -- executing a run -----------------------------------------------------------------------

    def _stop(self, entry: ActiveRun, reason: StopReason) -> None:
        if entry.request_stop(reason) and entry.task is not None and not entry.task.done():
            entry.task.cancel()

    def _spawn(self, scope: Scope, run: ClaimedRun, *, deadline: float, recovered: bool) -> None:
        # This process may have recovered its own orphan (its event loop stalled past the
        # lease): the older generation's lease is gone, so stop that task; it writes nothing.
        held_generations = self._generations.setdefault(run.run_id, set())
        for older in [self._active[(run.run_id, g)] for g in held_generations]:
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
            cancelled=asyncio.Event(), scope=scope, _worker=self)
        entry = ActiveRun(run=run, ctx=ctx, deadline=deadline)
        self._active[entry.key] = entry
        held_generations.add(run.lease_generation)
        entry.task = asyncio.create_task(self._execute(entry), name=f"run-{run.run_id}")
        if run.cancel_requested:  # the claim itself reported the cancel: the database said so
            self._stop(entry, StopReason.CANCEL)

    async def _execute(self, entry: ActiveRun) -> None:
        run = entry.run
        try:
            if entry.stop_reason is not None:  # stopped before this task ran (a claimed orphan
                await self._settle_stopped(entry)  # with a pending cancel): never start it
                return
            if run.undecodable is not None:
                # JSON the database holds but Python cannot decode: no handler could run it, and
                # no retry can change that.
                log.warning("run %s: cannot decode its JSON (%s); failing it", run.run_id,
                            run.undecodable)
                await self._fail(entry, InvalidPayloadError(
                    f"this worker cannot decode the run's JSON: {run.undecodable}"),
                    retryable=False)
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
            # Not log.exception: the chain may hold the handler's exception, whose message is
            # unbounded; describe() bounds it.
            log.error("run %s: worker error outside the handler\n%s", run.run_id,
                      describe(exc).traceback)
            self._worker_error("settle")
            await self._fail_quietly(entry, exc)
        finally:
            entry.finish()
            if self._active.get(entry.key) is entry:
                del self._active[entry.key]
                generations = self._generations.get(run.run_id)
                if generations is not None:
                    generations.discard(run.lease_generation)
                    if not generations:
                        del self._generations[run.run_id]
            if not entry.slot_passed_on:
                self._slot_freed(fleet=True)

    async def _execute_leased(self, entry: ActiveRun) -> None:
        # Both claim paths (claim_and_start, claim_orphaned) hand over runs already running.
        with tracing.process(entry.scope, entry.run, attempt=entry.ctx.attempt,
                             worker_id=self.worker_id, recovered=entry.ctx.recovered) as span:
            await self._attempt(entry, span)

    async def _attempt(self, entry: ActiveRun, span: Any) -> None:
        """Run the handler, then write the attempt's outcome (``span``: its trace span)."""
        run, ctx = entry.run, entry.ctx
        deployment = entry.scope.deployment_ref
        runs_started, runs_completed, run_duration = self._series[deployment]
        runs_started.inc()
        self._count_scope(self.metrics.scope_runs_started, entry.scope)
        started = time.monotonic()
        try:
            output = await self._handlers[deployment](ctx)
        except RunSlept as exc:
            if ctx.slept is not None:
                self._after_sleep(entry, span)
                return
            # Raised without a sleep of this attempt (made by the handler, or another run's):
            # its lease is still live, so it ends as a failure, never left to expire.
            self.metrics.handler_errors.labels(deployment).inc()
            log.warning("run %s attempt %d: the handler raised RunSlept without sleeping",
                        run.run_id, ctx.attempt)
            tracing.failed(span, exc, "handler failed")
            await self._fail(entry, exc, retryable=True)
            return
        except asyncio.CancelledError as exc:
            if ctx.slept is not None:  # asleep, so settled: no stop cancels it
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the loop is cancelling this task
                self._after_sleep(entry, span)
                return
            if entry.stop_reason is not None:
                tracing.failed(span, None, f"stopped: {entry.stop_reason.value}")
                await self._settle_stopped(entry)
                return
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the loop is cancelling this task: not the handler's doing
            # The handler raised CancelledError itself (a cancelled inner task it let escape):
            # a failure like any other, never a run dropped without an outcome.
            self.metrics.handler_errors.labels(deployment).inc()
            log.warning("run %s attempt %d: the handler raised CancelledError itself",
                        run.run_id, ctx.attempt)
            tracing.failed(span, exc, "handler failed")
            await self._fail(entry, exc, retryable=True)
            return
        except LeaseLostError as exc:
            tracing.failed(span, exc, "lease lost")
            self._lease_lost(entry, fenced=True)
            return
        except BaseException as exc:
            if ctx.slept is not None:  # it swallowed RunSlept and raised something else: the
                self._after_sleep(entry, span)  # sleep was accepted, nothing more is written
                return
            # Exception, and whatever else a handler may raise (GeneratorExit, a BaseException
            # subclass of its own, SystemExit from sys.exit or argparse, KeyboardInterrupt): a
            # failure of this attempt, never a run left to its lease nor the worker's end.
            # NonRetryableError (raised by the handler, or by the application API for a
            # payload that does not fit it) says no retry can succeed: the run fails now.
            failure = handler_exit(exc)
            retryable = not isinstance(failure, NonRetryableError)
            self.metrics.handler_errors.labels(deployment).inc()
            # Described once, bounded, before anything is done with it: the message may be a
            # response body of hundreds of MB (docs/python-guide.md).
            described = describe(failure)
            log.info("run %s attempt %d failed%s: %s: %s", run.run_id, ctx.attempt,
                     "" if retryable else " for good", described.type, described.message)
            tracing.failed(span, described, "handler failed" if retryable else "failed for good")
            if isinstance(exc, KeyboardInterrupt) and _interrupts_raise_here():
                # Where SIGINT raises KeyboardInterrupt in this thread (no run_until_stopped
                # nor asyncio.run handling it), this may be the operator's Ctrl-C: drain.
                log.warning("run %s: KeyboardInterrupt while SIGINT raises it here; the worker "
                            "drains", run.run_id)
                self._drain_soon()
            await self._fail(entry, described, retryable=retryable)
            return
        finally:
            run_duration.observe(time.monotonic() - started)
        if ctx.slept is not None:  # it swallowed RunSlept and returned: the run sleeps anyway
            self._after_sleep(entry, span)
            return
        if entry.lease_gone:
            tracing.failed(span, None, "lease lost")
            self._lease_lost(entry, fenced=False)
            return
        # Retrying cannot make an output JSON, nor storable: fail that run, never its batch.
        try:
            text = json.dumps(output, allow_nan=False)  # what the client will send
        except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: too deep
            tracing.failed(span, exc, "output is not JSON")
            self.metrics.handler_errors.labels(deployment).inc()
            await self._fail(entry, exc, retryable=False)
            return
        if len(text) > MAX_OUTPUT_CHARACTERS:
            log.warning("run %s: its output is %d characters of JSON, more than jsonb holds; "
                        "failing it", run.run_id, len(text))
            await self._fail(entry, ValueError(
                f"PostgreSQL cannot store the output: {len(text)} characters of JSON, more "
                f"than jsonb holds ({MAX_OUTPUT_CHARACTERS})"), retryable=False)
            tracing.failed(span, None, "output too large")
            self.metrics.handler_errors.labels(deployment).inc()
            return
        if (why := unstorable(output)) is not None:
            log.warning("run %s: PostgreSQL cannot store its output (%s); failing it",
                        run.run_id, why)
            tracing.failed(span, None, "output not storable")
            self.metrics.handler_errors.labels(deployment).inc()
            await self._fail(entry, ValueError(f"PostgreSQL cannot store the output: {why}"),
                             retryable=False)
            return
        try:
            with tracing.step("complete", deployment, run.run_id):
                completed = await self._complete(entry, output)
        except Exception as exc:
            # The database refused this one run's completion for its value (a data exception,
            # a program limit, a zeroth argument error): retrying cannot help. Anything else
            # (a cancelled statement, the completion machinery broke) may pass next time.
            refused = isinstance(exc, DatabaseError) and not isinstance(exc, RetryableError) and (
                (exc.code or getattr(exc, "sqlstate", None) or "")[:2] in ("22", "54", "ZP"))
            refusal = describe(exc)
            log.warning("run %s: its completion failed (%s: %s); failing it", run.run_id,
                        refusal.type, refusal.message)
            self._worker_error("completion_refused" if refused else "completion_lost",
                               deployment)
            tracing.failed(span, refusal, "completion refused" if refused else "completion lost")
            await self._fail(entry, refusal, retryable=not refused)
            return
        if completed:
            runs_completed.inc()
            # The acknowledgement, in the log: what a failover soak compares with what the new
            # primary holds (tests/failover).
            log.debug("run %s completed at generation %d", run.run_id, run.lease_generation)
            self._count_scope(self.metrics.scope_runs_completed, entry.scope)
            tracing.outcome(span, "completed")
        elif completed is False:
            tracing.failed(span, None, "lease lost")
            self._lease_lost(entry, fenced=True)
        else:
            tracing.failed(span, None, "no answer before the lease deadline")

    def run_slept(self, ctx: RunContext) -> None:
        """The database accepted ``ctx``'s sleep (RunContext.sleep_until): its lease is gone.
        Settled now, so neither a renewal nor a stop touches it while the handler unwinds."""
        entry = self._active.get((ctx.run_id, ctx.lease_generation))
        if entry is not None and entry.ctx is ctx and entry.state is RunState.EXECUTING:
            entry.advance(RunState.SETTLING)

    def _after_sleep(self, entry: ActiveRun, span: Any) -> None:
        """The attempt ended in a durable sleep: nothing is written; its slot frees when its
        task ends."""
        slept = entry.ctx.slept
        deployment = entry.scope.deployment_ref
        if slept is not None and slept.outcome is SleepOutcome.CANCELLED:
            log.info("run %s cancelled on request instead of sleeping", entry.run.run_id)
            tracing.outcome(span, "cancelled")
            return
        self.metrics.runs_slept.labels(deployment).inc()  # waits for an event count here too
        if slept is not None and slept.outcome is SleepOutcome.WAITING:
            log.info("run %s attempt %d waits for an event (deadline %s)", entry.run.run_id,
                     entry.ctx.attempt, slept.run_after)
        else:
            log.info("run %s attempt %d sleeps until %s", entry.run.run_id, entry.ctx.attempt,
                     None if slept is None else slept.run_after)
        tracing.outcome(span, "slept")

    async def _complete(self, entry: ActiveRun, output: Any) -> bool | None:
        """Queue the run's completion for the next complete_runs call and wait for its row:
        True completed, False refused by the fence, None no answer before the lease deadline."""
        entry.advance(RunState.COMPLETING)
        entry.claims_next = self._may_claim_along(entry)
        answer = self._completions.submit(entry, output)
        if not entry.claims_next:
            self._slot_freed()
        return await answer

    def _may_claim_along(self, entry: ActiveRun) -> bool:
        """The completion of ``entry`` may carry the claim of the next run into its slot: one
        commit for both (complete_and_claim). Only where a claim pass would do nothing else:
        one scope, no local deployment limits, no orphan sweep due (a claim pass sweeps first),
        no rate limit holding claims back, not stopping."""
        return (isinstance(self._source, OneScope) and entry.scope == self._source.scope
                and not self._stopping and not self.deployment_concurrency
                and not self._sweep_due and time.monotonic() < self._next_sweep
                and self._rate_retry_at is None)

    async def _complete_and_claim(self, batch: list[tuple[Leased, Any]]) -> list[bool] | None:
        """The claim_along of the completion batcher: complete ``batch`` and claim one run per
        entry that carries a claim, in one call; the claimed runs start here. The flags are
        cleared whatever happens, so a failed call gives the slots back to the claim loop."""
        along = [entry for entry, _ in batch if entry.claims_next]
        source = self._source
        full = False
        try:
            if not along or self._stopping or not isinstance(source, OneScope):
                return None
            sent, sent_ns = time.monotonic(), tracing.now_ns()
            completions, result = await source.complete_and_claim(
                self.worker_id,
                [(entry.run.run_id, entry.run.lease_generation, output)
                 for entry, output in batch],
                len(along), self.fleet_max_concurrency)
            tracing.received(result.runs, sent_ns)
            self._observe_saturation(result)
            for scope, run in result.runs:
                self._spawn(scope, run, deadline=sent + self.lease_duration, recovered=False)
                if self._stopping:
                    # The drain began while this call was out: never start these; each is
                    # handed back with its exact generation.
                    self._stop(self._active[(run.run_id, run.lease_generation)],
                               StopReason.SHUTDOWN)
            for entry in along[:len(result.runs)]:
                if isinstance(entry, ActiveRun):
                    entry.slot_passed_on = True
            full = len(result.runs) == len(along) and result.retry_after is None
            return [row.completed for row in completions]
        finally:
            for entry in along:
                entry.claims_next = False
            if along and not full:
                # The claim came back short (no more work, a limit, a rate limit) or was not
                # made: the claim loop takes over, so the wakeup gate, the rate-limit sleep and
                # the saturation flags follow a claim pass of its own, as without this call.
                self._wake.set()

    async def _completion_loop(self) -> None:
        await self._completions.run()

    async def _settle_stopped(self, entry: ActiveRun) -> None:
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

    async def _fail(self, entry: ActiveRun, exc: BaseException | ErrorDescription, *,
                    retryable: bool) -> None:
        """Write the attempt's failure with its error document (``exc`` bounded by
        :func:`~zeroth_pg.errors.describe`, unless described already)."""
        run = entry.run
        # Described before the state moves: nothing about the exception may raise past here.
        described = exc if isinstance(exc, ErrorDescription) else describe(exc)
        error = described.document(worker_id=self.worker_id,
                                   lease_generation=run.lease_generation)
        retry = self._retries[entry.scope.deployment_ref]
        entry.advance(RunState.SETTLING)

        def fail(document: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
            return self._fenced(
                entry, self.lease_manager.fail_run, error=document, retryable=retryable,
                retry_base_seconds=None if retry is None else retry.base_seconds,
                retry_max_seconds=None if retry is None else retry.max_seconds)

        try:
            outcome = await self._write(entry, fail(error))
        except ZerothError as refused:  # never a RetryableError: _write retries those
            # The document itself was refused (above the database's bound, a value it cannot
            # hold): the same call would be refused every time, and a run left to its lease
            # would be charged an attempt by every recovery. A minimal document instead.
            why = describe(refused)
            code = getattr(refused, "code", None) or refused.sqlstate
            log.warning("run %s: the database refused its error document (%s: %s); writing a "
                        "shorter one", run.run_id, why.type, why.message)
            outcome = await self._write(entry, fail({
                "type": bounded_text(described.type, 200),
                "message": bounded_text(described.message, 1000),
                "refused": bounded_text(f"{why.type} ({code}): {why.message}", 1000),
                "worker_id": self.worker_id, "lease_generation": run.lease_generation}))
        if outcome is not None:
            self._count_scope(self.metrics.scope_runs_failed, entry.scope)
            self.metrics.runs_failed.labels(entry.scope.deployment_ref,
                                            _FAILED_LABELS.get(outcome, "failed")).inc()
        if outcome is None:
            self._lease_lost(entry, fenced=True)
        elif outcome == FailOutcome.DEAD_LETTERED:
            self.metrics.runs_dead_lettered.labels(entry.scope.deployment_ref).inc()
            log.warning("run %s dead-lettered after %d attempts", run.run_id, entry.ctx.attempt)

    async def _fail_quietly(self, entry: ActiveRun, exc: BaseException) -> None:
        """Last resort after a worker error: a retryable failure with a minimal error document.
        If even that cannot be written, the lease expires and claim_orphaned recovers the run,
        counting the attempt, so a worker bug that always hits ends in a dead letter."""
        if not entry.may_settle:
            return
        entry.advance(RunState.SETTLING)
        described = describe(exc)
        try:
            await self._write(entry, self._fenced(
                entry, self.lease_manager.fail_run, retryable=True,
                error={"type": "WorkerError",
                       "message": bounded_text(f"{described.type}: {described.message}", 1000),
                       "worker_id": self.worker_id}))
        except Exception as broken:
            log.error("run %s: could not record the worker error; its lease will expire\n%s",
                      entry.run.run_id, describe(broken).traceback)

    def _lease_lost(self, entry: ActiveRun, *, fenced: bool) -> None:
        deployment = entry.scope.deployment_ref
        self.metrics.lease_lost.labels(deployment).inc()
        if fenced:
            self.metrics.fencing_rejected.labels(deployment).inc()
        log.warning("run %s: lease generation %d lost (%s); nothing more is written",
                    entry.run.run_id, entry.run.lease_generation,
                    "write refused" if fenced or entry.stop_reason is None
                    else entry.stop_reason.value)

    def _fenced(self, entry: ActiveRun, method: Callable[..., Awaitable[Any]],
                **extra: Any) -> Callable[[], Awaitable[Any]]:
        """A repeatable call of a LeaseManager write carrying this run's exact lease."""
        run, scope = entry.run, entry.scope
        return lambda: method(run.run_id, self.worker_id, generation=run.lease_generation,
                              tenant_id=scope.tenant_id, workspace_id=scope.workspace_id, **extra)

    async def _write(self, entry: ActiveRun, call: Callable[[], Awaitable[Any]]) -> Any:
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


#: zeroth_runs_failed's outcome label of each fail_run outcome (a fixed set of three).
_FAILED_LABELS = {FailOutcome.RETRY_SCHEDULED: "retried", FailOutcome.FAILED: "failed",
                  FailOutcome.DEAD_LETTERED: "dead_lettered"}


def _interrupts_raise_here() -> bool:
    """SIGINT raises KeyboardInterrupt in this thread: Python's default handler is installed and
    this is the main thread (neither :meth:`RunWorker.run_until_stopped` nor ``asyncio.run``
    took SIGINT over), so a KeyboardInterrupt out of a handler may be the operator's Ctrl-C."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
