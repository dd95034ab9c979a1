"""Fixtures of the race tests."""

from __future__ import annotations

import asyncio

import pytest
from interleave import Session


@pytest.fixture
async def sessions(connect):
    """Sessions A and B and an autocommit connection for setup and observation."""
    a, b, db = Session(await connect()), Session(await connect()), await connect()
    yield a, b, db
    pending = [task for task in a.tasks + b.tasks if not task.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
