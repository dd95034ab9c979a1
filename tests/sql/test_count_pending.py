"""zeroth.count_pending: the pending runs of one deployment in one scope."""

from __future__ import annotations

from helpers import DEPLOYMENT, make_run

COUNT = """SELECT zeroth.count_pending(deployment_ref => $1, tenant_id => $2,
               workspace_id => $3)"""


class TestCountPending:
    async def test_counts_pending_runs_claimed_or_not_and_nothing_else(self, conn):
        for status in ("pending", "pending", "claimed", "running", "waiting", "completed"):
            await make_run(conn, status)

        assert await conn.fetchval(COUNT, DEPLOYMENT, None, None) == 3

    async def test_is_scoped_to_deployment_tenant_and_workspace(self, conn):
        await make_run(conn, "pending")
        await make_run(conn, "pending", deployment_ref="other")
        await make_run(conn, "pending", tenant_id="acme")
        await make_run(conn, "pending", tenant_id="acme", workspace_id="w1")

        assert await conn.fetchval(COUNT, DEPLOYMENT, None, None) == 1
        assert await conn.fetchval(COUNT, DEPLOYMENT, "acme", None) == 1
        assert await conn.fetchval(COUNT, DEPLOYMENT, "acme", "w1") == 1
        assert await conn.fetchval(COUNT, DEPLOYMENT, None, "w1") == 0  # workspace without tenant

    async def test_an_empty_deployment_counts_zero(self, conn):
        assert await conn.fetchval(COUNT, "nothing-here", None, None) == 0
