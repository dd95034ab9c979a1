"""Deciding the outcome of an attempt: what the handler returned or raised, and the state of its
run, become one :class:`Outcome`. Pure: no metrics, no tracing, no write (the worker reports an
outcome, then the :class:`~._settle.Settler` writes it), so every case is a unit test
(tests/worker/test_outcome.py).
"""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import inspect
import types
from dataclasses import dataclass
from typing import Any

from zeroth_pg._jsonb import storage_problem
from zeroth_pg.errors import (
    ErrorDescription,
    LeaseLostError,
    NonRetryableError,
    bounded_text,
    describe,
    handler_exit,
)
from zeroth_pg.worker._run import RunSlept, StopReason

__all__ = ["Outcome", "OutcomeKind", "decide"]


class OutcomeKind(enum.Enum):
    COMPLETED = "completed"  # write the output (the completion batch)
    FAILED = "failed"  # write the failure: retried with backoff, or for good
    SLEPT = "slept"  # the database took the run already (a sleep, a wait): nothing to write
    STOPPED = "stopped"  # the worker stopped the handler: settle by the stop's reason
    LEASE_LOST = "lease_lost"  # the lease is gone: nothing may be written
    PROPAGATE = "propagate"  # the event loop is cancelling this task: not the handler's doing


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeKind
    #: COMPLETED: the handler's output.
    output: Any = None
    #: FAILED: what failed it (an exception, or one described already); LEASE_LOST: what the
    #: handler raised, if anything.
    error: BaseException | ErrorDescription | None = None
    retryable: bool = True
    #: The trace's word for a failure or a stop ("handler failed", "output too large", …).
    why: str = ""
    #: LEASE_LOST: a write was refused by the fence (else the lease was known gone).
    fenced: bool = False
    #: FAILED: the handler raised KeyboardInterrupt (maybe the operator's Ctrl-C).
    interrupt: bool = False
    #: What the trace records as the failure's exception (None: only ``why``).
    traced: BaseException | ErrorDescription | None = None


def decide(*, output: Any = None, raised: BaseException | None = None, slept: bool,
           stop_reason: StopReason | None, lease_gone: bool, cancelling: bool) -> Outcome:
    """The outcome of an attempt whose handler returned ``output``, or raised ``raised``.

    ``slept``: the database accepted a sleep or wait of this attempt (its lease is gone, so
    nothing more is written whatever the handler did next); ``stop_reason``: why the worker
    stopped the run, if it did; ``lease_gone``: the stop was for a lost lease; ``cancelling``:
    the task is being cancelled from outside (the event loop shutting down).
    """
    if raised is None:
        return _returned(output, slept=slept, lease_gone=lease_gone)
    if isinstance(raised, RunSlept) and not slept:
        # Raised without a sleep of this attempt (made by the handler, or another run's): its
        # lease is still live, so it ends as a failure, never left to expire.
        return Outcome(OutcomeKind.FAILED, error=raised, why="handler failed", traced=raised)
    if isinstance(raised, asyncio.CancelledError):
        if slept:  # asleep, so settled: no stop cancels it
            return Outcome(OutcomeKind.PROPAGATE if cancelling else OutcomeKind.SLEPT)
        if stop_reason is not None:
            return Outcome(OutcomeKind.STOPPED, why=f"stopped: {stop_reason.value}")
        if cancelling:
            return Outcome(OutcomeKind.PROPAGATE)
        # The handler raised CancelledError itself (a cancelled inner task it let escape): a
        # failure like any other, never a run dropped without an outcome.
        return Outcome(OutcomeKind.FAILED, error=raised, why="handler failed", traced=raised)
    if isinstance(raised, LeaseLostError):
        return Outcome(OutcomeKind.LEASE_LOST, error=raised, why="lease lost", fenced=True,
                       traced=raised)
    if slept:  # it swallowed RunSlept and raised something else: the sleep was accepted
        return Outcome(OutcomeKind.SLEPT)
    # Exception, and whatever else a handler may raise (GeneratorExit, a BaseException subclass
    # of its own, SystemExit from sys.exit or argparse, KeyboardInterrupt): a failure of this
    # attempt, never a run left to its lease nor the worker's end. NonRetryableError (raised by
    # the handler, or by the application API for a payload that does not fit it) says no retry
    # can succeed: the run fails now. Described once, bounded, before anything is done with it:
    # the message may be a response body of hundreds of MB.
    failure = handler_exit(raised)
    retryable = not isinstance(failure, NonRetryableError)
    described = describe(failure)
    return Outcome(OutcomeKind.FAILED, error=described, retryable=retryable,
                   why="handler failed" if retryable else "failed for good",
                   interrupt=isinstance(raised, KeyboardInterrupt), traced=described)


