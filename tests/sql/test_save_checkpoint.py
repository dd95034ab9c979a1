"""zeroth.save_checkpoint: the live holder of a running run appends (or replaces) a checkpoint;
the run row and the checkpoint row are written together or not at all."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from helpers import WORKER, at, claim, make_run, run_row

OTHER = "worker-b"
SOON = at(1)

SAVE = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
              data => $4::text::jsonb, checkpoint_id => $5, now_override => $6)"""


async def save(conn: asyncpg.Connection, run_id: UUID | None, data: Any, *,
               checkpoint_id: UUID | None = None, worker_id: str | None = WORKER,
               generation: int | None = 1, now: datetime = SOON) -> UUID | None:
    text = None if data is None else json.dumps(data)
    return await conn.fetchval(  # type: ignore[no-any-return]
        SAVE, run_id, worker_id, generation, text, checkpoint_id, now)


async def checkpoints(conn: asyncpg.Connection, run_id: UUID) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        """SELECT k.checkpoint_id, k.checkpoint_order, k.lease_generation, k.data, k.created_at
             FROM zeroth.checkpoints k WHERE k.run_id = $1 ORDER BY k.checkpoint_order""",
        run_id)
    return [{**dict(row), "data": json.loads(row["data"])} for row in rows]


async def recover(conn: asyncpg.Connection, now: datetime) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT run_id, lease_generation, recovery_checkpoint_id, checkpoint_data
             FROM zeroth_test.claim_orphaned(deployment_ref => 'deploy-a', worker_id => $1,
                  now_override => $2)""", OTHER, now)
    return [row for row in rows if row["run_id"] is not None]


async def rejected_with(conn: asyncpg.Connection, sqlstate: str, *args: Any,
                        **kwargs: Any) -> None:
    with pytest.raises(asyncpg.PostgresError) as raised:
        async with conn.transaction():
            await save(conn, *args, **kwargs)
    assert raised.value.sqlstate == sqlstate


class TestAppend:
    async def test_checkpoints_append_with_increasing_order(self, conn):
        lease = await make_run(conn, "running")

        ids = [await save(conn, lease.run_id, {"step": n}, now=at(n)) for n in (1, 2, 3)]

        assert all(isinstance(i, UUID) for i in ids)
        assert len(set(ids)) == 3
        assert await checkpoints(conn, lease.run_id) == [
            {"checkpoint_id": ids[n - 1], "checkpoint_order": n, "lease_generation": 1,
             "data": {"step": n}, "created_at": at(n)}
            for n in (1, 2, 3)]
        row = await run_row(conn, lease.run_id)
        assert row["checkpoint_seq"] == 3
        assert row["updated_at"] == at(3)

    async def test_caller_chosen_checkpoint_id_is_returned(self, conn):
        lease = await make_run(conn, "running")
        chosen = uuid4()

        assert await save(conn, lease.run_id, {"a": 1}, checkpoint_id=chosen) == chosen

        assert [k["checkpoint_id"] for k in await checkpoints(conn, lease.run_id)] == [chosen]

    async def test_saving_an_existing_id_replaces_it_and_makes_it_the_newest(self, conn):
        lease = await make_run(conn, "running")
        chosen = uuid4()
        await save(conn, lease.run_id, {"v": "old"}, checkpoint_id=chosen, now=at(1))
        other = await save(conn, lease.run_id, {"v": "middle"}, now=at(2))

        assert await save(conn, lease.run_id, {"v": "new"}, checkpoint_id=chosen,
                          now=at(3)) == chosen

        assert await checkpoints(conn, lease.run_id) == [
            {"checkpoint_id": other, "checkpoint_order": 2, "lease_generation": 1,
             "data": {"v": "middle"}, "created_at": at(2)},
            {"checkpoint_id": chosen, "checkpoint_order": 3, "lease_generation": 1,
             "data": {"v": "new"}, "created_at": at(3)},
        ]
        assert (await run_row(conn, lease.run_id))["checkpoint_seq"] == 3

    async def test_expiry_exactly_equal_to_now_still_saves(self, conn):
        lease = await make_run(conn, "running")

        assert await save(conn, lease.run_id, {"edge": True}, now=at(60)) is not None

        assert len(await checkpoints(conn, lease.run_id)) == 1


class TestCheckpointOfAnotherRun:
    async def test_checkpoint_id_of_another_run_raises_conflict_and_writes_nothing(self, conn):
        owner = await make_run(conn, "running", deployment_ref="d-owner")
        thief = await make_run(conn, "running")
        foreign = await save(conn, owner.run_id, {"mine": True})
        owner_before = (await run_row(conn, owner.run_id), await checkpoints(conn, owner.run_id))
        thief_before = await run_row(conn, thief.run_id)

        await rejected_with(conn, "ZP007", thief.run_id, {"stolen": True}, checkpoint_id=foreign,
                            now=at(2))

        assert (await run_row(conn, owner.run_id),
                await checkpoints(conn, owner.run_id)) == owner_before
        after = await run_row(conn, thief.run_id)
        assert after == thief_before
        assert after["checkpoint_seq"] == 0
        assert await checkpoints(conn, thief.run_id) == []

    async def test_a_checkpoint_id_is_the_scopes_own_another_tenant_neither_sees_nor_blocks_it(
            self, conn):
        """Checkpoint ids are per scope: a tenant saving a guessed id neither learns (ZP007)
        whether another tenant uses it nor, saving a predictable id first, makes the other
        tenant's save fail."""
        owner = await make_run(conn, "running", tenant_id="tenant-x")
        other = await make_run(conn, "running")
        chosen = uuid4()
        saved = await conn.fetchval(
            """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => 1,
                   data => '{"x": 1}', tenant_id => 'tenant-x', checkpoint_id => $3,
                   now_override => $4)""",
            owner.run_id, WORKER, chosen, at(1))
        assert saved == chosen

        # The same id in the default tenant: an ordinary save, no oracle, no interference.
        assert await save(conn, other.run_id, {"mine": True}, checkpoint_id=chosen) == chosen
        assert [k["data"] for k in await checkpoints(conn, owner.run_id)] == [{"x": 1}]
        assert [k["data"] for k in await checkpoints(conn, other.run_id)] == [{"mine": True}]
        # And the owner can still replace its own checkpoint by that id.
        assert await conn.fetchval(
            """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => 1,
                   data => '{"x": 2}', tenant_id => 'tenant-x', checkpoint_id => $3,
                   now_override => $4)""",
            owner.run_id, WORKER, chosen, at(2)) == chosen
        assert [k["data"] for k in await checkpoints(conn, owner.run_id)] == [{"x": 2}]
        assert [k["data"] for k in await checkpoints(conn, other.run_id)] == [{"mine": True}]


