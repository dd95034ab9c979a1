"""One exception tree for zeroth_pg, keyed by SQLSTATE.

The SQL functions raise SQLSTATE class ``ZP`` (listed in sql/README.md); :func:`translate` maps
an asyncpg error to the matching class here, once, so callers branch on types and never on
message text (which the server may localise). Serialization failures, deadlocks and lost
connections become :class:`RetryableError`: the whole call can be repeated safely, because every
function is one transaction.
"""

from __future__ import annotations

from typing import ClassVar

import asyncpg

__all__ = [
    "CheckpointConflictError",
    "ChildRunConflictError",
    "ConnectionLostError",
    "DatabaseError",
    "EventTimeoutError",
    "FenceColumnWriteError",
    "InvalidArgumentError",
    "InvalidPayloadError",
    "InvalidScopeError",
    "InvalidTransitionError",
    "LeaseLostError",
    "NonRetryableError",
    "ReservedKeyError",
    "RetryableError",
    "RunNotFoundError",
    "ScheduleNotFoundError",
    "StepResultError",
    "UnknownColumnError",
    "ZerothError",
    "translate",
]


class ZerothError(Exception):
    """Base class of every error zeroth_pg raises on purpose."""

    sqlstate: ClassVar[str | None] = None
    retryable: ClassVar[bool] = False


class RunNotFoundError(ZerothError, LookupError):
    """ZP001: no run has this id in this tenant/workspace scope."""

    sqlstate = "ZP001"


