"""One exception tree for zeroth_pg, keyed by SQLSTATE.

The SQL functions raise SQLSTATE class ``ZP`` (listed in sql/README.md); :func:`translate` maps
an asyncpg error to the matching class here, once, so callers branch on types and never on
message text (which the server may localise). Serialization failures, deadlocks and lost
connections become :class:`RetryableError`: the whole call can be repeated safely, because every
function is one transaction.
"""

from __future__ import annotations

import json
import re
import reprlib
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar

import asyncpg

__all__ = [
    "MAX_ERROR_DOCUMENT_BYTES",
    "MAX_ERROR_TEXT_BYTES",
    "CallTimeoutError",
    "CheckpointConflictError",
    "ChildRunConflictError",
    "ConnectionLostError",
    "DatabaseError",
    "DeadlinePassedError",
    "ErrorDescription",
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
    "RunEventLimitError",
    "RunNotFoundError",
    "ScheduleNotFoundError",
    "StepResultError",
    "TransitionNotListedError",
    "UnknownColumnError",
    "ZerothError",
    "bounded_text",
    "describe",
    "handler_exit",
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


class TransitionNotListedError(InvalidTransitionError):
    """ZP012: the run's status has no edge for this outcome in ``zeroth.run_transitions`` (the
    state machine as data); nothing was changed for that run. Reported per run by settle_runs
    (its ``sqlstate`` column), never raised by a function: the single-run ends raise ZP003 for
    the same refusal."""

    sqlstate = "ZP012"


class DeadlinePassedError(LeaseLostError):
    """ZP013: the holder's attempt deadline or run deadline (``attempt_timeout_seconds`` /
    ``run_timeout_seconds``, fixed by the claim on the database clock) has passed, so its lease
    cannot be renewed: raised by renew_lease, reported per run by renew_leases (its ``sqlstate``
    column). The attempt is over: its holder settles it as a timeout while its lease still lives,
    else the orphan sweep ends it (retried or dead-lettered by the retry policy, or failed for
    good past the run deadline). A LeaseLostError, so code that stops on a lost lease stops."""

    sqlstate = "ZP013"


class RunEventLimitError(ZerothError):
    """ZP014: the run's event stream already holds the most events its deployment allows
    (``zeroth.deployments.max_run_events``, set by a DBA; 10,000 when not set; END is not
    counted). Raised by append_run_event (``run.emit``) to the live lease holder; nothing was
    stored, and the run goes on: a handler may catch it and stop emitting, or let the attempt
    fail like any exception."""

    sqlstate = "ZP014"


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


class InvalidNameError(InvalidArgumentError, NonRetryableError):
    """A handler named a step or an event wrongly (``run.step("a#b")``, an empty name, one too
    long, not a string). Raised by ``run.step`` and ``run.wait_for_event`` before anything is
    written; the attempt fails without a retry, because the handler's code would make the same
    mistake in every attempt."""

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


class CallTimeoutError(ConnectionLostError):
    """The call got no answer within its bound (a worker's ``call_timeout``): its connection
    was terminated, so whether it committed is unknown, as for any lost connection; retryable.
    A hung or partitioned server (docs/dba-guide.md, "High availability")."""


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
        TransitionNotListedError,
        DeadlinePassedError,
        RunEventLimitError,
    )
    if cls.sqlstate is not None
}

# serialization_failure, deadlock_detected, lock_not_available, the server shutting down. Not
# 54000 (program_limit_exceeded): a value too large for jsonb or an index row is refused every
# time (a 256 MB output must not be retried for ever); zeroth itself never fills the
# NOTIFY queue (zeroth._notify stops at half full).
# query_canceled (57014: statement_timeout or pg_cancel_backend) too: it says nothing about the
# values, and a completion failed for it would throw away a successful run's output.
# read_only_sql_transaction (25006): a write that reached a server that is (no longer, or not
# yet) the primary, around a failover; the same call succeeds once the connection reaches the
# promoted one (docs/dba-guide.md, "High availability").
_RETRYABLE_SQLSTATES = frozenset({"25006", "40001", "40P01", "55P03", "57014", "57P01", "57P02",
                                  "57P03"})
#: insufficient_resources (disk full, out of memory, too many connections): the server's state,
#: never the call's values, so a worker must not fail a run for it (a completion refused by a
#: full NOTIFY queue is not "a value PostgreSQL cannot store").
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


# -- what a handler's exception becomes: bounded text ----------------------------------------------
#
# A handler's exception is the handler's data: its message may be a 300 MB response body, its
# __str__ may raise or be slow, its traceback may have thousands of frames, its chain may repeat
# all of that. Everything the worker does with it (log, trace, store) goes through describe(),
# whose work is O(the bound) once str() has returned, and whose texts are at most the bound.

