"""A worker's start-up: what it must get from its database before it serves.

Two things: its first connection (``zeroth-pg worker`` opens its pool, :mod:`._process`) and the
schedules it declares (:meth:`RunWorker.start`). Each is retried by :func:`retry_starting` while
its failure is one a retry can outlast (a database not up yet, restarting, shutting down, a
connection that ended under it), for :data:`STARTUP_SECONDS`: a worker started with its database,
or respawned by a supervisor during a restart, waits for it instead of exiting. A refusal (a
wrong password, role or database, a missing grant, a schedule the database rejects, client
settings asyncpg refuses, a server certificate that does not verify, a socket it may not open)
fails at once; a missing file, certificate or socket alike is retried (an absent Unix socket is a
server not up yet).

Nothing is held while a worker starts (no lease, no run), so a SIGTERM or SIGINT meanwhile just
ends the start-up: :class:`StartupSignals` (its first connection), :meth:`RunWorker.
run_until_stopped` (its schedules).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from zeroth_pg.errors import ConnectionLostError, RetryableError, translate
from zeroth_pg.worker._settle import Backoff
from zeroth_pg.worker._signals import drain_signals

__all__ = ["STARTUP_SECONDS", "StartInterrupted", "StartupSignals", "first_set",
           "retry_starting", "start_unless_stopped"]

log = logging.getLogger("zeroth_pg.worker")

T = TypeVar("T")

#: How long a starting worker keeps trying a start-up call whose failure passes.
STARTUP_SECONDS = 30.0


class StartInterrupted(Exception):
    """A SIGTERM or SIGINT came while the worker was starting: nothing was held yet."""


def never_passes(exc: BaseException) -> bool:
    """A failure that no retry outlasts, though translate() calls it retryable (it takes every
    InterfaceError and OSError for a lost connection)."""
    return isinstance(exc, asyncpg.ClientConfigurationError
                      | asyncpg.UnsupportedClientFeatureError
                      | ssl.SSLCertVerificationError | PermissionError)


async def retry_starting(call: Callable[[], Awaitable[T]], *, what: str, worker_id: str,
                         seconds: float = STARTUP_SECONDS) -> T:
    """``call()``, tried again after 50 ms doubling to 1 s (:class:`~._settle.Backoff`, the
    worker's one retry policy) for ``seconds`` while its failure is a
    :class:`~zeroth_pg.errors.RetryableError` once translated and not one
    :func:`never_passes` names; then that failure is raised. No try outlives the window (one
    still running then is cancelled). ``what`` names the call in the log: "could not <what>
    yet", and "could not <what> within …; giving up"."""
    give_up_at = time.monotonic() + seconds
    backoff = Backoff()
    while True:
        try:
            async with asyncio.timeout(max(0.0, give_up_at - time.monotonic())):
                return await call()
        except Exception as exc:
            if never_passes(exc) or not isinstance(translate(exc), RetryableError):
                raise
            if backoff.gives_up(give_up_at):
                gave_up = f"could not {what} within {seconds:g}s ({type(exc).__name__}: " \
                          f"{str(exc)[:200]})"
                log.error("worker %s: %s; giving up", worker_id, gave_up)
                raise ConnectionLostError(gave_up) from exc
            log.warning("worker %s: could not %s yet (%s: %s); trying again in %.2fs",
                        worker_id, what, type(exc).__name__, str(exc)[:200], backoff.delay)
        await backoff.wait()


class StartupSignals:
    """From a worker process's first step until it serves: a SIGTERM or SIGINT ends the start-up.

    Inside (``with``), with ``install``, the first signal cancels what :meth:`run` awaits and
    sets :attr:`signalled`; the second restores the default action, so a third ends the process
    at once (:func:`~._signals.drain_signals`). The handlers stay installed until the block
    ends or :meth:`RunWorker.run_until_stopped` installs its own over them, so no signal finds
    the default action in between; the caller checks :attr:`signalled` before it serves (a
    signal can come as the awaited step finishes)."""

    def __init__(self, worker_id: str, *, install: bool = True) -> None:
        self.worker_id = worker_id
        self.signalled = False
        self._install = install
        self._awaited: asyncio.Future[Any] | None = None
        self._scope: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> StartupSignals:
        self._scope = drain_signals(self._install, first=self._first, again=lambda _sig: None)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._scope is not None
        self._scope.__exit__(None, None, None)

    def _first(self) -> bool:
        if self.signalled:
            return False
        self.signalled = True
        if self._awaited is not None:
            self._awaited.cancel()
        return True

    async def run(self, step: Awaitable[T]) -> T:
        """Await ``step``; raises :class:`StartInterrupted` when a signal came while it ran."""
        if self.signalled and asyncio.iscoroutine(step):
            step.close()  # never started: no "never awaited" warning
        self.check()
        awaited: asyncio.Future[T] = asyncio.ensure_future(step)
        self._awaited = awaited
        try:
            return await awaited
        except asyncio.CancelledError:
            self.check()
            raise
        finally:
            self._awaited = None

    def check(self, what: str = "connect") -> None:
        """Raise :class:`StartInterrupted` (logged: "stopped before it could <what>") when a
        signal came."""
        if self.signalled:
            log.info("worker %s: stopped before it could %s", self.worker_id, what)
            raise StartInterrupted()


async def start_unless_stopped(start: Callable[[], Awaitable[None]], *stops: asyncio.Event,
                               worker_id: str) -> bool:
    """``start()``: True once it returned, or False (logged: "stopped before it could start") when
    one of ``stops`` was set first and it was cancelled. Cancelled itself, this cancels the
    start too (a wait does not cancel what it waits on): a start never goes on alone. A start
    that failed raises its error."""
    starting = asyncio.ensure_future(start())
    try:
        await first_set(*stops, also=starting)
    finally:
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    if starting.cancelled():
        log.info("worker %s: stopped before it could start", worker_id)
        return False
    starting.result()
    return True


async def first_set(*events: asyncio.Event, also: asyncio.Future[Any] | None = None) -> None:
    """Wait until one of ``events`` is set (or ``also`` is done); the waits it made are
    cancelled whatever ends it (``also`` is left as it is)."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait([*waiters, *([also] if also is not None else [])],
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
