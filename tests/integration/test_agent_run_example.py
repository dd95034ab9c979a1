"""examples/agent_run/agent.py run as its README says: a fleet worker process
(``python -m zeroth_pg.worker --app agent:app``), the run enqueued with ``zeroth-pg enqueue``, the
approval emitted with psql. The run waits for its two children without a lease, then for the
approval; after the emit it completes, and no step, child start or wait was run twice: every
step key was recorded once, exactly two children exist, and each research child ran once.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
from helpers import wait_until
from test_psql_client import _psql
from test_worker_processes import WorkerProcess

from zeroth_pg.testing import libpq_dsn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_run"
WITHIN = 60.0


def zeroth_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    return subprocess.run([sys.executable, "-m", "zeroth_pg.cli", *args],
                          env={**env, "ZEROTH_PG_DSN": dsn}, capture_output=True, text=True,
                          timeout=120, check=False)


def psql(dsn: str, statement: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_psql(), libpq_dsn(dsn), "-XAtqc", statement], capture_output=True,
                          text=True, timeout=60, check=False)


async def run_row(conn: asyncpg.Connection, run_id: UUID, status: str) -> asyncpg.Record:
    async def check() -> asyncpg.Record | None:
        row = await conn.fetchrow(
            "SELECT status::text AS status, wait_reason, output::text AS output, attempts "
            "FROM zeroth.runs WHERE run_id = $1", run_id)
        return row if row is not None and row["status"] == status else None

    return await wait_until(check, f"run {run_id} {status}", within=WITHIN)  # type: ignore[no-any-return]


async def test_the_agent_run_example_as_written(database_dsn: str, connect: Any,
                                                monkeypatch: Any) -> None:
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))  # agent:app
    worker = await WorkerProcess.spawn(database_dsn, None, "agent:app")
    try:
        await worker.started()
        enqueued = await asyncio.to_thread(
            zeroth_cli, database_dsn, "enqueue", "--deployment", "triage", "--json",
            "--payload", '{"ticket": "T-42", "question": "refund?"}')
        assert enqueued.returncode == 0, enqueued.stderr
        run_id = UUID(json.loads(enqueued.stdout)["run_id"])
        conn = await connect()

        # Waits for its two children first (no lease), then for the approval.
        await wait_until(lambda: _reason(conn, run_id, "event:approval:T-42"),
                         "the approval wait", within=WITHIN)
        assert await conn.fetchval(
            "SELECT lease_worker_id IS NULL AND admission_slot IS NULL FROM zeroth.runs "
            "WHERE run_id = $1", run_id)
        emit = await asyncio.to_thread(
            psql, database_dsn,
            """SELECT * FROM zeroth.emit_event('approval:T-42', '{"by": "ann", "ok": true}')""")
        assert emit.returncode == 0, emit.stderr
        assert emit.stdout.strip() == "t|1"

        done = await run_row(conn, run_id, "completed")
        output = json.loads(done["output"])
        assert output["sent"] is True
        assert output["reviewer"] == "ann"
        body = output["receipt"]["body"]
        assert body == ("<reply using <plan for refund?> and "
                        "['<notes on policy>', '<notes on history>']>")
        steps = await conn.fetch(
            "SELECT step_key FROM zeroth.run_steps WHERE run_id = $1 ORDER BY step_key", run_id)
        assert sorted(r["step_key"] for r in steps) == sorted(
            ["plan", "#child:research", "#child:research#2", "#children", "draft",
             "#event:approval:T-42", "send"])
        children = await conn.fetch(
            "SELECT status::text AS status, output->>'topic' AS topic, attempts "
            "FROM zeroth.runs WHERE parent_run_id = $1 ORDER BY output->>'topic'", run_id)
        assert [(c["status"], c["topic"], c["attempts"]) for c in children] == [
            ("completed", "history", 1), ("completed", "policy", 1)]
    finally:
        await worker.stop()


async def _reason(conn: asyncpg.Connection, run_id: UUID, reason: str) -> bool:
    row = await conn.fetchrow("SELECT status::text AS status, wait_reason FROM zeroth.runs "
                              "WHERE run_id = $1", run_id)
    return row is not None and row["status"] == "waiting" and row["wait_reason"] == reason


def test_the_python_guide_shows_the_example_as_it_is() -> None:
    guide = (EXAMPLE.parents[1] / "docs" / "python-guide.md").read_text(encoding="utf-8")
    shown = guide.split("### An agent run", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    source = (EXAMPLE / "agent.py").read_text(encoding="utf-8")
    assert shown in source
