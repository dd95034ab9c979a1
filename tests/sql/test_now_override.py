"""now_override is a test hook: production sessions cannot bring their own clock (seed §9.5).

The test databases set zeroth.allow_now_override = on; a session that turns it off sees what
production sees: every function refuses now_override with ZP008 and changes nothing.
"""

from __future__ import annotations

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, make_run, run_row

FAR_FUTURE = "2999-01-01T00:00:00Z"


async def turn_the_hook_off(conn):
    await conn.execute("SET LOCAL zeroth.allow_now_override = off")


class TestNowOverrideIsRefusedOutsideTests:
    @pytest.mark.parametrize("call", [
        "SELECT * FROM zeroth.claim_pending(deployment_ref => 'deploy-a', worker_id => 'w', "
        "now_override => '{t}')",
        "SELECT * FROM zeroth.claim_orphaned(deployment_ref => 'deploy-a', worker_id => 'w', "
        "now_override => '{t}')",
        "SELECT * FROM zeroth.enqueue_run(deployment_ref => 'deploy-a', now_override => '{t}')",
        "SELECT zeroth.renew_lease(run_id => '{run}', worker_id => 'worker-a', generation => 1, "
        "now_override => '{t}')",
        "SELECT zeroth.complete_run(run_id => '{run}', worker_id => 'worker-a', generation => 1, "
        "now_override => '{t}')",
        "SELECT zeroth.request_cancel(run_id => '{run}', now_override => '{t}')",
    ])
    async def test_a_far_future_worker_clock_is_refused_and_changes_nothing(self, conn, call):
        lease = await make_run(conn, "running")  # built with the hook, at T0 (still in the future)
        await turn_the_hook_off(conn)
        before = await run_row(conn, lease.run_id)
        count = await conn.fetchval("SELECT count(*) FROM zeroth.runs")

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await conn.execute(call.format(t=FAR_FUTURE, run=lease.run_id))

        assert raised.value.sqlstate == "ZP008"
        assert await run_row(conn, lease.run_id) == before
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == count

    async def test_database_time_decides_without_the_hook(self, conn):
        await turn_the_hook_off(conn)
        await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => $1)", DEPLOYMENT)

        row = await conn.fetchrow(
            """SELECT run_id, lease_expires_at - clock_timestamp() AS remaining
                 FROM zeroth.claim_pending(deployment_ref => $1, worker_id => $2)""",
            DEPLOYMENT, WORKER)

        assert row["run_id"] is not None
        assert 0 < row["remaining"].total_seconds() <= 60
