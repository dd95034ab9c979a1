"""The worker's side of the wakeup gates it waits on (sql/functions/internal/notify.sql): its
scope's gate for a worker of one scope, the gate of each deployment it serves for a fleet worker
(``announce_idle_deployment``). Each gate is a :class:`GateTarget`; the state below is over all
of them (``IDLE``: every stripe of every gate held).

Writers notify ``zeroth_wakeup`` only while a worker of the scope holds their stripe of the
scope's gate, so a NOTIFY costs nothing while every worker is busy (a notifying commit takes a
cluster-wide lock until it is flushed; docs/performance.md, "NOTIFY"). The claim loop drives one
:class:`WakeupGate` through three states:

* ``BUSY`` — the last claim filled every free slot, or no slot is free: nothing held, writers of
  the scope do not notify for this worker.
* ``PARTLY_IDLE`` — the last claim found nothing and ``announce_idle`` got only some stripes
  (or none): a writer's open transaction or another waiting worker holds the rest. The loop
  polls on a short backoff (5 ms doubling up to ``poll_interval``) and asks for the rest before
  every claim.
* ``IDLE`` — every stripe is held: every writer of the scope notifies; the loop sleeps until a
  NOTIFY or ``poll_interval``.

While work flows (a claim found some and left room for more) the worker holds nothing and looks
again every ``LINGER`` (2 ms); only ``LINGER_LOOKS`` empty looks in a row make it ask for the
gate. A worker that keeps up with a steady stream therefore polls briefly instead of having every
writer notify it, which would serialise their commits (docs/performance.md, "NOTIFY").

A claim that took fewer runs than it asked for makes the worker a waiting one (``idle``): it
keeps what it holds and asks for the rest. Whenever ``announce_idle`` returns a stripe it did not
hold before, the loop claims once more before it sleeps: a writer that held that stripe did not
notify, and its run is committed and visible by then. The locks live on the LISTEN connection
(``Notifier.on_session``); a reconnect drops them with the old session, and the gate starts over
as ``BUSY``. Without a listener the gate is inert and the worker polls on ``poll_interval``, as
before. Nothing may be written on the LISTEN session: a session's own gate locks never stop its
own writes, so such a write would never notify.

NOTIFY is a hint, so the claim loop never waits on the listener for long: each gate call runs in
a task of its own, and the loop waits for it ``LISTENER_WAIT`` at most. A call that takes longer
(a listener whose server hangs: the Notifier's bound on it is its ping bound, 5 s) goes on in
the background while the loop claims on; one call is out at a time (a look meanwhile asks for
nothing but wakes the loop when the call ends, for the look it was refused; a let-go meanwhile is
made when the call ends; of the two, the one asked for last wins), and a late ``idle`` that
gained a stripe wakes the loop (``wake``) for the look it would have made at once. Before, a
listener whose host froze after the worker took the gate held the claim loop for that whole
bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager
    from zeroth_pg.notify import Notifier

__all__ = ["WAKEUP_STRIPES", "GateState", "GateTarget", "WakeupGate"]

log = logging.getLogger("zeroth_pg.worker")

#: How many advisory locks a scope's gate has (``zeroth._wakeup_stripes()``; a test keeps them
#: equal).
WAKEUP_STRIPES = 8
#: The first poll after ``announce_idle`` left some stripes to others; doubled up to the
#: worker's poll interval.
FIRST_RETRY = 0.005
#: While work flows (the last claim found some, with room for more) the worker looks again this
#: often instead of asking writers to notify it, and only after this many empty looks in a row
#: does it wait for a NOTIFY: a NOTIFY per enqueue serialises the writers' commits, and a worker
#: that keeps up with a steady stream would otherwise ask for exactly that.
LINGER = 0.002
LINGER_LOOKS = 3
#: A waiting worker that holds every stripe asks again this often: the gate's keys come from the
#: notification secret, and after a rotation the stripes it holds are no gate any more.
REFRESH = 5.0
#: The longest the claim loop waits for a gate call on the LISTEN connection (a healthy one
#: answers in about a millisecond); a slower one goes on in the background (module docstring).
LISTENER_WAIT = 0.1


@dataclass(frozen=True, slots=True)
class GateTarget:
    """One gate: how to ask for its stripes and how to let them go, on the LISTEN session."""

    announce_idle: Callable[[Any], Awaitable[tuple[int, ...]]]
    announce_busy: Callable[[Any], Awaitable[int]]

    @classmethod
    def scope(cls, lm: LeaseManager, deployment_ref: str, tenant_id: str | None,
              workspace_id: str | None) -> GateTarget:
        """The gate of one scope (``announce_idle`` / ``announce_busy``)."""
        return cls(
            lambda conn: lm.announce_idle(deployment_ref, tenant_id=tenant_id,
                                          workspace_id=workspace_id, conn=conn),
            lambda conn: lm.announce_busy(deployment_ref, tenant_id=tenant_id,
                                          workspace_id=workspace_id, conn=conn))

    @classmethod
    def deployment(cls, lm: LeaseManager, deployment_ref: str) -> GateTarget:
        """The gate of every scope of a deployment (``announce_idle_deployment``)."""
        return cls(lambda conn: lm.announce_idle_deployment(deployment_ref, conn=conn),
                   lambda conn: lm.announce_busy_deployment(deployment_ref, conn=conn))


class GateState(enum.Enum):
    BUSY = "busy"
    PARTLY_IDLE = "partly_idle"
    IDLE = "idle"


class WakeupGate:
    """Which stripes of its gates this worker holds, on which LISTEN session."""

    def __init__(self, targets: Sequence[GateTarget]) -> None:
        self._targets = tuple(targets)
        self._notifier: Notifier | None = None
        self._session: int | None = None
        #: The stripes held, per target (index into the targets).
        self.held: tuple[tuple[int, ...], ...] = self._nothing()
        self.state = GateState.BUSY
        self._retry = FIRST_RETRY
        self._asked = 0.0
        self._empty_looks: int | None = None  # counting while work flows; None: not flowing
        #: The gate call on the LISTEN connection that is out, if any (one at a time).
        self._out: asyncio.Task[bool] | None = None
        #: The out call outlived LISTENER_WAIT: its answer is the background's.
        self._late = False
        #: A let-go asked for while a call was out: made when that call ends.
        self._let_go_after = False
        #: A look (idle) asked for while a call was out: the loop is woken for it when that call
        #: ends. The later of the two wishes wins: each clears the other.
        self._look_after = False
        #: Called when a late idle() gained a stripe: claim once more (the claim loop's wakeup).
        self.wake: Callable[[], None] | None = None

    def connected(self, notifier: Notifier) -> None:
        """A (re)connected LISTEN session: whatever the old one held went with it."""
        self._notifier = notifier
        self._session = notifier.connects
        self.held = self._nothing()
        self.state = GateState.BUSY
        self._retry = FIRST_RETRY
        self._empty_looks = None
        self._let_go_after = self._look_after = False

    async def idle(self) -> bool:
        """The last claim found nothing: after ``LINGER_LOOKS`` such looks in a row while work
        flowed (or at once otherwise), keep what is held and ask for the missing stripes. True
        when a stripe was gained (claim once more: its writer did not notify and has
        committed). The backoff of ``poll_in`` starts over only after a busy spell or a gain,
        so a worker that stays short of stripes polls less and less often."""
        if self._empty_looks is not None:
            self._empty_looks += 1
            if self._empty_looks < LINGER_LOOKS:
                return False  # look again in LINGER (poll_in)
            self._empty_looks = None
        notifier, session = self._notifier, self._session
        if notifier is None or session is None:
            return False
        if self._calling():
            # The worker waits for work: a let-go deferred meanwhile is stale (it would leave a
            # waiting worker holding nothing), and the look is asked for when the call ends
            # (_ended wakes the loop); else nothing notifies it for a poll interval.
            self._let_go_after, self._look_after = False, True
            return False
        if self.state is GateState.IDLE and time.monotonic() < self._asked + REFRESH:
            return False
        self._asked = time.monotonic()
        return await self._bounded(self._ask(notifier, session))

    async def _ask(self, notifier: Notifier, session: int) -> bool:
        """idle()'s call: ask for the missing stripes; True when one was gained."""
        gained = False
        for index, target in enumerate(self._targets):
            if len(self.held[index]) == WAKEUP_STRIPES and self.state is not GateState.IDLE:
                continue  # full: only the refresh of an idle worker asks again
            try:
                now_held = await notifier.on_session(target.announce_idle, session=session)
            except Exception as exc:  # a hint: the poll covers it
                log.debug("announce_idle failed (%s: %s); polling", type(exc).__name__, exc)
                return gained
            if session != self._session:
                return False  # reconnected meanwhile: those locks went with the old session
            # The database says what this session holds (pg_locks), so a lost answer costs
            # nothing but a look: "gained" is measured against what the last answer said.
            gained = gained or bool(set(now_held) - set(self.held[index]))
            self.held = (*self.held[:index], tuple(now_held), *self.held[index + 1:])
        if all(len(held) == WAKEUP_STRIPES for held in self.held):
            self.state = GateState.IDLE
        else:
            if self.state is GateState.BUSY or gained:
                self._retry = FIRST_RETRY
            self.state = GateState.PARTLY_IDLE
        return gained

    async def busy(self) -> None:
        """The last claim filled every free slot, or no slot is free: let go, writers stop
        notifying."""
        self._empty_looks = None
        if self._calling():
            # Made when the call that is out ends (_ended): it may be an idle() that is taking
            # stripes right now.
            self._let_go_after, self._look_after = True, False
            return
        if self._notifier is None or not any(self.held):
            # Nothing to let go (every pass while work flows comes here): no task, no wait.
            self.held, self.state = self._nothing(), GateState.BUSY
            return
        await self._bounded(self._let_go())

    async def _let_go(self) -> bool:
        """busy()'s call: let go of every stripe held."""
        notifier, session, held = self._notifier, self._session, self.held
        self.held = self._nothing()
        self.state = GateState.BUSY
        if notifier is None:
            return False
        for index, target in enumerate(self._targets):
            if not held[index]:
                continue
            try:
                await notifier.on_session(target.announce_busy, session=session)
            except Exception as exc:
                # The session is gone (its locks went with it), or the call failed on a live
                # one: writers notify until the next busy() or reconnect lets them go
                # (announce_busy reads what the session holds, so nothing is lost track of).
                # Time, not runs.
                log.debug("announce_busy failed (%s: %s)", type(exc).__name__, exc)
                if session == self._session:
                    self.held = (*self.held[:index], held[index], *self.held[index + 1:])
        return False

    # -- one call on the LISTEN connection at a time, waited for LISTENER_WAIT at most --------

    def _calling(self) -> bool:
        return self._out is not None and not self._out.done()

    async def _bounded(self, call: Coroutine[Any, Any, bool]) -> bool:
        """Run ``call`` in a task of its own and wait for it ``LISTENER_WAIT`` at most: its
        answer, or False when it is still out (it goes on; :meth:`_ended` takes its answer)."""
        task = asyncio.get_running_loop().create_task(call)
        self._out, self._late = task, False
        task.add_done_callback(self._ended)
        done, _ = await asyncio.wait({task}, timeout=LISTENER_WAIT)
        if task in done:
            return task.result()
        self._late = True
        log.debug("a wakeup gate call on the LISTEN connection is slow; claiming goes on")
        return False

    def _ended(self, task: asyncio.Task[bool]) -> None:
        if task is not self._out:
            return
        self._out = None
        gained = not task.cancelled() and task.exception() is None and task.result()
        look_after, self._look_after = self._look_after, False
        if ((self._late and gained) or (look_after and not task.cancelled())) and (
                self.wake is not None):
            self.wake()  # the look idle() would have asked for at once, or was refused
        if self._let_go_after and not task.cancelled():
            self._let_go_after = False
            if any(self.held):
                late = asyncio.get_running_loop().create_task(self._let_go())
                self._out, self._late = late, True
                late.add_done_callback(self._ended)

    async def stop(self) -> None:
        """Cancel the call that is out (the worker stops listening)."""
        task, self._out = self._out, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def flowing(self) -> None:
        """The last claim found work and left room for more: let go (writers stop notifying)
        and look again every ``LINGER`` until ``LINGER_LOOKS`` looks in a row find nothing."""
        await self.busy()
        self._empty_looks = 0

    def _nothing(self) -> tuple[tuple[int, ...], ...]:
        return tuple(() for _ in self._targets)

    def poll_in(self, poll_interval: float) -> float:
        """How long the claim loop may sleep before it polls: ``LINGER`` while work flows,
        ``poll_interval`` unless some stripes are held by others (then a short backoff,
        doubled each time)."""
        if self._empty_looks is not None:
            return min(LINGER, poll_interval)
        if self.state is not GateState.PARTLY_IDLE:
            return poll_interval
        wait = min(poll_interval, self._retry)
        self._retry = min(poll_interval, self._retry * 2)
        return wait
