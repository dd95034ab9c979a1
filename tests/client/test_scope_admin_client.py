"""LeaseManager's mirrors of the dashboard's admin calls over a real pool: set_scope_limits
(keeps what is not given, 0 / '' remove, ZP008 → InvalidArgumentError) and fire_schedule_now
(one run now, the schedule's cadence untouched; ZP009 → ScheduleNotFoundError)."""

from __future__ import annotations

import pytest

from zeroth_pg import InvalidArgumentError, LeaseManager, ScheduleNotFoundError
from zeroth_pg.types import ScopeLimits


async def test_set_scope_limits_writes_keeps_and_removes(pool):
    lm = LeaseManager(pool)
    await lm.set_rate_limit("k", 5, 1.0)
    await lm.set_scope_limits("mail", tenant_id="acme", max_concurrency=3, rate_limit="k")
    row = await lm.set_scope_limits("mail", tenant_id="acme", paused=True)
    assert row == ScopeLimits(tenant_id="acme", workspace_id=None, deployment_ref="mail",
                              paused=True, max_concurrency=3, weight=1, rate_limit="k", note=None)
    row = await pool.fetchrow("SELECT paused, max_concurrency, weight, rate_limit "
                              "FROM zeroth.scope_limits WHERE deployment_ref = 'mail'")
    assert tuple(row) == (True, 3, 1, "k")
    await lm.set_scope_limits("mail", tenant_id="acme", max_concurrency=0, rate_limit="")
    row = await pool.fetchrow("SELECT paused, max_concurrency, rate_limit "
                              "FROM zeroth.scope_limits WHERE deployment_ref = 'mail'")
    assert tuple(row) == (True, None, None)
    with pytest.raises(InvalidArgumentError, match="weight"):
        await lm.set_scope_limits("mail", tenant_id="acme", weight=0)
    with pytest.raises(InvalidArgumentError, match="no rate limit named"):
        await lm.set_scope_limits("mail", tenant_id="acme", rate_limit="missing")


async def test_fire_schedule_now_makes_one_run_and_leaves_the_cadence(pool):
    lm = LeaseManager(pool)
    created = await lm.create_schedule("hourly", "reports", interval_seconds=3600,
                                       tenant_id="acme")
    fire = await lm.fire_schedule_now("hourly", tenant_id="acme")
    assert (fire.schedule_id, fire.created) == (created.schedule_id, True)
    status = await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                 fire.run_id)
    assert status == "pending"
    (after,) = await lm.list_schedules(tenant_id="acme")
    assert (after.next_fire_at, after.fire_count, after.paused) == (
        created.next_fire_at, 0, False)
    with pytest.raises(ScheduleNotFoundError):
        await lm.fire_schedule_now("hourly")  # another tenant's name
