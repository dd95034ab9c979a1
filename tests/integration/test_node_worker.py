"""examples/node/worker.js: a zeroth_pg worker in Node.js with the `pg` package.

It runs as a subprocess against a fresh migrated database in the role zeroth_worker, like the
psql example (worker_examples.py holds the shared scenario). The `pg` package comes from
examples/node/node_modules when present (`npm install --prefix examples/node`, as .ci/run does),
else it is installed into a temporary directory (`npm install --prefer-offline`: a warm npm cache
suffices offline). Only a machine without node or npm skips these tests, saying so.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from worker_examples import assert_processed, enqueue, finish, read_until, rows, seed, start

from zeroth_pg.testing import libpq_dsn


@pytest.fixture
def database_dsn(clock_database_dsn):
    """The seeded orphan is made in the past on the test clock; the worker runs on real time."""
    return clock_database_dsn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
DEPLOYMENT = "node-loop"
WORKER = "node-loop-worker"
REQUEST_CANCEL = "SELECT zeroth.request_cancel(run_id => $1)"


@pytest.fixture(scope="session")
def node_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"examples/node needs Node.js: {' and '.join(missing)} not found on PATH")
    local = EXAMPLE / "node_modules"
    if (local / "pg").is_dir():
        return local
    prefix = tmp_path_factory.mktemp("node")
    shutil.copy(EXAMPLE / "package.json", prefix / "package.json")
    done = subprocess.run(
        ["npm", "install", "--prefix", str(prefix), "--prefer-offline", "--no-audit", "--no-fund",
         "--no-package-lock"], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail("npm could not install the pg package (it needs the npm registry or a warm "
                    "npm cache; `npm install --prefix examples/node` once with network access "
                    f"also does):\n{done.stdout}\n{done.stderr}")
    return prefix / "node_modules"


async def run_worker(node_modules: Path, dsn: str, *args: str, **env: str):
    return await start("node", str(EXAMPLE / "worker.js"), *args, libpq_dsn(dsn), env={
        "NODE_PATH": str(node_modules), "DEPLOYMENT": DEPLOYMENT, "WORKER_ID": WORKER, **env})


class TestNodeWorker:
    async def test_until_empty_processes_every_run_with_retries_and_recovery(
            self, node_modules, database_dsn, connect):
        db = await connect()
        seeded = await seed(db, DEPLOYMENT)

        code, out, err = await finish(await run_worker(
            node_modules, database_dsn, "--until-empty", "--batch", "2", RETRY_BASE_SECONDS="0"))

        assert code == 0, err
        await assert_processed(db, seeded, out, worker=WORKER, deployment=DEPLOYMENT)

    async def test_a_cancel_arrives_with_the_batch_renewal_and_sigterm_hands_back(
            self, node_modules, database_dsn, connect):
        db = await connect()
        first, second = [await enqueue(db, DEPLOYMENT, {"steps": 1000}) for _ in range(2)]
        # A 3 s lease is renewed every second: the cancel request comes back on a renewal.
        process = await run_worker(node_modules, database_dsn, "--batch", "2", "--lease", "3",
                                   STEP_SECONDS="0.05")
        await read_until(process, f"checkpoint {first} step")
        assert await db.fetchval(REQUEST_CANCEL, first) == "cancel_requested"
        await read_until(process, f"cancelled {first} after step")

        process.send_signal(signal.SIGTERM)
        code, out, err = await finish(process)

        assert code == 0, err
        handed_back = [match for line in out
                       if (match := re.fullmatch(
                           rf"stopping: handed back {second} after step (\d+): true", line))]
        assert len(handed_back) == 1, out
        assert out[-1] == "stopped"
        runs = await rows(db)
        assert {run_id: (run["status"], run["lease_worker_id"]) for run_id, run in runs.items()} \
            == {first: ("cancelled", None), second: ("pending", None)}
        assert (runs[second]["attempts"], runs[second]["checkpoints"]) == (
            0, int(handed_back[0].group(1)))

    async def test_a_renewal_that_finds_the_row_busy_keeps_the_lease(
            self, node_modules, database_dsn, connect):
        db = await connect()
        run_id = await enqueue(db, DEPLOYMENT, {"steps": 1000})
        # A 9 s lease is renewed every 3 s; the run's row is held for 4 s, across a renewal that
        # skips it (renewed NULL: busy, not lost), and given back 2 s or more before the lease
        # would run out.
        process = await run_worker(node_modules, database_dsn, "--lease", "9",
                                   STEP_SECONDS="0.05")
        await read_until(process, f"checkpoint {run_id} step")
        async with db.transaction():
            await db.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", run_id)
            # The last step saved before the lock (a checkpoint waits for the run's row).
            step = await db.fetchval("SELECT max((data->>'step')::int) FROM zeroth.checkpoints "
                                     "WHERE run_id = $1", run_id)
            await asyncio.sleep(4)
        # Its steps go on once the row is free: the checkpoint that waited for it, then one
        # more, taken after the lock was let go (a lease taken for lost would print "lease
        # lost" in place of it).
        def later_step(line: str) -> bool:
            return (line.startswith(f"checkpoint {run_id} step")
                    and int(line.split()[-1]) >= step + 2)

        seen: list[str] = []
        while not seen or not (seen[-1].startswith("lease lost") or later_step(seen[-1])):
            seen += await read_until(process, "")
        process.send_signal(signal.SIGTERM)
        code, out, err = await finish(process)

        assert code == 0, err
        assert not [line for line in seen + out if line.startswith("lease lost")], seen + out
        assert [line for line in out if re.fullmatch(
            rf"stopping: handed back {run_id} after step \d+: true", line)], out
        assert out[-1] == "stopped"
        run = (await rows(db))[run_id]
        assert (run["status"], run["lease_worker_id"], run["attempts"]) == ("pending", None, 0)

    async def test_a_notify_wakes_the_idle_worker_before_its_poll(
            self, node_modules, database_dsn, connect):
        db = await connect()
        # A 30 s poll: the run below is handled at once only if the NOTIFY woke the worker.
        process = await run_worker(node_modules, database_dsn, "--poll", "30")
        await read_until(process, "waiting for work")

        run_id = await enqueue(db, DEPLOYMENT, {"steps": 1})
        seen = await read_until(process, f"completed {run_id}")

        assert seen[:2] == ["woken by zeroth_wakeup", f"claimed {run_id} generation 1"]
        await read_until(process, "waiting for work")
        process.send_signal(signal.SIGTERM)
        code, out, err = await finish(process)
        assert (code, out) == (0, ["stopped"]), err

    async def test_missing_dsn_is_a_usage_error(self, node_modules):
        code, out, err = await finish(await start(
            "node", str(EXAMPLE / "worker.js"), "--until-empty",
            env={"NODE_PATH": str(node_modules)}))
        assert (code, out) == (2, [])
        assert "usage" in err
