"""The adversarial tier acts as the people the product must keep out, on databases exactly as
the package ships them: no test clock, no zeroth_test schema, no setting the harness turned on.

Roles (LOGIN, created per test and dropped after): ``nobody`` has no grant at all (anyone who can
connect), ``worker`` is a member of zeroth_worker, ``reader`` of zeroth_reader. A worker that lost
its lease is played by presenting an older generation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from roles import dsn_as, login_role

#: The public function names a LOGIN role is given through zeroth_worker (sql/README.md).
ROLES = {"nobody": None, "worker": "zeroth_worker", "reader": "zeroth_reader"}


@pytest.fixture
async def login(pg_server_dsn: str, database_dsn: str
                ) -> AsyncIterator[Callable[[str], Any]]:
    """``await login("worker")`` → an asyncpg connection to the shipped database as a new LOGIN
    role of that kind (nobody, worker, reader). Roles and connections go at teardown."""
    stack: list[Any] = []
    connections: list[asyncpg.Connection] = []

    async def connect(kind: str) -> asyncpg.Connection:
        context = login_role(pg_server_dsn, ROLES[kind])
        name, password = context.__enter__()
        stack.append(context)
        connection = await asyncpg.connect(dsn_as(database_dsn, name, password))
        connections.append(connection)
        return connection

    try:
        yield connect
    finally:
        for connection in connections:
            await connection.close()
        for context in reversed(stack):
            context.__exit__(None, None, None)


@pytest.fixture
async def admin(connect: Any) -> asyncpg.Connection:
    """A superuser connection to the same shipped database (to set up and to look)."""
    return await connect()
