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
ends the start-up: :func:`unless_signalled`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from zeroth_pg.errors import RetryableError, translate
from zeroth_pg.worker._settle import Backoff
from zeroth_pg.worker._signals import drain_signals

__all__ = ["STARTUP_SECONDS", "StartInterrupted", "retry_starting", "unless_signalled"]

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
                log.error("worker %s: could not %s within %gs (%s: %s); giving up",
                          worker_id, what, seconds, type(exc).__name__, str(exc)[:200])
                raise
            log.warning("worker %s: could not %s yet (%s: %s); trying again in %.2fs",
                        worker_id, what, type(exc).__name__, str(exc)[:200], backoff.delay)
        await backoff.wait()


async def unless_signalled(starting: Awaitable[T], *, install: bool = True) -> T:
    """Await ``starting``; a SIGTERM or SIGINT meanwhile (with ``install``) cancels it and
    raises :class:`StartInterrupted`. A second signal finds the default action (as during a
    drain: :func:`~._signals.drain_signals`)."""
    task = asyncio.ensure_future(starting)
    signalled = False

    def first() -> bool:
        nonlocal signalled
        if signalled:
            return False
        signalled = True
        task.cancel()
        return True

    with drain_signals(install, first=first, again=lambda _sig: None):
        try:
            return await task
        except asyncio.CancelledError:
            if signalled:
                raise StartInterrupted() from None
            raise
