"""Fixtures shared across test directories (the database ones come from zeroth_pg.testing)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest

try:  # pytest 9: a node's id (see _GroupedTestIds)
    from _pytest.nodeid import NodeId as _NodeId
except ImportError:  # pytest 8: xdist's own tagging works
    _NodeId = None  # type: ignore[assignment,misc]

from zeroth_pg import App
from zeroth_pg.testing import _session
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


# ---------------------------------------------------------------------------------------------
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (as in CI): pytest rewrites the
# asserts of every test module in every xdist worker (about 6 s of CPU per process for this
# suite), and every subprocess a test starts (the CLI, worker processes) compiled the package
# again. The files go where Python puts them (__pycache__, ignored by git; or the user's
# PYTHONPYCACHEPREFIX), for this process and the ones it starts, and from a fresh checkout each
# xdist worker rewrites its share of the test modules before it collects, so that together they
# rewrite each module once (_rewrite_test_modules). ZEROTH_PG_TEST_BYTECODE=0 keeps the variable.
if sys.dont_write_bytecode and os.environ.get("ZEROTH_PG_TEST_BYTECODE", "1") != "0":
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _rewrite_test_modules(config: pytest.Config, share: int, shares: int) -> None:
    """Write pytest's rewritten bytecode of the test modules this run collects, share ``share``
    of ``shares`` of them (every ``shares``-th module), where it is not cached yet. Each xdist
    worker writes its share before it collects, and its collection finds the other shares
    written by the others by then: from a fresh checkout every worker rewrote every module
    (about 6 s of CPU each, the first 5 s of a CI run on two cores), and a thread of the
    controller that rewrote them all while the workers booted was too slow to be ahead of
    them. Best effort: pytest's own cache layout, private helpers."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
        )

        state = config.stash[assertstate_key]
        roots = [Path(str(arg).split("::")[0]).resolve() for arg in config.args] or [_TESTS]
        fast_only = _selects_only_fast(config)
        collected = [
            path for path in sorted(_TESTS.rglob("test_*.py"))
            if any(root == path or root in path.parents for root in roots)
            and not (fast_only and path.relative_to(_TESTS).parts[0] not in FAST_TIERS)]
    except Exception:  # then the collection rewrites what it imports, as without this
        return
    for path in collected[share::shares]:
        try:
            cache = get_cache_dir(path)
            pyc = cache / (path.name[:-3] + PYC_TAIL)
            if _read_pyc(path, pyc, state.trace) is not None:
                continue
            cache.mkdir(parents=True, exist_ok=True)
            source_hash, code = _rewrite_test(path, config)
            _write_pyc(state, code, source_hash, pyc)  # atomic: a temporary file, renamed
        except Exception:  # a module that does not compile: its collection reports it
            continue


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    config.pluginmanager.register(_GroupedTestIds(), "zeroth-pg-grouped-test-ids")
    if (getattr(config.option, "assertmode", "rewrite") == "rewrite"
            and not sys.dont_write_bytecode):
        _rewrite_test_modules(config, *_share(workerinput))


def _share(workerinput: dict[str, Any]) -> tuple[int, int]:
    """This xdist worker's share of the test modules to rewrite: (N, count) for worker gwN of
    count; all of them (0, 1) for a worker named otherwise (``--tx id=name//popen``). A worker
    started again after a crash (gw4 of 4) takes a share another has done: no harm."""
    number = str(workerinput.get("workerid", "")).removeprefix("gw")
    count = workerinput.get("workercount")
    if not number.isdigit() or not isinstance(count, int) or count < 1:
        return 0, 1
    return int(number) % count, count


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    option = config.option
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # A worker parses the command line again, which does not say loadgroup when this
        # hook chose it on the controller: then the worker would not tag its tests with their
        # xdist_group and the controller could not keep a group on one worker (seen: the
        # browser module's tests on four workers, the two HA soaks at once).
        if workerinput.get(_LOADGROUP_KEY):
            option.loadgroup = True
        return
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if getattr(option, "numprocesses", None) is not None or getattr(option, "dist", "no") != "no":
        if getattr(option, "numprocesses", None) and getattr(option, "dist", "no") == "no":
            # -n N alone: xdist's default distribution ("load") ignores the xdist_group marks,
            # so a module's own server (dedicated_server(scope="module")), the browser module's
            # Chromium and test_claim_plan's volume were started once per worker that ran one
            # of their tests (seen in 4- and 6-worker runs); keep them grouped.
            option.dist = "loadgroup"
        return  # the command line said how
    if _one_process(option, [str(arg) for arg in config.args]):
        return
    option.numprocesses = "auto"
    option.dist = "loadgroup"


