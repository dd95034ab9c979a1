"""examples/psql/steps_events.sh: a step and an approval event with nothing but psql. The run
records its step, leaves its worker to wait, is made pending by emit_event, and the replay finds
the step recorded and the payload; a second emit changes nothing. Run as a subprocess against a
fresh migrated database (no test clock); its printed lines and its rows are both checked.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from test_psql_client import UUID_RE, _line, _psql

from zeroth_pg.testing import libpq_dsn

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "steps_events.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([str(SCRIPT), *args], env={**base, "PSQL": _psql()},
                          capture_output=True, text=True, timeout=120, check=False)


def test_without_a_dsn_it_prints_its_usage():
    assert os.access(SCRIPT, os.X_OK)
    done = _run()
    assert done.returncode == 2
    assert "usage" in done.stderr


async def test_a_step_and_an_approval_with_psql(database_dsn, connect):
    done = _run(libpq_dsn(database_dsn))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    run_id = _line(out, f"enqueued ({UUID_RE})").group(1)
    _line(out, 'psql-steps-a: step fetch-profile ran and was recorded: {"name": "Ann"}')
    _line(out, "psql-steps-a: wait_for_event -> waiting -")
    _line(out, f"status waiting event:approval:{run_id}")
    _line(out, "emit: t 1")
    _line(out, "emit again: f 0")
    _line(out, 'psql-steps-b: step fetch-profile already recorded: {"name": "Ann"}')
    _line(out, 'psql-steps-b: wait_for_event -> received {"by": "ann"}')
    _line(out, "psql-steps-b: completed: t")
    conn = await connect()
    rows = await conn.fetch(
        "SELECT step_key, result::text AS result FROM zeroth.run_steps WHERE run_id = $1::uuid "
        "ORDER BY step_key", run_id)
    assert [(r["step_key"], json.loads(r["result"])) for r in rows] == [
        ("#event:approval", {"event": f"approval:{run_id}", "outcome": "received",
                             "payload": {"by": "ann"}}),
        ("fetch-profile", {"name": "Ann"})]
