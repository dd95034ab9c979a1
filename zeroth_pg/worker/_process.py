"""A worker process: load the handler, set up logging and the pool, serve until SIGTERM.

:func:`run_process` is what ``zeroth-pg worker`` and ``python -m zeroth_pg.worker`` call (their
options live in :mod:`zeroth_pg.cli.worker`); nothing here needs the command-line framework.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from zeroth_pg import tracing
from zeroth_pg._connect import create_pool, skip_reset
from zeroth_pg.worker._claims import check_worker_id
from zeroth_pg.worker._run import Handler, orchestrator_handler
from zeroth_pg.worker._sources import default_worker_id
from zeroth_pg.worker._startup import StartInterrupted, StartupSignals, retry_starting
from zeroth_pg.worker._worker import RunWorker

__all__ = ["JsonFormatter", "WorkerApp", "load_app", "load_handler", "run_process", "serve",
           "skip_reset"]


log = logging.getLogger(__name__)


def _import(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--app must look like module:handler, got {spec!r}")
    # Like uvicorn, gunicorn and celery: `zeroth-pg worker --app mymodule:app` typed next to
    # mymodule.py finds it (a console script's sys.path does not hold the current directory).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def _as_handler(target: Any, what: str) -> Handler:
    if hasattr(target, "drive") and hasattr(target, "resume"):
        return orchestrator_handler(target)
    if not callable(target):
        raise ValueError(f"{what} is not callable")
    return target  # type: ignore[no-any-return]


def load_handler(spec: str) -> Handler:
    """``module:attr`` → an async handler; an object with drive/resume is adapted."""
    return _as_handler(_import(spec), spec)


@runtime_checkable
class WorkerApp(Protocol):
    """What a worker process needs of an application (:class:`zeroth_pg.App`): its DSN and the
    RunWorker arguments of some of its deployments. A protocol, so that this module, which the
    App imports, need not import it back."""

    dsn: str | None

    def select(self, names: Sequence[str] | None = None) -> list[Any]: ...

    def worker_options(self, names: Sequence[str] | None = None) -> dict[str, Any]: ...


def load_app(spec: str) -> Handler | dict[str, Handler] | WorkerApp:
    """``module:attr`` → a :class:`zeroth_pg.App` (its deployments), one handler, or (a mapping
    of deployment names to handlers) the handlers of a fleet worker, each adapted like
    :func:`load_handler`."""
    target = _import(spec)
    if isinstance(getattr(target, "app", None), WorkerApp) and hasattr(target, "handle"):
        # One deployment of an App: calling it would call the bare function without a payload.
        raise ValueError(f"{spec} is one deployment of an App: give the App (module:app) and "
                         f"--deployment {getattr(target, 'name', '...')}")
    if isinstance(target, WorkerApp):
        target.select()  # ValueError when it has no deployment
        return target
    if isinstance(target, Mapping):
        if not target:
            raise ValueError(f"{spec} maps no deployment to a handler")
        return {str(name): _as_handler(h, f"{spec}[{name!r}]") for name, h in target.items()}
    return _as_handler(target, spec)


class JsonFormatter(logging.Formatter):
    """One JSON object per log line (structured logging for collectors)."""

    def format(self, record: logging.LogRecord) -> str:
        data = {"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data)


async def serve(
    *,
    deployment: str | Sequence[str] | None,
    app: str,
    dsn: str | None = None,
    tenant: str | None = None,
    workspace: str | None = None,
    concurrency: int = 8,
    claim_ahead: int = 0,
    fleet_concurrency: int | None = None,
    poll_interval: float = 0.5,
    orphan_sweep_interval: float = 5.0,
    lease: float | None = None,
    call_timeout: float | None = 5.0,
    shutdown_timeout: float = 30.0,
    retry_base: float | None = None,
    worker_id: str | None = None,
    code_version: str | None = None,
    metrics_port: int = 0,
    scope_metrics: bool = False,
    fire_schedules: bool | None = None,
    queue_depth_interval: float | None = None,
    otel: bool = False,
) -> None:
    """Serve ``deployment`` with the handler ``app`` (``module:attr``) until SIGTERM/SIGINT,
    then drain. An ``app`` that is a :class:`zeroth_pg.App`, or a mapping of deployment names to
    handlers, makes a fleet worker: it serves the named deployments (``deployment``: one name
    or several; None: every one) in every scope, or in the one scope ``tenant``/``workspace``
    name, with each App deployment's retry policy and local limit. No ``dsn``: the App's, else
    ``ZEROTH_PG_DSN`` as it is (never migrated by a worker), else the embedded server
    (migrated). Traces leave the process when ``otel`` or the standard ``OTEL_*`` variables
    ask for them (:func:`zeroth_pg.tracing.configure_from_environment`; flushed at exit)."""
    from zeroth_pg.embedded import resolve_dsn
    from zeroth_pg.metrics import start_http_server

    loaded = load_app(app)
    names = [deployment] if isinstance(deployment, str) else list(deployment or ())
    # A database it was given (ZEROTH_PG_DSN) is never migrated by a worker: that needs the
    # migrating role's privileges, not zeroth_worker's. Only the embedded server is.
    dsn = dsn or (loaded.dsn if isinstance(loaded, WorkerApp) else None) or resolve_dsn(
        migrate=not os.environ.get("ZEROTH_PG_DSN"))
    target: str | dict[str, Handler]
    handler: Handler | None = None
    scopes: list[tuple[str | None, str | None]] | None = None
    per_deployment: dict[str, Any] = {}
    app_lease: float | None = None  # the longest lease_seconds of the App's deployments served
    if isinstance(loaded, WorkerApp):
        per_deployment = loaded.worker_options(names)  # ValueError names unknown deployments
        app_lease = per_deployment.pop("lease_duration", None)
        target = per_deployment.pop("deployment_ref")
        if tenant is not None or workspace is not None:
            scopes = [(tenant, workspace)]
        tenant = workspace = None
    elif isinstance(loaded, dict):
        unknown = [name for name in names if name not in loaded]
        if unknown:
            raise ValueError(f"{app} has no handler for deployment(s) {', '.join(unknown)} "
                             f"(it has {', '.join(loaded)})")
        target = {name: loaded[name] for name in names} if names else loaded
        if tenant is not None or workspace is not None:
            scopes = [(tenant, workspace)]
        tenant = workspace = None
    else:
        if len(names) != 1:
            raise ValueError(f"{app} is one handler: name exactly one --deployment for it")
        target, handler = names[0], loaded
    try:
        provider = tracing.configure_from_environment(otel)
    except tracing.TracingSetupError as exc:
        if otel:
            raise  # asked for on the command line: the worker does not start without it
        log.warning("%s; this worker sends no traces", exc)  # a variable of the environment
        provider = None
    if metrics_port:
        start_http_server(metrics_port)
    worker_id = check_worker_id(worker_id) or default_worker_id()
    pool = None
    try:
        with StartupSignals(worker_id) as startup:
            pool = await startup.run(_open_pool(dsn, worker_id, max_size=max(4, concurrency + 2)))
            startup.check("start")  # a signal as the pool opened; run_until_stopped's next
            worker = RunWorker(
                pool, target, handler, scopes=scopes, dsn=dsn, tenant_id=tenant,
                workspace_id=workspace,
                max_concurrency=concurrency, claim_ahead=claim_ahead,
                fleet_max_concurrency=fleet_concurrency,
                poll_interval=poll_interval, orphan_sweep_interval=orphan_sweep_interval,
                worker_id=worker_id, shutdown_timeout=shutdown_timeout,
                lease_duration=(lease or app_lease or getattr(loaded, "lease_duration", None)
                                or 60.0),
                retry_base_seconds=retry_base, scope_metrics=scope_metrics,
                call_timeout=call_timeout,
                queue_depth_interval=queue_depth_interval,
                fire_schedules=fire_schedules,
                code_version=code_version or getattr(loaded, "code_version", None),
                **per_deployment)
            await worker.run_until_stopped()
    except StartInterrupted:
        pass  # stopped while its database was away: nothing held, nothing to drain
    finally:
        if pool is not None:
            await pool.close()
        if provider is not None:
            provider.shutdown()  # sends the spans still batched


async def _open_pool(dsn: str, worker_id: str, *, max_size: int) -> Any:
    """The worker's pool, its first connection retried while the database is away
    (:func:`~._startup.retry_starting`)."""
    return await retry_starting(
        lambda: create_pool(dsn, min_size=1, max_size=max_size,
                            server_settings={"application_name": f"zeroth-worker:{worker_id}"}),
        what="connect", worker_id=worker_id)


def run_process(*, log_format: str = "text", log_level: str = "INFO", **options: Any) -> int:
    """Log to stderr (``text`` or ``json`` lines), then :func:`serve` ``options``; returns 0,
    or 2 when ``otel`` asked for traces that cannot be sent (the reason on stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(serve(**options))
    except tracing.TracingSetupError as exc:  # --otel, and traces cannot be sent
        print(f"zeroth-pg worker: --otel: {exc}", file=sys.stderr, flush=True)
        return 2
    # What still runs after the drain: tasks given one second to end once cancelled, and handlers
    # the drain abandoned because they ignored their cancellation. asyncio.run would cancel and
    # wait for every one of those for ever (a second SIGTERM's promise is an exit within a
    # lease); their leases lapse and claim_orphaned recovers the runs, so the process ends.
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=1.0))
    stuck = sum(not task.done() for task in left)
    if not stuck:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    # A synchronous handler still running in its thread would be joined at exit, for ever.
    threads = [t for t in threading.enumerate()
               if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if stuck or threads:
        if stuck:
            logging.getLogger("zeroth_pg.worker").error(
                "exiting with %d task(s) that ignored their cancellation (their runs' leases "
                "lapse and the orphan sweep recovers them)", stuck)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