#: The most UTF-8 bytes of one text taken from a handler's exception (its message, its traceback,
#: its type's name) that the worker logs, traces or stores; a longer text is cut, with a marker
#: ``…[truncated N characters]`` saying how much was left out. The database bounds a stored
#: error document again, for every client (zeroth.fail_run, zeroth.commit_fenced); its bounds are
#: looser (per string and per document), so a document within this module's is stored unchanged.
MAX_ERROR_TEXT_BYTES = 64 * 1024
#: The most UTF-8 bytes of the JSON text of a whole error document the worker writes (the texts
#: are shortened further when their JSON escapes would pass it).
MAX_ERROR_DOCUMENT_BYTES = 3 * MAX_ERROR_TEXT_BYTES

_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")
#: Room kept for the marker: "…[truncated " + up to 20 digits + " characters]".
_MARKER_ROOM = 48
#: Of a traceback: the innermost frames of each exception, and the exceptions of its chain
#: (__cause__ / __context__), newest first.
_MAX_FRAMES = 40
_MAX_CHAIN = 5
#: Of each exception's message in a traceback (the document's ``message`` has the long one).
_TRACEBACK_MESSAGE_BYTES = 4096
_MAX_NOTES = 5
_MAX_GROUP_MEMBERS = 5


def _storable(text: str) -> str:
    """``text`` with what jsonb cannot hold (U+0000, lone surrogates) replaced by U+FFFD."""
    return _UNSTORABLE_TEXT.sub("\ufffd", text)


def bounded_text(text: str, limit: int = MAX_ERROR_TEXT_BYTES, *, tail: bool = False) -> str:
    """``text``, storable in jsonb (U+0000 and lone surrogates become U+FFFD) and at most
    ``limit`` UTF-8 bytes: a longer text keeps its head (``tail``: its end) and says how many
    characters were cut. The work is O(``limit``) whatever the length of ``text``: it is sliced
    before anything else is done with it."""
    length = len(text)
    if length * 4 <= limit:  # at most 4 bytes a character, U+FFFD 3: fits whatever it holds
        return _storable(str(text))
    window = _storable(text[-limit:] if tail else text[:limit])
    data = window.encode()
    if length <= limit and len(data) <= limit:
        return window
    budget = max(0, limit - _MARKER_ROOM)
    kept = (data[-budget:] if tail else data[:budget]).decode(errors="ignore") if budget else ""
    marker = f"[truncated {length - len(kept)} characters]"
    return f"{marker}\u2026{kept}" if tail else f"{kept}\u2026{marker}"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 2000
_REPR.maxlevel = 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 20
_REPR.maxdeque = _REPR.maxarray = 20
#: Values whose str() is their repr (or bytes'), which reprlib abbreviates without building it.
_ABBREVIATED = (list, tuple, dict, set, frozenset, bytes, bytearray)


def bounded_repr(value: object) -> str:
    """A short repr of ``value``: containers and strings are abbreviated without building their
    whole repr (reprlib); another object's repr is cut to the bound."""
    return bounded_text(_REPR.repr(value), 4 * _REPR.maxother)


def _raw_message(exc: BaseException) -> str:
    """What ``str(exc)`` says, without building it where the exception only holds its arguments
    (BaseException's and KeyError's __str__): a huge list argument is abbreviated, a string
    argument is returned as it is (no copy)."""
    kind = type(exc)
    args = exc.args if isinstance(exc.args, tuple) else ()
    if kind.__str__ is BaseException.__str__ and isinstance(exc.args, tuple):
        if not args:
            return ""
        if len(args) == 1:
            only = args[0]
            if isinstance(only, str):
                return only
            if isinstance(only, _ABBREVIATED):
                return bounded_repr(only)
        elif len(args) > 1:
            return bounded_repr(args)
    elif kind.__str__ is KeyError.__str__ and len(args) == 1:
        return bounded_repr(args[0])
    text = str(exc)
    if not isinstance(text, str):  # pragma: no cover - str() always returns a str
        raise TypeError("__str__ returned a non-string")
    return text


def _message(exc: BaseException, limit: int) -> str:
    try:
        return bounded_text(_raw_message(exc), limit)
    except Exception as broken:
        return f"<str() of the exception raised {type(broken).__name__}>"


def _type_name(exc: BaseException, limit: int = 1024) -> str:
    try:
        return bounded_text(type(exc).__name__, limit)
    except Exception:  # pragma: no cover - a class's __name__ is always a str
        return "<unnamed exception type>"