def _one_process(option: Any, args: list[str]) -> bool:
    """Whether a run the command line did not size runs in one process: a debugger, a listing,
    output to watch (-s), chosen test ids (one server), or a server of the caller's
    (``ZEROTH_PG_TEST_DSN``): every worker would share it, and on a shared server a transaction
    open in one test's database holds back the horizon by which PostgreSQL prunes on access in
    every other database's tables, which tests/plans counts (seen on 15 and 18: all five of
    test_fresh_database and test_generic_plans_all fail while another database holds one
    transaction open, and pass once it ends). ``-n N`` still runs N workers on it."""
    if (option.usepdb or getattr(option, "trace", False) or option.collectonly
            or getattr(option, "capture", None) == "no"):
        return True
    named = [arg for arg in args if not arg.startswith("-")]
    if named and all("::" in arg for arg in named):
        return True
    return bool(os.environ.get("ZEROTH_PG_TEST_DSN"))


_LOADGROUP_KEY = "zeroth_pg_loadgroup"


class _GroupedTestIds:
    """Keeps an xdist_group's tests on one worker under pytest 9: pytest-xdist (3.8) tags a
    grouped test by setting ``item._nodeid`` to ``<id>@<group>``, which pytest 9 no longer
    reads (a node's id is ``item._id``), so every group was silently spread over the workers —
    a module's dedicated server started once per worker, the browser module's Chromium too, the
    two HA soaks at the same time. Runs after xdist's own tagging and does it where it did not
    take."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                            for mark in item.iter_markers("xdist_group")})
            if names and "@" not in item.nodeid and _NodeId is not None and hasattr(item, "_id"):
                item._id = _NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller, for each worker it starts: whether the run distributes by group."""
    node.workerinput[_LOADGROUP_KEY] = node.config.option.dist == "loadgroup"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return WORKERS_PER_CPU * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                              else os.cpu_count() or 1)


def _selects_only_fast(config: pytest.Config) -> bool:
    """True when ``-m`` can select nothing outside the fast tier: ``-m fast`` or
    ``-m "fast and ..."``."""
    expression = " ".join(str(getattr(config.option, "markexpr", "") or "").split())
    return expression == "fast" or expression.startswith("fast and ")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m fast`` the modules outside the fast tier are not even imported: every xdist
    worker would collect all of them (seconds of CPU each) only for ``-m`` to deselect them."""
    if not _selects_only_fast(config):
        return None
    try:
        relative = collection_path.resolve().relative_to(_TESTS)
    except ValueError:  # not under tests/
        return None
    if not relative.parts:
        return None
    if len(relative.parts) == 1 and collection_path.is_file():
        return True if collection_path.name.startswith("test_") else None  # tests/test_*.py
    return True if relative.parts[0] not in FAST_TIERS else None


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
        # Under xdist the slow tests go first, so that none starts last and runs alone; the
        # rest spread over the run (_spread).
        spread = _spread(items)
        items.sort(key=lambda item: (item.get_closest_marker("slow") is None, spread[item.nodeid]))


def _spread(items: list[pytest.Item]) -> dict[str, tuple[float, int, int]]:
    """A sort key per test that spreads each module's tests evenly over the run, each module
    from its own starting point. The workers take tests in collection order, so a module's
    tests ran on all four workers at once: a module of tests that mostly wait (on worker
    processes, leases running out, a hung server: test_writable_server, test_hung_server,
    test_worker_leases, test_sweep_poisoning) left the cores a third to a half idle for
    10-20 s, several times a run. Spread, the waiting tests run beside the CPU-bound ones.

    A module whose tests share a module- or class-scoped fixture (its own server, a
    PgBouncer, a browser) stays together, where it starts (its slow tests, if some are and
    some are not, first with the others): apart, the fixture would be made again for every
    stretch. The same order in every worker (xdist requires it)."""
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)
    keys: dict[str, tuple[float, int, int]] = {}
    for position, module in enumerate(sorted(by_module)):
        tests, phase = by_module[module], position / len(by_module)
        together = any(definition.scope in ("module", "class", "package")
                       for item in tests
                       for definitions in _fixture_definitions(item)
                       for definition in definitions)
        for index, item in enumerate(tests):
            offset = 0.0 if together else (index + 0.5) / len(tests)
            keys[item.nodeid] = ((phase + offset) % 1.0, position, index)
    return keys


def _fixture_definitions(item: pytest.Item) -> list[Any]:
    """The definitions of the fixtures ``item`` uses (none for an item that is no function)."""
    info = getattr(item, "_fixtureinfo", None)
    return list(info.name2fixturedefs.values()) if info is not None else []


# ---------------------------------------------------------------------------------------------
# Where a parallel run's time goes: ZEROTH_PG_TEST_TIMELINE=<file> appends one JSON line per test
# (xdist worker, node id, start and end on the wall clock, the CPU seconds of the worker process,
# of its ended subprocesses and of its own test server), and
# the run ends with each worker's busy time and finish and the longest tests, so the long pole of
# a whole run (one worker still busy when the others are done) is seen, not guessed. .ci/run
# sets it.
TIMELINE_ENV = "ZEROTH_PG_TEST_TIMELINE"


def _children_cpu() -> float:
    """CPU seconds of the worker's child processes that have ended (the CLI and worker
    subprocesses a test starts)."""
    times = os.times()
    return times.children_user + times.children_system


_postmasters: dict[str, int] = {}


def _process_cpu(pid: int | str, *, ended_children: bool) -> float:
    """utime + stime of a process in clock ticks (with ``ended_children``: and those of the
    children it reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), here 11-14 after the name
    return sum(int(value) for value in fields[11:15 if ended_children else 13])


