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


def _worker_example() -> str:
    text = README.read_text()
    section = text.split("## A worker in 15 lines", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README lost its worker example"
    return match.group(1)


def test_readme_worker_example_is_at_most_fifteen_lines_of_code():
    code = [line for line in _worker_example().splitlines() if line.strip()]
    assert len(code) <= 15


async def test_readme_worker_example_completes_a_run(database_dsn):
    env = {**os.environ, "ZEROTH_PG_DSN": database_dsn}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _worker_example()], env=env,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    conn = await asyncpg.connect(database_dsn)
    try:
        row = await conn.fetchrow(
            "SELECT status::text, output::text FROM zeroth.runs WHERE deployment_ref = 'greeter'")
    finally:
        await conn.close()
    assert row["status"] == "completed"
    assert row["output"] == '{"hello": "world"}'
