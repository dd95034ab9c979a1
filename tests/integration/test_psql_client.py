"""examples/psql/lifecycle.sh: a whole worker lifecycle, fencing included, with nothing but psql.

The script is the proof that any language can be a client of the SQL API. It runs here as a
subprocess against a fresh migrated database; its printed lines and the rows it leaves behind are
both checked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn, psql_executable

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "lifecycle.sh"
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _psql() -> str:
    """The embedded server's own psql when the wheel is installed (same major version as the
    server), else whatever psql the testing plugin finds."""
    embedded = migrate.embedded_bin_dir()
    if embedded is not None and (embedded / "psql").exists():
        return str(embedded / "psql")
    return psql_executable()


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [str(SCRIPT), *args], env={**base, "PSQL": _psql(), **(env or {})},
        capture_output=True, text=True, timeout=120, check=False)


def _line(stdout: str, pattern: str) -> re.Match[str]:
    match = re.search(f"^{pattern}$", stdout, re.MULTILINE)
    assert match is not None, f"no line matching {pattern!r} in:\n{stdout}"
    return match


class TestLifecycleScript:
    def test_script_is_executable(self):
        assert os.access(SCRIPT, os.X_OK)

    async def test_lifecycle_and_fencing_through_psql_only(self, database_dsn, connect):
        done = _run(libpq_dsn(database_dsn))
        assert done.returncode == 0, done.stderr
        out = done.stdout

        run_1 = _line(out, f"enqueued ({UUID_RE})").group(1)
        _line(out, f"claimed {run_1} generation 1")
        _line(out, f"started {run_1}: start_run -> t")
        checkpoints = [_line(out, f"checkpoint {n} ({UUID_RE})").group(1) for n in (1, 2)]
        _line(out, "renewed lease: renew_lease -> t")
        _line(out, "committed progress: commit_fenced -> t")
        _line(out, f"completed {run_1}: complete_run -> t")

        run_2 = _line(out, f"enqueued ((?!{run_1}){UUID_RE})").group(1)
        _line(out, f"claimed {run_2} generation 1")
        _line(out, f"lease of {run_2} expired: clear_lease -> t")
        recovery = _line(
            out, f"psql-worker-2 took over {run_2} generation 2 "
                 f"\\(resumes from checkpoint ({UUID_RE})\\)").group(1)
        _line(out, "stale generation 1 refused: renew_lease -> f")
        _line(out, "stale generation 1 refused: commit_fenced -> f")
        _line(out, "stale generation 1 refused: complete_run -> f")
        _line(out, f"generation 2 completed {run_2}: complete_run -> t")
        _line(out, f"final {run_1} completed generation 1 done by psql-worker")
        _line(out, f"final {run_2} completed generation 2 done by psql-worker-2")

        conn = await connect()
        first = await conn.fetchrow(
            """SELECT r.status::text AS status, r.output::text AS output,
                      r.progress::text AS progress, r.payload::text AS payload, r.attempts,
                      r.lease_generation, r.lease_worker_id, r.finished_at
                 FROM zeroth.runs r WHERE r.run_id = $1""", run_1)
        assert first["status"] == "completed"
        assert json.loads(first["output"]) == {"summary": "done by psql-worker"}
        assert json.loads(first["progress"]) == {"percent": 100, "note": "written by psql"}
        assert json.loads(first["payload"]) == {"task": "summarise", "document": 42}
        assert (first["attempts"], first["lease_generation"]) == (1, 1)
        assert first["lease_worker_id"] is None
        assert first["finished_at"] is not None
        saved = await conn.fetch(
            """SELECT k.checkpoint_id::text AS checkpoint_id, k.checkpoint_order,
                      k.lease_generation, k.data::text AS data
                 FROM zeroth.checkpoints k WHERE k.run_id = $1 ORDER BY k.checkpoint_order""",
            run_1)
        assert [row["checkpoint_id"] for row in saved] == checkpoints
        assert [row["checkpoint_order"] for row in saved] == [1, 2]
        assert [row["lease_generation"] for row in saved] == [1, 1]
        assert [json.loads(row["data"]) for row in saved] == [
            {"step": 1, "done": 50}, {"step": 2, "done": 100}]

        second = await conn.fetchrow(
            """SELECT r.status::text AS status, r.output::text AS output, r.lease_generation,
                      r.lease_worker_id, r.recovery_checkpoint_id::text AS recovery
                 FROM zeroth.runs r WHERE r.run_id = $1""", run_2)
        assert second["status"] == "completed"
        assert second["lease_generation"] == 2
        assert json.loads(second["output"]) == {"summary": "done by psql-worker-2"}
        assert second["lease_worker_id"] is None
        # The stale owner's refused writes left nothing: its checkpoint is the one handed over.
        assert await conn.fetchval(
            "SELECT k.checkpoint_id::text FROM zeroth.checkpoints k WHERE k.run_id = $1",
            run_2) == recovery
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 2

    async def test_dsn_from_database_url(self, database_dsn, connect):
        done = _run(env={"DATABASE_URL": libpq_dsn(database_dsn)})
        assert done.returncode == 0, done.stderr
        _line(done.stdout, "stale generation 1 refused: complete_run -> f")
        conn = await connect()
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.status = 'completed'") == 2

    def test_missing_dsn_is_a_usage_error(self):
        done = _run()
        assert done.returncode == 2
        assert "usage" in done.stderr
        assert done.stdout == ""
