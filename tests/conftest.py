"""Fixtures shared across test directories (the database ones come from zeroth_pg.testing)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from zeroth_pg import App
from zeroth_pg.worker import RunWorker

pytest_plugins = ["zeroth_pg.testing", "pytester"]


@pytest.fixture
async def app(pool: asyncpg.Pool, database_dsn: str) -> AsyncIterator[App]:
    """An App over the test's pool (integration/test_app.py, adversarial/test_app_attacks.py)."""
    application = App(database_dsn, pool=pool)
    yield application
    await application.close()  # not the test's pool: only a pool the App created is closed


@pytest.fixture
async def serve(app: App) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    """``await serve(*deployments, **RunWorker options)`` starts a worker of ``app`` (quick
    polls); every one is drained at teardown."""
    workers: list[RunWorker] = []

    async def start(*deployments: str, **options: Any) -> RunWorker:
        options.setdefault("poll_interval", 0.05)
        options.setdefault("orphan_sweep_interval", 0.2)
        options.setdefault("shutdown_timeout", 2.0)
        worker = await app.worker(list(deployments) or None, **options)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield start
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
