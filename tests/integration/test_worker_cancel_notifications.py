"""A zeroth_control notification is a hint that makes the worker ask the database (RunWorker in
the test's event loop, against a real database): forged notifications cancel nothing, a real
cancel request reaches the handler through the early renewal it triggers, and a cancel of the
same run id in another tenant stops nothing here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

import worker_probes
from helpers import unique_deployment, wait_until
from worker_probes import (
    FOREVER,
    stored_run,
    wait_for_status,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_forged_control_notifications_do_not_cancel_a_live_run(pool, spawn_worker, connect):
    dep = unique_deployment("harden")
    running = asyncio.Event()
    release = asyncio.Event()
    contexts: list[RunContext] = []

    async def handler(ctx: RunContext) -> Any:
        contexts.append(ctx)
        running.set()
        await release.wait()
        return {"cancel_requested": ctx.cancel_requested}

    # Renewals only every 20 s: a renewal within the test was asked for by a notification.
    worker = await spawn_worker(dep, handler, lease_duration=60.0)
    assert worker.notifier is not None
    await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(running.wait(), timeout=10)
    claimed = (await stored_run(pool, run))["lease_expires_at"]

    forger = await connect()
    key = await LeaseManager(pool).control_key(worker.worker_id)
    old_style = [{"type": "cancel", "run_id": str(run), "worker_id": worker.worker_id,
                  "lease_generation": 1},
                 {"type": "cancel", "run_id": str(run), "worker_id": worker.worker_id}]
    for payload in old_style:
        await forger.execute("SELECT pg_notify('zeroth_control', $1)", json.dumps(payload))
    for _ in range(5):
        await forger.execute("SELECT pg_notify('zeroth_control', $1)", key)

    async def renewed() -> bool:
        return bool((await stored_run(pool, run))["lease_expires_at"] > claimed)

    # Delivered in order: once the real key's renewal landed, every forgery has been read.
    await wait_until(renewed, "the renewal a notification asked for", within=10)
    assert worker.active_run_ids == [run]
    [ctx] = contexts
    assert not ctx.cancel_requested
    release.set()

    row = await wait_for_status(pool, run, "completed")
    assert row["output"] == {"cancel_requested": False}
    assert (row["cancel_requested_at"], row["error"], row["lease_generation"]) == (None, None, 1)
    assert not ctx.cancel_requested


async def test_a_real_cancel_request_stops_the_handler_through_the_early_renewal(
        pool, spawn_worker, connect):
    dep = unique_deployment("harden")
    running = asyncio.Event()
    stopped: list[bool] = []

    async def handler(ctx: RunContext) -> Any:
        running.set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            stopped.append(ctx.cancel_requested)
            raise
        return {"unreachable": True}

    # Renewals only every 20 s: the cancel must come through the renewal the NOTIFY asks for.
    worker = await spawn_worker(dep, handler, lease_duration=60.0)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(running.wait(), timeout=10)

    operator = await connect()
    requested_at = time.monotonic()
    assert (await LeaseManager(operator).request_cancel(run)).value == "cancel_requested"
    await wait_until(lambda: stopped, "the handler to see the cancel", within=10)
    print(f"\nreal cancel: the handler stopped {(time.monotonic() - requested_at) * 1000:.0f} ms "
          "after the request (routine renewal every 20 s)")
    assert stopped == [True]
    row = await wait_for_status(pool, run, "cancelled")
    assert (row["lease_worker_id"], row["error"], row["output"]) == (None, None, None)
    assert row["finished_at"] is not None
    await wait_until(lambda: worker.active_run_ids == [], "the slot to be freed", within=30)


async def test_a_cancel_of_the_same_run_id_in_another_tenant_stops_nothing_here(
        pool, spawn_worker):
    """Run ids are unique per scope only, so a cancel is matched by its scope too, not by run
    id, worker id and generation alone. Two workers with the same
    worker id (ids are labels, e.g. a host name) in two tenants each hold a run with the same
    caller-chosen run id at generation 1; a cancel in tenant t-2 stops t-2's run only."""
    dep = unique_deployment("harden")
    run_id = uuid4()
    running = {"t-1": asyncio.Event(), "t-2": asyncio.Event()}
    release = asyncio.Event()
    stopped: set[str] = set()

    def handler_for(tenant: str) -> Callable[[RunContext], Awaitable[Any]]:
        async def handler(ctx: RunContext) -> Any:
            running[tenant].set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                stopped.add(tenant)
                raise
            return {"tenant": tenant}
        return handler

    for tenant in ("t-1", "t-2"):
        worker = await spawn_worker(dep, handler_for(tenant), tenant_id=tenant,
                                    worker_id="host-1", lease_duration=60.0, poll_interval=0.05)
        await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    for tenant in ("t-1", "t-2"):
        await pool.execute(
            "SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2, run_id => $3)",
            dep, tenant, run_id)
    for event in running.values():
        await asyncio.wait_for(event.wait(), timeout=10)
    assert dict(await pool.fetch(
        "SELECT tenant_id, lease_generation FROM zeroth.runs WHERE run_id = $1", run_id)) == {
        "t-1": 1, "t-2": 1}

    assert await pool.fetchval(
        "SELECT zeroth.request_cancel(run_id => $1, tenant_id => 't-2')",
        run_id) == "cancel_requested"

    async def status_in(tenant: str) -> str:
        return await pool.fetchval(  # type: ignore[no-any-return]
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1 AND tenant_id = $2",
            run_id, tenant)

    async def t2_cancelled() -> bool:
        return await status_in("t-2") == "cancelled"

    await wait_until(t2_cancelled, "t-2's run to be cancelled", within=10)
    # The hint reached both workers (same worker id, same key): give t-1's worker a moment to
    # act on it wrongly before letting its handler finish.
    await asyncio.sleep(0.3)
    release.set()

    async def t1_finished() -> str | None:
        status = await status_in("t-1")
        return status if status not in ("pending", "running") else None

    assert await wait_until(t1_finished, "t-1's run to finish", within=10) == "completed"
    assert stopped == {"t-2"}
