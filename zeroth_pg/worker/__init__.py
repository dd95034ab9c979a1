"""RunWorker: claims runs, executes a handler under a renewed lease, recovers orphans, drains.

One worker is a handful of asyncio tasks around the SQL functions:

* the **claim loop** (:meth:`RunWorker.poll_loop`) claims *and starts* pending runs in batches
  up to the free local slots (``claim_and_start``: one round trip per batch), sweeps for orphans
  on start and every ``orphan_sweep_interval`` (``claim_orphaned``, which also ends the orphans
  nobody may resume), and sleeps until a NOTIFY, a freed slot after a full batch, or
  ``poll_interval``. It is the only task that claims, so local slot accounting needs no lock; a
  wakeup only sets an event and never blocks. A failing sweep is logged and claiming goes on.
  Writers notify only while a worker waits: when a claim comes back short the loop takes the
  scope's wakeup gate (``announce_idle`` on the LISTEN connection) and looks once more; when it
  is woken it lets the gate go while it claims (:mod:`._gate`);
* one **renewal task** (:mod:`._leases`) renews every lease of the worker with one
  ``renew_leases`` call every ``lease_duration / 3``, and at once when a ``zeroth_control``
  notification carries this worker's key. A refused renewal stops that run's handler at once and
  nothing more is written for it; a renewal that reports ``cancel_requested`` stops it as
  cancelled. The database is the only source of a stop: a notification (which anyone can send)
  only makes the worker ask. A renewal that *fails* (connection lost) is retried until the last
  confirmed lease deadline, measured on the local monotonic clock from the moment the confirmed
  call was sent; past it the handler is stopped (fail-stop). The run is neither failed nor
  released: its lease simply expires, so it is never stranded and claim_orphaned recovers it;
* the **notifier** (:class:`zeroth_pg.notify.Notifier`) turns NOTIFYs that carry this worker's
  opaque keys into "poll now" and "renew now", and triggers a claim pass after every reconnect;
* one task per run executes ``handler(ctx)``: a returned value completes the run, an exception
  fails it (retry with backoff until ``max_attempts``, then dead letter). Its lifecycle is
  :class:`RunState` and :class:`StopReason`, its transitions in :class:`._run.ActiveRun`. With
  ``claim_ahead`` (:mod:`._ahead`) a worker whose handlers are short holds runs more than its
  handlers, and each run's task first waits for one of ``max_concurrency`` handler slots;
* with schedules (``schedules=`` or ``fire_schedules=True``), one **schedule task**
  (:mod:`._schedules`) registers the application's schedules on start and turns due fire times
  of the deployments served into runs (``fire_due_schedules``, safe with any number of workers),
  sleeping until the next fire time, at most ``schedule_max_sleep``;
* one **settle task** (:mod:`._settle`) sends the outcomes of runs that ended together
  (completions, failures, cancels, hand-backs) as one ``settle_runs`` call per scope (each row
  fenced on its own; retries of differing retry policies in separate calls, as settle_runs takes
  one). It never waits to fill a batch: it sends what has queued up by the time the previous
  call came back, so a lone run is settled as fast as with one call of its own and a burst takes
  one round trip instead of one per run. An output or error document PostgreSQL cannot store
  fails that run's write (an output: the run fails; an error document: a minimal one is written)
  and never its batch. A release (an interrupted run) is one ``release_lease`` call.

Every background task is supervised: a crash is logged, counted (``zeroth_worker_errors``) and
the task restarted. Every path that stops a run ends in a fenced outcome (completed, failed,
cancelled, handed back) or leaves a lease that expires by itself; none drops a run silently.
Every write for a run carries its lease generation and is fenced in SQL; the worker keeps no
state that safety depends on.

Modules, each one concern (none imports another in a circle, not even for the type checker):

* ``_worker``: :class:`RunWorker` itself: construction, start, drain, supervision;
* ``_claims``: the claim loop (sweeps, claims, the sleep between passes, claims carried by
  completions); ``_pacing``: its memory between passes and every decision about when to claim
  (pure); ``_slots``: the runs held and the free slots; ``_ahead``: the handler slots and the
  evidence of a worker that claims ahead; ``_sources``: one scope or many;
  ``_gate``: the wakeup gate; ``_listen``: the notifications;
* ``_execute``: a task per run: the handler, then its outcome decided by ``_outcome`` (pure),
  reported, and written by ``_settle`` (every outcome, one retry policy; completions batched);
* ``_leases``: the renewals; ``_run``: what a handler sees (:class:`RunContext`, which depends on
  the :class:`~._run.RunHost` protocol only) and a run's lifecycle; ``_schedules``;
  ``_signals``; ``_process``: a worker process, for the command line in
  :mod:`zeroth_pg.cli.worker`. This package imports no command-line framework.
"""

from zeroth_pg.worker._process import JsonFormatter, load_handler, run_process, serve, skip_reset
from zeroth_pg.worker._run import (
    Handler,
    Orchestrator,
    RunContext,
    RunSlept,
    RunState,
    StopReason,
    orchestrator_handler,
)
from zeroth_pg.worker._schedules import PeriodicSchedule, ScheduleFirer
from zeroth_pg.worker._worker import RunWorker

__all__ = [
    "Handler",
    "JsonFormatter",
    "Orchestrator",
    "PeriodicSchedule",
    "RunContext",
    "RunSlept",
    "RunState",
    "RunWorker",
    "ScheduleFirer",
    "StopReason",
    "load_handler",
    "orchestrator_handler",
    "run_process",
    "serve",
    "skip_reset",
]
