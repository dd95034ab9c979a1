"""Prometheus metrics of the worker (the upstream names), labelled by deployment.

What went wrong is counted apart, so each can be alerted on by itself (docs/python-guide.md,
"Metrics"): ``zeroth_handler_errors`` (a handler raised: the application's failure),
``zeroth_runs_failed`` (the failures the database recorded, by outcome: retried, failed,
dead-lettered), ``zeroth_lease_lost`` (this worker lost a run's lease),
``zeroth_outcomes_unknown`` (an outcome's write got no answer and no repeat confirmed it), and
``zeroth_worker_crashes`` (the worker's own machinery: one of its loops crashed and was
restarted, or its orphan sweep recovered a run whose worker stopped renewing it: a process that
died, was killed, or stalled past its lease). Before issue 31, ``zeroth_worker_crashes`` counted
handler exceptions, now ``zeroth_handler_errors``.

Every label is a bounded set: a deployment served by this process, and a fixed vocabulary
(``outcome``, ``kind``, ``reason``, ``resource``); nothing a handler raises becomes a label.
The database-side gauges (depth by state, oldest due age, dead letters, expired leases) are not
here: one exporter per fleet serves them (:mod:`zeroth_pg.fleet_metrics`).

The metrics live in one registry per process (prometheus-client's default unless a registry is
passed), so several workers in one process share them and are told apart by the label.

The ``zeroth_scope_runs_*`` counters are labelled by deployment, tenant and workspace as well
(the null workspace is ``""``). They always exist, but only a worker built with
``scope_metrics=True`` counts into them: a fleet worker serving every scope would make one
series per tenant it ever saw, an unbounded number.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from zeroth_pg._hosts import LOOPBACK_HOSTS, host_allowed, host_name

__all__ = ["WorkerMetrics", "default_metrics", "start_http_server"]

#: A run claimed ahead waits about a handler's time (the worker claims ahead only while its
#: handlers return within 0.25 s) and is handed back after a second (a drain or its last attempt:
#: longer).
SLOT_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


@dataclass(frozen=True)
class WorkerMetrics:
    runs_started: Counter
    runs_completed: Counter
    run_duration: Histogram
    lease_lost: Counter
    outcomes_unknown: Counter
    fencing_rejected: Counter
    handler_errors: Counter
    runs_failed: Counter
    worker_crashes: Counter
    runs_dead_lettered: Counter
    runs_slept: Counter
    runs_not_started_ahead: Counter
    slot_wait: Histogram
    guardrail_rejections: Counter
    utilization: Gauge
    queue_depth: Gauge
    worker_errors: Counter
    scope_runs_started: Counter
    scope_runs_completed: Counter
    scope_runs_failed: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry = REGISTRY) -> WorkerMetrics:
        d = ("deployment",)
        scope = (*d, "tenant", "workspace")
        return cls(
            runs_started=Counter("zeroth_runs_started", "Run executions started.", d,
                                 registry=registry),
            runs_completed=Counter("zeroth_runs_completed", "Run executions that completed.", d,
                                   registry=registry),
            run_duration=Histogram("zeroth_run_duration_seconds", "Handler execution time.", d,
                                   registry=registry),
            lease_lost=Counter("zeroth_lease_lost", "Leases lost: renewal refused, fenced write "
                               "rejected, or local lease deadline passed.", d, registry=registry),
            outcomes_unknown=Counter(
                "zeroth_outcomes_unknown", "Attempt outcomes (a completion, failure, cancel, "
                "hand-back) whose write got no answer (the call bound, call_timeout, or a lost "
                "connection) and that no later try confirmed: a repeat refused by the fence "
                "(most likely the first landed) or no answer until the lease deadline. Not "
                "counted in zeroth_lease_lost.", d, registry=registry),
            fencing_rejected=Counter("zeroth_lease_fencing_rejected", "Fenced writes refused.", d,
                                     registry=registry),
            handler_errors=Counter(
                "zeroth_handler_errors", "Attempts whose handler raised (any exception, "
                "NonRetryableError included), or returned an output that cannot be stored.", d,
                registry=registry),
            runs_failed=Counter(
                "zeroth_runs_failed", "Attempt failures the database recorded for this "
                "worker (a handler's failure, a timeout, a hand-back with the run's hand-backs "
                "spent), by outcome: retried (a retry is scheduled), failed (for good, no dead "
                "letter) or dead_lettered.", (*d, "outcome"), registry=registry),
            worker_crashes=Counter(
                "zeroth_worker_crashes", "Crashes of the worker machinery, by kind: loop (a "
                "background loop of this worker crashed and was restarted), orphan (this "
                "worker's sweep recovered a run whose lease expired while it ran: its worker "
                "process died, was killed or stalled past its lease). Handler exceptions are "
                "zeroth_handler_errors.", (*d, "kind"), registry=registry),
            runs_dead_lettered=Counter("zeroth_runs_dead_lettered",
                                       "Runs this worker's attempt dead-lettered (the "
                                       "same runs as zeroth_runs_failed with outcome "
                                       "dead_lettered).", d,
                                       registry=registry),
            runs_slept=Counter("zeroth_runs_slept", "Attempts that ended in a durable sleep "
                               "(sleep_run: pending until their resume time).", d,
                               registry=registry),
            runs_not_started_ahead=Counter(
                "zeroth_runs_not_started_ahead", "Runs claimed ahead (claim_ahead) that found "
                "no handler slot within a second (or before their deadline) and were "
                "handed back without running.", d,
                registry=registry),
            slot_wait=Histogram(
                "zeroth_run_slot_wait_seconds", "How long a run claimed ahead (claim_ahead) "
                "waited for a handler slot, from the moment it found none free until it got one "
                "or was stopped (handed back, cancelled, its lease lost). Runs that found a slot "
                "free at once are not observed.", d, buckets=SLOT_WAIT_BUCKETS, registry=registry),
            guardrail_rejections=Counter("zeroth_guardrail_rejections",
                                         "Claims refused by a guardrail.", (*d, "reason"),
                                         registry=registry),
            utilization=Gauge("zeroth_guardrail_utilization_ratio",
                              "Live leases / max_concurrency seen by the last claim.",
                              (*d, "resource"), registry=registry),
            queue_depth=Gauge("zeroth_queue_depth",
                              "Pending runs of the deployment in the scopes the worker serves "
                              "(only sampled with queue_depth_interval set: every worker of a "
                              "fleet would report the same number; see zeroth_fleet_runs).",
                              d, registry=registry),
            worker_errors=Counter(
                "zeroth_worker_errors", "Failures of the worker's own machinery, by kind: a "
                "background loop that crashed and was restarted (renew_loop, claim_loop, ...), a "
                "failed claim pass or orphan sweep, a run settled after a worker error (settle), "
                "a completion batch or a run's completion the database refused, a settle_runs "
                "call that failed transiently and is tried again (settle_retry: one per call, "
                "whatever the runs in its batch).",
                (*d, "kind"), registry=registry),
            scope_runs_started=Counter(
                "zeroth_scope_runs_started", "Run executions started, per scope (only counted "
                "by a worker with scope_metrics=True).", scope, registry=registry),
            scope_runs_completed=Counter(
                "zeroth_scope_runs_completed", "Run executions that completed, per scope (only "
                "counted by a worker with scope_metrics=True).", scope, registry=registry),
            scope_runs_failed=Counter(
                "zeroth_scope_runs_failed", "Attempts whose failure was recorded (retried, "
                "failed or dead-lettered), per scope (only counted by a worker with "
                "scope_metrics=True).", scope, registry=registry),
        )


_default: WorkerMetrics | None = None


def default_metrics() -> WorkerMetrics:
    """The process-wide metrics in prometheus-client's default registry (created once)."""
    global _default
    if _default is None:
        _default = WorkerMetrics.create()
    return _default


