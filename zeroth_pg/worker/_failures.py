"""How a loop that retries reports its failures: one traceback per streak, not one per retry.

The claim loop retries a failed claim pass after 50 ms, doubling to a second, and a failed orphan
sweep likewise. While the database is down, refuses the worker's role or rejects a statement,
every retry fails the same way: logged in full each time, a one-minute outage was sixty
tracebacks, and the one line an operator needs (the first error, when it began, when it ended)
was lost among them.

A :class:`FailureStreak` logs the first failure of a streak, and any failure unlike the one
before it, at ERROR (or the level it is given) with its traceback; repeats of the same failure as
one WARNING line at most every :data:`REPEAT_EVERY` seconds (and when the loop stops), with how
many there were; and the first success after a streak (a call that was made and answered) as one
INFO line. "The same" is the same exception type and, for a lost connection, any message; for
a database error, the same SQLSTATE, for an OS error the same errno, else the same message: a
message that names a process id or a lock (a deadlock, a lock timeout) changes from one try to
the next, and a lost connection's names the bound that ran out or the host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from zeroth_pg.errors import ConnectionLostError, bounded_text, describe

__all__ = ["REPEAT_EVERY", "FailureStreak"]

#: Seconds between two "still failing" lines of one streak.
REPEAT_EVERY = 30.0
#: UTF-8 bytes of an error's message kept to tell failures apart and to quote them.
MESSAGE_BYTES = 300


class FailureStreak:
    """The failures of one retrying loop (``what``: "claim pass", "orphan sweep")."""

    def __init__(self, what: str, log: logging.Logger, *, repeat_every: float = REPEAT_EVERY,
                 clock: Callable[[], float] = time.monotonic,
                 first_level: int = logging.ERROR) -> None:
        """``first_level``: the level of a streak's first line (and of a failure unlike the one
        before): ERROR where any failure is news, WARNING where one retried failure is
        expected now and then (a settling write that meets a deadlock)."""
        self.what = what
        self._log = log
        self._first_level = first_level
        self._repeat_every = repeat_every
        self._clock = clock
        self._kind: tuple[str, str] | None = None
        self._message = ""
        #: Failures in the current streak, when it began, when a line last reported it.
        self.failures = 0
        self._began = 0.0
        self._reported = 0.0
        self._unreported = 0

    def failed(self, error: BaseException, retry_in: float | None, retrying: str = "") -> None:
        """Report ``error``; ``retry_in``: seconds until the next try (None: not this loop's to
        say, ``retrying`` does); ``retrying``: what the loop does meanwhile (a clause such as
        "claiming goes on")."""
        now = self._clock()
        # describe() never raises: an exception whose str() raises (or is megabytes) must not
        # turn the report of a failure into a crash of the loop that reports it.
        message = bounded_text(describe(error).message, MESSAGE_BYTES)
        kind = (type(error).__qualname__, _variant(error) or message)
        doing = f"{retrying}, " if retrying else ""
        if self._kind != kind:
            if self.failures:
                self._flush(now)
            if not self.failures:
                self._began = now
            self._kind, self._message = kind, message
            self.failures += 1
            self._reported, self._unreported = now, 0
            if retry_in is None:
                self._log.log(self._first_level, "%s failed; %s", self.what, retrying,
                              exc_info=error)
            else:
                self._log.log(self._first_level, "%s failed; %sretrying in %.2f s", self.what,
                              doing, retry_in, exc_info=error)
            return
        self.failures += 1
        self._unreported += 1
        if now - self._reported >= self._repeat_every:
            self._flush(now)

    def answered(self) -> None:
        """The loop's call succeeded: a streak, if any, has ended."""
        if not self.failures:
            return
        now = self._clock()
        self._log.info("%s answers again, after %d failure%s over %.1f s", self.what,
                       self.failures, "" if self.failures == 1 else "s", now - self._began)
        self._kind = None
        self.failures = self._unreported = 0

    def stopped(self) -> None:
        """The loop stops (the worker stops, or the loop crashed and is restarted): repeats not
        reported yet are, or their count would go with it."""
        self._flush(self._clock())

    def _flush(self, now: float) -> None:
        """One line for the repeats not reported yet."""
        if not self._unreported or self._kind is None:
            return
        self._log.warning("%s still failing: %d more time%s in %.0f s, each with %s: %s",
                          self.what, self._unreported, "" if self._unreported == 1 else "s",
                          now - self._reported, self._kind[0], self._message)
        self._reported, self._unreported = now, 0


def _variant(error: BaseException) -> str | None:
    """What tells two failures of one exception type apart, when not their message: a database
    error's SQLSTATE (asyncpg's ``sqlstate``; zeroth_pg's own errors keep it in ``code``), an OS
    error's errno; nothing for a lost connection (its type is enough)."""
    if isinstance(error, ConnectionLostError):
        # Its messages name the bound that ran out or the host: a hung server alternates
        # between "no answer within" and "no connection of the pool within".
        return "connection lost"
    for attribute in ("sqlstate", "code"):
        sqlstate = getattr(error, attribute, None)
        if isinstance(sqlstate, str) and len(sqlstate) == 5:
            return f"SQLSTATE {sqlstate}"
    if isinstance(error, OSError) and error.errno is not None:
        return f"errno {error.errno}"
    return None
