"""RunWorker: construction, start, drain and supervision of a worker's tasks.

The parts a worker is made of live beside it (the package docstring has the whole picture):
:mod:`._claims` (the claim loop, paced by :mod:`._pacing`, over the slots of :mod:`._slots`),
:mod:`._execute` (a task per run: the handler, its outcome decided by :mod:`._outcome`),
:mod:`._settle` (every outcome written, completions batched), :mod:`._leases` (renewals) and
:mod:`._run` (what a handler sees, and a run's lifecycle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from uuid import UUID

import asyncpg

from zeroth_pg.client import LeaseManager
from zeroth_pg.metrics import WorkerMetrics, default_metrics
from zeroth_pg.notify import Notifier
from zeroth_pg.types import RetryPolicy
from zeroth_pg.worker._ahead import check_claim_ahead
from zeroth_pg.worker._claims import ClaimLoop, ClaimSettings, check_code_version, check_options
from zeroth_pg.worker._execute import RunExecutor, scope_counter
from zeroth_pg.worker._gate import WakeupGate
from zeroth_pg.worker._leases import LeaseUpkeep
from zeroth_pg.worker._listen import Listener
from zeroth_pg.worker._pacing import ClaimPacer
from zeroth_pg.worker._run import ActiveRun, Handler, RunState, StopReason
from zeroth_pg.worker._schedules import PeriodicSchedule, ScheduleFirer, firer_for
from zeroth_pg.worker._settle import CompletionBatcher, Settler
from zeroth_pg.worker._signals import drain_signals
from zeroth_pg.worker._slots import HeldRuns
from zeroth_pg.worker._sources import OneScope, default_worker_id, per_deployment, source_for
from zeroth_pg.worker._sources import retry_policies as retry_policies_of
from zeroth_pg.worker._startup import first_set, start_unless_stopped
from zeroth_pg.worker._stuck import suspended_at

__all__ = ["RunWorker"]

log = logging.getLogger("zeroth_pg.worker")


class RunWorker:
    """A worker of one deployment in one tenant/workspace scope, or (a fleet worker) of several
    deployments in many scopes.

    ``RunWorker(pool, "send-email", handler, tenant_id=…)`` serves one scope.
    ``RunWorker(pool, {"send-email": h1, "resize": h2})`` serves every scope of those
    deployments, and with ``scopes=[(tenant_id, workspace_id), …]`` the listed ones; one claim
    loop (``zeroth.claim_and_start_scopes``: fair shares per scope, by the weights of
    ``zeroth.scope_limits``), one listener, one renewal task and one settle task for all of
    them, each run's handler chosen by its deployment.

    ``max_concurrency`` is the local cap (handlers running in this process; ``claim_ahead``
    runs more, claimed and started, may wait for one: docs "Claiming ahead"), and
    ``deployment_concurrency`` (``{deployment: n}``) caps single deployments under it;
    ``retries`` (``{deployment: RetryPolicy}``) replaces ``retry_base_seconds`` /
    ``retry_max_seconds`` for some deployments; with neither (both None, the default) a
    deployment's failures take its policy registered in ``zeroth.deployments``, else 1 / 300 s.
    ``fleet_max_concurrency``, when set, is passed to every claim and bounds live leases of each
    scope across all workers, atomically in SQL (a scope's ``zeroth.scope_limits`` row, when it
    has one, replaces it). ``dsn`` enables LISTEN/NOTIFY wakeups on a dedicated connection;
    without it the worker polls. The orphan sweep also ends the runs no
    worker may resume (out of attempts; not resumable and expired more than ``orphan_grace``
    seconds ago), so their threads move on.

    ``scope_metrics=True`` also counts each run in the ``zeroth_scope_runs_started`` /
    ``_completed`` / ``_failed`` counters labelled by deployment, tenant and workspace. Off by
    default: a fleet worker of every scope makes a series per tenant it ever saw (unbounded
    cardinality for the metrics backend); turn it on for a bounded set of tenants.
    ``queue_depth_interval`` (seconds; default None, off) samples the ``zeroth_queue_depth``
    gauge of the deployments served: off by default, since every worker of a fleet would report
    the same number; ``zeroth-pg metrics`` (:mod:`zeroth_pg.fleet_metrics`) serves the
    database's gauges once per fleet. ``call_timeout`` (seconds; None: unbounded) bounds each
    call through ``pool`` (:class:`~zeroth_pg.client.LeaseManager`): a hung primary is left.
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
        max_concurrency: int = 8, claim_ahead: int = 0,
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
        fire_schedules: bool | None = None, schedule_max_sleep: float = 1.0,
        code_version: str | None = None,  # see docs: Code versions
        call_timeout: float | None = 5.0,
    ) -> None:
        check_options(max_concurrency, poll_interval, orphan_sweep_interval, lease_duration,
                      renew_fraction, call_timeout, worker_id)
        self.pool = pool  # every claim of its LeaseManager declares code_version (issue 34)
        self.lease_manager = LeaseManager(pool, lease_duration, check_code_version(code_version),
                                          call_timeout=call_timeout)
        self._handlers, self._source = source_for(self.lease_manager, deployment_ref, handler,
                                                  scopes, tenant_id, workspace_id)
        #: The first (for a worker of one deployment, the only) deployment served.
        self.deployment_ref = self._source.deployments[0]
        self.dsn, self.tenant_id, self.workspace_id = dsn, tenant_id, workspace_id
        self.max_concurrency, self.fleet_max_concurrency = max_concurrency, fleet_max_concurrency
        self.claim_ahead = check_claim_ahead(claim_ahead, max_concurrency, fleet_max_concurrency)
        self.poll_interval, self.orphan_sweep_interval, self.orphan_grace = \
            poll_interval, orphan_sweep_interval, orphan_grace
        self.worker_id = worker_id or default_worker_id()  # checked: never "" here
        self.shutdown_timeout = shutdown_timeout
        self.lease_duration = lease_duration
        self.renew_interval = lease_duration * renew_fraction
        self.retry_base_seconds, self.retry_max_seconds = retry_base_seconds, retry_max_seconds
        retry_policies = retry_policies_of(retry_base_seconds, retry_max_seconds, retries,
                                           self._source.deployments)
        #: Local limits of single deployments (handlers running at once in this process), under
        #: the total ``max_concurrency``.
        self.deployment_concurrency = per_deployment(
            deployment_concurrency, self._source.deployments, "deployment_concurrency")
        if any(not isinstance(n, int) or n < 1 for n in self.deployment_concurrency.values()):
            raise ValueError("every deployment_concurrency limit must be an int of at least 1")
        self.queue_depth_interval = queue_depth_interval
        self.metrics = metrics or default_metrics()
        self.scope_metrics = scope_metrics
        self._count_scope = scope_counter(lambda: self.scope_metrics)
        self.notifier: Notifier | None = None
        # Registered on start, then fired for the deployments and scopes served (_schedules).
        self._firer: ScheduleFirer | None = firer_for(
            self.lease_manager, self._source, (tenant_id, workspace_id), schedules,
            fire_schedules, schedule_max_sleep)
        self._assemble(retry_policies)
        self._stopping = False
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()  # hurry(): a drain hands everything back at once
        self._tasks: list[asyncio.Task[None]] = []
        self._claim_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None

    def _assemble(self, retries: Mapping[str, RetryPolicy | None]) -> None:
        """The parts: the held runs, the settler, the run executor, the claim loop, renewals."""
        self._runs = HeldRuns(self.max_concurrency, self.fleet_max_concurrency,
                              on_linger_end=lambda: self._claims.wake.set(),
                              claim_ahead=self.claim_ahead)
        #: The runs held, keyed by (run_id, generation).
        self._active: dict[tuple[UUID, int], ActiveRun] = self._runs.active
        completions = CompletionBatcher(
            self.lease_manager, self.worker_id,
            # A handler that finishes in this same turn of the event loop joins the batch.
            others_may_join=lambda: any(
                e.state is RunState.EXECUTING for e in self._active.values()),
            on_batch_refused=lambda: self._worker_error("completion_batch"),
            on_retry=lambda: self._worker_error("settle_retry"),
            claim_along=((lambda batch: self._claims.complete_and_claim(batch))
                         if isinstance(self._source, OneScope) else None))
        self._settler = Settler(self.lease_manager, self.worker_id, self.metrics, retries,
                                count_scope=self._count_scope, completions=completions)
        self._executor = RunExecutor(
            self.lease_manager, self.worker_id, self._handlers, self._runs, self._settler,
            self.metrics, count_scope=self._count_scope, worker_error=self._worker_error,
            drain_soon=self._drain_soon)
        # Writers notify only while this worker waits for work and holds their stripe (_gate).
        self._gate = WakeupGate(self._source.gate_targets())
        self._claims = ClaimLoop(
            ClaimSettings(self.worker_id, self.fleet_max_concurrency, self.lease_duration,
                          self.poll_interval, self.orphan_sweep_interval, self.orphan_grace,
                          self.deployment_ref),
            self.lease_manager, self._source, self._runs,
            ClaimPacer(deployment_limits=self.deployment_concurrency), self._gate, self.metrics,
            spawn=self._executor.spawn, stopping=lambda: self._stopping,
            worker_error=self._worker_error)
        self._executor.may_claim_along = self._claims.may_claim_along
        self._executor.slot_freed = self._claims.slot_freed
        self._executor.stopping = lambda: self._stopping
        self._listener = Listener(
            self.lease_manager, self._source, self._gate, self.worker_id,
            wake=lambda: self.handle_wakeup(), rate_held=self._claims.rate_held,
            renew=lambda: self._leases.renew_now.set(), holding=lambda: bool(self._active))
        self._leases = LeaseUpkeep(
            self.lease_manager, self.worker_id, runs=self._active.values,
            stop=lambda entry, reason: entry.stop(reason),
            lease_duration=self.lease_duration, renew_interval=self.renew_interval)

    # -- public surface ------------------------------------------------------------------------

    @property
    def active_run_ids(self) -> list[UUID]:
        return list(dict.fromkeys(run_id for run_id, _ in self._active))

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def _claim_round(self) -> int:
        """Claim passes (and sweeps) made with deployment limits (their order rotates)."""
        return self._claims.pacer.claim_round

    async def start(self) -> None:
        """Declare the schedules (._schedules), then start the notifier, renewals and claims."""
        if self._claim_task is not None or self._stopping:  # started, or stopped (for good)
            return
        if self._firer is not None:  # a schedule the database refuses fails the start
            await self._firer.register(self.worker_id)
            if self._stopping:  # graceful_shutdown() while it waited: start nothing
                return
        if self.dsn is not None:
            self.notifier = self._listener.start(self.dsn)
        loops: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("renew", self._renew_loop), ("complete", self._settler.completions.run)]
        if self.queue_depth_interval:
            # Opt-in: every worker of a fleet would report the same depth; one exporter per fleet
            # serves the database's gauges (fleet_metrics).
            loops.append(("depth", lambda: self._claims.sample_queue_depth(
                self.queue_depth_interval or 10.0)))
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
        self._claims.wake.set()

    async def poll_loop(self) -> None:
        """Claim until stopping: orphans when a sweep is due, then pending runs in batches."""
        await self._claims.run()

    async def interrupt_active_run(self, run_id: UUID) -> None:
        """Stop this worker's execution of a run without changing its persisted status; its
        lease is released (a running run's lease is expired in place and stays recoverable)."""
        entries = [e for (rid, _), e in self._active.items() if rid == run_id]
        for entry in entries:
            entry.stop(StopReason.INTERRUPT)
        # Bounded: a handler that ignores its cancellation is left to itself after
        # shutdown_timeout (its lease is released or lapses).
        tasks = [entry.task for entry in entries if entry.task is not None]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=self.shutdown_timeout)
            for task in stuck:
                log.error("run %s: its handler ignored the interrupt; leaving it (waiting at %s)",
                          run_id, suspended_at(task))

    async def graceful_shutdown(self) -> None:
        """Stop claiming, let running handlers finish for up to ``shutdown_timeout``, then
        cancel the rest and hand each back to pending with its exact generation."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._claims.wake.set()
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
            entry.stop(StopReason.SHUTDOWN)
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
                log.error("a handler ignored its cancellation at shutdown; abandoning it (%s, "
                          "waiting at %s)", task.get_name(), suspended_at(task))
        background = list(self._tasks)
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._listener.stop()
        self._stopped.set()
        log.info("worker %s stopped", self.worker_id)

    async def run_until_stopped(self, *, install_signal_handlers: bool = True) -> None:
        """Start, then run until SIGTERM/SIGINT (or :meth:`graceful_shutdown`), and drain.

        The handlers are installed before the start: a SIGTERM once the worker said it started
        drains it (it used to kill the process with runs in hand); one while the start waits
        for its database ends it there, nothing held."""
        stop = asyncio.Event()

        def first() -> bool:  # a graceful drain
            if stop.is_set() or self._stopping:
                return False
            stop.set()
            return True

        def again(sig: signal.Signals) -> None:  # while draining: hand everything back now
            log.warning("worker %s: %s again while draining; handing every run back now",
                        self.worker_id, sig.name)
            self.hurry()

        with drain_signals(install_signal_handlers, first=first, again=again):
            try:
                if not await start_unless_stopped(self.start, stop, self._stopped,
                                                  worker_id=self.worker_id):
                    return  # a signal or graceful_shutdown() while it started: nothing held
                await first_set(stop, self._stopped)
            finally:
                # Whatever ends it, a worker that started (its claim loop exists: even one whose
                # start finished as this call was cancelled) is drained, with the handlers still
                # installed: a second signal during the drain hurries it.
                if self._claim_task is not None:
                    await self.graceful_shutdown()

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

    # -- background loops ----------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        await self._leases.run()