class TestFencedOut:
    async def test_fenced_out_caller_cannot_replace_an_existing_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        chosen = await save(conn, lease.run_id, {"v": "kept"})
        kept = await checkpoints(conn, lease.run_id)

        assert await save(conn, lease.run_id, {"v": "overwritten"}, checkpoint_id=chosen,
                          worker_id=OTHER) is None

        assert await checkpoints(conn, lease.run_id) == kept

class TestBadArguments:
    async def test_null_data_raises_invalid_argument(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP008", lease.run_id, None)

        assert await run_row(conn, lease.run_id) == before
        assert await checkpoints(conn, lease.run_id) == []

class TestRecovery:
    async def test_orphan_claim_hands_the_latest_checkpoint_to_the_next_owner(self, conn):
        lease = await make_run(conn, "running")
        ids = [await save(conn, lease.run_id, {"step": n}, now=at(n)) for n in (1, 2, 3)]

        recovered = await recover(conn, at(61))

        assert [(r["run_id"], r["lease_generation"], r["recovery_checkpoint_id"])
                for r in recovered] == [(lease.run_id, 2, ids[2])]
        assert json.loads(recovered[0]["checkpoint_data"]) == {"step": 3}
        assert await conn.fetchval(
            "SELECT zeroth.get_recovery_checkpoint_id(run_id => $1)", lease.run_id) == ids[2]

    async def test_replaced_checkpoint_is_the_one_recovered(self, conn):
        lease = await make_run(conn, "running")
        chosen = await save(conn, lease.run_id, {"v": 1}, now=at(1))
        await save(conn, lease.run_id, {"v": 2}, now=at(2))
        await save(conn, lease.run_id, {"v": 3}, checkpoint_id=chosen, now=at(3))

        recovered = await recover(conn, at(61))

        assert [r["recovery_checkpoint_id"] for r in recovered] == [chosen]
        assert json.loads(recovered[0]["checkpoint_data"]) == {"v": 3}

    async def test_new_owner_appends_after_the_old_owners_checkpoints(self, conn):
        lease = await make_run(conn, "running")
        await save(conn, lease.run_id, {"step": 1})
        assert [r["lease_generation"] for r in await recover(conn, at(61))] == [2]

        new = await save(conn, lease.run_id, {"step": 2}, worker_id=OTHER, generation=2,
                         now=at(62))

        saved = await checkpoints(conn, lease.run_id)
        assert [(k["checkpoint_order"], k["lease_generation"]) for k in saved] == [(1, 1), (2, 2)]
        assert saved[-1]["checkpoint_id"] == new

    async def test_retried_run_is_claimed_with_its_latest_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        latest = await save(conn, lease.run_id, {"step": 1})
        outcome = await conn.fetchval(
            """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => 1,
                   retry_base_seconds => 0, retry_max_seconds => 0, now_override => $3)""",
            lease.run_id, WORKER, at(2))
        assert outcome == "retry_scheduled"

        claimed = await claim(conn, now=at(3))

        assert [(r["run_id"], r["recovery_checkpoint_id"]) for r in claimed] == [
            (lease.run_id, latest)]
