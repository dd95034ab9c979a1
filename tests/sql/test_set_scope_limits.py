"""zeroth.set_scope_limits: the one function that writes a scope's zeroth.scope_limits row (the
dashboard's deployment page, a DBA in psql): a NULL argument keeps a value, 0 / '' remove the
concurrency limit / the rate limit key, bad input is refused with ZP006 / ZP008 and changes
nothing, and the next claim applies what it wrote."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import DEPLOYMENT, at, claim, enqueue

SET = """SELECT * FROM zeroth.set_scope_limits(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3, paused => $4, max_concurrency => $5, weight => $6, rate_limit => $7,
    note => $8)"""


async def set_limits(conn: asyncpg.Connection, deployment: str = DEPLOYMENT, *,
                     tenant: str | None = None, workspace: str | None = None,
                     paused: bool | None = None, max_concurrency: int | None = None,
                     weight: int | None = None, rate_limit: str | None = None,
                     note: str | None = None) -> asyncpg.Record:
    return await conn.fetchrow(SET, deployment, tenant, workspace, paused,  # type: ignore[no-any-return]
                               max_concurrency, weight, rate_limit, note)


async def rows(conn: asyncpg.Connection) -> list[tuple[object, ...]]:
    return [tuple(r) for r in await conn.fetch(
        """SELECT tenant_id, workspace_id, deployment_ref, max_concurrency, weight, paused, note,
                  rate_limit FROM zeroth.scope_limits ORDER BY 1, 2, 3""")]


async def refused(conn: asyncpg.Connection, **kwargs: object) -> str:
    with pytest.raises(asyncpg.PostgresError) as caught:
        async with conn.transaction():
            await set_limits(conn, **kwargs)  # type: ignore[arg-type]
    return caught.value.sqlstate or ""


class TestSetScopeLimits:
    async def test_a_new_row_takes_the_defaults_for_what_is_not_given(self, conn):
        row = await set_limits(conn, tenant="acme", workspace="w1", max_concurrency=3)
        assert (row["tenant_id"], row["workspace_id"], row["max_concurrency"], row["weight"],
                row["paused"], row["rate_limit"]) == ("acme", "w1", 3, 1, False, None)

    async def test_null_keeps_a_value_and_zero_or_empty_removes_it(self, conn):
        await conn.execute("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 5, "
                           "period_seconds => 1)")
        await set_limits(conn, max_concurrency=4, weight=7, rate_limit="k", note="why")
        row = await set_limits(conn, paused=True)
        assert (row["paused"], row["max_concurrency"], row["weight"], row["rate_limit"],
                row["note"]) == (True, 4, 7, "k", "why")
        row = await set_limits(conn, paused=False, max_concurrency=0, rate_limit="")
        assert (row["paused"], row["max_concurrency"], row["weight"], row["rate_limit"]) == (
            False, None, 7, None)

    async def test_the_next_claim_applies_a_pause_and_a_resume(self, conn):
        for _ in range(3):
            await enqueue(conn)
        await set_limits(conn, paused=True)
        assert await claim(conn, batch_size=10, now=at(1)) == []
        await set_limits(conn, paused=False, max_concurrency=2)
        assert len(await claim(conn, batch_size=10, now=at(2))) == 2

    async def test_the_default_tenant_is_the_scope_of_a_call_without_one(self, conn):
        await set_limits(conn, paused=True)
        assert await rows(conn) == [("default", None, DEPLOYMENT, None, 1, True, None, None)]

    @pytest.mark.parametrize(("kwargs", "code"), [
        ({"workspace": "w"}, "ZP006"),
        ({"deployment": ""}, "ZP008"),
        ({"deployment": "x" * 201}, "ZP008"),
        ({"tenant": ""}, "ZP008"),
        ({"tenant": "t", "workspace": ""}, "ZP008"),
        ({"max_concurrency": -1}, "ZP008"),
        ({"max_concurrency": 10001}, "ZP008"),
        ({"weight": 0}, "ZP008"),
        ({"weight": 1001}, "ZP008"),
        ({"rate_limit": "no-such-key"}, "ZP008"),
        ({"note": "n" * 1001}, "ZP008"),
    ])
    async def test_bad_input_is_refused_and_changes_nothing(self, conn, kwargs, code):
        await set_limits(conn, max_concurrency=5)
        before = await rows(conn)
        assert await refused(conn, paused=True, **kwargs) == code
        assert await rows(conn) == before

    async def test_a_worker_role_may_not_call_it(self, conn):
        granted = await conn.fetchval(
            """SELECT has_function_privilege('zeroth_worker', 'zeroth.set_scope_limits(text, text,
                   text, boolean, integer, integer, text, text)', 'EXECUTE')""")
        reader = await conn.fetchval(
            """SELECT has_function_privilege('zeroth_reader', 'zeroth.set_scope_limits(text, text,
                   text, boolean, integer, integer, text, text)', 'EXECUTE')""")
        assert (granted, reader) == (False, False)
