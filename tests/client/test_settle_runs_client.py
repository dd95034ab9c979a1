"""LeaseManager.settle_runs: zeroth.settle_runs with typed arguments and results."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from zeroth_pg import (
    InvalidArgumentError,
    LeaseManager,
    RunSettled,
    SettleKind,
    Settlement,
    SettleOutcome,
    TransitionNotListedError,
)
from zeroth_pg.errors import LeaseLostError

DEPLOY = "deploy-settle-client"
W1 = "worker-1"


async def _row(pool: Any, run_id: UUID) -> dict[str, Any]:
    row = await pool.fetchrow("SELECT * FROM zeroth.runs r WHERE r.run_id = $1", run_id)
    assert row is not None
    return dict(row)


class TestSettleRuns:
    async def test_a_mixed_batch_comes_back_typed_in_order(self, pool):
        lm = LeaseManager(pool)
        for _ in range(4):
            await lm.enqueue_run(DEPLOY)
        runs = (await lm.claim_and_start(DEPLOY, W1, batch_size=4)).runs
        claimed = (await lm.enqueue_run(DEPLOY)).run_id
        assert await lm.claim_pending(DEPLOY, W1) == claimed  # held, not started

        result = await lm.settle_runs(W1, [
            Settlement(runs[0].run_id, runs[0].lease_generation, SettleKind.COMPLETE,
                       output={"answer": 1}),
            Settlement(str(runs[1].run_id), runs[1].lease_generation, SettleKind.FAIL,
                       error={"message": "no"}),
            Settlement(runs[2].run_id, runs[2].lease_generation + 1, SettleKind.CANCEL),
            Settlement(runs[3].run_id, runs[3].lease_generation, SettleKind.HAND_BACK),
            Settlement(claimed, 1, SettleKind.COMPLETE),
        ])

        assert result == [
            RunSettled(runs[0].run_id, SettleOutcome.COMPLETED, None),
            RunSettled(runs[1].run_id, SettleOutcome.FAILED, None),
            RunSettled(runs[2].run_id, None, LeaseLostError.sqlstate),
            RunSettled(runs[3].run_id, SettleOutcome.HANDED_BACK, None),
            RunSettled(claimed, None, TransitionNotListedError.sqlstate)]
        assert [r.settled for r in result] == [True, True, False, True, False]
        assert json.loads((await _row(pool, runs[0].run_id))["output"]) == {"answer": 1}
        assert json.loads((await _row(pool, runs[1].run_id))["error"]) == {"message": "no"}
        assert (await _row(pool, runs[2].run_id))["status"] == "running"

    async def test_a_retry_reports_its_schedule(self, pool):
        lm = LeaseManager(pool)
        await lm.enqueue_run(DEPLOY)
        (run,) = (await lm.claim_and_start(DEPLOY, W1)).runs
        (settled,) = await lm.settle_runs(
            W1, [Settlement(run.run_id, run.lease_generation, SettleKind.RETRY, error="x")],
            retry_base_seconds=5, retry_max_seconds=5)
        assert settled.outcome is SettleOutcome.RETRY_SCHEDULED
        assert (await _row(pool, run.run_id))["status"] == "pending"

    @pytest.mark.parametrize("settlements", [
        pytest.param([(uuid4(), 1, "complete")], id="not-a-settlement"),
        pytest.param([Settlement(uuid4(), 1, "sleep")], id="unknown-kind"),  # type: ignore[arg-type]
        pytest.param([Settlement("not-a-uuid", 1, SettleKind.CANCEL)], id="bad-uuid"),
        pytest.param([Settlement(uuid4(), 1, SettleKind.COMPLETE, output={1, 2})],
                     id="output-not-json"),
    ])
    async def test_bad_input_is_refused_before_sending(self, pool, settlements):
        with pytest.raises(InvalidArgumentError):
            await LeaseManager(pool).settle_runs(W1, settlements)

    async def test_an_error_for_a_completion_raises_invalid_argument(self, pool):
        with pytest.raises(InvalidArgumentError) as caught:
            await LeaseManager(pool).settle_runs(
                W1, [Settlement(uuid4(), 1, SettleKind.COMPLETE, error={"m": 1})])
        assert isinstance(caught.value.__cause__, asyncpg.PostgresError)
        assert caught.value.__cause__.sqlstate == "ZP008"