def _server_cpu(config: pytest.Config) -> float:
    """CPU seconds of this worker's test server so far: the postmaster's own, its ended
    backends' and its live children's (the checkpointer, walwriter, I/O workers, kept
    connections' backends), so a long-lived process's CPU lands on the tests it ran during, not
    on the one during which it ended. 0 before the server is up."""
    server = _session(config).server
    if server is None or not server.owned:
        return 0.0
    pid = _postmasters.get(server.dsn)
    if pid is None:
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            row = connection.execute("SELECT current_setting('data_directory')").fetchone()
        assert row is not None
        pid = _postmasters[server.dsn] = int(
            (Path(row[0]) / "postmaster.pid").read_text(encoding="ascii").split()[0])
    ticks = _process_cpu(pid, ended_children=True)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: ended backends only
        children = []
    ticks += sum(_process_cpu(child, ended_children=False) for child in children)
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    path = os.environ.get(TIMELINE_ENV)
    if not path:
        yield
        return
    start, cpu = time.time(), time.process_time()
    children, server = _children_cpu(), _server_cpu(item.config)
    yield
    line = json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                       "test": item.nodeid, "start": round(start, 3),
                       "end": round(time.time(), 3),
                       "cpu": round(time.process_time() - cpu, 3),
                       "children_cpu": round(_children_cpu() - children, 3),
                       "server_cpu": round(_server_cpu(item.config) - server, 3)})
    with open(path, "a", encoding="utf-8") as timeline:  # one short line: an atomic append
        timeline.write(line + "\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if path and not hasattr(session.config, "workerinput"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("", encoding="utf-8")  # this run's lines only


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if not path or hasattr(config, "workerinput") or not Path(path).is_file():
        return
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip()]
    if not rows:
        return
    origin = min(row["start"] for row in rows)
    write = terminalreporter.write_line
    terminalreporter.section(f"timeline ({path})")
    for worker in sorted({row["worker"] for row in rows}):
        mine = [row for row in rows if row["worker"] == worker]
        busy = sum(row["end"] - row["start"] for row in mine)
        cpu = sum(row["cpu"] for row in mine)
        children = sum(row.get("children_cpu", 0) for row in mine)
        server = sum(row.get("server_cpu", 0) for row in mine)
        last = max(row["end"] for row in mine) - origin
        write(f"{worker}: {len(mine)} tests, busy {busy:.0f} s (CPU: its own {cpu:.0f} s, "
              f"its subprocesses' {children:.0f} s, its server's {server:.0f} s), "
              f"last test ended at {last:.0f} s")
    for row in sorted(rows, key=lambda r: r["start"] - r["end"])[:15]:
        write(f"{row['end'] - row['start']:7.1f} s  {row['worker']}  "
              f"[{row['start'] - origin:.0f}-{row['end'] - origin:.0f} s]  {row['test']}")


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
