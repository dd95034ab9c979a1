"""Tracing while no tracer is configured (zeroth_pg.tracing.process / step): the worker wraps
every attempt and every completion in them, so with tracing off they cost one check and yield
None; an exception passes through unchanged, and the runs of one worker may use them at once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from zeroth_pg import tracing
from zeroth_pg.types import ClaimedRun, RunStatus, Scope


@pytest.fixture
def no_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", lambda: None)


def _run() -> ClaimedRun:
    return ClaimedRun(run_id=uuid4(), lease_generation=1, lease_expires_at=datetime.now(UTC),
                      status=RunStatus.RUNNING, attempts=1, max_attempts=3, priority=0,
                      thread_id=None, idempotency_key=None, payload={}, metadata={},
                      recovery_checkpoint_id=None, checkpoint_data=None, cancel_requested=False)


@pytest.mark.usefixtures("no_tracer")
def test_process_and_step_yield_no_span_and_let_exceptions_through() -> None:
    scope = Scope("d", "t", None)
    with tracing.process(scope, _run(), attempt=1, worker_id="w", recovered=False) as span:
        assert span is None
        with tracing.step("complete", "d", uuid4()) as inner:
            assert inner is None
    with pytest.raises(KeyError, match="boom"), tracing.step("complete", "d", uuid4()):
        raise KeyError("boom")
    with pytest.raises(asyncio.CancelledError), tracing.process(
            scope, _run(), attempt=1, worker_id="w", recovered=False):
        raise asyncio.CancelledError


@pytest.mark.usefixtures("no_tracer")
async def test_many_runs_may_be_inside_a_no_op_span_at_once() -> None:
    # One shared no-op context manager serves every run: entering it in one task while others
    # are inside it (and leaving in any order) changes nothing.
    scope = Scope("d", "t", None)
    inside = 0
    most = 0

    async def attempt(delay: float) -> str:
        nonlocal inside, most
        with tracing.process(scope, _run(), attempt=1, worker_id="w", recovered=False) as span:
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(delay)
            with tracing.step("complete", "d", uuid4()):
                await asyncio.sleep(0)
            inside -= 1
            return "done" if span is None else "span"

    results = await asyncio.gather(*(attempt(0.001 * (i % 3)) for i in range(20)))
    assert results == ["done"] * 20
    assert most == 20
    assert inside == 0
