"""Bad inputs the fuzz found, which the SQL functions once failed to refuse cleanly.

Each test states the correct behaviour — ZP008 invalid_argument and nothing changed.
"""

from __future__ import annotations

import json
import random
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER

# 3,000 characters that do not compress: as a key of a btree index entry it exceeds the
# 2,704-byte limit (a repeated character would be compressed and fit).
_rng = random.Random(7)
LONG = "".join(chr(_rng.randint(0xA1, 0x2FFF)) for _ in range(3000))


async def sqlstate_of(conn: asyncpg.Connection, sql: str, *args: Any) -> str | None:
    """The SQLSTATE the statement fails with (in a savepoint), or None when it succeeds."""
    try:
        async with conn.transaction():
            await conn.fetch(sql, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


@pytest.mark.parametrize("function", ["claim_pending", "claim_orphaned"])
async def test_a_huge_max_concurrency_is_an_invalid_argument(conn, function):
    await conn.execute("SET LOCAL statement_timeout = '1s'")
    assert await sqlstate_of(
        conn, f"""SELECT * FROM zeroth.{function}(deployment_ref => $1, worker_id => $2,
                      max_concurrency => 2147483647)""", DEPLOYMENT, WORKER) == "ZP008"


async def test_a_long_idempotency_key_is_an_invalid_argument(conn):
    assert await sqlstate_of(
        conn, "SELECT * FROM zeroth.enqueue_run(deployment_ref => $1, idempotency_key => $2)",
        DEPLOYMENT, LONG) == "ZP008"


async def test_a_long_idempotency_key_in_a_batch_is_an_invalid_argument(conn):
    assert await sqlstate_of(
        conn, "SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        DEPLOYMENT, json.dumps([{"idempotency_key": LONG}])) == "ZP008"


@pytest.mark.parametrize("function", ["claim_pending", "claim_orphaned"])
@pytest.mark.parametrize("scope", [{"tenant_id": LONG}, {"tenant_id": "t", "workspace_id": LONG}],
                         ids=["long-tenant", "long-workspace"])
async def test_a_long_scope_identifier_in_a_limited_claim_is_an_invalid_argument(
        conn, function, scope):
    assert await sqlstate_of(
        conn, f"""SELECT * FROM zeroth.{function}(deployment_ref => $1, worker_id => $2,
                      tenant_id => $3, workspace_id => $4, max_concurrency => 2)""",
        DEPLOYMENT, WORKER, scope["tenant_id"], scope.get("workspace_id")) == "ZP008"
