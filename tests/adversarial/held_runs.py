"""A run held by a worker role on a database as shipped (no test clock), and its lease lapsing
on the real clock: shared by the role modules of tests/adversarial.

A lease that must lapse is not claimed short: what the holder does while it holds the lease
(start a child, record a step, append an event) would then race the lease on a loaded machine
and be refused now and then. The run is claimed with a long lease, the holder does its work, and
:func:`lapse` then has the holder renew its own lease for a millisecond and waits until the
database's clock has passed that expiry: the lease still ends on the real clock, when the test
says, however slow the machine.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from helpers import wait_until

ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1)"
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd',
               worker_id => $1, tenant_id => $2, lease_seconds => $3) WHERE run_id IS NOT NULL"""
ORPHANED = """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(deployment_ref => 'd',
                  worker_id => $1, tenant_id => $2, grace_seconds => 0) WHERE run_id IS NOT NULL"""
SHORTEN = """SELECT zeroth.renew_lease(run_id => $1, worker_id => $2, generation => $3,
                 tenant_id => $4, lease_seconds => 0.001)"""
LAPSED = """SELECT lease_expires_at < clock_timestamp() FROM zeroth.runs
             WHERE run_id = $1 AND lease_generation = $2"""


async def held_run(admin: asyncpg.Connection, worker: asyncpg.Connection, *,
                   tenant: str = "acme", worker_id: str = "w1",
                   lease_seconds: float = 60) -> tuple[Any, int]:
    """A run of deployment 'd' in ``tenant``, claimed and started by ``worker`` as
    ``worker_id``: (run_id, generation)."""
    run_id = await admin.fetchval(ENQUEUE, tenant)
    (row,) = await worker.fetch(CLAIM, worker_id, tenant, lease_seconds)
    assert row["run_id"] == run_id
    return run_id, row["lease_generation"]


async def lapse(admin: asyncpg.Connection, worker: asyncpg.Connection, run_id: Any,
                generation: int, *, tenant: str = "acme", worker_id: str = "w1") -> None:
    """The holder's live lease ends on the real clock: renewed by its holder for 1 ms, then
    awaited until the database's clock is past it."""
    assert await worker.fetchval(SHORTEN, run_id, worker_id, generation, tenant) is True

    async def lapsed() -> bool:
        return bool(await admin.fetchval(LAPSED, run_id, generation))

    await wait_until(lapsed, "the 1 ms lease to lapse", within=60)
