"""FailureStreak (zeroth_pg/worker/_failures.py): what a retrying loop logs — the first failure
of a streak and any unlike the one before with a traceback, repeats as one line at most every
repeat interval with their count, and the end of the streak as one line. On a test clock."""

from __future__ import annotations

import logging

import pytest

from zeroth_pg.worker._failures import FailureStreak

LOG = logging.getLogger("zeroth_pg.worker.streak_test")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def streak(caplog: pytest.LogCaptureFixture) -> tuple[FailureStreak, Clock]:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    clock = Clock()
    return FailureStreak("claim pass", LOG, repeat_every=30.0, clock=clock), clock


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, bool]]:
    return [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records
            if r.name == LOG.name]


def test_sixty_identical_failures_a_second_apart_are_one_traceback_and_one_line_a_half_minute(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    failures, clock = streak
    for _ in range(61):
        failures.failed(ConnectionRefusedError("connection refused"), 1.0)
        clock.now += 1.0
    failures.answered()
    logged = lines(caplog)
    assert logged[0] == (logging.ERROR, "claim pass failed; retrying in 1.00 s", True)
    assert [level for level, _, _ in logged] == [logging.ERROR, logging.WARNING,
                                                 logging.WARNING, logging.INFO]
    assert logged[1][1] == ("claim pass still failing: 30 more times in 30 s, each with "
                            "ConnectionRefusedError: connection refused")
    assert logged[2][1].startswith("claim pass still failing: 30 more times in 30 s")
    assert logged[3][1] == "claim pass answers again, after 61 failures over 61.0 s"


def test_a_different_failure_gets_its_own_traceback_after_the_repeats_of_the_last(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    failures, clock = streak
    failures.failed(ConnectionRefusedError("refused"), 0.05)
    clock.now += 0.1
    failures.failed(ConnectionRefusedError("refused"), 0.1)
    clock.now += 0.2
    failures.failed(PermissionError("permission denied for function claim_and_start"), 0.2,
                    "claiming goes on")
    logged = lines(caplog)
    assert logged == [
        (logging.ERROR, "claim pass failed; retrying in 0.05 s", True),
        (logging.WARNING, "claim pass still failing: 1 more time in 0 s, each with "
                          "ConnectionRefusedError: refused", False),
        (logging.ERROR, "claim pass failed; claiming goes on, retrying in 0.20 s", True),
    ]
    assert failures.failures == 3


def test_a_success_with_no_failure_before_it_logs_nothing_and_a_new_streak_starts_afresh(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    failures, clock = streak
    failures.answered()
    assert lines(caplog) == []
    failures.failed(TimeoutError("t"), 0.05)
    failures.answered()
    clock.now += 5
    failures.failed(TimeoutError("t"), 0.05)
    logged = lines(caplog)
    assert [(level, exc) for level, _, exc in logged] == [
        (logging.ERROR, True), (logging.INFO, False), (logging.ERROR, True)]
    assert logged[1][1] == "claim pass answers again, after 1 failure over 0.0 s"


def test_a_huge_message_is_quoted_bounded(streak: tuple[FailureStreak, Clock],
                                          caplog: pytest.LogCaptureFixture) -> None:
    failures, clock = streak
    huge = RuntimeError("x" * 5_000_000)
    failures.failed(huge, 1.0)
    failures.failed(huge, 1.0)
    clock.now += 31
    failures.failed(huge, 1.0)
    repeat = lines(caplog)[1][1]
    assert repeat.startswith("claim pass still failing: 2 more times in 31 s, each with "
                             "RuntimeError: xxx")
    assert len(repeat.encode()) < 600


def test_database_errors_are_the_same_failure_by_sqlstate_whatever_their_message_names(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    import asyncpg

    failures, _ = streak
    for pid in (101, 102, 103):
        error = asyncpg.DeadlockDetectedError(f"Process {pid} waits for ShareLock")
        failures.failed(error, 0.05)
    failures.failed(asyncpg.InsufficientPrivilegeError("permission denied"), 0.05)
    logged = lines(caplog)
    assert [(level, exc) for level, _, exc in logged] == [
        (logging.ERROR, True), (logging.WARNING, False), (logging.ERROR, True)]
    assert logged[1][1] == ("claim pass still failing: 2 more times in 0 s, each with "
                            "DeadlockDetectedError: Process 101 waits for ShareLock")


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


def test_a_failure_whose_str_raises_is_reported_not_raised(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    # The report runs in the loop's `except Exception`: raising there crashed the claim loop
    # (restarted by its supervisor, a traceback each time) instead of counting a failure.
    failures, clock = streak
    failures.failed(_UnprintableError(), 1.0)
    failures.failed(_UnprintableError(), 1.0)
    clock.now += 31
    failures.failed(_UnprintableError(), 1.0)
    logged = lines(caplog)
    assert [level for level, _, _ in logged] == [logging.ERROR, logging.WARNING]
    assert "_UnprintableError: <str() of the exception raised ValueError>" in logged[1][1]
    assert failures.failures == 3


def test_zeroth_pg_s_own_database_errors_are_the_same_failure_by_their_sqlstate(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    from zeroth_pg.errors import RetryableError

    failures, _ = streak
    for pid in (7, 8):
        failures.failed(RetryableError(f"deadlock detected (process {pid})", sqlstate="40P01"),
                        0.05)
    failures.stopped()
    logged = lines(caplog)
    assert [(level, exc) for level, _, exc in logged] == [
        (logging.ERROR, True), (logging.WARNING, False)]
    assert "1 more time" in logged[1][1]


def test_a_lost_connection_is_one_failure_whatever_its_message_names(
        streak: tuple[FailureStreak, Clock], caplog: pytest.LogCaptureFixture) -> None:
    # A hung server alternates between the two bounds of a call: one traceback, not one per
    # switch.
    from zeroth_pg.errors import CallTimeoutError

    failures, _ = streak
    for _ in range(3):
        failures.failed(CallTimeoutError("settle_runs: no answer within 10 s"), 0.05)
        failures.failed(CallTimeoutError("settle_runs: no connection of the pool within 10 s"),
                        0.05)
    failures.stopped()
    logged = lines(caplog)
    assert [(level, exc) for level, _, exc in logged] == [
        (logging.ERROR, True), (logging.WARNING, False)]
    assert "5 more times" in logged[1][1]


def test_a_streak_told_to_begin_at_warning_does(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    failures = FailureStreak("settle_runs", LOG, clock=Clock(), first_level=logging.WARNING)
    failures.failed(TimeoutError("t"), 0.05, "its leases are live")
    failures.failed(KeyError("k"), 0.1)
    failures.answered()
    assert lines(caplog) == [
        (logging.WARNING, "settle_runs failed; its leases are live, retrying in 0.05 s", True),
        (logging.WARNING, "settle_runs failed; retrying in 0.10 s", True),
        (logging.INFO, "settle_runs answers again, after 2 failures over 0.0 s", False)]
