"""Waiting helpers of the failover tests: poll for a condition, never sleep as an assertion."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from zeroth_pg.errors import RetryableError, translate

__all__ = ["eventually", "retrying"]

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
