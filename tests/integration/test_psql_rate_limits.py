"""examples/psql/rate_limits.sh: rate limits from psql alone — a DBA's key and scope, a claim cut
short by the limit, a claim held back with the time to wait, a wait of exactly that, and the start
times (database clock) never more than the limit in any window. Run as a subprocess against a
fresh migrated database, like examples/psql/lifecycle.sh (tests/integration/test_psql_client.py);
its printed lines and the rows it leaves are both checked."""

from __future__ import annotations

import os
import re
from pathlib import Path

from test_psql_client import _line, _psql

from zeroth_pg.testing import libpq_dsn

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "psql" / "rate_limits.sh"


def _run(dsn: str) -> tuple[int, str, str]:
    import subprocess

    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run([str(SCRIPT), dsn], env={**base, "PSQL": _psql()},
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


def test_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)


async def test_rate_limits_through_psql_only(database_dsn, connect):
    code, out, err = _run(libpq_dsn(database_dsn))
    assert code == 0, err
    deployment = _line(out, r"deployment (\S+)").group(1)
    _line(out, rf"rate limit {re.escape(deployment)}-quota: 3 starts per 2 s")
    _line(out, "enqueued 5")
    first = _line(out, r"claimed 3, next start possible in ([0-9.]+)s")
    held = _line(out, r"held back: claimed 0, next start possible in ([0-9.]+)s")
    assert 0 < float(held.group(1)) <= float(first.group(1)) <= 2.002  # + period / 1000
    _line(out, "after the wait: claimed 2")
    _line(out, "most starts in any 2 s window: 3")

    conn = await connect()
    rows = await conn.fetch("SELECT status::text AS status, started_at FROM zeroth.runs "
                            "WHERE deployment_ref = $1 ORDER BY started_at", deployment)
    assert [r["status"] for r in rows] == ["completed"] * 5
    # The last two started a full window after the first three (the database clock).
    assert (rows[3]["started_at"] - rows[0]["started_at"]).total_seconds() >= 2
    assert await conn.fetchval("SELECT rate_limit FROM zeroth.scope_limits "
                               "WHERE deployment_ref = $1", deployment) == f"{deployment}-quota"
