"""zeroth.enqueue_runs: batch enqueue in input order, all-or-nothing, one NOTIFY per transaction."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from helpers import (
    DEFAULT_SCOPE,
    DEPLOYMENT,
    T0,
    Scope,
    at,
    claim,
    enqueue,
    run_row,
    wakeup_key,
    wakeup_listener,
)

NOTIFY_TIMEOUT = 10  # only guards against a hang; no assertion depends on it


async def enqueue_batch(conn: asyncpg.Connection, runs: Any, *, deployment_ref: str = DEPLOYMENT,
                        tenant_id: str | None = None, workspace_id: str | None = None,
                        now: Any = T0) -> list[asyncpg.Record]:
    """zeroth.enqueue_runs; ``runs`` is JSON-encoded here (anything, so bad shapes can be sent)."""
    return await conn.fetch(  # type: ignore[no-any-return]
        """SELECT ordinality, run_id, created, status
             FROM zeroth_test.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb,
                                      tenant_id => $3, workspace_id => $4, now_override => $5)""",
        deployment_ref, json.dumps(runs), tenant_id, workspace_id, now)


async def snapshot(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT * FROM zeroth.runs r ORDER BY r.tenant_id, r.workspace_key, r.run_id")
    return [dict(row) for row in rows]


class TestInputOrder:
    async def test_results_come_back_in_input_order(self, conn):
        run_ids = [uuid4() for _ in range(5)]
        # Priorities deliberately out of order: results follow the input, not the claim order.
        items = [{"run_id": str(r), "priority": p} for r, p in zip(run_ids, [1, 9, -3, 5, 0],
                                                                     strict=True)]
        rows = await enqueue_batch(conn, items)
        assert [row["ordinality"] for row in rows] == [1, 2, 3, 4, 5]
        assert [row["run_id"] for row in rows] == run_ids
        assert all(row["created"] and row["status"] == "pending" for row in rows)

    async def test_a_batch_is_claimed_in_input_order(self, conn):
        # Runs with a key are inserted in key order (so concurrent batches lock keys in one
        # order), the others in input order; at equal priority and run_after the claims take a
        # batch in input order either way: the k-th run is created k - 1 µs after the batch's
        # time, its own claim-order position (issue 30: a claim floor can name any run of it).
        items = [{"idempotency_key": key} for key in ("k5", "k3", "k9", "k1")]
        items += [{}, {"run_id": str(uuid4())}, {}]
        rows = await enqueue_batch(conn, items)
        created = [(await run_row(conn, row["run_id"]))["created_at"] for row in rows]
        assert created == [T0 + timedelta(microseconds=k) for k in range(len(items))]
        claimed = [row["run_id"] for row in await claim(conn, batch_size=len(items),
                                                         now=T0 + timedelta(seconds=1))]
        assert claimed == [row["run_id"] for row in rows]

    async def test_generated_run_ids_map_to_their_items(self, conn):
        rows = await enqueue_batch(conn, [{"payload": {"i": i}} for i in range(4)])
        for row in rows:
            stored = await run_row(conn, row["run_id"])
            assert json.loads(stored["payload"]) == {"i": row["ordinality"] - 1}

    async def test_empty_batch_returns_no_rows_and_inserts_nothing(self, conn):
        assert await enqueue_batch(conn, []) == []
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0


class TestIdempotency:
    async def test_mix_of_new_and_existing_keys(self, conn):
        existing = await enqueue(conn, idempotency_key="k1", payload={"old": True})
        rows = await enqueue_batch(conn, [
            {"idempotency_key": "k1", "payload": {"old": False}},
            {"idempotency_key": "k2"},
            {},
        ])
        assert [row["created"] for row in rows] == [False, True, True]
        assert rows[0]["run_id"] == existing
        assert len({row["run_id"] for row in rows}) == 3
        assert json.loads((await run_row(conn, existing))["payload"]) == {"old": True}
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 3

    async def test_repeated_key_within_one_batch_returns_the_first_item(self, conn):
        rows = await enqueue_batch(conn, [{"idempotency_key": "k"}, {"idempotency_key": "k"}])
        assert [row["created"] for row in rows] == [True, False]
        assert rows[0]["run_id"] == rows[1]["run_id"]

    async def test_existing_caller_run_id_is_returned_not_replaced(self, conn):
        run_id = uuid4()
        await enqueue(conn, run_id=run_id, payload={"v": 1})
        rows = await enqueue_batch(conn, [{"run_id": str(run_id), "payload": {"v": 2}}])
        assert (rows[0]["run_id"], rows[0]["created"]) == (run_id, False)
        assert json.loads((await run_row(conn, run_id))["payload"]) == {"v": 1}

    async def test_keys_are_scoped_to_the_batch_scope(self, conn):
        default_scope = await enqueue(conn, idempotency_key="k")
        rows = await enqueue_batch(conn, [{"idempotency_key": "k"}], tenant_id="t1",
                                   workspace_id="w1")
        assert rows[0]["created"] is True
        assert rows[0]["run_id"] != default_scope


class TestPerItemFields:
    async def test_every_item_key_is_stored(self, conn):
        run_id = uuid4()
        rows = await enqueue_batch(conn, [{
            "run_id": str(run_id), "payload": {"x": 1}, "priority": 4,
            "run_after": at(120).isoformat(), "max_attempts": 5, "idempotency_key": "idem",
            "metadata": {"m": "v"}, "thread_id": "thread-9",
        }], tenant_id="t1", workspace_id="w1")
        assert rows[0]["run_id"] == run_id
        row = await run_row(conn, run_id, tenant_id="t1", workspace_id="w1")
        assert json.loads(row["payload"]) == {"x": 1}
        assert row["priority"] == 4
        assert row["run_after"] == at(120)
        assert row["max_attempts"] == 5
        assert row["idempotency_key"] == "idem"
        assert json.loads(row["metadata"]) == {"m": "v"}
        assert row["thread_id"] == "thread-9"
        assert row["deployment_ref"] == DEPLOYMENT
        assert (row["tenant_id"], row["workspace_id"]) == ("t1", "w1")
        assert row["created_at"] == T0

    async def test_absent_item_keys_take_enqueue_run_defaults(self, conn):
        rows = await enqueue_batch(conn, [{}])
        row = await run_row(conn, rows[0]["run_id"])
        assert json.loads(row["payload"]) == {}
        assert json.loads(row["metadata"]) == {}
        assert row["priority"] == 0
        assert row["run_after"] == T0
        assert row["max_attempts"] == 3
        assert row["idempotency_key"] is None
        assert row["thread_id"] is None

    async def test_items_keep_their_own_fields(self, conn):
        rows = await enqueue_batch(conn, [
            {"priority": 1, "thread_id": "a"}, {"priority": 2, "thread_id": "b"}])
        stored = [await run_row(conn, row["run_id"]) for row in rows]
        assert [(r["priority"], r["thread_id"]) for r in stored] == [(1, "a"), (2, "b")]


class TestWholeBatchRejected:
    @pytest.mark.parametrize(
        "bad_item",
        [
            pytest.param({"idempotency_key": ""}, id="empty-idempotency-key"),
            pytest.param({"run_id": "not-a-uuid"}, id="bad-uuid"),
            pytest.param({"run_after": "not a timestamp"}, id="bad-timestamp"),
            pytest.param({"run_after": "2030-13-45T99:00:00Z"}, id="out-of-range-timestamp"),
            pytest.param({"run_after": "infinity"}, id="infinite-run-after"),
            pytest.param(5, id="number-item"),
            pytest.param("text", id="string-item"),
            pytest.param([{}], id="array-item"),
            pytest.param(None, id="null-item"),
            pytest.param({"priority": "high"}, id="non-integer-priority"),
            pytest.param({"priority": 2**40}, id="priority-out-of-range"),
            pytest.param({"max_attempts": 0}, id="max-attempts-0"),
            pytest.param({"max_attempts": 1001}, id="max-attempts-1001"),
            pytest.param({"payload": [1]}, id="payload-not-object"),
            pytest.param({"metadata": "m"}, id="metadata-not-object"),
            pytest.param({"unknown_key": 1}, id="unknown-key"),
            # Not 22023: every data exception of an item is the item's ZP008.
            pytest.param({"run_after": "2024-01-01 00:00 Mars/Olympus"}, id="unknown-time-zone"),
        ])
    async def test_one_bad_item_rejects_the_batch_with_zp008(self, conn, bad_item):
        await enqueue(conn, idempotency_key="existing")
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await enqueue_batch(conn, [{"idempotency_key": "a"}, bad_item,
                                           {"idempotency_key": "c"}])
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before

    @pytest.mark.parametrize(
        "runs",
        [
            pytest.param({"payload": {}}, id="object"),
            pytest.param("runs", id="string"),
            pytest.param(None, id="json-null"),
        ])
    async def test_runs_that_is_not_an_array_raises_zp008(self, conn, runs):
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await enqueue_batch(conn, runs)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before

    @pytest.mark.parametrize(
        "deployment_ref", [pytest.param("", id="empty"), pytest.param("d" * 201, id="201-chars")])
    async def test_bad_deployment_raises_zp008(self, conn, deployment_ref):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await enqueue_batch(conn, [{}], deployment_ref=deployment_ref)
        assert caught.value.sqlstate == "ZP008"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_a_key_with_the_schedules_prefix_raises_zp011_naming_the_item(self, conn):
        # fire_due_schedules' own keys; the whole batch is refused.
        before = await snapshot(conn)
        for items in ([{"idempotency_key": "a"}, {"idempotency_key": "zeroth-schedule:x:y"}],
                      [{}, {"thread_id": "t", "idempotency_key": "zeroth-schedule:x:y"}]):
            with pytest.raises(asyncpg.PostgresError) as caught:
                async with conn.transaction():
                    await enqueue_batch(conn, items)
            assert caught.value.sqlstate == "ZP011"
            assert "runs[2].idempotency_key" in caught.value.message
        assert await snapshot(conn) == before

    async def test_workspace_without_tenant_raises_zp006(self, conn):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await enqueue_batch(conn, [{}, {}], workspace_id="w1")
        assert caught.value.sqlstate == "ZP006"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    @pytest.mark.parametrize(
        ("kwargs", "sqlstate"),
        [
            pytest.param({"deployment_ref": ""}, "ZP008", id="empty-deployment"),
            pytest.param({"workspace_id": "w1"}, "ZP006", id="workspace-without-tenant"),
        ])
    async def test_empty_batch_still_validates_deployment_and_scope(self, conn, kwargs,
                                                                    sqlstate):
        # The arguments are malformed whatever the batch holds (sql/README.md: ZP006 is raised by
        # enqueue_run(s) for a workspace without a tenant; ZP008 by every function).
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await enqueue_batch(conn, [], **kwargs)
        assert caught.value.sqlstate == sqlstate


# --- NOTIFY (committed transactions on a fresh database) ---------------------------------------


async def listen(connect: Any, *scopes: Scope) -> asyncio.Queue[str]:
    """A listener that waits for work of ``scopes`` (default: the default scope) like an idle
    worker."""
    return await wakeup_listener(connect, scopes or (DEFAULT_SCOPE,))


async def notifications_before_sentinel(queue: asyncio.Queue[str],
                                        producer: asyncpg.Connection) -> list[str]:
    """Everything the listener got before a marker sent in a later transaction (commit order)."""
    await producer.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")
    received = []
    while (payload := await asyncio.wait_for(queue.get(), NOTIFY_TIMEOUT)) != "sentinel":
        received.append(payload)
    return received


class TestRepeatsWithinOneBatch:
    """The runs without a thread go in with one INSERT: repeats inside the batch come back as
    they would from one call after another (the first in input order is created)."""

    async def test_a_repeated_key_in_one_batch_creates_the_first_only(self, conn):
        rows = await enqueue_batch(conn, [{"idempotency_key": "k", "payload": {"n": 1}},
                                          {"payload": {"n": 2}},
                                          {"idempotency_key": "k", "payload": {"n": 3}}])
        assert [r["created"] for r in rows] == [True, True, False]
        assert rows[2]["run_id"] == rows[0]["run_id"]
        assert json.loads((await run_row(conn, rows[0]["run_id"]))["payload"]) == {"n": 1}

    async def test_a_repeated_run_id_in_one_batch_creates_the_first_only(self, conn):
        run_id = str(uuid4())
        rows = await enqueue_batch(conn, [{"run_id": run_id, "payload": {"n": 1}},
                                          {"run_id": run_id, "payload": {"n": 2}}])
        assert [(str(r["run_id"]), r["created"]) for r in rows] == [(run_id, True),
                                                                    (run_id, False)]
        assert json.loads((await run_row(conn, rows[0]["run_id"]))["payload"]) == {"n": 1}

    async def test_threads_and_plain_runs_mix_in_one_batch(self, conn):
        rows = await enqueue_batch(conn, [{"thread_id": "t"}, {}, {"thread_id": "t"}, {}])
        assert [r["status"] for r in rows] == ["pending", "pending", "waiting", "pending"]
        assert [r["created"] for r in rows] == [True] * 4


class TestWakeupNotify:
    async def test_a_batch_sends_one_notification_per_transaction(self, connect):
        queue = await listen(connect, (DEPLOYMENT, "t1", "w1"))
        producer = await connect()
        rows = await enqueue_batch(producer, [{}, {}, {}], tenant_id="t1", workspace_id="w1")
        assert len(rows) == 3
        received = await notifications_before_sentinel(queue, producer)
        assert received == [await wakeup_key(producer, DEPLOYMENT, "t1", "w1")]

    async def test_a_batch_of_runs_not_due_wakes_nobody(self, connect):
        # A worker woken for a run_after in the future claims nothing; the poll finds it.
        queue = await listen(connect)
        producer = await connect()
        later = (T0 + timedelta(minutes=5)).isoformat()
        await enqueue_batch(producer, [{"run_after": later}, {"run_after": later}])
        assert await notifications_before_sentinel(queue, producer) == []

    async def test_two_batches_in_two_transactions_notify_twice(self, connect):
        queue = await listen(connect)
        producer = await connect()
        await enqueue_batch(producer, [{}, {}])
        await enqueue_batch(producer, [{}])
        received = await notifications_before_sentinel(queue, producer)
        assert len(received) == 2

    async def test_batch_of_only_replays_does_not_notify(self, connect):
        queue = await listen(connect)
        producer = await connect()
        first = await enqueue_batch(producer, [{"idempotency_key": "a"}, {"idempotency_key": "b"}])
        assert len(await notifications_before_sentinel(queue, producer)) == 1
        replay = await enqueue_batch(producer, [{"idempotency_key": "b"}, {"idempotency_key": "a"}])
        assert [row["created"] for row in replay] == [False, False]
        assert [row["run_id"] for row in replay] == [first[1]["run_id"], first[0]["run_id"]]
        assert await notifications_before_sentinel(queue, producer) == []

    async def test_rejected_batch_does_not_notify(self, connect):
        queue = await listen(connect)
        producer = await connect()
        with pytest.raises(asyncpg.PostgresError) as caught:
            await enqueue_batch(producer, [{}, {"run_id": "nope"}])
        assert caught.value.sqlstate == "ZP008"
        assert await notifications_before_sentinel(queue, producer) == []
        assert await producer.fetchval("SELECT count(*) FROM zeroth.runs") == 0


async def test_an_item_whose_key_overflows_the_index_rejects_the_batch_with_zp008(conn):
    # The idempotency index refuses rows over 2704 bytes with 54000,
    # which a producer would retry for ever; the batch is refused up front, naming the item.
    wide = {"deployment_ref": "\U0001F602" * 200, "tenant_id": "\U0001F600" * 200,
            "workspace_id": "\U0001F601" * 200}
    with pytest.raises(asyncpg.PostgresError) as caught:
        async with conn.transaction():
            await enqueue_batch(conn, [{"idempotency_key": "a"},
                                       {"idempotency_key": "\U0001F603" * 500}], **wide)
    assert caught.value.sqlstate == "ZP008"
    assert "runs[2]" in caught.value.args[0]
    assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0
