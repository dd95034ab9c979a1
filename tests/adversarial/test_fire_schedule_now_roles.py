"""zeroth.fire_schedule_now (the dashboard's and the CLI's "Fire now", with its idempotency key,
issue 31) on a database exactly as shipped: only a DBA (zeroth_owner) fires a schedule by hand. A
LOGIN role with no grant, a zeroth_worker member and a zeroth_reader member cannot, with a key or
without, and make no run; nor can a worker plant the run a key would return."""

from __future__ import annotations

import asyncpg
import pytest

CALLS = (
    "SELECT * FROM zeroth.fire_schedule_now(name => 's', tenant_id => 'acme')",
    "SELECT * FROM zeroth.fire_schedule_now(name => 's', tenant_id => 'acme', "
    "idempotency_key => 'k')",
    "SELECT * FROM zeroth.fire_schedule_now('s', 'acme', NULL, 'k')",
)


@pytest.mark.parametrize("kind", ["nobody", "worker", "reader"])
@pytest.mark.parametrize("call", CALLS)
async def test_no_role_but_a_dba_fires_a_schedule_by_hand(login, admin, kind, call):
    await admin.execute("SELECT zeroth.create_schedule(name => 's', deployment_ref => 'd', "
                        "tenant_id => 'acme', interval_seconds => 3600)")
    role = await login(kind)
    with pytest.raises(asyncpg.PostgresError) as caught:
        await role.fetch(call)
    assert caught.value.sqlstate == "42501"
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0
    # The DBA's own fire with that key is a new run, not anything the role left behind.
    fired = await admin.fetchrow("SELECT * FROM zeroth.fire_schedule_now(name => 's', "
                                 "tenant_id => 'acme', idempotency_key => 'k')")
    assert fired["created"] is True


async def test_a_worker_cannot_plant_the_run_a_fire_key_returns(login, admin):
    schedule_id = await admin.fetchval(
        "SELECT schedule_id FROM zeroth.create_schedule(name => 's', deployment_ref => 'd', "
        "tenant_id => 'acme', interval_seconds => 3600)")
    worker = await login("worker")
    with pytest.raises(asyncpg.PostgresError) as caught:
        await worker.fetch("SELECT * FROM zeroth.enqueue_run(deployment_ref => 'd', "
                           "tenant_id => 'acme', idempotency_key => $1)",
                           f"zeroth-schedule:{schedule_id}:manual:key:k")
    assert caught.value.sqlstate == "ZP011"
    fired = await admin.fetchrow("SELECT * FROM zeroth.fire_schedule_now(name => 's', "
                                 "tenant_id => 'acme', idempotency_key => 'k')")
    assert fired["created"] is True
