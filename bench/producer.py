"""The producers, in their own process so the consumer's event loop cannot delay them.

    python -m bench.producer SYSTEM DSN N GAP          # wakeup latency: N runs GAP s apart
    python -m bench.producer --flood SYSTEM DSN P S    # many writers: P sessions for S seconds

Enqueues N runs of SYSTEM ``GAP`` seconds apart, each in its own transaction through that
system's own enqueue path, and prints ``<job key> <instant>`` per run, where the instant is
``time.perf_counter()`` right after the enqueue came back committed. On Linux perf_counter reads
CLOCK_MONOTONIC, which is shared by every process, so the consumer's handler-start instants
compare with these directly.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

Enqueue = Callable[[], Awaitable[Any]]


async def _sql(dsn: str, statement: str) -> Enqueue:
    conn = await asyncpg.connect(dsn)
    return lambda: conn.fetchval(statement)


async def _pgqueuer(dsn: str) -> Enqueue:
    from pgqueuer import AsyncpgDriver, Queries

    queries = Queries(AsyncpgDriver(await asyncpg.connect(dsn)))

    async def one() -> Any:
        return (await queries.enqueue("noop", None, 0))[0]

    return one


async def _procrastinate(dsn: str, stack: list[Any]) -> Enqueue:
    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App in __main__" notice
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=1, max_size=1))
    task = app.task(name="noop", queue="bench")(lambda: None)
    opened = app.open_async()
    await opened.__aenter__()
    stack.append(opened)
    return lambda: task.defer_async()


async def _absurd(dsn: str, stack: list[Any]) -> Enqueue:
    from absurd_sdk import AsyncAbsurd

    app = AsyncAbsurd(dsn, queue_name="bench")
    stack.append(app)

    async def one() -> Any:
        return (await app.spawn("noop", {}, queue="bench"))["task_id"]

    return one


async def _dbos(dsn: str, stack: list[Any]) -> Enqueue:
    from bench.dbos_peer import APP_VERSION, QUEUE, WORKFLOW, client_for

    dbos = client_for(dsn)
    stack.append(dbos)
    options: Any = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "app_version": APP_VERSION}

    async def one() -> Any:
        return (await dbos.enqueue_async(options)).get_workflow_id()

    return one


async def _chancy(dsn: str, stack: list[Any]) -> Enqueue:
    from chancy import Chancy, Job

    from bench.chancy_jobs import noop

    log = logging.getLogger("bench.chancy")
    log.setLevel(logging.WARNING)
    app = Chancy(dsn, min_connection_pool_size=1, max_connection_pool_size=1, log=log)
    await app.__aenter__()
    stack.append(app)
    job = Job.from_func(noop, queue="bench")

    async def one() -> Any:
        return (await app.push(job)).identifier

    return one


async def _close(opened: Any) -> None:
    if hasattr(opened, "__aexit__"):
        await opened.__aexit__(None, None, None)
    elif hasattr(opened, "destroy"):
        opened.destroy()
    else:
        await opened.close()


STATEMENTS = {
    "zeroth": "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'bench')",
    "raw": """WITH j AS (INSERT INTO raw_jobs DEFAULT VALUES RETURNING id)
              SELECT j.id FROM j, pg_notify('raw_wakeup', '')""",
    "seed": """INSERT INTO seed_runs (tenant_id, workspace_scope, run_id, deployment_ref, status)
               VALUES ('default', 'null', gen_random_uuid(), 'bench', 'PENDING')
               RETURNING run_id""",
}


async def _enqueuer(system: str, dsn: str, stack: list[Any]) -> Enqueue:
    """One session's enqueue of one run, in its own transaction, through the system's path."""
    if system in STATEMENTS:
        return await _sql(dsn, STATEMENTS[system])
    if system == "pgqueuer":
        return await _pgqueuer(dsn)
    if system == "procrastinate":
        return await _procrastinate(dsn, stack)
    if system in ("absurd", "dbos", "chancy"):
        return await {"absurd": _absurd, "dbos": _dbos, "chancy": _chancy}[system](dsn, stack)
    raise SystemExit(f"unknown system {system!r}")


async def flood(system: str, dsn: str, sessions: int, seconds: float) -> None:
    """``sessions`` concurrent writers, each enqueueing single runs in its own transaction as
    fast as it can, like the request handlers of a web service; prints
    ``<runs committed> <seconds>`` measured from the moment every session is connected."""
    stack: list[Any] = []
    writers = [await _enqueuer(system, dsn, stack) for _ in range(sessions)]
    for one in writers:
        await one()  # warm each connection
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    count = 0
    started = time.perf_counter()
    stop = started + seconds

    async def write(one: Enqueue) -> None:
        nonlocal count
        while time.perf_counter() < stop:
            await one()
            count += 1

    await asyncio.gather(*(write(one) for one in writers))
    print(count, time.perf_counter() - started, flush=True)
    for opened in stack:
        await _close(opened)


async def main(system: str, dsn: str, n: int, gap: float) -> None:
    stack: list[Any] = []
    one = await _enqueuer(system, dsn, stack)
    await one()  # warm the connection and prepared statements; the consumer skips this key
    print("ready", flush=True)
    for _ in range(n):
        key = await one()
        print(key, time.perf_counter(), flush=True)
        await asyncio.sleep(gap)
    for opened in stack:
        await _close(opened)


if __name__ == "__main__":
    if sys.argv[1] == "--flood":
        asyncio.run(flood(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
    else:
        asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
