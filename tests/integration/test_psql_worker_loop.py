"""examples/psql/worker_loop.sh: a whole worker loop with nothing but bash and psql.

The script runs as a subprocess against a fresh migrated database, its psql sessions in the role
zeroth_worker, so it proves the loop needs the worker functions only (worker_examples.py). With
--until-empty it stops at the first empty claim; the rows it leaves are checked as admin.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from worker_examples import assert_processed, enqueue, finish, read_until, rows, seed, start

from zeroth_pg.testing import libpq_dsn, psql_executable


@pytest.fixture
def database_dsn(clock_database_dsn):
    """The seeded orphan is made in the past on the test clock; the worker runs on real time."""
    return clock_database_dsn


SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "worker_loop.sh"
DEPLOYMENT = "psql-loop"
WORKER = "psql-loop-worker"
LEASE_OF = """SELECT r.lease_acquired_at, r.lease_expires_at FROM zeroth.runs r
               WHERE r.run_id = $1"""


async def run_script(dsn: str, *args: str, **env: str):
    return await start(str(SCRIPT), *args, libpq_dsn(dsn), env={
        "PSQL": psql_executable(), "DEPLOYMENT": DEPLOYMENT, "WORKER_ID": WORKER, **env})


class TestWorkerLoop:
    def test_script_is_executable(self):
        assert os.access(SCRIPT, os.X_OK)

    async def test_until_empty_processes_every_run_with_retries_and_recovery(
            self, database_dsn, connect):
        db = await connect()
        seeded = await seed(db, DEPLOYMENT)

        code, out, err = await finish(await run_script(
            database_dsn, "--until-empty", "--batch", "2", RETRY_BASE_SECONDS="0"))

        assert code == 0, err
        await assert_processed(db, seeded, out, worker=WORKER, deployment=DEPLOYMENT)

    async def test_a_payload_it_cannot_decode_fails_once_and_blocks_nothing(
            self, database_dsn, connect):
        db = await connect()
        poison = await enqueue(db, DEPLOYMENT, {"steps": "x"})  # type: ignore[dict-item]
        plain = await enqueue(db, DEPLOYMENT, {"steps": 1})

        code, out, err = await finish(await run_script(
            database_dsn, "--until-empty", "--batch", "1"))

        assert code == 0, err
        assert f"failed {poison}: bad payload: failed" in out
        runs = await rows(db)
        assert (runs[poison]["status"], runs[poison]["attempts"]) == ("failed", 1)
        assert runs[plain]["status"] == "completed"

    async def test_batch_renewal_then_sigterm_hands_back_the_run_in_hand_and_releases_the_rest(
            self, database_dsn, connect):
        db = await connect()
        first, second = [await enqueue(db, DEPLOYMENT, {"steps": 1000}) for _ in range(2)]
        # A 3 s lease: the waiting second run is renewed with the batch every second.
        process = await run_script(database_dsn, "--batch", "2", "--lease", "3",
                                   STEP_SECONDS="0.05")
        await read_until(process, f"checkpoint {first} step 30")
        waiting = await db.fetchrow(LEASE_OF, second)
        assert waiting["lease_expires_at"] - waiting["lease_acquired_at"] > timedelta(seconds=3)

        process.send_signal(signal.SIGTERM)
        code, out, err = await finish(process)

        assert code == 0, err
        # The script processes a batch one run at a time: the first was in hand.
        handed_back = re.fullmatch(rf"stopping: handed back {first} after step (\d+): t", out[-3])
        assert handed_back is not None, out
        assert out[-2:] == [f"stopping: released {second}", "stopped"]
        runs = await rows(db)
        assert {run_id: (run["status"], run["attempts"], run["lease_worker_id"])
                for run_id, run in runs.items()} == {
            first: ("pending", 0, None), second: ("pending", 0, None)}
        assert runs[first]["checkpoints"] == int(handed_back.group(1))

    async def test_a_role_without_worker_rights_fails_loudly(self, database_dsn, connect):
        await enqueue(await connect(), DEPLOYMENT, {"steps": 1})

        code, out, err = await finish(await run_script(
            database_dsn, "--until-empty", PGOPTIONS="-c role=zeroth_reader"))

        assert code != 0
        assert "permission denied for function claim_orphaned" in err
        assert "queue empty" not in "\n".join(out)

    async def test_missing_dsn_is_a_usage_error(self):
        process = await start(str(SCRIPT), "--until-empty", env={})
        code, out, err = await finish(process)
        assert (code, out) == (2, [])
        assert "usage" in err
