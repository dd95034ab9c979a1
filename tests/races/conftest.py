"""Fixtures of the race tests. Their databases carry the test clock
(zeroth_pg.testing.install_test_clock): interleavings place each call at a chosen time."""

from __future__ import annotations

import asyncio

import pytest
from interleave import Session


@pytest.fixture
def conn(clock_conn):
    return clock_conn


@pytest.fixture
def database_dsn(clock_database_dsn):
    return clock_database_dsn


@pytest.fixture
async def sessions(connect):
    """Sessions A and B and an autocommit connection for setup and observation."""
    a, b, db = Session(await connect()), Session(await connect()), await connect()
    yield a, b, db
    pending = [task for task in a.tasks + b.tasks if not task.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
