"""The application API: declare each kind of work once, enqueue it with checked arguments, serve
all of it with one worker.

::

    app = zeroth_pg.App()                          # ZEROTH_PG_DSN, or the embedded server

    @app.deployment("send-email", max_attempts=5)
    async def send_email(run, to: str, subject: str) -> dict: ...

    await send_email.enqueue(to="a@b", subject="hi", tenant_id="acme")
    await app.run_worker()                         # or: zeroth-pg worker --app mymodule:app

    @app.periodic(cron="0 7 * * mon-fri", time_zone="Europe/Berlin", payload={"kind": "daily"})
    @app.deployment("report")
    async def report(run, kind: str) -> dict: ...  # a run every weekday at 07:00 Berlin time

A :class:`Deployment` is the function plus its defaults. The App registers the defaults in the
database when it first opens its pool (``zeroth.register_deployment``: the registry
``zeroth.deployments``), so a run enqueued from psql, another language or the CLI without
``max_attempts`` / ``priority`` gets them too; :meth:`App.register_deployments` does it on demand.
Its payload is the function's arguments
after the first (the :class:`~zeroth_pg.worker.RunContext`), by name, checked against the
signature and its annotations when the run is enqueued (:class:`InvalidPayloadError`, nothing
sent) and again when it runs, since another client may have written it (the run then fails
without a retry). A plain ``def`` runs in a thread of its own, so it never blocks the event loop
that renews its lease; it gets a :class:`SyncRunContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import os
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NoReturn, Union, cast
from uuid import UUID

import asyncpg

from zeroth_pg._connect import create_pool
from zeroth_pg._jsonb import json_problem
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import DatabaseError, InvalidPayloadError, LeaseLostError, handler_exit
from zeroth_pg.types import ChildOutcome, DeploymentRegistration, EnqueuedRun, RetryPolicy
from zeroth_pg.worker import PeriodicSchedule, RunContext, RunSlept, RunWorker
from zeroth_pg.worker._claims import check_code_version, check_worker_id
from zeroth_pg.worker._sources import default_worker_id
from zeroth_pg.worker._startup import StartInterrupted, StartupSignals, retry_starting

__all__ = ["App", "Deployment", "SyncRunContext"]

_log = logging.getLogger("zeroth_pg.app")

#: What a registration may meet on a database it cannot write the registry of: a role without
#: EXECUTE on register_deployment (42501), a schema older than the registry (42883). The App then
#: sends its declared defaults with every enqueue, as before the registry existed.
_UNREGISTRABLE = frozenset({"42501", "42883"})

#: Keyword arguments of ``Deployment.enqueue`` that are options of the run, not its payload; a
#: handler parameter may not share a name with one.
ENQUEUE_OPTIONS = frozenset({"tenant_id", "workspace_id", "priority", "run_after",
                             "max_attempts", "idempotency_key", "metadata", "run_id",
                             "thread_id", "attempt_timeout_seconds", "run_timeout_seconds",
                             "conn"})

_NoneType = type(None)

# -- payload checks -----------------------------------------------------------------------------

#: Checks one JSON value; returns what is wrong with it, or None.
Check = Callable[[Any], "str | None"]


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object", _NoneType: "null"}.get(
                type(value), type(value).__name__)


def _any(_value: Any) -> str | None:
    return None


def _compile(annotation: Any, where: str) -> Check:
    """The check of one annotation, or TypeError when it is not a JSON type we can check."""
    if annotation in (inspect.Parameter.empty, Any, object):
        return _any
    if annotation is None or annotation is _NoneType:
        return lambda v: None if v is None else f"expected null, got {_kind(v)}"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _compile(args[0], where)
    if origin is Union or origin is types.UnionType:
        options = [_compile(arg, where) for arg in args]

        def one_of(v: Any) -> str | None:
            problems = [check(v) for check in options]
            if all(problems):
                return f"matches none of {annotation}: {'; '.join(p for p in problems if p)}"
            return None
        return one_of
    if origin is Literal:
        allowed = args
        return lambda v: None if any(v == a and type(v) is type(a) for a in allowed) else (
            f"expected one of {list(allowed)!r}, got {v!r:.60}")
    if annotation is bool:
        return lambda v: None if isinstance(v, bool) else f"expected a boolean, got {_kind(v)}"
    if annotation is int:
        return lambda v: None if isinstance(v, int) and not isinstance(v, bool) else (
            f"expected an integer, got {_kind(v)}")
    if annotation is float:  # JSON has one number type: an integer is a float too
        return lambda v: None if isinstance(v, int | float) and not isinstance(v, bool) else (
            f"expected a number, got {_kind(v)}")
    if annotation is str:
        return lambda v: None if isinstance(v, str) else f"expected a string, got {_kind(v)}"
    if annotation is list or origin is list:
        item = _compile(args[0], where) if args else _any

        def array(v: Any) -> str | None:
            if not isinstance(v, list):
                return f"expected an array, got {_kind(v)}"
            for i, element in enumerate(v):
                if (problem := item(element)) is not None:
                    return f"[{i}]: {problem}"
            return None
        return array
    if annotation is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: a JSON object's keys are strings, not {args[0]!r}")
        value_check = _compile(args[1], where) if args else _any

        def obj(v: Any) -> str | None:
            if not isinstance(v, dict):
                return f"expected an object, got {_kind(v)}"
            for key, element in v.items():
                if not isinstance(key, str):
                    return f"an object key must be a string, got {_kind(key)}"
                if (problem := value_check(element)) is not None:
                    return f"[{key!r}]: {problem}"
            return None
        return obj
    raise TypeError(
        f"{where}: {annotation!r} is not a JSON type. A payload argument must be str, int, "
        "float, bool, None, list[...], dict[str, ...], Any, or a Union / Optional / Literal / "
        "Annotated of those (it is stored as JSON and comes back as JSON)")


@dataclass(frozen=True, slots=True)
class _Argument:
    name: str
    required: bool
    positional: bool  # may be given by position
    check: Check


def _signature(fn: Callable[..., Any],
               name: str) -> tuple[list[_Argument], Check | None, str | None]:
    """The payload arguments of a handler (every parameter after the run), the check of extra
    keyword arguments when it takes ``**kwargs``, and the name no payload key may have (the
    run's parameter, unless it is positional-only)."""
    # A functools.partial's annotations are its function's; a callable object's, its __call__'s.
    annotated = getattr(fn, "func", None) if isinstance(fn, functools.partial) else (
        fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__)
    try:
        hints = typing.get_type_hints(annotated, include_extras=True)
    except Exception as exc:  # an annotation naming something that does not exist
        raise TypeError(f"deployment {name!r}: cannot resolve the annotations of "
                        f"{_label(fn)}: {exc}") from exc
    parameters = list(inspect.signature(fn).parameters.values())
    if not parameters or parameters[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"deployment {name!r}: {_label(fn)} must take the run as its "
                        "first positional parameter")
    arguments: list[_Argument] = []
    extra: Check | None = None
    run_name = (parameters[0].name
                if parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD else None)
    for p in parameters[1:]:
        where = f"deployment {name!r}, parameter {p.name!r}"
        check = _compile(hints.get(p.name, inspect.Parameter.empty), where)
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = check
            continue
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(f"{where}: a payload is an object of named arguments, so a "
                            "handler cannot take positional-only or *args parameters")
        if p.name in ENQUEUE_OPTIONS:
            raise TypeError(f"{where}: the name is an option of enqueue "
                            f"({', '.join(sorted(ENQUEUE_OPTIONS))}); rename the parameter")
        if p.default is not inspect.Parameter.empty and (
                problem := json_problem({p.name: p.default})) is not None:
            raise TypeError(f"{where}: its default is not JSON ({problem})")
        arguments.append(_Argument(p.name, p.default is inspect.Parameter.empty,
                                   p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, check))
    return arguments, extra, run_name


def _label(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


#: How many bad payloads an enqueue_many error names one by one (the rest are counted).
_MAX_NAMED_PAYLOADS = 20


# -- what a synchronous handler sees ------------------------------------------------------------

class SyncRunContext:
    """What a plain ``def`` handler sees: the run's fields (as on
    :class:`~zeroth_pg.worker.RunContext`) and blocking, fenced ``commit`` / ``checkpoint`` /
    ``progress`` / ``sleep`` / ``sleep_until``, run on the worker's event loop.

    The handler runs in its own thread while the loop renews its lease. Python cannot stop a
    thread from outside, so when the worker stops the run (a cancel request, a lost lease, the
    end of a graceful shutdown) :attr:`stop_requested` turns true, every later write raises
    :class:`~zeroth_pg.errors.LeaseLostError`, and whatever the function returns is dropped: poll
    :attr:`cancel_requested` or :attr:`stop_requested` between steps.
    """

    def __init__(self, run: RunContext, loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self._loop = loop
        self._stopped = threading.Event()

    def __getattr__(self, name: str) -> Any:  # the run's data fields
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._run, name)

    @property
    def cancel_requested(self) -> bool:
        """True once the database reported a cancel request for this run."""
        return self._run.cancel_requested

    @property
    def stop_requested(self) -> bool:
        """True once the worker stopped waiting for this handler (cancel, lease lost,
        shutdown): return as soon as you can; nothing more will be written."""
        return self._stopped.is_set() or self._run.cancel_requested

    def _call(self, coroutine: Any) -> Any:
        if self._stopped.is_set():
            coroutine.close()
            raise LeaseLostError("the worker stopped this run", run_id=self._run.run_id,
                                 worker_id=self._run.worker_id,
                                 generation=self._run.lease_generation)
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def commit(self, **columns: Any) -> None:
        """:meth:`RunContext.commit`, blocking."""
        self._call(self._run.commit(**columns))

    def checkpoint(self, data: Any, *, checkpoint_id: Any = None) -> Any:
        """:meth:`RunContext.checkpoint`, blocking; returns the checkpoint id."""
        return self._call(self._run.checkpoint(data, checkpoint_id=checkpoint_id))

    def progress(self, value: Any) -> None:
        """:meth:`RunContext.progress`, blocking."""
        self._call(self._run.progress(value))

    def sleep(self, seconds: float, *, checkpoint: Any = None) -> NoReturn:
        """:meth:`RunContext.sleep`, blocking: raises :class:`~zeroth_pg.worker.RunSlept` (a
        BaseException; let it propagate) once the sleep is accepted. The function is called
        again from the start when the run resumes, with the latest checkpoint."""
        self._call(self._run.sleep(seconds, checkpoint=checkpoint))
        raise AssertionError("unreachable: RunContext.sleep always raises")

    def sleep_until(self, when: datetime, *, checkpoint: Any = None) -> NoReturn:
        """:meth:`RunContext.sleep_until`, blocking; as :meth:`sleep`."""
        self._call(self._run.sleep_until(when, checkpoint=checkpoint))
        raise AssertionError("unreachable: RunContext.sleep_until always raises")

    @property
    def step_key(self) -> str | None:
        """:attr:`RunContext.step_key` (the step whose function runs in this thread)."""
        return self._run.step_key

    @property
    def step_idempotency_key(self) -> str | None:
        """:attr:`RunContext.step_idempotency_key`."""
        return self._run.step_idempotency_key

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`RunContext.step`, blocking: ``fn`` runs in this (the handler's) thread; the
        read and the record run on the worker's event loop, fenced."""
        if self._run.slept is not None:  # left its worker already (it swallowed RunSlept)
            raise RunSlept(self._run.slept)
        call = self._run.begin_step(name)
        recorded, result = self._call(call.read())
        if recorded:
            return result
        with call.running():
            value = fn(*args, **kwargs)
        return self._call(call.record(value))

    def wait_for_event(self, name: str, *, timeout: float | None = None) -> Any:
        """:meth:`RunContext.wait_for_event`, blocking: returns the payload, raises
        :class:`~zeroth_pg.errors.EventTimeoutError`, or raises
        :class:`~zeroth_pg.worker.RunSlept` (let it propagate) when the run leaves its worker
        to wait; the function is called again from the start once the event is emitted."""
        return self._call(self._run.wait_for_event(name, timeout=timeout))


    def start_child(self, deployment: str, payload: Mapping[str, Any] | None = None, *,
                    key: str | None = None, priority: int | None = None,
                    max_attempts: int | None = None, metadata: Mapping[str, Any] | None = None,
                    detached: bool = False) -> UUID:
        """:meth:`RunContext.start_child`, blocking: returns the child's run id."""
        return cast(UUID, self._call(self._run.start_child(
            deployment, payload, key=key, priority=priority, max_attempts=max_attempts,
            metadata=metadata, detached=detached)))

    def wait_for_children(self, children: Sequence[UUID], *,
                          mode: str = "all") -> list[ChildOutcome]:
        """:meth:`RunContext.wait_for_children`, blocking: returns the outcomes, or raises
        :class:`~zeroth_pg.worker.RunSlept` (let it propagate) when the run leaves its worker
        to wait; the function is called again from the start once the wait is met."""
        return cast(list[ChildOutcome], self._call(
            self._run.wait_for_children(children, mode=mode)))

async def _in_thread(fn: Callable[..., Any], run: RunContext, arguments: dict[str, Any]) -> Any:
    """Call ``fn(SyncRunContext, **arguments)`` in a daemon thread of its own and wait for it.

    A thread per run, not a pool: the worker's local concurrency already bounds how many run at
    once, and a daemon thread that ignores its stop never holds up the process's exit (a
    ThreadPoolExecutor joins its threads at exit). Context variables (a trace's span) follow.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    sync_run = SyncRunContext(run, loop)
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return  # the worker stopped waiting
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result = context.run(fn, sync_run, **arguments)
        except RunSlept as exc:  # the attempt ended in a durable sleep: the worker's to see
            outcome: tuple[Any, BaseException | None] = (None, exc)
        except Exception as exc:
            # A future cannot carry StopIteration; a failure of the run either way.
            error = exc if not isinstance(exc, StopIteration) else RuntimeError(
                "the handler raised StopIteration")
            outcome = (None, error)
        except BaseException as exc:
            # SystemExit or KeyboardInterrupt in this thread ends the thread, not the process:
            # a failure of this attempt, as any other, described as an async handler's is.
            failure = handler_exit(exc)
            if failure is exc:  # another BaseException: carried as an Exception
                failure = RuntimeError(f"the handler's thread raised {type(exc).__name__}")
                failure.__cause__ = exc
            outcome = (None, failure)
        else:
            outcome = (result, None)
        # A closed loop: the worker is gone, and so is the run's lease.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name=f"zeroth-run-{run.run_id}", daemon=True).start()
    try:
        return await asyncio.shield(done)  # a cancel of this task must not cancel `done`
    except asyncio.CancelledError:
        sync_run._stopped.set()
        # The run's outcome is settled now, but the thread runs until it returns: it keeps its
        # deployment's local slot until then (a second run of a deployment limited to one must
        # not start beside a thread still running).
        run.linger(done)
        raise


# -- deployments --------------------------------------------------------------------------------

class Deployment:
    """One kind of work: a handler and its defaults. Calling it calls the function itself."""

    def __init__(self, app: App, name: str, fn: Callable[..., Any], *, max_attempts: int,
                 priority: int, retry: RetryPolicy | None, concurrency: int | None,
                 lease_seconds: float | None = None,
                 attempt_timeout_seconds: float | None = None,
                 run_timeout_seconds: float | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("a deployment needs a non-empty name")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"deployment {name!r}: concurrency must be an int of at least 1")
        if lease_seconds is not None and (
                isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float)
                or not 1 <= lease_seconds <= 86400):
            # Registered (zeroth.deployments: 1 <= s <= 86400): the lease of every claim of the
            # deployment that names none; a shorter one lapses before its run can start.
            raise ValueError(f"deployment {name!r}: lease_seconds must be a number in "
                             "[1, 86400]")
        # Registered (zeroth.deployments: zeroth._check_timeouts' bounds): checked here first.
        for what, value, top in (("attempt_timeout_seconds", attempt_timeout_seconds, 86400 * 30),
                                 ("run_timeout_seconds", run_timeout_seconds, 86400 * 365)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not 1 <= value <= top):
                raise ValueError(f"deployment {name!r}: {what} must be a number in [1, {top}]")
        self.app = app
        self.name = name
        self.fn = fn
        self.max_attempts = max_attempts
        self.priority = priority
        self.retry = retry
        #: The lease of a claim of its runs that names none (None: not set), registered.
        self.lease_seconds = None if lease_seconds is None else float(lease_seconds)
        #: The bound on an attempt's wall time and on a run's total time (None: not set),
        #: registered; the claims fix them as deadlines on the database clock.
        self.attempt_timeout_seconds = (None if attempt_timeout_seconds is None
                                        else float(attempt_timeout_seconds))
        self.run_timeout_seconds = (None if run_timeout_seconds is None
                                    else float(run_timeout_seconds))
        #: Handlers of this deployment running at once in one worker (None: the worker's).
        self.concurrency = concurrency
        # A callable object with an async __call__ is a coroutine function too.
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None))  # noqa: B004 - the method itself
        self._arguments, self._extra, self._run_name = _signature(fn, name)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Deployment {self.name!r} of {_label(self.fn)}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    # -- the payload -------------------------------------------------------------------------

    def payload(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The payload of a run of these arguments (positional ones by the handler's parameter
        order), checked; raises :class:`InvalidPayloadError`."""
        positional = [a for a in self._arguments if a.positional]
        if len(args) > len(positional):
            raise InvalidPayloadError(
                f"{self.name}: takes {len(positional)} positional argument(s) after the run, "
                f"got {len(args)}")
        given = dict(kwargs)
        for argument, value in zip(positional, args, strict=False):
            if argument.name in given:
                raise InvalidPayloadError(
                    f"{self.name}: got several values for argument {argument.name!r}")
            given[argument.name] = value
        self._check(given, "")
        return given

    def _check(self, payload: Mapping[str, Any], context: str) -> None:
        """Raise :class:`InvalidPayloadError` unless ``payload`` fits the handler."""
        known = {a.name for a in self._arguments}
        problems: list[str] = []
        missing = [a.name for a in self._arguments if a.required and a.name not in payload]
        if missing:
            problems.append(f"missing {', '.join(map(repr, missing))}")
        for key, value in payload.items():
            if not isinstance(key, str):
                problems.append(f"an argument name must be a string, got {key!r:.60}")
                continue
            if key == self._run_name:  # fn(run, **payload) would get it twice
                problems.append(f"{key!r:.60} names the run's own parameter")
                continue
            if key in known:
                check = next(a.check for a in self._arguments if a.name == key)
            elif self._extra is not None:
                check = self._extra
            else:
                problems.append(f"unexpected argument {key!r:.60}")
                continue
            if (problem := check(value)) is not None:
                problems.append(f"{key}: {problem}")
            elif (problem := json_problem(value)) is not None:  # every problem, each named
                problems.append(f"{key}: not storable as JSON: {problem:.200}")
        if problems:
            raise InvalidPayloadError(f"{self.name}{context}: {'; '.join(problems)}")

    # -- enqueue -----------------------------------------------------------------------------

    def configure(self, **options: Any) -> _Configured:
        """Bind enqueue options (``tenant_id``, ``priority``, ``conn``, ...) for the calls
        that follow: ``await send_email.configure(tenant_id="acme").enqueue(to=...)``."""
        unknown = sorted(set(options) - ENQUEUE_OPTIONS)
        if unknown:
            raise TypeError(f"unknown enqueue option(s) {', '.join(unknown)}")
        return _Configured(self, options)

    async def enqueue(self, *args: Any, **kwargs: Any) -> EnqueuedRun:
        """Check the arguments against the handler and create a pending run
        (``zeroth.enqueue_run``). Keyword arguments named like an enqueue option
        (:data:`ENQUEUE_OPTIONS`) are options; the rest is the payload. Raises
        :class:`InvalidPayloadError` (nothing enqueued)."""
        return await _Configured(self, {}).enqueue(*args, **kwargs)

    async def enqueue_many(self, payloads: Iterable[Mapping[str, Any]],
                           **options: Any) -> list[EnqueuedRun]:
        """Many runs in one call (``zeroth.enqueue_runs``), each mapping the keyword arguments
        of one run; ``options``: ``tenant_id``, ``workspace_id``, ``priority``,
        ``max_attempts``, ``run_after``, ``metadata``, ``conn``. Every payload is checked before
        anything is sent."""
        return await _Configured(self, {}).enqueue_many(payloads, **options)

    # -- the worker side ---------------------------------------------------------------------

    async def handle(self, run: RunContext) -> Any:
        """The worker's handler: check the stored payload, then call the function (in a thread
        of its own when it is not a coroutine function)."""
        payload = run.payload
        if not isinstance(payload, dict):
            raise InvalidPayloadError(f"{self.name}: the payload is not a JSON object")
        self._check(payload, f" (run {run.run_id})")
        if self.is_async:
            return await self.fn(run, **payload)
        return await _in_thread(self.fn, run, payload)


def _whole_seconds(seconds: float | None) -> int | None:
    """A declared timeout as a run's own (whole seconds: zeroth.runs keeps them as integers),
    rounded up: sent with each enqueue only while the registry does not hold the declared one."""
    return None if seconds is None else math.ceil(seconds)


class _Configured:
    """A deployment with bound enqueue options (:meth:`Deployment.configure`)."""

    def __init__(self, deployment: Deployment, options: Mapping[str, Any]) -> None:
        self._deployment = deployment
        self._options = options

    def _split(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        options = dict(self._options)
        payload: dict[str, Any] = {}
        for key, value in kwargs.items():
            (options if key in ENQUEUE_OPTIONS else payload)[key] = value
        return options, payload

    async def enqueue(self, *args: Any, **kwargs: Any) -> EnqueuedRun:
        d = self._deployment
        options, payload = self._split(kwargs)
        checked = d.payload(*args, **payload)
        lm = await d.app.lease_manager(options.get("conn"))
        # Registered: what the caller leaves out is the registry's (a DBA's change included).
        registered = d.app._registered
        return await lm.enqueue_run(
            d.name, checked, tenant_id=options.get("tenant_id"),
            workspace_id=options.get("workspace_id"),
            priority=options.get("priority", None if registered else d.priority),
            run_after=options.get("run_after"),
            max_attempts=options.get("max_attempts", None if registered else d.max_attempts),
            idempotency_key=options.get("idempotency_key"), metadata=options.get("metadata"),
            run_id=options.get("run_id"), thread_id=options.get("thread_id"),
            attempt_timeout_seconds=options.get(
                "attempt_timeout_seconds",
                None if registered else _whole_seconds(d.attempt_timeout_seconds)),
            run_timeout_seconds=options.get(
                "run_timeout_seconds",
                None if registered else _whole_seconds(d.run_timeout_seconds)),
            conn=options.get("conn"))

    async def enqueue_many(self, payloads: Iterable[Mapping[str, Any]],
                           **options: Any) -> list[EnqueuedRun]:
        d = self._deployment
        bound = {**self._options, **options}
        per_run = {"priority", "max_attempts", "run_after", "metadata",
                   "attempt_timeout_seconds", "run_timeout_seconds"}
        unknown = sorted(set(bound) - per_run - {"tenant_id", "workspace_id", "conn"})
        if unknown:
            raise TypeError(f"enqueue_many takes no option(s) {', '.join(unknown)} (they name "
                            "one run: use enqueue)")
        if isinstance(payloads, Mapping | str | bytes):
            raise InvalidPayloadError(f"{d.name}: enqueue_many needs an iterable of mappings")
        lm = await d.app.lease_manager(bound.get("conn"))
        registered = d.app._registered
        items: list[dict[str, Any]] = []
        bad: list[str] = []  # every bad payload is named, not only the first
        for i, arguments in enumerate(payloads):
            if not isinstance(arguments, Mapping):
                bad.append(f"payload [{i}] is not a mapping")
                continue
            try:
                checked = d.payload(**arguments)
            except InvalidPayloadError as exc:
                bad.append(f"payload [{i}]: {exc}")
                continue
            except TypeError as exc:  # a non-string key
                bad.append(f"payload [{i}]: {exc}")
                continue
            item: dict[str, Any] = {"payload": checked}
            for option, declared in (("priority", d.priority), ("max_attempts", d.max_attempts),
                                     ("attempt_timeout_seconds",
                                      _whole_seconds(d.attempt_timeout_seconds)),
                                     ("run_timeout_seconds",
                                      _whole_seconds(d.run_timeout_seconds))):
                if bound.get(option) is not None:
                    item[option] = bound[option]
                elif not registered:
                    item[option] = declared
            if bound.get("metadata") is not None:
                item["metadata"] = bound["metadata"]
            if bound.get("run_after") is not None:
                item["run_after"] = bound["run_after"]
            items.append(item)
        if bad:
            shown = bad[:_MAX_NAMED_PAYLOADS]
            more = len(bad) - len(shown)
            raise InvalidPayloadError(
                f"{d.name}: {len(bad)} bad payload(s), nothing enqueued: " + "; ".join(shown)
                + (f"; and {more} more" if more else ""))
        return await lm.enqueue_runs(d.name, items, tenant_id=bound.get("tenant_id"),
                                     workspace_id=bound.get("workspace_id"),
                                     conn=bound.get("conn"))


# -- the application ----------------------------------------------------------------------------

class App:
    """A registry of deployments, and the pool they enqueue and run through.

    ``dsn``: the database (default: ``ZEROTH_PG_DSN`` as it is, else the embedded server,
    migrated);
    ``pool``: an asyncpg pool of your own instead (``dsn`` then only enables LISTEN/NOTIFY
    wakeups of :meth:`worker`). A pool the App creates is :func:`zeroth_pg.create_pool`'s: a
    connection that only served a zeroth_pg call goes back without asyncpg's reset round trip,
    any other is reset in full.
    The pool opens on first use; close it with :meth:`close` or ``async with app:``.
    ``code_version``: the version of this application's code (e.g. a build id), declared by
    every worker of the App (RunWorker ``code_version``; None: unversioned).
    """

    def __init__(self, dsn: str | None = None, *, pool: asyncpg.Pool | None = None,
                 pool_size: int = 16, lease_duration: float = 60.0,
                 code_version: str | None = None) -> None:
        self.dsn = dsn
        #: The version of this application's code (issue 34): every worker of the App declares
        #: it (RunWorker ``code_version``); None: unversioned.
        self.code_version = check_code_version(code_version)
        self._pool = pool
        self._own_pool = pool is None
        self.pool_size = pool_size
        self.lease_duration = lease_duration
        self._deployments: dict[str, Deployment] = {}
        self._schedules: dict[tuple[str | None, str | None, str], PeriodicSchedule] = {}
        self._lease_manager: LeaseManager | None = None
        self._opening: asyncio.Lock | None = None  # created in the loop that opens the pool
        #: The registry holds this App's deployments (committed): enqueues leave it the defaults.
        self._registered = False
        self._unregistrable = False  # the role or schema cannot register: not tried again

    # -- declaring work ----------------------------------------------------------------------

    def deployment(self, name: str | None = None, *, max_attempts: int = 3, priority: int = 0,
                   retry: RetryPolicy | None = None,
                   concurrency: int | None = None,
                   lease_seconds: float | None = None,
                   attempt_timeout_seconds: float | None = None,
                   run_timeout_seconds: float | None = None,
                   ) -> Callable[[Callable[..., Any]], Deployment]:
        """Register the decorated function as the handler of deployment ``name`` (default: the
        function's name). ``max_attempts`` and ``priority`` are the defaults of its runs,
        registered in the database (``zeroth.deployments``) when the App opens its pool, so
        that every client's enqueue gets them; ``retry`` the backoff of its failed attempts and
        ``lease_seconds`` the lease of its claims, registered too (a worker in any language
        that passes none gets them; None: not set, 1 / 300 s and 60 s), ``concurrency`` a
        local limit of its handlers in one worker (the fleet-wide limits of a scope are
        ``zeroth.scope_limits``: ``zeroth-pg deployments``). The App's worker holds every lease
        for the longest ``lease_seconds`` of the deployments it serves (else the App's
        ``lease_duration``). ``attempt_timeout_seconds`` / ``run_timeout_seconds``: the bound on
        an attempt's wall time and on a run's total time from its first claim, registered too:
        the claims fix them as deadlines on the database clock, renewals never pass them, the
        worker stops the handler at the deadline and the run is retried (an attempt timeout,
        by ``max_attempts`` and ``retry``) or failed for good (a run timeout); an enqueue may
        give a run its own (``enqueue(..., attempt_timeout_seconds=…)``)."""

        def register(fn: Callable[..., Any]) -> Deployment:
            chosen = name or fn.__name__
            if chosen in self._deployments:
                raise ValueError(f"deployment {chosen!r} is registered already "
                                 f"(by {_label(self._deployments[chosen].fn)})")
            deployment = Deployment(self, chosen, fn, max_attempts=max_attempts,
                                    priority=priority, retry=retry, concurrency=concurrency,
                                    lease_seconds=lease_seconds,
                                    attempt_timeout_seconds=attempt_timeout_seconds,
                                    run_timeout_seconds=run_timeout_seconds)
            self._deployments[chosen] = deployment
            # A deployment declared after the registration: registered on the next open.
            self._registered = self._unregistrable = False
            return deployment

        return register

    def periodic(self, *, cron: str | None = None, interval_seconds: int | None = None,
                 name: str | None = None, time_zone: str = "UTC",
                 payload: Mapping[str, Any] | None = None, tenant_id: str | None = None,
                 workspace_id: str | None = None, missed_fire_policy: str = "skip",
                 catch_up_limit: int | None = None, misfire_grace_seconds: int = 60,
                 priority: int | None = None) -> Callable[[Deployment], Deployment]:
        """Run the decorated deployment on a schedule (stack it above ``@app.deployment``):
        exactly one of ``cron`` (5 fields, on the wall clock of ``time_zone``) and
        ``interval_seconds``. ``payload`` is checked against the handler's signature now. The
        schedule (``name``, default: the deployment's) is registered when a worker of the App
        starts (``zeroth.register_schedule``): created, updated, or, once a DBA paused or
        changed it in SQL, kept as the DBA left it. Every worker of the deployment fires it;
        each fire time becomes one run whichever does."""
        if (cron is None) == (interval_seconds is None):
            raise ValueError("periodic needs exactly one of cron and interval_seconds")

        def register(deployment: Deployment) -> Deployment:
            if not isinstance(deployment, Deployment) or deployment.app is not self:
                raise TypeError("@app.periodic decorates a deployment of this App: put it "
                                "above @app.deployment")
            data = dict(payload or {})
            deployment._check(data, f" (the payload of periodic {name or deployment.name!r})")
            schedule = PeriodicSchedule(
                name=name or deployment.name, deployment_ref=deployment.name, cron=cron,
                interval_seconds=interval_seconds, time_zone=time_zone, payload=data,
                tenant_id=tenant_id, workspace_id=workspace_id,
                priority=deployment.priority if priority is None else priority,
                max_attempts=deployment.max_attempts, missed_fire_policy=missed_fire_policy,
                catch_up_limit=catch_up_limit, misfire_grace_seconds=misfire_grace_seconds)
            key = (tenant_id, workspace_id, schedule.name)
            if key in self._schedules:
                raise ValueError(f"a schedule named {schedule.name!r} is declared already in "
                                 "this scope: give this one a name=")
            self._schedules[key] = schedule
            return deployment

        return register

    @property
    def schedules(self) -> list[PeriodicSchedule]:
        """The schedules declared with :meth:`periodic`."""
        return list(self._schedules.values())

    @property
    def deployments(self) -> Mapping[str, Deployment]:
        return types.MappingProxyType(self._deployments)

    def select(self, names: Sequence[str] | None = None) -> list[Deployment]:
        """The named deployments (None: every one), or ValueError naming the unknown ones."""
        if not self._deployments:
            raise ValueError("this App has no deployment registered")
        if not names:
            return list(self._deployments.values())
        unknown = [n for n in names if n not in self._deployments]
        if unknown:
            raise ValueError(f"no deployment {', '.join(map(repr, unknown))} in this App "
                             f"(it has {', '.join(self._deployments)})")
        return [self._deployments[n] for n in dict.fromkeys(names)]

    def worker_options(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """The RunWorker arguments the deployments define: their handlers (a fleet worker's
        mapping), retry policies, local limits, the schedules declared for them and, when one
        of them sets ``lease_seconds``, the longest as ``lease_duration``."""
        chosen = self.select(names)
        served = {d.name for d in chosen}
        leases = [d.lease_seconds for d in chosen if d.lease_seconds is not None]
        return {
            **({"lease_duration": max(leases)} if leases else {}),
            "deployment_ref": {d.name: d.handle for d in chosen},
            "retries": {d.name: d.retry for d in chosen if d.retry is not None},
            "deployment_concurrency": {d.name: d.concurrency for d in chosen
                                       if d.concurrency is not None},
            "schedules": [s for s in self._schedules.values() if s.deployment_ref in served],
        }

    # -- the connection ----------------------------------------------------------------------

    async def open(self) -> asyncpg.Pool:
        """The pool, created on first use; the deployments are registered then
        (:meth:`register_deployments`)."""
        pool = await self._open_pool()
        if not (self._registered or self._unregistrable) and self._deployments:
            async with self._opening_lock():
                if not (self._registered or self._unregistrable):
                    await self._register(pool, quiet=True)
        return pool

    async def _open_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._pool is None:
                    if self.dsn is None:
                        self.dsn = await self._embedded_dsn()
                    self._pool = await create_pool(
                        self.dsn, min_size=1, max_size=self.pool_size)
        return self._pool

    @staticmethod
    async def _embedded_dsn() -> str:
        """No DSN given: ``ZEROTH_PG_DSN`` as it is, else the embedded server. Like a worker
        process: a database it was given is installed by its DBA, never migrated from here;
        the embedded one is."""
        from zeroth_pg.embedded import resolve_dsn

        given = bool(os.environ.get("ZEROTH_PG_DSN"))
        return await asyncio.to_thread(resolve_dsn, migrate=not given)

    def _opening_lock(self) -> asyncio.Lock:
        if self._opening is None:
            self._opening = asyncio.Lock()
        return self._opening

    async def register_deployments(
            self, conn: asyncpg.Connection | None = None) -> list[DeploymentRegistration]:
        """Register every deployment's defaults in the database (``zeroth.register_deployment``,
        in one transaction; the App does it when it opens its pool): created, updated (the last
        registration wins: a warning names the values it replaced, and
        ``zeroth.deployment_changes`` keeps who changed what when), unchanged, or kept (a DBA
        set them with ``zeroth.set_deployment_defaults``: logged when they differ from the
        App's). Over ``conn``: in the caller's transaction, if one is open.

        Until the registration is committed, the App's enqueues send its declared defaults
        (an App used only with ``conn=`` never opens its pool: call this at its start so that
        its enqueues leave the defaults to the registry, a DBA's setting included)."""
        if conn is not None:
            return await self._register(conn, quiet=False)
        pool = await self._open_pool()
        async with self._opening_lock():
            return await self._register(pool, quiet=False)

    async def _register(self, executor: asyncpg.Pool | asyncpg.Connection, *,
                        quiet: bool) -> list[DeploymentRegistration]:
        """register_deployments over ``executor``; ``quiet``: a role or schema that cannot
        register (:data:`_UNREGISTRABLE`) is logged, and the App keeps sending its defaults."""
        deployments = list(self._deployments.values())
        lm = LeaseManager(executor, lease_duration_seconds=self.lease_duration)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if isinstance(executor, asyncpg.Pool):
                    conn = await stack.enter_async_context(executor.acquire())
                else:
                    conn = executor
                committed = not conn.is_in_transaction()
                await stack.enter_async_context(conn.transaction())
                results = [await lm.register_deployment(
                    d.name, max_attempts=d.max_attempts, priority=d.priority,
                    retry_base_seconds=None if d.retry is None else d.retry.base_seconds,
                    retry_max_seconds=None if d.retry is None else d.retry.max_seconds,
                    lease_seconds=d.lease_seconds,
                    attempt_timeout_seconds=d.attempt_timeout_seconds,
                    run_timeout_seconds=d.run_timeout_seconds, conn=conn)
                    for d in deployments]
        except DatabaseError as exc:
            if not quiet or exc.code not in _UNREGISTRABLE:
                raise
            _log.warning("zeroth_pg: could not register the deployments' defaults (%s); "
                         "enqueues from this App send them, other clients get the database's",
                         exc)
            self._unregistrable = True
            return []
        for d, result in zip(deployments, results, strict=True):
            if result.outcome == "updated":
                _log.warning("zeroth_pg: deployment %r: defaults changed from %s to "
                             "max_attempts=%d, priority=%d (another registration had set them; "
                             "see zeroth.deployment_changes)", d.name, result.previous,
                             result.max_attempts, result.priority)
            elif result.outcome == "kept" and (result.max_attempts, result.priority) != (
                    d.max_attempts, d.priority):
                _log.info("zeroth_pg: deployment %r: a DBA set max_attempts=%d, priority=%d "
                          "(zeroth.set_deployment_defaults); the App's %d / %d are not used",
                          d.name, result.max_attempts, result.priority, d.max_attempts,
                          d.priority)
        # Registered for good once committed: a registration in the caller's transaction may
        # still be rolled back, so it counts only for that transaction's own enqueues.
        if committed:
            self._registered = True
        return results

    async def lease_manager(self, conn: asyncpg.Connection | None = None) -> LeaseManager:
        """The App's LeaseManager; with ``conn``, one over that connection alone (an enqueue in
        the caller's transaction never opens the App's pool, nor an embedded server)."""
        if conn is not None:
            return LeaseManager(conn, lease_duration_seconds=self.lease_duration,
                                code_version=self.code_version)
        if self._lease_manager is None:
            self._lease_manager = LeaseManager(await self.open(),
                                               lease_duration_seconds=self.lease_duration,
                                               code_version=self.code_version)
        return self._lease_manager

    async def close(self) -> None:
        """Close the pool if the App created it (a pool it was given stays open, and stays the
        App's: a later use never opens another behind the caller's back)."""
        if not self._own_pool:
            return
        pool, self._pool, self._lease_manager = self._pool, None, None
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    # -- workers -----------------------------------------------------------------------------

    async def worker(self, deployments: Sequence[str] | None = None, *,
                     scopes: Sequence[tuple[str | None, str | None]] | None = None,
                     **options: Any) -> RunWorker:
        """A (not yet started) worker of the named deployments (None: all) in every scope, or
        in ``scopes``; ``options`` are :class:`~zeroth_pg.worker.RunWorker`'s keywords."""
        pool = await self.open()
        arguments = self.worker_options(deployments)
        arguments["retries"] = {**arguments["retries"], **options.pop("retries", {})}
        arguments["deployment_concurrency"] = {**arguments["deployment_concurrency"],
                                               **options.pop("deployment_concurrency", {})}
        options.setdefault("dsn", self.dsn)
        options.setdefault("code_version", self.code_version)
        options.setdefault("lease_duration",
                           arguments.pop("lease_duration", None) or self.lease_duration)
        arguments.pop("lease_duration", None)
        if "schedules" in options:
            arguments.pop("schedules")
        return RunWorker(pool, arguments.pop("deployment_ref"), scopes=scopes, **arguments,
                         **options)

    async def run_worker(self, deployments: Sequence[str] | None = None, **options: Any) -> None:
        """Serve the deployments until SIGTERM/SIGINT, then drain (:meth:`worker` options). A
        database that is away when it starts (not up yet, restarting) is waited for, for up to
        30 s, as by ``zeroth-pg worker``; a SIGTERM or SIGINT meanwhile just returns."""
        worker_id = options["worker_id"] = (check_worker_id(options.get("worker_id"))
                                             or default_worker_id())
        if self.dsn is None and self._pool is None:
            # The embedded server (started and migrated, slow on a first run) is not a
            # database that is away: it is ready before the start-up's window opens.
            async with self._opening_lock():
                if self.dsn is None:
                    self.dsn = await self._embedded_dsn()
        with StartupSignals(worker_id) as startup:
            try:
                await startup.run(retry_starting(self.open, what="connect",
                                                 worker_id=worker_id))
                worker = await self.worker(deployments, **options)
                startup.check("start")  # from here run_until_stopped's handlers take them
            except StartInterrupted:
                return
            await worker.run_until_stopped()

