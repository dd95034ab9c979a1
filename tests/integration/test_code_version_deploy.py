"""A deploy in the middle of durable runs (issue 34, item 3), with real RunWorkers of two code
versions: the deployment's version policy is ``same``, so a run a v1 worker started (and that
went to sleep: pending again, its checkpoint recorded) is resumed only by a v1 worker, while
runs never started go to either version and record the one that starts them. Once v1 is
drained its sleeping runs are pinned to a version nobody serves: zeroth.pinned_runs shows them
waiting for their version, the v2 worker passes over them (it completes a run enqueued after
them), and retire_code_version moves them to v2, which then finishes them. Every run ends, each
resumed by a version its policy allowed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import worker_probes
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker

WITHIN = 60.0
V1, V2 = "2026.12.05-v1", "2026.12.06-v2"


spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown
#: What this module's workers use besides worker_probes' defaults: quick polls, the default sweep.
QUICK = {"poll_interval": 0.05, "shutdown_timeout": 5.0, "orphan_sweep_interval": 5.0}


def handler_of(version: str, entered: list[tuple[str, UUID, bool]], event: str
               ) -> Callable[[RunContext], Awaitable[Any]]:
    """A durable run: its first step records the version of the code that started it; a
    "short" run then sleeps 0.2 s, a "long" one waits for ``event`` (each leaves its worker,
    started, and comes back pending); it finishes naming both versions."""

    async def handle(run: RunContext) -> dict[str, Any]:
        entered.append((version, run.run_id, run.recovery_checkpoint_id is not None))
        started_by = await run.step("started_by", lambda: version)
        if run.payload["kind"] == "short":
            if run.recovery_checkpoint_id is None:
                await run.sleep(0.2, checkpoint={"slept": True})
        else:
            await run.wait_for_event(event)
        return {"started_by": started_by, "finished_by": version}

    return handle


async def runs(pool: asyncpg.Pool, dep: str) -> dict[UUID, asyncpg.Record]:
    return {r["run_id"]: r for r in await pool.fetch(
        """SELECT r.run_id, r.status::text AS status, v.code_version, r.output::text AS output
             FROM zeroth.runs r LEFT JOIN zeroth.code_versions v ON v.version_id = r.code_version_id
            WHERE r.deployment_ref = $1""", dep)}


class TestAFleetMidDeploy:
    async def test_v1_and_v2_together_then_v1_drained_and_every_run_ends(self, pool,
                                                                          spawn_worker):
        dep = unique_deployment("deploy")
        lm = LeaseManager(pool)
        await lm.register_deployment(dep)
        await lm.set_version_policy(dep, "same")
        entered: list[tuple[str, UUID, bool]] = []

        event = f"{dep}-go"
        # 1. Only v1 runs: it starts every run; "short" ones sleep 0.2 s, "long" ones wait for
        #    an event.
        v1 = await spawn_worker(dep, handler_of(V1, entered, event), code_version=V1,
                                worker_id="worker-v1", **QUICK)
        short = [(await lm.enqueue_run(dep, {"kind": "short"})).run_id for _ in range(4)]
        long = [(await lm.enqueue_run(dep, {"kind": "long"})).run_id for _ in range(4)]

        async def long_waiting() -> bool:
            rows = await runs(pool, dep)
            return all((rows[r]["status"], rows[r]["code_version"]) == ("waiting", V1)
                       for r in long)

        await wait_until(long_waiting, "v1 to start the long runs", within=WITHIN)

        # 2. v2 joins while v1 still serves: new runs go to either, each recording its starter.
        v2 = await spawn_worker(dep, handler_of(V2, entered, event), code_version=V2,
                                worker_id="worker-v2", **QUICK)
        fresh = [(await lm.enqueue_run(dep, {"kind": "short"})).run_id for _ in range(4)]

        async def short_and_fresh_done() -> bool:
            rows = await runs(pool, dep)
            return all(rows[r]["status"] == "completed" for r in short + fresh)

        await wait_until(short_and_fresh_done, "the short and fresh runs", within=WITHIN)

        # 3. v1 is drained, then the long runs' event comes: they are pending again, pinned to a
        #    version nobody serves.
        await v1.graceful_shutdown()
        assert (await lm.emit_event(event)).woken == len(long)

        async def long_due_and_waiting() -> bool:
            pinned = await lm.pinned_runs(dep)
            return sum(p.waiting_for_version for p in pinned if p.code_version == V1) == len(long)

        await wait_until(long_due_and_waiting, "the long runs waiting for v1", within=WITHIN)
        # v2 passes over them: a run enqueued after they became due is started and finished by
        # v2 (same priority, later run_after: it comes after them in the claim's order). Until
        # then, no v2 attempt ever entered one of them (checked below).
        probe = (await lm.enqueue_run(dep, {"kind": "short"})).run_id
        await wait_until(lambda: _completed(pool, probe), "v2 to finish the probe", within=WITHIN)
        rows = await runs(pool, dep)
        assert all((rows[r]["status"], rows[r]["code_version"]) == ("pending", V1) for r in long)
        assert not any(version == V2 and run_id in long for version, run_id, _ in entered)

        # 4. The way out: the operator moves them to v2, which resumes and finishes them.
        retired = await lm.retire_code_version(dep, V1, "move", to_version=V2)
        assert (retired.runs_changed, retired.runs_left) == (len(long), 0)

        async def all_done() -> bool:
            rows = await runs(pool, dep)
            return all(row["status"] == "completed" for row in rows.values())

        await wait_until(all_done, "every run to end", within=WITHIN)
        rows = await runs(pool, dep)
        outputs = {run_id: json.loads(row["output"]) for run_id, row in rows.items()}
        # Every short run a v1 worker started, a v1 worker finished (v2 never resumed one).
        assert all(outputs[r] == {"started_by": V1, "finished_by": V1} for r in short)
        assert all(outputs[r]["finished_by"] == outputs[r]["started_by"] for r in fresh)
        assert all(rows[r]["code_version"] == outputs[r]["started_by"] for r in fresh)
        assert all(outputs[r] == {"started_by": V1, "finished_by": V2} for r in long)
        assert outputs[probe] == {"started_by": V2, "finished_by": V2}
        assert await lm.pinned_runs(dep) == []
        assert v2.lease_manager.code_version == V2
        audit = await pool.fetch("SELECT action, code_version, to_version, run_count "
                                 "FROM zeroth.code_version_changes WHERE deployment_ref = $1 "
                                 "ORDER BY change_id", dep)
        assert [tuple(r) for r in audit] == [("set_policy", None, None, None),
                                             ("move", V1, V2, len(long))]


async def _completed(pool: asyncpg.Pool, run_id: UUID) -> bool:
    return await pool.fetchval("SELECT status = 'completed' FROM zeroth.runs WHERE run_id = $1",
                               run_id) is True


class TestTheWorkerChecksItsVersion:
    @pytest.mark.parametrize("version", ["", "a b", "x" * 129, "v1\n", 12])
    async def test_a_bad_code_version_is_refused_before_anything_starts(self, pool, version):
        with pytest.raises(ValueError, match="code_version"):
            RunWorker(pool, "anything", lambda run: None, code_version=version)