def _returned(output: Any, *, slept: bool, lease_gone: bool) -> Outcome:
    if slept or lease_gone:
        _close_unstarted(output)  # nothing is written, but no "never awaited" later either
    if slept:  # it swallowed RunSlept and returned: the run sleeps anyway
        return Outcome(OutcomeKind.SLEPT)
    if lease_gone:
        return Outcome(OutcomeKind.LEASE_LOST, why="lease lost")
    if _is_awaitable(output):
        return _awaitable_returned(output)
    try:
        problem = storage_problem(output, "output")
    except Exception as exc:
        # The output's own code raised while it was encoded (a mapping's items(), called by
        # json.dumps; a __class__ read by its error message): the handler's doing, so the
        # attempt fails as if the handler had raised it (a BaseException escapes to _execute,
        # which does the same), not as a worker error.
        return decide(raised=exc, slept=False, stop_reason=None, lease_gone=False,
                      cancelling=False)
    # Retrying cannot make an output JSON, nor storable: fail that run, never its batch.
    if problem is not None:
        why, error = problem
        # Only an output that is not JSON has an exception of its own to trace.
        return Outcome(OutcomeKind.FAILED, error=error, retryable=False, why=why,
                       traced=error if why.endswith("not JSON") else None)
    return Outcome(OutcomeKind.COMPLETED, output=output)


def _is_awaitable(output: Any) -> bool:
    """inspect.isawaitable by the output's type alone: isinstance() reads the object's own
    ``__class__``, which a handler's object may define (a lazy proxy's raises; a fake's claims
    coroutine, so its close() and __qualname__ ran here)."""
    kind = type(output)
    return (kind is types.CoroutineType
            or (kind is types.GeneratorType  # a @types.coroutine generator
                and bool(output.gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE))
            or issubclass(kind, collections.abc.Awaitable))


def _awaitable_returned(output: Any) -> Outcome:
    """The handler returned an awaitable instead of its result: it called something async
    without ``await``, or it is a plain ``def`` that should be an ``async def``. Awaiting it here
    would run the handler's work outside its attempt, and a retry would return one again, so the
    run fails for good, saying so (not only "not JSON"). A coroutine never started is closed
    first (which runs none of its code): left to the garbage collector, Python would warn that it
    was never awaited from wherever it is collected, far from this run and its logs. One already
    started is left as it is: a task may be running it (the handler started it and returned the
    coroutine, not the task's result), and closing it would run its clean-up here, which may
    raise or await."""
    # Only a real coroutine's own attributes are read (their values are the interpreter's):
    # another awaitable is the handler's object, whose attribute lookups run its code; its
    # type's name says enough.
    if type(output) is types.CoroutineType:
        name = f"coroutine {bounded_text(output.__qualname__, 200)}"
        if _close_unstarted(output):
            fate = "it was not run"
        else:
            fate = "it was started, and is left as it is"
    else:
        name = bounded_text(type(output).__qualname__, 200)
        fate = "it was not awaited"
    error = TypeError(
        f"the handler returned an awaitable ({name}) instead of its result: an async call "
        f"without await, or a plain def that should be an async def; {fate}")
    return Outcome(OutcomeKind.FAILED, error=error, retryable=False,
                   why="output is an awaitable", traced=error)


def _close_unstarted(output: Any) -> bool:
    """Close ``output`` if it is a coroutine never started (which runs none of its code); say
    whether it was one. A started one is left to whatever runs it."""
    if (type(output) is types.CoroutineType
            and inspect.getcoroutinestate(output) == inspect.CORO_CREATED):
        output.close()
        return True
    return False
