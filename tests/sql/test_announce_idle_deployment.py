"""zeroth.announce_idle_deployment / announce_busy_deployment / deployment_wakeup_key: the
wakeup gate of a whole deployment, for fleet workers that serve every scope of it.

What must hold: while a session holds the deployment's stripes, a writer in ANY scope of that
deployment notifies with the deployment's key (and only then, and never for another
deployment); a writer that skipped its NOTIFY holds its stripe until it commits, so the claim
after the gain finds the run; bad input changes nothing. Committed sessions on a fresh database.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from test_announce_idle import heard_before_sentinel

ALL = list(range(8))


async def idle(conn: asyncpg.Connection, deployment_ref: str = "fleet") -> list[int]:
    return list(await conn.fetchval("SELECT zeroth.announce_idle_deployment($1)",
                                    deployment_ref))


async def busy(conn: asyncpg.Connection, deployment_ref: str = "fleet") -> int:
    return int(await conn.fetchval("SELECT zeroth.announce_busy_deployment($1)", deployment_ref))


async def key(conn: asyncpg.Connection, deployment_ref: str = "fleet") -> str:
    return await conn.fetchval("SELECT zeroth.deployment_wakeup_key($1)",  # type: ignore[no-any-return]
                               deployment_ref)


async def enqueue(conn: asyncpg.Connection, tenant: str, deployment_ref: str = "fleet",
                  workspace: str | None = None) -> None:
    await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2, "
                       "workspace_id => $3)", deployment_ref, tenant, workspace)


async def listening(conn: asyncpg.Connection) -> asyncio.Queue[str]:
    queue: asyncio.Queue[str] = asyncio.Queue()
    await conn.add_listener("zeroth_wakeup", lambda *a: queue.put_nowait(a[3]))
    return queue


class TestGate:
    async def test_a_writer_in_any_scope_notifies_the_deployment_while_it_is_held(self, connect):
        fleet, writer = await connect(), await connect()
        queue = await listening(fleet)
        assert await idle(fleet) == ALL
        for tenant, workspace in (("acme", None), ("globex", "w1"), ("initech", None)):
            await enqueue(writer, tenant, workspace=workspace)
        assert await heard_before_sentinel(queue, writer) == [await key(writer)] * 3

    async def test_nobody_waiting_means_no_notify_and_busy_lets_go(self, connect):
        fleet, writer = await connect(), await connect()
        queue = await listening(fleet)
        await enqueue(writer, "acme")
        assert await heard_before_sentinel(queue, writer) == []
        await idle(fleet)
        assert await busy(fleet) == 8
        await enqueue(writer, "acme")
        assert await heard_before_sentinel(queue, writer) == []

    async def test_another_deployments_writers_do_not_notify_it(self, connect):
        fleet, writer = await connect(), await connect()
        queue = await listening(fleet)
        await idle(fleet, "fleet")
        await enqueue(writer, "acme", deployment_ref="elsewhere")
        assert await heard_before_sentinel(queue, writer) == []

    async def test_the_keys_differ_per_deployment_and_from_every_scope_key(self, connect):
        conn = await connect()
        scope_key = await conn.fetchval(
            "SELECT zeroth.wakeup_key(deployment_ref => 'fleet', tenant_id => 'default')")
        assert len({await key(conn, "fleet"), await key(conn, "other"), scope_key}) == 3

    async def test_a_writer_that_did_not_notify_holds_its_stripe_until_commit(self, connect):
        fleet, writer = await connect(), await connect()
        transaction = writer.transaction()
        await transaction.start()
        await enqueue(writer, "acme")  # nobody waits: takes its stripe of both gates, shared
        held = await idle(fleet)
        assert len(held) == 7  # the writer's stripe is not free until it commits
        await transaction.commit()
        assert await idle(fleet) == ALL  # gained: the fleet worker claims once more
        assert await fleet.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = 'fleet'") == 1

    async def test_a_scope_worker_and_a_fleet_worker_are_both_notified(self, connect):
        fleet, single, writer = await connect(), await connect(), await connect()
        fleet_queue, single_queue = await listening(fleet), await listening(single)
        await idle(fleet)
        assert len(await single.fetchval(
            "SELECT zeroth.announce_idle(deployment_ref => 'fleet', tenant_id => 'acme')")) == 8
        await enqueue(writer, "acme")
        scope_key = await writer.fetchval(
            "SELECT zeroth.wakeup_key(deployment_ref => 'fleet', tenant_id => 'acme')")
        assert sorted(await heard_before_sentinel(fleet_queue, writer)) == sorted(
            [scope_key, await key(writer)])
        assert sorted(await heard_before_sentinel(single_queue, writer)) == sorted(
            [scope_key, await key(writer)])


class TestBadInput:
    @pytest.mark.parametrize("function", ["announce_idle_deployment", "announce_busy_deployment",
                                          "deployment_wakeup_key"])
    @pytest.mark.parametrize("deployment_ref", [None, "", "x" * 201])
    async def test_zp008_and_no_lock_taken(self, connect, function, deployment_ref):
        conn, other = await connect(), await connect()
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetchval(f"SELECT zeroth.{function}($1)", deployment_ref)
        assert caught.value.sqlstate == "ZP008"
        assert await other.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1",
            conn.get_server_pid()) == 0
