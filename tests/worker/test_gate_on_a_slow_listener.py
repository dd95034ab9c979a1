"""The wakeup gate (zeroth_pg.worker._gate.WakeupGate) when its calls on the LISTEN connection
are slow: the claim loop waits for one ``LISTENER_WAIT`` at most and goes on; the call goes on
in the background, one at a time, and what the loop would have done with its answer is done
when it comes (issue 35). A real Notifier on the test's database; each gate call is the real
``announce_idle`` / ``announce_busy`` on its session, held back until the test lets it go (as
a listener whose server hangs holds it, without the Notifier's bound)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import asyncpg
import pytest
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.notify import Notifier
from zeroth_pg.worker._gate import WAKEUP_STRIPES, GateState, GateTarget, WakeupGate

T = TypeVar("T")


@pytest.fixture
async def notifier(database_dsn: str) -> AsyncIterator[Notifier]:
    # A ping bound far above the test's holds: only the gate's own wait is under test.
    listener = Notifier(database_dsn, on_notification=lambda _c, _p: None, ping_timeout=600.0)
    listener.start()
    try:
        await asyncio.wait_for(listener.connected.wait(), timeout=60)
        yield listener
    finally:
        await listener.stop()


class HeldCalls:
    """The gate of one scope whose calls wait for ``go`` before they reach the database."""

    def __init__(self, lm: LeaseManager, deployment: str) -> None:
        self.go = asyncio.Event()
        self.calls: list[str] = []
        self.target = GateTarget(
            lambda conn: self._held("idle", lambda: lm.announce_idle(deployment, conn=conn)),
            lambda conn: self._held("busy", lambda: lm.announce_busy(deployment, conn=conn)))

    async def _held(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        self.calls.append(name)
        await self.go.wait()
        return await call()


async def _stripes_held(pool: asyncpg.Pool, notifier: Notifier) -> int:
    return int(await pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND granted",
        notifier.backend_pid))


def _held_gate(pool: asyncpg.Pool, notifier: Notifier) -> tuple[HeldCalls, WakeupGate, list[int]]:
    """A gate on the Notifier's session whose calls are held back, and the list its wake-ups of
    the claim loop are counted in."""
    held = HeldCalls(LeaseManager(pool), unique_deployment("gate"))
    gate = WakeupGate([held.target])
    gate.connected(notifier)
    woken: list[int] = []
    gate.wake = lambda: woken.append(1)
    return held, gate, woken


async def test_a_slow_idle_lets_the_loop_go_on_and_its_late_gain_wakes_it(
        pool: asyncpg.Pool, notifier: Notifier) -> None:
    held, gate, woken = _held_gate(pool, notifier)

    # Its answer is not in: the loop goes on as if nothing was gained (it sleeps, then polls).
    # Before, idle() waited for the answer (the Notifier's ping bound; here held for ever).
    assert await _bounded(gate.idle()) is False
    assert held.calls == ["idle"]
    assert woken == []
    # The next look while it is out asks for nothing more (one call on the session at a time).
    assert await _bounded(gate.idle()) is False
    assert held.calls == ["idle"]

    held.go.set()
    # Every stripe gained: the look the loop would have made at once is asked for now.
    await wait_until(lambda: woken == [1], "the late gain to wake the claim loop", within=60)
    assert gate.state is GateState.IDLE
    assert await _stripes_held(pool, notifier) == WAKEUP_STRIPES


async def test_a_let_go_asked_for_while_a_call_is_out_is_made_when_it_ends(
        pool: asyncpg.Pool, notifier: Notifier) -> None:
    held, gate, _woken = _held_gate(pool, notifier)

    assert await _bounded(gate.idle()) is False  # out
    await _bounded(gate.busy())  # the loop found work meanwhile: it does not wait for the listener
    assert held.calls == ["idle"]

    held.go.set()
    # The idle call took the stripes; the let-go asked for meanwhile follows it, so writers do
    # not go on notifying a busy worker.
    await wait_until(lambda: held.calls == ["idle", "busy"], "the deferred let-go", within=60)
    await wait_until(lambda: _let_go(gate), "the let-go to end", within=60)
    assert await _stripes_held(pool, notifier) == 0
    assert gate.state is GateState.BUSY


async def test_a_stopped_listener_cancels_the_call_that_is_out(
        pool: asyncpg.Pool, notifier: Notifier) -> None:
    _held, gate, _woken = _held_gate(pool, notifier)
    assert await _bounded(gate.idle()) is False
    await gate.stop()
    assert not _calling(gate)
    assert await _stripes_held(pool, notifier) == 0  # it never reached the database


async def _bounded(call: Awaitable[T]) -> T:
    """A guard far above the gate's wait, so a gate that waits on the listener fails here."""
    return await asyncio.wait_for(call, timeout=60)


def _calling(gate: WakeupGate) -> bool:
    return gate._calling()


def _let_go(gate: WakeupGate) -> bool:
    return not gate._calling() and gate.held == ((),)


async def test_a_look_asked_for_while_a_let_go_is_out_is_made_when_it_ends(
        pool: asyncpg.Pool, notifier: Notifier) -> None:
    # The loop let go (it was busy), the listener was slow to answer, and meanwhile the loop
    # found nothing and wanted the gate: idle() asks for nothing while a call is out, and the
    # let-go leaves the worker holding no stripe, so no writer notifies it. Unless the end of
    # the let-go wakes the loop for that look, a run enqueued meanwhile waits a poll interval.
    held, gate, woken = _held_gate(pool, notifier)
    held.go.set()
    assert await _bounded(gate.idle()) is True  # every stripe, at once
    assert gate.state is GateState.IDLE

    held.go.clear()
    await _bounded(gate.busy())  # the let-go is out
    assert _calling(gate)
    assert await _bounded(gate.idle()) is False  # the loop waits for work: nothing asked yet
    assert held.calls == ["idle", "busy"]

    held.go.set()
    await wait_until(lambda: gate._out is None, "the let-go to end", within=60)
    assert await _stripes_held(pool, notifier) == 0
    # The look the loop wanted is asked for now (the loop is woken and asks for the gate).
    assert woken == [1]
    assert await _bounded(gate.idle()) is True
    assert await _stripes_held(pool, notifier) == WAKEUP_STRIPES


async def test_a_worker_that_waits_again_keeps_what_a_late_idle_gained(
        pool: asyncpg.Pool, notifier: Notifier) -> None:
    # busy() while an idle() call was out defers a let-go; if the loop then waits for work
    # again (idle) before that call ends, the let-go is stale: making it would leave a waiting
    # worker holding nothing (no writer notifies it; it sleeps a poll interval).
    held, gate, _woken = _held_gate(pool, notifier)
    assert await _bounded(gate.idle()) is False  # out
    await _bounded(gate.busy())  # work came: a let-go is deferred
    assert await _bounded(gate.idle()) is False  # nothing again: the worker waits for work
    held.go.set()
    await wait_until(lambda: gate._out is None, "the gate calls to end", within=60)
    assert held.calls == ["idle"]
    assert gate.state is GateState.IDLE
    assert await _stripes_held(pool, notifier) == WAKEUP_STRIPES
