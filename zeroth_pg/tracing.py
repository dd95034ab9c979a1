"""OpenTelemetry spans of a run's life, when ``opentelemetry-api`` is installed (the ``otel``
extra); without it every function here is a no-op costing one attribute check.

One trace follows a run from the code that enqueued it, across processes and retries: the
enqueue (a ``send`` span, kind PRODUCER) writes its W3C trace context into the run's metadata
under :data:`METADATA_KEY` (``{"traceparent": …, "tracestate": …}``); every attempt's execution
is a ``process`` span (kind CONSUMER) whose parent is that context, so a retry or a recovery on
another worker lands in the same trace, one span per attempt. Inside it: ``checkpoint`` spans,
the handler's own spans, and the ``complete`` span of the outcome. A claim that handed runs over
is a ``receive`` span linked to each run's context. Names and attributes follow the messaging
semantic conventions (``messaging.system`` = ``zeroth_pg``, ``messaging.destination.name`` =
the deployment, ``messaging.message.id`` = the run id). Spans are created through the global
tracer provider: configure the SDK as usual, nothing else. The carrier is W3C trace context
only (``traceparent``, ``tracestate``; never baggage). A client in another language carries a
trace into a run by writing ``metadata.otel.traceparent`` itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # W3C trace context only, whatever the process's global propagators: the carrier is data in
    # a shared table, so it holds the trace's ids and nothing else (no baggage, which a writer
    # of the row could otherwise pass into every handler's context and outgoing calls).
    _PROPAGATOR = TraceContextTextMapPropagator()
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

from zeroth_pg.errors import ErrorDescription, describe

if TYPE_CHECKING:
    from zeroth_pg.types import ClaimedRun, Scope

__all__ = ["METADATA_KEY", "TracingSetupError", "configure_from_environment", "enabled",
           "failed", "inject", "process", "received", "send", "step", "wanted"]

#: The key of the run's metadata that carries the trace context of its enqueue.
METADATA_KEY = "otel"
SYSTEM = "zeroth_pg"


def enabled() -> bool:
    return trace is not None


_cached: tuple[Any, Any] | None = None  # (provider, its tracer or None)
_checked_at = -1.0  # monotonic time of the last look at the global provider
_RECHECK_SECONDS = 1.0


def _tracer() -> Any:
    """The tracer of the configured provider, or None while none is configured: with the API
    installed but no SDK set up (a dependency of some other library), a no-op span per run
    would still cost ~10-20 µs of this process's CPU, and it records nothing. The provider is
    looked up at most once a second (the lookup reads os.environ while none is set: two
    lookups per run were 5% of a 100-slot worker's CPU), so an SDK configured after the
    worker started is picked up within a second."""
    global _cached, _checked_at
    now = time.monotonic()
    if _cached is None or now - _checked_at >= _RECHECK_SECONDS:
        _checked_at = now
        provider = trace.get_tracer_provider()
        if _cached is None or _cached[0] is not provider:
            from zeroth_pg import __version__

            unset = isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
            _cached = (provider,
                       None if unset else provider.get_tracer("zeroth_pg", __version__))
    return _cached[1]


def _scope_attributes(deployment_ref: str, tenant_id: str | None,
                      workspace_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"messaging.system": SYSTEM,
                                  "messaging.destination.name": deployment_ref,
                                  "zeroth.tenant_id": tenant_id or "default"}
    if workspace_id is not None:
        attributes["zeroth.workspace_id"] = workspace_id
    return attributes


def inject(metadata: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``metadata`` with the current trace context under :data:`METADATA_KEY`; unchanged
    without tracing, without a sampled span, or when the caller set that key itself."""
    if trace is None or (metadata is not None and (
            not isinstance(metadata, Mapping) or METADATA_KEY in metadata)):
        return metadata  # a metadata that is not an object is the client's error to report
    if not trace.get_current_span().get_span_context().is_valid:
        return metadata
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if not carrier:
        return metadata
    return {**(metadata or {}), METADATA_KEY: carrier}


@contextlib.contextmanager
def send(deployment_ref: str, tenant_id: str | None, workspace_id: str | None,
         count: int | None = None) -> Iterator[Any]:
    """The span of an enqueue (``count`` runs for a batch); yields it, or None."""
    tracer = _tracer() if trace is not None else None
    if tracer is None:
        yield None
        return
    attributes = _scope_attributes(deployment_ref, tenant_id, workspace_id)
    attributes["messaging.operation.type"] = "send"
    attributes["messaging.operation.name"] = "enqueue_run" if count is None else "enqueue_runs"
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(f"send {deployment_ref}", kind=SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        yield span


def sent(span: Any, run_id: object) -> None:
    """Name the run an enqueue span created (one run only)."""
    if span is not None:
        span.set_attribute("messaging.message.id", str(run_id))


def _extract(metadata: Mapping[str, Any] | None) -> Any:
    carrier = (metadata or {}).get(METADATA_KEY)
    if not isinstance(carrier, Mapping):
        return None
    return _PROPAGATOR.extract({k: v for k, v in carrier.items()
                                if k in ("traceparent", "tracestate") and isinstance(v, str)})


def received(runs: Iterable[tuple[Scope, ClaimedRun]], started_ns: int) -> None:
    """A ``receive`` span for a claim that handed runs over, begun at ``started_ns`` (a claim
    that found nothing leaves no span), linked to each run's enqueue."""
    tracer = _tracer() if trace is not None else None
    if tracer is None:
        return
    runs = list(runs)
    if not runs:
        return
    links = []
    for _scope, run in runs:
        context = _extract(run.metadata)
        if context is not None:
            span_context = trace.get_current_span(context).get_span_context()
            if span_context.is_valid:
                links.append(Link(span_context, {"messaging.message.id": str(run.run_id)}))
    deployments = sorted({scope.deployment_ref for scope, _ in runs})
    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "receive",
                  "messaging.operation.name": "claim",
                  "messaging.batch.message_count": len(runs)}
    if len(deployments) == 1:
        attributes["messaging.destination.name"] = deployments[0]
    span = tracer.start_span(
        "receive" if len(deployments) > 1 else f"receive {deployments[0]}",
        kind=SpanKind.CONSUMER, attributes=attributes, links=links, start_time=started_ns)
    span.end()


def now_ns() -> int:
    return time.time_ns()


#: What :func:`process` and :func:`step` return while no tracer is configured: one shared
#: context manager that yields None (reusable, stateless), instead of a generator-based one
#: made per call (two per run were about 5% of a 64-slot worker's CPU with tracing off).
_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def process(scope: Scope, run: ClaimedRun, *, attempt: int, worker_id: str,
            recovered: bool) -> contextlib.AbstractContextManager[Any]:
    """The span of one attempt's execution, a child of the run's enqueue, as a context manager
    that yields it, or None. The worker marks failures itself (:func:`failed`): a handler's
    exception is an outcome."""
    tracer = _tracer() if trace is not None else None
    if tracer is None:
        return _NO_SPAN
    return _process(tracer, scope, run, attempt=attempt, worker_id=worker_id,
                    recovered=recovered)


@contextlib.contextmanager
def _process(tracer: Any, scope: Scope, run: ClaimedRun, *, attempt: int, worker_id: str,
             recovered: bool) -> Iterator[Any]:
    attributes = _scope_attributes(scope.deployment_ref, scope.tenant_id, scope.workspace_id)
    attributes.update({"messaging.operation.type": "process",
                       "messaging.message.id": str(run.run_id),
                       "messaging.consumer.group.name": scope.deployment_ref,
                       "zeroth.attempt": attempt, "zeroth.lease_generation": run.lease_generation,
                       "zeroth.worker_id": worker_id, "zeroth.recovered": recovered})
    with tracer.start_as_current_span(
            f"process {scope.deployment_ref}", context=_extract(run.metadata),
            kind=SpanKind.CONSUMER, attributes=attributes, record_exception=False,
            set_status_on_exception=False) as span:
        yield span


def step(name: str, deployment_ref: str,
         run_id: object) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one (``checkpoint``, ``complete``, ``fail``, ``sleep``), as a
    context manager that yields it, or None."""
    tracer = _tracer() if trace is not None else None
    if tracer is None:
        return _NO_SPAN
    return _step(tracer, name, deployment_ref, run_id)


@contextlib.contextmanager
def _step(tracer: Any, name: str, deployment_ref: str, run_id: object) -> Iterator[Any]:
    attributes = {"messaging.system": SYSTEM, "messaging.destination.name": deployment_ref,
                  "messaging.message.id": str(run_id)}
    if name in ("complete", "fail", "sleep"):
        attributes["messaging.operation.type"] = "settle"
    # Exceptions are recorded bounded (_record), never by the SDK's record_exception, which
    # formats the whole message and traceback of whatever passes through.
    with tracer.start_as_current_span(f"{name} {deployment_ref}", attributes=attributes,
                                      record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            yield span
        except Exception as exc:  # as the SDK: not GeneratorExit, CancelledError, RunSlept
            described = describe(exc)
            _record(span, described)
            span.set_status(Status(StatusCode.ERROR, described.type))
            raise


def _record(span: Any, exc: BaseException | ErrorDescription) -> None:
    """An ``exception`` event of ``exc``, each text bounded (zeroth_pg.errors.describe): a
    handler's exception may carry a message of hundreds of MB."""
    described = exc if isinstance(exc, ErrorDescription) else describe(exc)
    span.add_event("exception", {"exception.type": described.type,
                                 "exception.message": described.message,
                                 "exception.stacktrace": described.traceback,
                                 "exception.escaped": False})


def failed(span: Any, exc: BaseException | ErrorDescription | None, outcome: str) -> None:
    """Mark an attempt's span as failed (``outcome``: retried, failed, lease lost, …); ``exc``
    (an exception, or its description) is recorded bounded."""
    if span is None:
        return
    span.set_attribute("zeroth.outcome", outcome)
    if exc is not None:
        _record(span, exc)
    span.set_status(Status(StatusCode.ERROR, outcome))


def outcome(span: Any, value: str) -> None:
    if span is not None:
        span.set_attribute("zeroth.outcome", value)


# -- an SDK for a worker process, from the standard OTEL_* variables --------------------------

log = logging.getLogger(__name__)

#: The service.name of a worker's spans when neither OTEL_SERVICE_NAME nor
#: OTEL_RESOURCE_ATTRIBUTES names one.
DEFAULT_SERVICE_NAME = "zeroth-pg-worker"
_INSTALL = "pip install 'zeroth-pg[otel-export]'"


class TracingSetupError(RuntimeError):
    """Traces were asked for (``--otel`` or an ``OTEL_*`` variable) and cannot be sent: the
    SDK or the exporter is not installed, or an exporter name is unknown."""


def wanted(requested: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a worker process sets up an SDK: ``--otel`` (``requested``), or a variable that
    asks for traces (``OTEL_TRACES_EXPORTER`` other than ``none``, or an OTLP endpoint); never
    with ``OTEL_SDK_DISABLED=true``."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return requested or bool(exporters) or any(
        env.get(name, "").strip() for name in ("OTEL_EXPORTER_OTLP_ENDPOINT",
                                               "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure_from_environment(requested: bool = False,
                               environ: Mapping[str, str] | None = None) -> Any:
    """Set up the OpenTelemetry SDK of this process as the standard variables say, when
    :func:`wanted`; returns the tracer provider (call its ``shutdown()`` at exit: it flushes),
    or None when nothing was set up (not wanted, or a provider was configured already, e.g. by
    ``opentelemetry-instrument``).

    ``OTEL_TRACES_EXPORTER``: ``otlp`` (default), ``console``, or several separated by commas;
    ``otlp`` speaks ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (``http/protobuf``, the default, or ``grpc``) to ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``
    (default: the local collector's); the exporters read their own variables (headers,
    timeout, compression, certificates), the batch processor ``OTEL_BSP_*``, the resource
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (service.name defaults to
    ``zeroth-pg-worker``), the sampler ``OTEL_TRACES_SAMPLER[_ARG]``.

    Raises :class:`TracingSetupError` when the SDK or an exporter is not installed, or an
    exporter name is unknown."""
    env = os.environ if environ is None else environ
    if not wanted(requested, env):
        return None
    if trace is None:
        raise TracingSetupError(f"traces were asked for, but opentelemetry-api is not "
                                f"installed: {_INSTALL}")
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        log.info("OpenTelemetry: a tracer provider is configured already (%s); using it",
                 type(current).__name__)
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingSetupError(f"traces were asked for, but the OpenTelemetry SDK is not "
                                f"installed ({exc}): {_INSTALL}") from None
    names = [n.strip().lower() for n in
             (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    exporters = [_exporter(name, env) for name in dict.fromkeys(names) if name != "none"]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("OpenTelemetry: sending the spans of service %s to %s",
             resource.attributes.get(SERVICE_NAME), ", ".join(names))
    return provider


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingSetupError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (this worker "
                                "knows otlp, console and none)")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    if protocol == "http/protobuf":
        module, package = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                           "opentelemetry-exporter-otlp-proto-http")
    elif protocol == "grpc":
        module, package = ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                           "opentelemetry-exporter-otlp-proto-grpc")
    else:
        raise TracingSetupError(f"OTEL_EXPORTER_OTLP_PROTOCOL: unknown protocol {protocol!r} "
                                "(http/protobuf or grpc)")
    try:
        import importlib

        exporter_class = importlib.import_module(module).OTLPSpanExporter
    except ImportError as exc:
        raise TracingSetupError(f"traces over OTLP {protocol} need {package}, which is not "
                                f"installed ({exc}): pip install {package}"
                                + (f", or {_INSTALL} (http/protobuf)" if protocol == "grpc"
                                   else f" or {_INSTALL}")) from None
    return exporter_class()
