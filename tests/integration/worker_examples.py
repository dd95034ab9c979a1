"""Shared scenario of the example workers in other languages (examples/psql, examples/node).

Each example is a whole worker loop run as a subprocess against a fresh migrated database in the
role zeroth_worker (PGOPTIONS="-c role=zeroth_worker", so only the worker functions are usable).
:func:`seed` enqueues one run of every kind a worker must handle and :func:`assert_processed`
checks what the example printed and left behind; both examples print the same lines.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from helpers import make_run

PAST = datetime(2020, 1, 1, tzinfo=UTC)
# Generous failure bound for an example to print a line or to exit; never a measured duration.
DEADLINE = 60.0
ENQUEUE = """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1,
                 payload => $2::text::jsonb, max_attempts => $3)"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3, data => '{"step": 2}', now_override => $4)"""
RUNS = """SELECT r.run_id, r.status::text AS status, r.attempts, r.lease_generation,
                 r.lease_worker_id, r.output::text AS output, r.dead_lettered_at,
                 (SELECT count(*) FROM zeroth.checkpoints k
                   WHERE k.run_id = r.run_id) AS checkpoints
            FROM zeroth.runs r"""


@dataclass(frozen=True, slots=True)
class Seeded:
    orphan: Any
    plain: list[Any]
    retried: Any
    dead: Any


async def enqueue(db: asyncpg.Connection, deployment: str, payload: dict[str, int],
                  max_attempts: int = 3) -> Any:
    return await db.fetchval(ENQUEUE, deployment, json.dumps(payload), max_attempts)


async def rows(db: asyncpg.Connection) -> dict[Any, dict[str, Any]]:
    return {row["run_id"]: dict(row) for row in await db.fetch(RUNS)}


async def seed(db: asyncpg.Connection, deployment: str) -> Seeded:
    """An orphan (started in 2020 by a worker that died after its checkpoint at step 2), two
    plain runs, one that fails once, and one that fails until it is dead-lettered."""
    orphan = await make_run(db, "running", deployment_ref=deployment, now=PAST,
                            payload={"steps": 3})
    assert await db.fetchval(SAVE_CHECKPOINT, orphan.run_id, orphan.worker_id, 1,
                             PAST + timedelta(seconds=1))
    return Seeded(
        orphan=orphan.run_id,
        plain=[await enqueue(db, deployment, {"steps": 2}) for _ in range(2)],
        retried=await enqueue(db, deployment, {"steps": 1, "fail_attempts": 1}),
        dead=await enqueue(db, deployment, {"steps": 1, "fail_attempts": 9}, max_attempts=2))


async def assert_processed(db: asyncpg.Connection, seeded: Seeded, out: list[str], *,
                           worker: str, deployment: str) -> None:
    """The example ran with --until-empty --batch 2 and RETRY_BASE_SECONDS=0."""
    assert out[0] == f"worker {worker} serving deployment {deployment} (batch 2, lease 30s)"
    # One batch: the orphan (claim_orphaned) and a pending run (claim_pending), then work.
    assert [line.split()[0] for line in out[1:4]] == ["claimed", "claimed", "started"]
    assert out[1] == f"claimed {seeded.orphan} generation 2"
    assert f"failed {seeded.retried} attempt 1: retry_scheduled" in out
    assert f"failed {seeded.dead} attempt 1: retry_scheduled" in out
    assert f"failed {seeded.dead} attempt 2: dead_lettered" in out
    assert out[-1] == "queue empty: exiting (--until-empty)"

    runs = await rows(db)
    assert {run_id: run["status"] for run_id, run in runs.items()} == {
        seeded.orphan: "completed", seeded.plain[0]: "completed", seeded.plain[1]: "completed",
        seeded.retried: "completed", seeded.dead: "failed"}
    assert all(run["lease_worker_id"] is None for run in runs.values())
    for run_id in seeded.plain:
        assert (runs[run_id]["attempts"], runs[run_id]["checkpoints"]) == (1, 2)
        assert json.loads(runs[run_id]["output"]) == {
            "steps": 2, "resumed_from": 0, "attempt": 1, "worker": worker}
    assert (runs[seeded.retried]["attempts"], runs[seeded.retried]["lease_generation"]) == (2, 2)
    dead = runs[seeded.dead]
    assert (dead["attempts"], dead["dead_lettered_at"] is not None) == (2, True)
    # The orphan resumed after its checkpoint: one more step, a new generation, and its second
    # attempt (the first died with its worker).
    orphan = runs[seeded.orphan]
    assert json.loads(orphan["output"]) == {
        "steps": 3, "resumed_from": 2, "attempt": 2, "worker": worker}
    assert (orphan["attempts"], orphan["lease_generation"], orphan["checkpoints"]) == (2, 2, 2)


async def start(*command: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start an example as the role zeroth_worker, with a clean DATABASE_URL/PGOPTIONS."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGOPTIONS")}
    return await asyncio.create_subprocess_exec(
        *command, env={**base, "PGOPTIONS": "-c role=zeroth_worker", **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def read_until(process: asyncio.subprocess.Process, prefix: str) -> list[str]:
    """Lines printed up to and including the first that starts with ``prefix``."""
    assert process.stdout is not None
    seen: list[str] = []
    while not seen or not seen[-1].startswith(prefix):
        line = await asyncio.wait_for(process.stdout.readline(), DEADLINE)
        assert line, f"the example ended before printing {prefix!r}: {seen}"
        seen.append(line.decode().rstrip("\n"))
    return seen


async def finish(process: asyncio.subprocess.Process) -> tuple[int, list[str], str]:
    stdout, stderr = await asyncio.wait_for(process.communicate(), DEADLINE)
    assert process.returncode is not None
    return process.returncode, stdout.decode().splitlines(), stderr.decode()
