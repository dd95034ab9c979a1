"""examples/psql/schedules.sh: schedules managed and fired with nothing but psql, on the real
database clock. The script runs as a subprocess against a fresh migrated database (as its owner:
the schedule management functions are admin only); its printed lines and the rows it leaves are
both checked."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn, psql_executable

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "schedules.sh"


def _psql() -> str:
    embedded = migrate.embedded_bin_dir()
    if embedded is not None and (embedded / "psql").exists():
        return str(embedded / "psql")
    return psql_executable()


def _line(stdout: str, pattern: str) -> re.Match[str]:
    match = re.search(f"^{pattern}$", stdout, re.MULTILINE)
    assert match is not None, f"no line matching {pattern!r} in:\n{stdout}"
    return match


class TestSchedulesScript:
    def test_script_is_executable(self):
        assert os.access(SCRIPT, os.X_OK)

    async def test_manage_and_fire_schedules_through_psql_only(self, database_dsn, connect):
        base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        done = subprocess.run(  # noqa: ASYNC221 - the script is the test subject
            [str(SCRIPT), libpq_dsn(database_dsn)],
            env={**base, "PSQL": _psql(), "DEPLOYMENT": "psql-sched", "FIRE_SECONDS": "3"},
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        _line(out, r"created morning-report next (Mon|Tue|Wed|Thu|Fri) 07:30 Europe/Berlin")
        _line(out, "created tick every 1s")
        _line(out, 'refused: never fires: day-of-month 31 never occurs in month 2')
        fired = re.findall(r"^tick fired (\d\d:\d\d:\d\d) run ", out, re.MULTILINE)
        assert fired
        assert len(fired) == len(set(fired))
        _line(out, "paused tick: true")
        _line(out, "while paused: 0 fired")
        _line(out, "altered tick every 60s")
        _line(out, "resumed tick: paused false")
        _line(out, f"schedule tick every 60s fired {len(fired)} managed_by sql")
        _line(out, r"schedule morning-report 30 7 \* \* mon-fri fired 0 managed_by sql")
        _line(out, f"runs {len(fired)} distinct fire times {len(fired)}")
        _line(out, "deleted [0-9a-f-]{36}")

        conn = await connect()
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = 'psql-sched' "
            "AND status = 'pending'") == len(fired)
        assert [r["name"] for r in await conn.fetch("SELECT name FROM zeroth.schedules")] == [
            "tick"]
