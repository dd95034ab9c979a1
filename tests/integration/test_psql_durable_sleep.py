"""examples/psql/durable_sleep.sh: a run that sleeps three times for one second, with nothing but
psql, resumed by two psql "workers" in turn from the checkpoint each sleep saved; a stale holder's
sleep is refused. Run as a subprocess against a fresh migrated database (no test clock: real
time); its printed lines and the rows it leaves behind are both checked.
"""

from __future__ import annotations

import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

from test_psql_client import UUID_RE, _line, _psql

from zeroth_pg.testing import libpq_dsn

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "durable_sleep.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([str(SCRIPT), *args], env={**base, "PSQL": _psql()},
                          capture_output=True, text=True, timeout=120, check=False)


class TestDurableSleepScript:
    def test_script_is_executable(self):
        assert os.access(SCRIPT, os.X_OK)

    def test_without_a_dsn_it_prints_its_usage(self):
        done = _run()
        assert done.returncode == 2
        assert "usage" in done.stderr

    async def test_three_sleeps_resume_from_their_checkpoints_and_complete(self, database_dsn,
                                                                          connect):
        done = _run(libpq_dsn(database_dsn))
        assert done.returncode == 0, done.stderr
        out = done.stdout

        run_id = _line(out, f"enqueued ({UUID_RE})").group(1)
        workers = ["psql-sleeper-a", "psql-sleeper-b"]
        resume_at: list[datetime] = []
        for n in range(4):
            # Each round is a new generation, the attempt given back by every sleep (max 1).
            _line(out, f"round {n}: {workers[n % 2]} claimed generation {n + 1} attempt 1 "
                       f"at step {n}")
            if n < 3:
                stamp = _line(out, f"round {n}: sleeping until (\\S+) with checkpoint "
                                   f"step {n + 1}").group(1)
                resume_at.append(datetime.fromisoformat(stamp))
        _line(out, "stale generation 1: sleep_run -> refused")
        _line(out, "round 3: completed: complete_run -> t")
        _line(out, "final completed attempts 1 generation 4 checkpoints 3")
        assert resume_at == sorted(resume_at)

        conn = await connect()
        row = await conn.fetchrow(
            """SELECT r.status::text AS status, r.output::text AS output, r.attempts,
                      r.max_attempts FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
        assert (row["status"], row["attempts"], row["max_attempts"]) == ("completed", 1, 1)
        steps = [re.sub(r"\s", "", text) for text in await conn.fetchval(
            """SELECT array_agg(k.data::text ORDER BY k.checkpoint_order)
                 FROM zeroth.checkpoints k WHERE k.run_id = $1""", run_id)]
        # The stale holder's {"step": 99} was never written.
        assert steps == ['{"step":1}', '{"step":2}', '{"step":3}']
