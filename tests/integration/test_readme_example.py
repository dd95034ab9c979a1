"""The README's worker example runs as written, against the test database."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg

README = Path(__file__).resolve().parents[2] / "README.md"


def _example(heading: str) -> str:
    section = README.read_text().split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"README lost its example under {heading!r}"
    return match.group(1)


def _worker_example() -> str:
    return _example("## A worker in 15 lines")


async def _run_example(code: str, dsn: str) -> None:
    env = {**os.environ, "ZEROTH_PG_DSN": dsn}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], env=env, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr


def test_readme_worker_example_is_at_most_fifteen_lines_of_code():
    code = [line for line in _worker_example().splitlines() if line.strip()]
    assert len(code) <= 15


async def test_readme_worker_example_completes_a_run(database_dsn):
    await _run_example(_worker_example(), database_dsn)
    conn = await asyncpg.connect(database_dsn)
    try:
        row = await conn.fetchrow(
            "SELECT status::text, output::text FROM zeroth.runs WHERE deployment_ref = 'greeter'")
    finally:
        await conn.close()
    assert row["status"] == "completed"
    assert row["output"] == '{"hello": "world"}'


async def test_readme_application_example_serves_two_deployments_with_one_worker(
        database_dsn, tmp_path):
    section = README.read_text().split("## An application: two deployments, one worker", 1)[1]
    module, script = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    (tmp_path / "mymodule.py").write_text(module)
    env = {**os.environ, "ZEROTH_PG_DSN": database_dsn}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        'resize completed {"path": "cat.png", "width": 640}',
        'send-email completed {"sent_to": "ada@example.com"}']
    conn = await asyncpg.connect(database_dsn)
    try:
        rows = await conn.fetch(
            "SELECT deployment_ref, tenant_id, status::text AS status, output::text AS output "
            "FROM zeroth.runs ORDER BY deployment_ref")
        checkpoints = await conn.fetchval("SELECT count(*) FROM zeroth.checkpoints")
    finally:
        await conn.close()
    assert [(r["deployment_ref"], r["tenant_id"], r["status"]) for r in rows] == [
        ("resize", "globex", "completed"), ("send-email", "acme", "completed")]
    assert [r["output"] for r in rows] == ['{"path": "cat.png", "width": 640}',
                                           '{"sent_to": "ada@example.com"}']
    assert checkpoints == 1
