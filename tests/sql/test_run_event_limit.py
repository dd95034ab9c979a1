"""The bound on a run's events (issue 34): zeroth.append_run_event refuses the live holder's
event past its deployment's max_run_events (NULL or no deployment row: 10,000; END not counted)
with ZP014 and stores nothing; a stale holder at the bound gets NULL as for any fenced append.
Roles and the real clock: tests/adversarial/test_run_event_limit_roles.py; two appenders at the
last place: tests/races/test_run_event_limit_races.py.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row

APPEND = """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => $3,
               name => 'token', data => $4::text::jsonb, now_override => $5)"""


async def append(conn: asyncpg.Connection, run_id: UUID, *, worker: str = WORKER,
                 generation: int = 1, data: Any = 1, now: Any = None) -> Any:
    return await conn.fetchval(APPEND, run_id, worker, generation, json.dumps(data),
                               now or at(5))


async def fill(conn: asyncpg.Connection, run_id: UUID, count: int) -> None:
    """`count` events stored directly (as the owner), numbered 1..count, as appends would."""
    await conn.execute(
        """INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id, kind, name,
                                         data, lease_generation, created_at)
           SELECT r.tenant_id, r.workspace_key, r.run_id, g, 'event', 'token', '1', 1, now()
             FROM zeroth.runs r, generate_series(1, $2) AS g WHERE r.run_id = $1""",
        run_id, count)


async def stored(conn: asyncpg.Connection, run_id: UUID) -> tuple[int, int, str | None]:
    row = await conn.fetchrow(
        """SELECT count(*) AS n, max(event_id) AS last,
                  (SELECT kind FROM zeroth.run_events l WHERE l.run_id = $1
                    ORDER BY event_id DESC LIMIT 1) AS last_kind
             FROM zeroth.run_events e WHERE e.run_id = $1""", run_id)
    return int(row["n"]), int(row["last"] or 0), row["last_kind"]


async def refused(conn: asyncpg.Connection, run_id: UUID, **kwargs: Any) -> str | None:
    try:
        async with conn.transaction():
            await append(conn, run_id, **kwargs)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


async def set_bound(conn: asyncpg.Connection, bound: int | None) -> None:
    await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await conn.execute("UPDATE zeroth.deployments SET max_run_events = $2 "
                       "WHERE deployment_ref = $1", DEPLOYMENT, bound)


class TestDefaultBound:
    async def test_a_run_without_a_deployment_row_holds_ten_thousand_events_then_zp014(
            self, conn):
        lease = await make_run(conn, "running")
        await fill(conn, lease.run_id, 9999)
        before = dict(await run_row(conn, lease.run_id))

        assert await append(conn, lease.run_id) == 10000
        assert await refused(conn, lease.run_id) == "ZP014"

        assert await stored(conn, lease.run_id) == (10000, 10000, "event")
        after = dict(await run_row(conn, lease.run_id))
        assert {k: v for k, v in after.items() if k != "updated_at"} == {
            k: v for k, v in before.items() if k != "updated_at"}

    async def test_a_deployment_row_with_no_bound_set_holds_ten_thousand(self, conn):
        await set_bound(conn, None)
        lease = await make_run(conn, "running")
        await fill(conn, lease.run_id, 10000)

        assert await refused(conn, lease.run_id) == "ZP014"
        assert await stored(conn, lease.run_id) == (10000, 10000, "event")


class TestDeploymentBound:
    async def test_a_deployments_max_run_events_bounds_each_of_its_runs(self, conn):
        await set_bound(conn, 120)
        lease = await make_run(conn, "running")
        other = await make_run(conn, "running")
        await fill(conn, lease.run_id, 119)

        assert await append(conn, lease.run_id) == 120
        assert await refused(conn, lease.run_id) == "ZP014"
        # the bound is per run: another run of the deployment appends on
        assert await append(conn, other.run_id) == 1
        assert await stored(conn, lease.run_id) == (120, 120, "event")

    async def test_a_bound_raised_by_a_dba_lets_the_run_append_again(self, conn):
        await set_bound(conn, 100)
        lease = await make_run(conn, "running")
        await fill(conn, lease.run_id, 100)
        assert await refused(conn, lease.run_id) == "ZP014"

        await set_bound(conn, 200)

        assert await append(conn, lease.run_id) == 101

    @pytest.mark.parametrize("bound", [0, 99, 10000001, -1])
    async def test_a_bound_out_of_range_is_refused_by_the_check(self, conn, bound):
        await set_bound(conn, None)
        with pytest.raises(asyncpg.CheckViolationError):
            await set_bound(conn, bound)


class TestEndAndFence:
    async def test_a_run_at_its_bound_still_ends_with_its_end(self, conn):
        await set_bound(conn, 100)
        lease = await make_run(conn, "running")
        await fill(conn, lease.run_id, 100)
        assert await refused(conn, lease.run_id) == "ZP014"

        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => 1,
                   output => '{}', now_override => $3)""", lease.run_id, WORKER, at(6))

        assert await stored(conn, lease.run_id) == (101, 101, "end")

    async def test_a_stale_holder_at_the_bound_gets_null_not_zp014(self, conn):
        await set_bound(conn, 100)
        lease = await make_run(conn, "running")
        await fill(conn, lease.run_id, 100)

        assert await append(conn, lease.run_id, worker="intruder") is None
        assert await append(conn, lease.run_id, generation=7) is None
        # its lease lapsed (LEASE seconds after T0): fenced out, whatever the bound
        assert await append(conn, lease.run_id, now=at(10_000)) is None
        assert await stored(conn, lease.run_id) == (100, 100, "event")
