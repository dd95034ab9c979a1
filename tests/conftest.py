"""Fixtures shared across test directories (the database ones come from zeroth_pg.testing)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from zeroth_pg import App
from zeroth_pg.worker import RunWorker

pytest_plugins = ["zeroth_pg.testing", "pytester"]

# ---------------------------------------------------------------------------------------------
# Parallel by default (pytest-xdist): `python -m pytest` runs the suite in WORKERS_PER_CPU
# processes per core, each with its own PostgreSQL server, templates and clones
# (zeroth_pg.testing). Serial: `-n 0` (or `-p no:xdist`); a run that names only test ids
# (path::name), or asks for -s, --pdb or --collect-only, is serial unless it says -n.
# PYTEST_XDIST_AUTO_NUM_WORKERS=<n> sets the count.

#: Processes per core for `-n auto`: a test spends much of its time waiting on PostgreSQL, on
#: worker processes it started and on the clock, so more processes than cores keep them busy.
WORKERS_PER_CPU = 2

_TESTS = Path(__file__).resolve().parent

#: The fast tier (`-m fast`): the SQL contract and the client and worker units, at the database
#: level and on the test clock. Everything else, and anything in these marked slow, is not in it.
FAST_TIERS = ("sql", "client", "worker")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    option = config.option
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    if getattr(option, "numprocesses", None) is not None or getattr(option, "dist", "no") != "no":
        return  # the command line said how
    if (option.usepdb or getattr(option, "trace", False) or option.collectonly
            or getattr(option, "capture", None) == "no"):
        return  # a debugger, a listing, or output to watch (-s): one process
    named = [arg for arg in config.args if not arg.startswith("-")]
    if named and all("::" in arg for arg in named):
        return  # chosen tests: one process, one server
    option.numprocesses = "auto"
    option.dist = "loadgroup"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return WORKERS_PER_CPU * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count() or 1)


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            relative = Path(str(item.path)).resolve().relative_to(_TESTS)
        except ValueError:  # not under tests/
            continue
        if (len(relative.parts) > 1 and relative.parts[0] in FAST_TIERS
                and item.get_closest_marker("slow") is None):
            item.add_marker(pytest.mark.fast)
        dedicated = item.get_closest_marker("dedicated_server")
        if (dedicated is not None and dedicated.kwargs.get("scope") == "module"
                and config.pluginmanager.hasplugin("xdist")):
            # The module's own server (a module-scoped fixture) is started by one worker only.
            item.add_marker(pytest.mark.xdist_group(relative.as_posix()))
    if hasattr(config, "workerinput"):
        # Under xdist the slow tests go first, so that none starts last and runs alone.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
