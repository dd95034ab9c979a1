"""``zeroth-pg worker`` (also ``python -m zeroth_pg.worker``): serve a deployment until SIGTERM.

The options only; the process is :func:`zeroth_pg.worker.run_process`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from zeroth_pg.cli._common import App, Dsn, Tenant, Workspace

__all__ = ["LogFormat", "app", "main", "worker"]


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"  # one JSON object per line


def _worker_id(value: str | None) -> str | None:
    """--worker-id as RunWorker takes it (an empty one is refused, not taken for "random")."""
    if value is None:
        return None
    from zeroth_pg.worker._claims import MAX_WORKER_ID, check_worker_id

    try:
        return check_worker_id(value)
    except ValueError:
        raise typer.BadParameter(f"must be 1 to {MAX_WORKER_ID} characters of valid UTF-8, no "
                                 "NUL (leave it out for a random id)") from None


def worker(
    handler: Annotated[str, typer.Option(
        "--app", envvar="ZEROTH_PG_APP",
        help="A zeroth_pg.App as module:attr (a worker of its deployments), a mapping "
             "{deployment: handler} (the same), or one handler with --deployment. An App or "
             "mapping is served in every scope, or in --tenant/--workspace.",
        show_default=False)],
    deployment: Annotated[list[str] | None, typer.Option(
        "--deployment", envvar="ZEROTH_PG_DEPLOYMENT",
        help="deployment_ref to serve (repeat it for a fleet worker's subset; default: every "
             "deployment of a mapping).", show_default=False)] = None,
    dsn: Dsn = None,
    tenant: Tenant = None,
    workspace: Workspace = None,
    concurrency: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_CONCURRENCY", help="Local slots.")] = 8,
    claim_ahead: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_CLAIM_AHEAD", min=0,
        help="Runs held beyond the local slots, claimed and started, each waiting for a "
             "handler to return, while handlers take under 0.25 s (0 to --concurrency; not "
             "with --fleet-concurrency): the next run starts without a round trip. One that "
             "waits over a second is handed back.")] = 0,
    fleet_concurrency: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_FLEET_CONCURRENCY",
        help="Fleet-wide max_concurrency of the deployment (0: none).")] = 0,
    poll_interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_POLL_INTERVAL", help="Seconds between claims with no NOTIFY.")] = 0.5,
    orphan_sweep_interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_ORPHAN_SWEEP_INTERVAL", help="Seconds between orphan sweeps.")] = 5.0,
    lease: Annotated[float | None, typer.Option(
        envvar="ZEROTH_PG_LEASE_SECONDS",
        help="Lease duration in seconds (default: the App's lease_duration, else 60).",
        show_default=False)] = None,
    call_timeout: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_CALL_TIMEOUT",
        help="Seconds a call to the database may take (a claim, a completion, a renewal; "
             "the wait for a connection included) before its connection is dropped and the "
             "call retried on a new one: a hung or partitioned primary is left for the next "
             "host of the DSN (0: unbounded).")] = 5.0,
    shutdown_timeout: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_SHUTDOWN_TIMEOUT",
        help="On SIGTERM, seconds running handlers get before they are handed back.")] = 30.0,
    retry_base: Annotated[float | None, typer.Option(
        envvar="ZEROTH_PG_RETRY_BASE_SECONDS",
        help="First retry delay in seconds, doubled per attempt (default: each deployment's "
             "registered retry policy, zeroth-pg deployments; else 1).",
        show_default=False)] = None,
    worker_id: Annotated[str | None, typer.Option(
        envvar="ZEROTH_PG_WORKER_ID", callback=_worker_id,
        help="1 to 200 characters (valid UTF-8, no NUL). Default: 12 random hex digits.",
        show_default=False)] = None,
    code_version: Annotated[str | None, typer.Option(
        envvar="ZEROTH_PG_CODE_VERSION",
        help="The version of the code this worker runs (a build id, e.g. 2026.12.05-abc123): "
             "runs it starts record it, and under a deployment's version policy it resumes only "
             "the runs its version may serve (default: the App's code_version, else none).",
        show_default=False)] = None,
    metrics_port: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_METRICS_PORT", help="Serve /metrics on this port (0: off).")] = 0,
    scope_metrics: Annotated[bool, typer.Option(
        "--scope-metrics", envvar="ZEROTH_PG_SCOPE_METRICS",
        help="Also count runs per (deployment, tenant, workspace) in zeroth_scope_runs_* "
             "(one series per tenant served: keep it for a bounded set of tenants).")] = False,
    fire_schedules: Annotated[bool, typer.Option(
        "--fire-schedules", envvar="ZEROTH_PG_FIRE_SCHEDULES",
        help="Also fire the due schedules (zeroth.schedules) of the deployments served, those a "
             "DBA made in SQL included; an App's worker fires its @app.periodic ones anyway. "
             "Any number of workers may: each fire time becomes one run.")] = False,
    queue_depth_interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_QUEUE_DEPTH_INTERVAL",
        help="Seconds between samples of the zeroth_queue_depth gauge (0: off, the default: "
             "every worker of a fleet would report the same number; serve the database's "
             "gauges once with `zeroth-pg metrics` or `zeroth-pg web`).")] = 0.0,
    otel: Annotated[bool, typer.Option(
        "--otel", envvar="ZEROTH_PG_OTEL",
        help="Send OpenTelemetry traces as the standard OTEL_* variables say (OTLP over "
             "http/protobuf to OTEL_EXPORTER_OTLP_ENDPOINT by default); they alone turn it on "
             "too (OTEL_TRACES_EXPORTER, an OTLP endpoint). Needs the otel-export extra: "
             "without it --otel exits 2, a variable alone only warns.")] = False,
    log_format: Annotated[LogFormat, typer.Option(
        envvar="ZEROTH_PG_LOG_FORMAT", help="Log lines on stderr.")] = LogFormat.TEXT,
    log_level: Annotated[str, typer.Option(envvar="ZEROTH_PG_LOG_LEVEL")] = "INFO",
) -> None:
    """Run a worker: --app module:app (a zeroth_pg.App, or a mapping of handlers) for a fleet
    worker of its deployments, or --app module:handler --deployment NAME; SIGTERM drains.

    Running handlers then get --shutdown-timeout seconds; the rest are cancelled and handed back
    to pending with their checkpoints. A second SIGTERM (or SIGINT) while draining hands every
    run back at once and exits 0; a third ends the process at once (its leases expire and an
    orphan sweep recovers the runs). A database that is away when it starts (not up yet,
    restarting) is waited for: its first connection and its schedules each for up to 30 s; a
    SIGTERM meanwhile ends it at once. Exit codes: 0 after a drain, or stopped before it
    started; 1 the database refused it or stayed away; 2 a bad option, or --otel without the
    OpenTelemetry SDK.
    """
    from zeroth_pg.worker import run_process
    from zeroth_pg.worker._ahead import check_claim_ahead

    try:  # refused before any connection is made, as a bad option (exit 2)
        check_claim_ahead(claim_ahead, concurrency, fleet_concurrency or None)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--claim-ahead") from None
    raise typer.Exit(run_process(
        log_format=log_format.value, log_level=log_level, deployment=deployment, app=handler,
        dsn=dsn, tenant=tenant, workspace=workspace, concurrency=concurrency,
        claim_ahead=claim_ahead, fleet_concurrency=fleet_concurrency or None,
        poll_interval=poll_interval,
        orphan_sweep_interval=orphan_sweep_interval, lease=lease,
        call_timeout=call_timeout or None, shutdown_timeout=shutdown_timeout,
        retry_base=retry_base, worker_id=worker_id,
        code_version=code_version,
        metrics_port=metrics_port, scope_metrics=scope_metrics,
        fire_schedules=fire_schedules or None,
        queue_depth_interval=queue_depth_interval or None, otel=otel))


#: The command alone, for ``python -m zeroth_pg.worker``.
app = App(name="worker")
app.command()(worker)


def main(prog_name: str = "python -m zeroth_pg.worker") -> None:
    app(prog_name=prog_name)