def start_http_server(port: int, addr: str = "127.0.0.1",
                      allowed_hosts: Sequence[str] = ()) -> WSGIServer:
    """Serve ``/metrics`` for the default registry from a daemon thread (prometheus-client's
    WSGI app and threaded server), answering only a Host that is a loopback name, ``addr`` or
    one of ``allowed_hosts`` (the names a scraper reaches it by, for a wildcard ``addr``): 421
    otherwise. A page whose name an attacker points at this address (DNS rebinding) would read
    it as its own origin: deployment names, counts, and tenants with scope metrics on. The
    dashboard and ``zeroth-pg metrics`` refuse such a Host the same way. Returns the server
    (its ``server_port``; ``shutdown()`` stops it)."""
    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    allowed = frozenset(host_name(h) for h in (*LOOPBACK_HOSTS, *allowed_hosts, addr)
                        if h.strip() and h not in ("0.0.0.0", "::"))
    serve_metrics = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if not host_allowed(environ.get("HTTP_HOST", ""), allowed):
            start_response("421 Misdirected Request",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [b"this worker's metrics do not answer to that Host\n"]
        return serve_metrics(environ, start_response)  # type: ignore[no-any-return]

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """A scrape every few seconds is not worth a line on stderr."""

    class _Server(ThreadingWSGIServer):
        # The address's own family (an IPv6 one such as ::1 or ::), as prometheus-client picks.
        address_family = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM,
                                            flags=socket.AI_PASSIVE)[0][0]

    server = make_server(addr, port, app, _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="zeroth-metrics", daemon=True).start()
    return server
