"""Handlers the benchmark's worker processes load with ``--app bench.handlers:NAME``."""

from __future__ import annotations

import asyncio
from typing import Any


async def block(_run: Any) -> None:
    """Never returns: the run stays running until its worker is killed."""
    await asyncio.Event().wait()
