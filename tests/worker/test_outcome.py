"""Deciding the outcome of an attempt (zeroth_pg.worker._outcome.decide): what a handler returned
or raised, and the state of its run, become completed / failed (retryable or not) / slept /
stopped / lease lost. Pure; the worker writes each outcome against the database in
tests/integration (test_worker_hardening, test_durable_sleep, ...)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest

from zeroth_pg import _jsonb
from zeroth_pg.errors import ErrorDescription, LeaseLostError, NonRetryableError
from zeroth_pg.types import SleepOutcome, SleepResult
from zeroth_pg.worker import RunSlept, StopReason
from zeroth_pg.worker._outcome import Outcome, OutcomeKind, decide


def outcome(*, output: Any = None, raised: BaseException | None = None, slept: bool = False,
            stop_reason: StopReason | None = None, cancelling: bool = False) -> Outcome:
    return decide(output=output, raised=raised, slept=slept, stop_reason=stop_reason,
                  lease_gone=stop_reason is not None and stop_reason.lease_gone,
                  cancelling=cancelling)


def slept_exc() -> RunSlept:
    return RunSlept(SleepResult(outcome=SleepOutcome.SLEEPING, run_after=datetime.now(UTC),
                                checkpoint_id=None))


class TestReturned:
    def test_a_json_output_completes_the_run(self):
        decided = outcome(output={"ok": [1, 2]})
        assert decided.kind is OutcomeKind.COMPLETED
        assert decided.output == {"ok": [1, 2]}

    def test_an_output_after_an_accepted_sleep_writes_nothing(self):
        assert outcome(output={"ok": 1}, slept=True).kind is OutcomeKind.SLEPT

    def test_an_output_after_the_lease_was_lost_writes_nothing(self):
        decided = outcome(output={"ok": 1}, stop_reason=StopReason.LEASE_LOST)
        assert decided.kind is OutcomeKind.LEASE_LOST
        assert not decided.fenced

    @pytest.mark.parametrize("output", [{1, 2}, float("nan"), object()])
    def test_an_output_that_is_not_json_fails_for_good(self, output):
        decided = outcome(output=output)
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output is not JSON")
        assert isinstance(decided.error, TypeError | ValueError)
        assert decided.traced is decided.error

    def test_a_returned_coroutine_fails_for_good_saying_so_and_is_closed_unrun(self):
        ran = []

        async def forgot_await() -> int:
            ran.append(True)
            return 1

        coroutine = forgot_await()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decided = outcome(output=coroutine)
            del coroutine
            gc.collect()
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output is an awaitable")
        assert isinstance(decided.error, TypeError)
        assert "forgot_await" in str(decided.error)
        assert "without await" in str(decided.error)
        assert decided.traced is decided.error
        assert ran == []
        # Closed here: no "coroutine ... was never awaited" from wherever it is collected.
        assert not [w for w in caught if "never awaited" in str(w.message)]

    async def test_a_returned_future_fails_for_good_and_is_left_as_it_is(self):
        future = asyncio.get_running_loop().create_future()
        decided = outcome(output=future)
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output is an awaitable")
        assert not future.done()

    async def test_a_returned_coroutine_already_started_fails_for_good_and_is_left_running(self):
        """The handler started the coroutine in a task and returned the coroutine, not the
        task's result: closing it would throw GeneratorExit into code a task is running (a
        finally that awaits makes close() raise, a worker error retried as if the worker had
        failed), and break that task. It is left as it is; the run fails for good."""
        finished = []

        async def started() -> int:
            try:
                await asyncio.sleep(0)
                return 1
            finally:
                await asyncio.sleep(0)  # a clean-up that awaits
                finished.append(True)

        coroutine = started()
        task = asyncio.ensure_future(coroutine)
        await asyncio.sleep(0)  # the task is in the first await
        decided = outcome(output=coroutine)
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output is an awaitable")
        assert isinstance(decided.error, TypeError)
        assert await task == 1  # the task ran to its end, undisturbed
        assert finished == [True]

    def test_an_object_posing_as_a_coroutine_runs_none_of_its_code(self):
        """isinstance() reads an object's own __class__: one that claims to be a coroutine was
        taken for one, and its close() and __qualname__ (the handler's code) ran in decide()."""
        ran = []

        class Posing:
            @property
            def __class__(self) -> type:  # type: ignore[override]
                return type(_a_coroutine_type_probe)

            def close(self) -> None:
                ran.append("close")
                raise ValueError("the handler's close")

            def __getattr__(self, name: str) -> Any:
                ran.append(name)
                raise ValueError(name)

        decided = outcome(output=Posing())
        assert ran == []
        assert (decided.kind, decided.retryable) == (OutcomeKind.FAILED, False)

    @pytest.mark.parametrize("state", ["slept", "lease gone"])
    def test_a_coroutine_returned_after_a_sleep_or_a_lost_lease_is_closed_too(self, state):
        """Nothing is written for such an attempt, but its coroutine is closed all the same:
        else Python warns that it was never awaited wherever it is collected."""
        async def forgot_await() -> int:
            return 1

        lost = next(reason for reason in StopReason if reason.lease_gone)
        coroutine = forgot_await()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            decided = (outcome(output=coroutine, slept=True) if state == "slept"
                       else outcome(output=coroutine, stop_reason=lost))
            del coroutine
            gc.collect()
        assert decided.kind in (OutcomeKind.SLEPT, OutcomeKind.LEASE_LOST)
        assert not [w for w in caught if "never awaited" in str(w.message)]

    def test_an_output_nested_deeper_than_the_encoder_goes_fails_for_good(self):
        deep: list[Any] = []
        for _ in range(100_000):
            deep = [deep]
        decided = outcome(output=deep)
        assert decided.kind is OutcomeKind.FAILED
        assert not decided.retryable
        assert isinstance(decided.error, RecursionError)

    @pytest.mark.parametrize("text", ["a\x00b", "\ud800"])
    def test_an_output_jsonb_cannot_hold_fails_for_good(self, text):
        decided = outcome(output={"text": text})
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output not storable")
        assert "PostgreSQL cannot store the output" in str(decided.error)

    @pytest.mark.parametrize("output", [
        {"k\x00": 1}, ["ok", {"deep": ["x", "\udfff"]}], ("a", "b\x00"), {"\ud83d": "key"}])
    def test_a_character_jsonb_refuses_is_found_in_keys_and_nested_values(self, output):
        # The encoder's text tells whether the walk over the value is needed at all: every
        # unstorable character, wherever it sits, shows in it as an escape.
        decided = outcome(output=output)
        assert (decided.kind, decided.why) == (OutcomeKind.FAILED, "output not storable")

    @pytest.mark.parametrize("output", [
        None, "\ud55c\uad6d\uc5b4", {"emoji": "\U0001f600", "cjk": ["\u4e2d", "\ud7a3"]},
        "backslash u0000 spelled out: \\u0000 and \\ud800"])
    def test_non_ascii_text_and_escape_lookalikes_complete(self, output):
        # Hangul (U+D55C …) is written \ud55c by the encoder, like a surrogate's escape, and
        # a literal backslash-u is written \\u…: both are storable and complete the run.
        decided = outcome(output=output)
        assert decided.kind is OutcomeKind.COMPLETED
        assert decided.output == output

    def test_an_output_longer_than_jsonb_holds_fails_for_good(self, monkeypatch):
        monkeypatch.setattr(_jsonb, "MAX_JSONB_CHARACTERS", 100)
        decided = outcome(output={"text": "x" * 200})
        assert (decided.kind, decided.retryable, decided.why) == (
            OutcomeKind.FAILED, False, "output too large")
        assert decided.traced is None


class TestRaised:
    def test_an_exception_fails_the_run_retryably_and_is_described_bounded(self):
        decided = outcome(raised=RuntimeError("x" * 10_000_000))
        assert decided.kind is OutcomeKind.FAILED
        assert decided.retryable
        assert isinstance(decided.error, ErrorDescription)
        assert decided.error.type == "RuntimeError"
        assert len(decided.error.message) < 10_000_000

    def test_a_non_retryable_error_fails_for_good(self):
        decided = outcome(raised=NonRetryableError("no"))
        assert decided.kind is OutcomeKind.FAILED
        assert not decided.retryable
        assert decided.why == "failed for good"

    @pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit(), KeyboardInterrupt()])
    def test_a_base_exception_is_a_failure_not_the_worker_s_end(self, exc):
        decided = outcome(raised=exc)
        assert decided.kind is OutcomeKind.FAILED
        assert decided.interrupt is isinstance(exc, KeyboardInterrupt)

    def test_lease_lost_writes_nothing_more(self):
        decided = outcome(raised=LeaseLostError("gone"))
        assert decided.kind is OutcomeKind.LEASE_LOST
        assert decided.fenced

    def test_run_slept_after_a_sleep_of_this_attempt_is_a_sleep(self):
        assert outcome(raised=slept_exc(), slept=True).kind is OutcomeKind.SLEPT

    def test_run_slept_without_a_sleep_fails_the_run_retryably(self):
        decided = outcome(raised=slept_exc())
        assert decided.kind is OutcomeKind.FAILED
        assert decided.retryable

    def test_another_exception_after_an_accepted_sleep_writes_nothing(self):
        assert outcome(raised=ValueError("late"), slept=True).kind is OutcomeKind.SLEPT


class TestCancelled:
    def test_a_stopped_handler_is_settled_by_its_stop(self):
        decided = outcome(raised=asyncio.CancelledError(), stop_reason=StopReason.CANCEL)
        assert decided.kind is OutcomeKind.STOPPED
        assert decided.why == "stopped: cancel"

    def test_a_cancel_of_the_task_from_outside_propagates(self):
        assert outcome(raised=asyncio.CancelledError(),
                       cancelling=True).kind is OutcomeKind.PROPAGATE
        assert outcome(raised=asyncio.CancelledError(), slept=True,
                       cancelling=True).kind is OutcomeKind.PROPAGATE

    def test_a_cancel_after_an_accepted_sleep_is_a_sleep(self):
        assert outcome(raised=asyncio.CancelledError(), slept=True).kind is OutcomeKind.SLEPT

    def test_cancelled_error_raised_by_the_handler_itself_fails_the_run(self):
        decided = outcome(raised=asyncio.CancelledError())
        assert decided.kind is OutcomeKind.FAILED
        assert decided.retryable


async def _a_coroutine() -> None:
    pass


_a_coroutine_type_probe = _a_coroutine()
_a_coroutine_type_probe.close()