def _exception_text(exc: BaseException, limit: int) -> str:
    """The frames (innermost :data:`_MAX_FRAMES`) and the last line of one exception (its
    message at most ``limit`` bytes)."""
    tb = exc.__traceback__
    lines: list[str] = []
    if tb is not None:
        total = sum(1 for _ in traceback.walk_tb(tb))
        frames = traceback.extract_tb(tb, limit=-_MAX_FRAMES)
        lines.append("Traceback (most recent call last):\n")
        if total > len(frames):
            lines.append(f"  [{total - len(frames)} outer frames left out]\n")
        lines.extend(bounded_text(line, MAX_ERROR_TEXT_BYTES // _MAX_FRAMES)
                     for line in frames.format())
    name, message = _type_name(exc), _message(exc, limit)
    lines.append(f"{name}: {message}\n" if message else f"{name}\n")
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        lines.extend(f"{bounded_text(note, 1024)}\n" for note in notes[:_MAX_NOTES]
                     if isinstance(note, str))
    members = getattr(exc, "exceptions", None)
    if isinstance(exc, BaseExceptionGroup) and isinstance(members, tuple):
        lines.append(f"[a group of {len(members)} exceptions]\n")
        lines.extend(f"  +- {_type_name(member)}: {_message(member, 1024)}\n"
                     for member in members[:_MAX_GROUP_MEMBERS])
    return "".join(lines)


def _traceback(exc: BaseException, limit: int) -> str:
    """The traceback of ``exc`` and its chain, as Python prints it but bounded: at most
    :data:`_MAX_CHAIN` exceptions, each with its innermost frames and a bounded message; the
    whole cut to ``limit`` bytes, keeping its end (the exception raised)."""
    try:
        chain: list[tuple[BaseException, str]] = []
        seen: set[int] = set()
        current: BaseException | None = exc
        how = ""
        while current is not None and id(current) not in seen and len(chain) < _MAX_CHAIN:
            seen.add(id(current))
            chain.append((current, how))
            cause, context = current.__cause__, current.__context__
            if isinstance(cause, BaseException):
                current, how = cause, ("\nThe above exception was the direct cause of the "
                                       "following exception:\n\n")
            elif isinstance(context, BaseException) and not current.__suppress_context__:
                current, how = context, ("\nDuring handling of the above exception, another "
                                         "exception occurred:\n\n")
            else:
                current = None
        parts: list[str] = []
        if current is not None and id(current) not in seen:
            parts.append("[earlier exceptions of the chain left out]\n")
        for link, link_how in reversed(chain):
            parts.append(_exception_text(link, min(limit // 2, _TRACEBACK_MESSAGE_BYTES)))
            parts.append(link_how)
        return bounded_text("".join(parts), limit, tail=True)
    except Exception as broken:
        return f"<the traceback could not be formatted: {type(broken).__name__}>"


@dataclass(frozen=True)
class ErrorDescription:
    """A handler's exception as the worker logs, traces and stores it: its type's name, its
    message and its traceback, each storable and at most :data:`MAX_ERROR_TEXT_BYTES` (see
    :func:`describe`)."""

    type: str
    message: str
    traceback: str
    _exc: BaseException | None = field(default=None, repr=False, compare=False)

    def document(self, **extra: Any) -> dict[str, Any]:
        """The error document of a failed attempt: ``type``, ``message``, ``traceback`` and
        ``extra`` (small values of the worker's own), its JSON text at most
        :data:`MAX_ERROR_DOCUMENT_BYTES` (texts full of characters JSON escapes are cut
        further)."""
        description = self
        limit = MAX_ERROR_TEXT_BYTES
        while True:
            document = {"type": description.type, "message": description.message,
                        "traceback": description.traceback, **extra}
            size = len(json.dumps(document, ensure_ascii=False).encode())
            if size <= MAX_ERROR_DOCUMENT_BYTES or limit < 1024:
                return document
            limit //= 2
            description = (_describe(self._exc, limit) if self._exc is not None else
                           ErrorDescription(bounded_text(self.type, limit),
                                            bounded_text(self.message, limit),
                                            bounded_text(self.traceback, limit, tail=True)))


def _describe(exc: BaseException, limit: int) -> ErrorDescription:
    return ErrorDescription(_type_name(exc, min(limit, 1024)), _message(exc, limit),
                            _traceback(exc, limit), exc)


def describe(exc: BaseException) -> ErrorDescription:
    """Describe a handler's exception, never raising: ``str(exc)`` is called once (its result,
    however long, is sliced before anything else is done with it; one that raises or returns
    something else is described as such; a huge argument list is abbreviated without building
    its repr), the traceback keeps the innermost frames of at most a few chained exceptions, and
    every text is storable in jsonb and at most :data:`MAX_ERROR_TEXT_BYTES`."""
    return _describe(exc, MAX_ERROR_TEXT_BYTES)


def handler_exit(exc: BaseException) -> BaseException:
    """What the worker records for ``exc`` raised by a handler (either kind, async or sync):
    ``SystemExit`` (``sys.exit``, argparse or click on bad input) and ``KeyboardInterrupt`` end
    the run's attempt, never the worker, as a ``RuntimeError`` naming them (the exit code
    included) whose ``__cause__`` is ``exc``; anything else is returned unchanged."""
    if isinstance(exc, SystemExit):
        failure = RuntimeError(f"the handler raised SystemExit (exit code {bounded_repr(exc.code)})"
                               "; a handler's exit fails its run, not the worker")
    elif isinstance(exc, KeyboardInterrupt):
        failure = RuntimeError("the handler raised KeyboardInterrupt; a handler's interrupt "
                               "fails its run, not the worker")
    else:
        return exc
    failure.__cause__ = exc
    return failure
