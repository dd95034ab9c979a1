"""CLI tables survive a terminal and a pipe: a status or an id is never shortened, whatever the
width, and piped output is one complete line per row (so `| grep failed` finds every failed run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncpg
from helpers import make_run
from rich.console import Console

from zeroth_pg.cli._common import rows_table

REPO = Path(__file__).resolve().parents[2]
STATUSES = ("completed", "failed", "cancelled", "running", "pending")


def _runs_list(dsn: str, columns: int) -> str:
    env = {"PATH": "/usr/bin:/bin", "ZEROTH_PG_DSN": dsn, "COLUMNS": str(columns),
           "PYTHONPATH": ":".join(sys.path)}
    result = subprocess.run([sys.executable, "-m", "zeroth_pg.cli", "runs", "list"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_piped_runs_list_prints_every_status_and_id_whole_at_80_columns(database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        ids = {status: (await make_run(conn, status, deployment_ref="a-rather-long-deployment-"
                                       "name-for-a-narrow-terminal")).run_id
               for status in STATUSES}
    finally:
        await conn.close()
    piped = _runs_list(database_dsn, 80)
    for status, run_id in ids.items():
        line = next((line for line in piped.splitlines() if str(run_id) in line), None)
        assert line is not None, f"run {run_id} is missing or cut in:\n{piped}"
        assert f" {status} " in f" {line} ", line
        assert "…" not in line


def test_a_terminal_table_shrinks_free_text_never_an_id_or_a_status():
    rows = [{"run_id": "0b7d5c55-7b7a-4f0e-9f59-7f0f3b0d4a11", "status": status,
             "error": "x" * 300} for status in STATUSES]
    table = rows_table(rows, [("run_id", "run_id"), ("status", "status"), ("error", "error")])
    for width in (60, 80, 100, 120):
        console = Console(width=width, force_terminal=True, color_system=None, record=True)
        console.print(table)
        text = console.export_text()
        for status in STATUSES:
            assert f" {status} " in text, (width, text)
        assert "0b7d5c55-7b7a-4f0e-9f59-7f0f3b0d4a11" in text
        assert "…" not in text