class LeaseLostError(ZerothError):
    """ZP002: a fenced write was refused; the caller no longer holds the lease generation.

    The SQL functions report a refused fenced write as a return value (false/NULL); clients raise
    this where a refusal must stop the caller (the worker's RunContext does).
    """

    sqlstate = "ZP002"

    def __init__(self, message: str, *, run_id: object = None, worker_id: str | None = None,
                 generation: int | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.worker_id = worker_id
        self.generation = generation


class InvalidTransitionError(ZerothError):
    """ZP003: the run's status does not allow this transition."""

    sqlstate = "ZP003"


class FenceColumnWriteError(ZerothError, ValueError):
    """ZP004: commit_fenced was asked to write a lease, fence, status or identity column."""

    sqlstate = "ZP004"


class UnknownColumnError(ZerothError, ValueError):
    """ZP005: commit_fenced was given a column that is not writable or does not exist."""

    sqlstate = "ZP005"


class InvalidScopeError(ZerothError, ValueError):
    """ZP006: the tenant/workspace scope cannot name any run (a workspace without a tenant)."""

    sqlstate = "ZP006"


class CheckpointConflictError(ZerothError):
    """ZP007: a caller-chosen checkpoint id already belongs to another run of the same scope."""

    sqlstate = "ZP007"


class InvalidArgumentError(ZerothError, ValueError):
    """ZP008: an argument is out of range, missing or malformed. Nothing was changed."""

    sqlstate: ClassVar[str | None] = "ZP008"


class ScheduleNotFoundError(ZerothError, LookupError):
    """ZP009: no schedule has this name in this tenant/workspace scope."""

    sqlstate = "ZP009"


class ChildRunConflictError(ZerothError, ValueError):
    """ZP010: a child run's step key already names another child (another deployment, payload or
    detached flag) or another kind of step. A replayed parent must start the same children in the
    same order: a handler whose children depend on something that changed between attempts."""

    sqlstate = "ZP010"


class ReservedKeyError(InvalidArgumentError):
    """ZP011: an idempotency key starts with ``zeroth-schedule:``, the prefix reserved for the runs
    of schedules (``fire_due_schedules`` keys each fire so). Raised by enqueue_run, enqueue_runs
    and admit_run; nothing was changed. An InvalidArgumentError, so code that catches bad
    arguments catches it too."""

    sqlstate = "ZP011"


class NonRetryableError(ZerothError):
    """Raised by a handler (or for it): fail this run now, without a retry, whatever attempts it
    has left (``zeroth.fail_run`` with ``retryable => false``: status failed)."""


class InvalidPayloadError(InvalidArgumentError, NonRetryableError):
    """A payload does not match its deployment's handler (a missing or unknown argument, a value
    of the wrong JSON type). Raised by ``Deployment.enqueue`` before anything is sent, and in the
    worker for a payload another client wrote: that run fails without a retry, because no retry
    can make its payload fit."""

    sqlstate = None  # raised in Python only: the server's ZP008 stays InvalidArgumentError


class StepResultError(InvalidArgumentError, NonRetryableError):
    """A step's function returned a value that is not JSON (a set, an object, NaN, ...) or that
    PostgreSQL cannot store (nested too deep to encode included). Raised by ``run.step`` before
    anything is recorded; the attempt fails without a retry (the same code would return the same
    value again). Also raised by the client's get_step, record_step and wait_for_event for a
    recorded step result or event payload that Python cannot decode (written by psql or another
    language: an integer of more than 4,300 digits, nesting deeper than the decoder goes)."""

    sqlstate = None  # raised in Python only


class EventTimeoutError(ZerothError, TimeoutError):
    """``run.wait_for_event`` reached its deadline before the event was emitted. The timeout is
    the wait's recorded step result, so every replay of the handler raises it again at the same
    place: catch it to go on without the event."""

    def __init__(self, name: str) -> None:
        super().__init__(f"event {name!r} was not emitted before the wait's deadline")
        self.name = name


class DatabaseError(ZerothError):
    """Any other database error, with its SQLSTATE."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.code = sqlstate


class RetryableError(DatabaseError):
    """A transient failure (serialization, deadlock, lost connection, a write that met a
    read-only server during a failover): the call may be repeated."""

    retryable = True


class ConnectionLostError(RetryableError):
    """The connection broke during the call; whether the call committed is unknown."""


_BY_SQLSTATE: dict[str, type[ZerothError]] = {
    cls.sqlstate: cls
    for cls in (
        RunNotFoundError,
        LeaseLostError,
        InvalidTransitionError,
        FenceColumnWriteError,
        UnknownColumnError,
        InvalidScopeError,
        CheckpointConflictError,
        InvalidArgumentError,
        ScheduleNotFoundError,
        ChildRunConflictError,
        ReservedKeyError,
    )
    if cls.sqlstate is not None
}

# serialization_failure, deadlock_detected, lock_not_available, the server shutting down. Not
# 54000 (program_limit_exceeded): a value too large for jsonb or an index row is refused every
# time (red-team pass 7: a 256 MB output was retried for ever); zeroth itself never fills the
# NOTIFY queue (zeroth._notify stops at half full).
# query_canceled (57014: statement_timeout or pg_cancel_backend) too: it says nothing about the
# values, and a completion failed for it threw away a successful run's output (red-team pass 8).
# read_only_sql_transaction (25006): a write that reached a server that is (no longer, or not
# yet) the primary, around a failover; the same call succeeds once the connection reaches the
# promoted one (docs/dba-guide.md, "High availability").
_RETRYABLE_SQLSTATES = frozenset({"25006", "40001", "40P01", "55P03", "57014", "57P01", "57P02",
                                  "57P03"})
#: insufficient_resources (disk full, out of memory, too many connections): the server's state,
#: never the call's values, so a worker must not fail a run for it (red-team F2: a completion
#: refused by a full NOTIFY queue was failed as "a value PostgreSQL cannot store").
_RETRYABLE_CLASSES = ("53",)


def translate(exc: BaseException) -> BaseException:
    """Map a driver exception to the zeroth_pg exception to raise in its place.

    Exceptions that are not database errors are returned unchanged.
    """
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None)
        message = getattr(exc, "message", None) or str(exc)
        cls = _BY_SQLSTATE.get(sqlstate or "")
        if cls is not None:
            return cls(message)
        if (sqlstate or "").startswith("08"):
            return ConnectionLostError(message, sqlstate=sqlstate)
        if sqlstate in _RETRYABLE_SQLSTATES or (sqlstate or "")[:2] in _RETRYABLE_CLASSES:
            return RetryableError(message, sqlstate=sqlstate)
        return DatabaseError(message, sqlstate=sqlstate)
    # InternalClientError: asyncpg's protocol state after the server dropped the connection under
    # it ("cannot switch to state …; another operation is in progress"), seen in the chaos soak.
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError | ConnectionError
                  | OSError):
        return ConnectionLostError(str(exc) or type(exc).__name__)
    return exc
