"""zeroth.count_pending_scopes: count_pending over many deployments and scopes, summed per
deployment (a fleet worker's queue-depth gauge) — every scope of the deployments or a listed set,
one row per deployment asked for, and bad input refused."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from helpers import make_run

COUNT = """SELECT deployment_ref, pending FROM zeroth.count_pending_scopes(
    deployment_refs => $1::text[], tenant_ids => $2::text[], workspace_ids => $3::text[])"""


async def count(conn: asyncpg.Connection, deployments: Any, tenants: Any = None,
                workspaces: Any = None) -> dict[str, int]:
    rows = await conn.fetch(COUNT, deployments, tenants, workspaces)
    return {row["deployment_ref"]: row["pending"] for row in rows}


async def seed(conn: asyncpg.Connection) -> None:
    for status in ("pending", "pending", "claimed", "running", "completed"):
        await make_run(conn, status, deployment_ref="a", tenant_id="acme")
    await make_run(conn, "pending", deployment_ref="a", tenant_id="acme", workspace_id="w1")
    await make_run(conn, "pending", deployment_ref="a", tenant_id="globex")
    await make_run(conn, "pending", deployment_ref="a")  # the default tenant
    await make_run(conn, "pending", deployment_ref="b", tenant_id="globex")
    await make_run(conn, "pending", deployment_ref="c", tenant_id="acme")  # not asked for


class TestCountPendingScopes:
    async def test_every_scope_of_the_deployments_summed_per_deployment(self, conn):
        await seed(conn)
        # a: acme 3 (two pending, one claimed), acme/w1 1, globex 1, default 1.
        assert await count(conn, ["a", "b"]) == {"a": 6, "b": 1}

    async def test_the_listed_scopes_only(self, conn):
        await seed(conn)
        assert await count(conn, ["a", "b"], ["acme", "globex"], [None, None]) == {
            "a": 4, "b": 1}
        assert await count(conn, ["a"], ["acme"], ["w1"]) == {"a": 1}
        assert await count(conn, ["a"], [None]) == {"a": 1}  # NULL tenant: 'default'

    async def test_each_deployment_once_and_zero_when_it_has_none(self, conn):
        await seed(conn)
        assert await count(conn, ["b", "nothing", "b"]) == {"b": 1, "nothing": 0}
        assert await count(conn, ["a", "nothing"], ["initech"]) == {"a": 0, "nothing": 0}
        rows = await conn.fetch(COUNT, ["b", "a", "b"], None, None)
        assert [row["deployment_ref"] for row in rows] == ["a", "b"]

    @pytest.mark.parametrize(("deployments", "tenants", "workspaces", "code"), [
        (None, None, None, "ZP008"),
        ([], None, None, "ZP008"),
        ([""], None, None, "ZP008"),
        (["a"], None, ["w1"], "ZP008"),  # workspaces need tenants
        (["a"], ["acme"], ["w1", "w2"], "ZP008"),  # not as long as tenants
        (["a"], [None], ["w1"], "ZP006"),  # a workspace without a tenant
    ])
    async def test_bad_arguments_are_refused(self, conn, deployments, tenants, workspaces,
                                             code):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await count(conn, deployments, tenants, workspaces)
        assert caught.value.sqlstate == code
