"""The chaos audit trail on a real database, at the edge of a lease: what the history triggers
record on either side of the fence, and how the checker judges it (docs/reliability.md).

A failover soak once reported a ``fail`` accepted 94 ms after its lease expired. The run's
holder cannot land one: every lease-ending call locks the run, reads ``clock_timestamp()`` (not
the transaction's start) and settles only while ``lease_expires_at >= that time``, in the
UPDATE's own predicate. The orphan sweep can: ``claim_orphaned`` ends a lapsed lease of a run out
of attempts (dead-lettered, failed), and *must* do so only after the expiry. The trigger names a
write by the run's new status, so both were a ``fail``; it now records the call stack that made
the write, and the checker holds the sweep's ends to the opposite fence (expired at their time).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from chaos_history import AUDIT_DDL, EVENTS_QUERY, HISTORY_QUERY, RUNS_QUERY, check_history
from helpers import DEPLOYMENT, T0, at, enqueue

from zeroth_pg.testing import asyncpg_dsn

LEASE = 3.0


async def _connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")
    return conn


async def _running(conn: asyncpg.Connection, worker: str, max_attempts: int) -> tuple[Any, int]:
    """A run claimed and started by ``worker`` at T0 with a LEASE-second lease."""
    run_id = await enqueue(conn, max_attempts=max_attempts)
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, lease_seconds => $3, now_override => $4)""",
        DEPLOYMENT, worker, LEASE, T0)
    generation = next(r["lease_generation"] for r in rows if r["run_id"] == run_id)
    assert await conn.fetchval(
        """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", run_id, worker, generation, T0)
    return run_id, generation


async def _sweep(conn: asyncpg.Connection, now: Any) -> list[Any]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1,
               worker_id => 'sweeper', lease_seconds => $2, now_override => $3)""",
        DEPLOYMENT, LEASE, now)
    return [row["run_id"] for row in rows if row["run_id"] is not None]


async def _check(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    history, events, runs = [[dict(row) for row in await conn.fetch(query)]
                             for query in (HISTORY_QUERY, EVENTS_QUERY, RUNS_QUERY)]
    report = check_history(history, events, runs, lease_seconds=LEASE, min_stale_refused=0)
    return history, report.violations


@pytest.fixture
async def audited(clock_database_dsn: str) -> Any:
    conn = await _connect(clock_database_dsn)
    try:
        await conn.execute(AUDIT_DDL)
        yield clock_database_dsn, conn
    finally:
        await conn.close()


async def test_the_sweeps_end_of_a_lapsed_lease_is_not_a_stale_write(audited: Any) -> None:
    _, conn = audited
    run_id, generation = await _running(conn, "w1", max_attempts=1)
    # 94 ms past the expiry, the sweep finds the run out of attempts and dead-letters it.
    assert await _sweep(conn, at(LEASE + 0.094)) == []
    assert await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                               run_id) == "failed"

    history, violations = await _check(conn)
    assert violations == {}
    (end,) = [row for row in history if row["kind"] == "fail"]
    assert end["fn_now"] - end["old_expires"] == timedelta(milliseconds=94)
    assert (end["old_worker"], end["old_generation"]) == ("w1", generation)
    assert end["data"]["stop_reason"] == "attempts_exhausted"
    assert "_take_over" in end["writer_calls"]
    assert end["writer_calls"][-1] == "claim_orphaned"


async def test_the_holders_fail_after_its_expiry_is_refused(audited: Any) -> None:
    _, conn = audited
    run_id, generation = await _running(conn, "w1", max_attempts=3)
    assert await conn.fetchval(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => 'w1', generation => $2,
               retryable => false, now_override => $3)""",
        run_id, generation, at(LEASE + 0.094)) is None
    history, violations = await _check(conn)
    assert [row["kind"] for row in history if row["run_id"] == run_id] == ["claim", "start"]
    # still running on w1's lapsed lease, with no outcome: nothing stale was accepted
    assert set(violations) == {"all_runs_terminal", "one_terminal_outcome_per_run"}
    assert await conn.fetchval("SELECT lease_worker_id FROM zeroth.runs WHERE run_id = $1",
                               run_id) == "w1"


@pytest.mark.parametrize("max_attempts", [1, 3], ids=["sweep_would_end", "sweep_would_re_lease"])
async def test_a_fail_decided_before_the_expiry_and_committed_after_it_is_the_only_outcome(
        audited: Any, max_attempts: int) -> None:
    """The holder's transaction decides (locks the run, reads the clock, settles) before its
    lease expires and commits after; a sweep meanwhile, past the expiry, skips the locked run —
    neither ending nor re-leasing it — and finds it failed once the holder commits. The one
    accepted outcome is the holder's, judged at its decision time."""
    dsn, conn = audited
    run_id, generation = await _running(conn, "w1", max_attempts=max_attempts)
    holder = await _connect(dsn)
    try:
        async with holder.transaction():
            assert await holder.fetchval(
                """SELECT zeroth_test.fail_run(run_id => $1, worker_id => 'w1',
                       generation => $2, retryable => false, now_override => $3)""",
                run_id, generation, at(LEASE - 0.1)) == "failed"
            assert await _sweep(conn, at(LEASE + 0.5)) == []  # past the expiry: skipped
            assert await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                       run_id) == "running"
        assert await _sweep(conn, at(LEASE + 0.6)) == []
    finally:
        await holder.close()

    history, violations = await _check(conn)
    assert [row["kind"] for row in history if row["run_id"] == run_id] == [
        "claim", "start", "fail"]
    fail = history[-1]
    assert fail["writer_calls"][-1] == "fail_run"
    assert "_take_over" not in fail["writer_calls"]
    assert fail["fn_now"] == at(LEASE - 0.1) <= fail["old_expires"]
    assert violations == {}
