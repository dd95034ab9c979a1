"""zeroth.enqueue_run: new → pending, idempotency, argument checks and the zeroth_wakeup NOTIFY."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from helpers import (
    DEFAULT_SCOPE,
    DEPLOYMENT,
    T0,
    Scope,
    announce_idle,
    at,
    clock_schema,
    run_row,
    wakeup_key,
    wakeup_listener,
)

JSONB = ("payload", "metadata")
# asyncpg encodes these two sentinels as the timestamps 'infinity' and '-infinity'.
INFINITY = datetime.max
MINUS_INFINITY = datetime.min
NOTIFY_TIMEOUT = 10  # only guards against a hang; no assertion depends on it


async def call_enqueue(conn: asyncpg.Connection, **kwargs: Any) -> asyncpg.Record:
    """enqueue_run with exactly the given named arguments (deployment and clock defaulted).

    payload/metadata: a dict/list is JSON-encoded, a str is raw JSON text, None is SQL NULL.
    """
    kwargs.setdefault("deployment_ref", DEPLOYMENT)
    kwargs.setdefault("now_override", T0)
    names, values = [], []
    for name, value in kwargs.items():
        names.append(name)
        values.append(json.dumps(value) if name in JSONB and isinstance(value, dict | list)
                      else value)
    args = ", ".join(
        f"{name} => ${i + 1}{'::text::jsonb' if name in JSONB else ''}"
        for i, name in enumerate(names))
    return await conn.fetchrow(  # type: ignore[no-any-return]
        f"SELECT run_id, created, status FROM {clock_schema(names)}.enqueue_run({args})", *values)


async def snapshot(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT * FROM zeroth.runs r ORDER BY r.tenant_id, r.workspace_key, r.run_id")
    return [dict(row) for row in rows]


async def count_runs(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM zeroth.runs")  # type: ignore[no-any-return]


class TestDefaults:
    async def test_minimal_enqueue_creates_pending_run_with_documented_defaults(self, conn):
        result = await call_enqueue(conn)
        assert result["created"] is True
        assert result["status"] == "pending"
        row = await run_row(conn, result["run_id"])
        assert row["tenant_id"] == "default"
        assert row["workspace_id"] is None
        assert row["workspace_key"] == ""
        assert row["deployment_ref"] == DEPLOYMENT
        assert row["status"] == "pending"
        assert row["priority"] == 0
        assert row["run_after"] == T0
        assert row["created_at"] == T0
        assert row["updated_at"] == T0
        assert row["attempts"] == 0
        assert row["max_attempts"] == 3
        assert json.loads(row["payload"]) == {}
        assert json.loads(row["metadata"]) == {}
        assert row["idempotency_key"] is None
        assert row["thread_id"] is None
        assert row["lease_generation"] == 0
        assert row["checkpoint_seq"] == 0
        for column in ("lease_worker_id", "lease_acquired_at", "lease_expires_at",
                       "admission_slot", "recovery_checkpoint_id", "started_at", "finished_at",
                       "output", "error", "progress", "wait_reason", "cancel_action",
                       "cancel_requested_at", "dead_lettered_at"):
            assert row[column] is None, column

    async def test_generated_run_ids_are_distinct(self, conn):
        first = await call_enqueue(conn)
        second = await call_enqueue(conn)
        assert first["run_id"] != second["run_id"]
        assert await count_runs(conn) == 2

    async def test_tenant_and_workspace_are_stored_with_their_scope_key(self, conn):
        result = await call_enqueue(conn, tenant_id="t1", workspace_id="w1")
        row = await run_row(conn, result["run_id"], tenant_id="t1", workspace_id="w1")
        assert (row["tenant_id"], row["workspace_id"], row["workspace_key"]) == ("t1", "w1", "w:w1")


class TestCallerRunId:
    async def test_caller_chosen_run_id_is_used(self, conn):
        run_id = uuid4()
        result = await call_enqueue(conn, run_id=run_id)
        assert (result["run_id"], result["created"]) == (run_id, True)
        assert (await run_row(conn, run_id))["status"] == "pending"

    async def test_repeated_caller_run_id_returns_existing_run_unchanged(self, conn):
        run_id = uuid4()
        await call_enqueue(conn, run_id=run_id, payload={"n": 1})
        before = await snapshot(conn)
        again = await call_enqueue(conn, run_id=run_id, payload={"n": 2}, now_override=at(5))
        assert (again["run_id"], again["created"], again["status"]) == (run_id, False, "pending")
        assert await snapshot(conn) == before


class TestIdempotencyKey:
    async def test_repeated_key_returns_existing_run_with_created_false(self, conn):
        first = await call_enqueue(conn, idempotency_key="order-1", payload={"n": 1})
        before = await snapshot(conn)
        second = await call_enqueue(conn, idempotency_key="order-1", payload={"n": 2},
                                    now_override=at(5))
        assert first["created"] is True
        assert (second["run_id"], second["created"]) == (first["run_id"], False)
        assert await snapshot(conn) == before
        assert json.loads((await run_row(conn, first["run_id"]))["payload"]) == {"n": 1}

    async def test_replay_reports_the_current_status_of_the_existing_run(self, conn):
        first = await call_enqueue(conn, idempotency_key="order-1")
        await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => 'w',
                   now_override => $2)""", DEPLOYMENT, T0)
        await conn.fetchval(
            """SELECT zeroth_test.start_run(run_id => $1, worker_id => 'w', generation => 1,
                   now_override => $2)""", first["run_id"], T0)
        replay = await call_enqueue(conn, idempotency_key="order-1")
        assert (replay["run_id"], replay["created"], replay["status"]) == (
            first["run_id"], False, "running")

    @pytest.mark.parametrize(
        "other_scope",
        [
            pytest.param({"tenant_id": "t2"}, id="other-tenant"),
            pytest.param({"tenant_id": "t1", "workspace_id": "w2"}, id="other-workspace"),
            pytest.param({"tenant_id": "t1"}, id="null-workspace-vs-w1"),
            pytest.param({"tenant_id": "t1", "workspace_id": "w1", "deployment_ref": "deploy-b"},
                         id="other-deployment"),
        ])
    async def test_same_key_in_another_scope_or_deployment_creates_a_new_run(
            self, conn, other_scope):
        first = await call_enqueue(conn, tenant_id="t1", workspace_id="w1", idempotency_key="k")
        second = await call_enqueue(conn, idempotency_key="k", **other_scope)
        assert second["created"] is True
        assert second["run_id"] != first["run_id"]
        assert await count_runs(conn) == 2

    async def test_null_tenant_and_default_tenant_share_one_key_space(self, conn):
        first = await call_enqueue(conn, idempotency_key="k")
        second = await call_enqueue(conn, idempotency_key="k", tenant_id="default")
        assert (second["run_id"], second["created"]) == (first["run_id"], False)

    async def test_caller_run_id_taken_in_another_scope_still_creates_a_run(self, conn):
        run_id = uuid4()
        await call_enqueue(conn, run_id=run_id, tenant_id="t1")
        result = await call_enqueue(conn, run_id=run_id, tenant_id="t2")
        assert (result["run_id"], result["created"]) == (run_id, True)
        assert await count_runs(conn) == 2


class TestStoredFields:
    async def test_priority_run_after_max_attempts_metadata_thread_and_payload_are_stored(
            self, conn):
        result = await call_enqueue(
            conn, priority=-7, run_after=at(300), max_attempts=9, metadata={"source": "api"},
            thread_id="thread-1", payload={"input": [1, 2]}, idempotency_key="key-1")
        row = await run_row(conn, result["run_id"])
        assert row["priority"] == -7
        assert row["run_after"] == at(300)
        assert row["created_at"] == T0
        assert row["max_attempts"] == 9
        assert json.loads(row["metadata"]) == {"source": "api"}
        assert row["thread_id"] == "thread-1"
        assert json.loads(row["payload"]) == {"input": [1, 2]}
        assert row["idempotency_key"] == "key-1"

    async def test_run_after_in_the_past_is_kept(self, conn):
        result = await call_enqueue(conn, run_after=at(-3600))
        assert (await run_row(conn, result["run_id"]))["run_after"] == at(-3600)

    @pytest.mark.parametrize("max_attempts", [1, 1000])
    async def test_max_attempts_bounds_are_accepted(self, conn, max_attempts):
        result = await call_enqueue(conn, max_attempts=max_attempts)
        assert (await run_row(conn, result["run_id"]))["max_attempts"] == max_attempts

    async def test_deployment_ref_of_200_characters_is_accepted(self, conn):
        result = await call_enqueue(conn, deployment_ref="d" * 200)
        assert result["created"] is True


class TestRejectedInput:
    @pytest.mark.parametrize(
        "kwargs",
        [
            pytest.param({"deployment_ref": ""}, id="empty-deployment"),
            pytest.param({"deployment_ref": None}, id="null-deployment"),
            pytest.param({"deployment_ref": "d" * 201}, id="201-char-deployment"),
            pytest.param({"payload": "[1, 2]"}, id="payload-array"),
            pytest.param({"payload": '"text"'}, id="payload-string"),
            pytest.param({"payload": "null"}, id="payload-json-null"),
            pytest.param({"payload": None}, id="payload-sql-null"),
            pytest.param({"metadata": "[]"}, id="metadata-array"),
            pytest.param({"metadata": "42"}, id="metadata-number"),
            pytest.param({"metadata": None}, id="metadata-sql-null"),
            pytest.param({"max_attempts": 0}, id="max-attempts-0"),
            pytest.param({"max_attempts": 1001}, id="max-attempts-1001"),
            pytest.param({"idempotency_key": ""}, id="empty-idempotency-key"),
            pytest.param({"run_after": INFINITY}, id="run-after-infinity"),
            pytest.param({"run_after": MINUS_INFINITY}, id="run-after-minus-infinity"),
            pytest.param({"tenant_id": ""}, id="empty-tenant"),
            pytest.param({"tenant_id": "t" * 201}, id="201-char-tenant"),
            pytest.param({"tenant_id": "t1", "workspace_id": ""}, id="empty-workspace"),
            pytest.param({"tenant_id": "t1", "workspace_id": "w" * 201}, id="201-char-workspace"),
            # 200 four-byte characters each and a 500-character key overflow the idempotency
            # index's 2704-byte row (54000, which a producer would retry for ever).
            pytest.param({"tenant_id": "\U0001F600" * 200, "workspace_id": "\U0001F601" * 200,
                          "deployment_ref": "\U0001F602" * 200,
                          "idempotency_key": "\U0001F603" * 500}, id="key-over-2600-bytes"),
        ])
    async def test_bad_argument_raises_zp008_and_inserts_nothing(self, conn, kwargs):
        await call_enqueue(conn, idempotency_key="existing")
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await call_enqueue(conn, **kwargs)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before

    async def test_workspace_without_tenant_raises_zp006_and_inserts_nothing(self, conn):
        await call_enqueue(conn)
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await call_enqueue(conn, workspace_id="w1")
        assert caught.value.sqlstate == "ZP006"
        assert await snapshot(conn) == before


class TestReservedKeyPrefix:
    """'zeroth-schedule:' keys are fire_due_schedules' own: a caller planting the run of a future
    fire time would pre-empt the schedule."""

    @pytest.mark.parametrize("key", ["zeroth-schedule:", "zeroth-schedule:x:2030-01-01T00:00:00Z"])
    async def test_a_key_with_the_schedules_prefix_raises_zp011_and_inserts_nothing(self, conn,
                                                                                  key):
        await call_enqueue(conn, idempotency_key="existing")
        before = await snapshot(conn)
        for thread_id in (None, "t"):
            with pytest.raises(asyncpg.PostgresError) as caught:
                async with conn.transaction():
                    await call_enqueue(conn, idempotency_key=key, thread_id=thread_id)
            assert caught.value.sqlstate == "ZP011"
            assert "zeroth-schedule:" in caught.value.message
        assert await snapshot(conn) == before

    @pytest.mark.parametrize("key", ["Zeroth-schedule:x", "zeroth-schedule",
                                     "my-zeroth-schedule:x"])
    async def test_a_key_that_only_resembles_the_prefix_is_taken(self, conn, key):
        row = await call_enqueue(conn, idempotency_key=key)
        assert row["created"] is True
        assert await conn.fetchval("SELECT schedule_id FROM zeroth.runs WHERE run_id = $1",
                                   row["run_id"]) is None


# --- NOTIFY zeroth_wakeup (committed transactions on a fresh database) -------------------------


async def listen(connect: Any, *scopes: Scope) -> asyncio.Queue[str]:
    """A dedicated listener connection that waits for work of ``scopes`` (default: the default
    scope) like an idle worker; its notifications land in the returned queue."""
    return await wakeup_listener(connect, scopes or (DEFAULT_SCOPE,))


async def next_notification(queue: asyncio.Queue[str]) -> str:
    return await asyncio.wait_for(queue.get(), timeout=NOTIFY_TIMEOUT)


async def send_sentinel(producer: asyncpg.Connection) -> None:
    """A marker notification in its own later transaction: notifications arrive in commit order,
    so whatever the listener receives before the sentinel is everything that was sent before it."""
    await producer.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")


async def drain_until_sentinel(queue: asyncio.Queue[str]) -> list[str]:
    received = []
    while (payload := await next_notification(queue)) != "sentinel":
        received.append(payload)
    return received


class TestWakeupNotify:
    async def test_committed_enqueue_notifies_with_the_scopes_opaque_key(self, connect):
        queue = await listen(connect)
        producer = await connect()
        await call_enqueue(producer)
        assert await next_notification(queue) == await wakeup_key(producer)

    async def test_payload_names_no_tenant_workspace_or_deployment(self, connect):
        # LISTEN needs no privilege: the payload must tell a stranger nothing about the scope.
        queue = await listen(connect, ("deploy-x", "t1", "w1"))
        producer = await connect()
        await call_enqueue(producer, tenant_id="t1", workspace_id="w1", deployment_ref="deploy-x")
        payload = await next_notification(queue)
        assert payload == await wakeup_key(producer, "deploy-x", "t1", "w1")
        assert re.fullmatch(r"[0-9a-f]{32}", payload)
        others = {await wakeup_key(producer, "deploy-x", "t1", None),
                  await wakeup_key(producer, "deploy-x", "t2", "w1"),
                  await wakeup_key(producer, "deploy-y", "t1", "w1")}
        assert payload not in others
        assert len(others) == 3

    async def test_rolled_back_enqueue_does_not_notify(self, connect):
        queue = await listen(connect)
        producer = await connect()
        transaction = producer.transaction()
        await transaction.start()
        await call_enqueue(producer)
        await transaction.rollback()
        await send_sentinel(producer)
        assert await drain_until_sentinel(queue) == []

    async def test_two_transactions_with_identical_payloads_both_notify(self, connect):
        # Upstream's fixed ARQ job id dropped a repeated wakeup; a NOTIFY per transaction never is.
        queue = await listen(connect)
        producer = await connect()
        await call_enqueue(producer)
        await call_enqueue(producer)
        await send_sentinel(producer)
        received = await drain_until_sentinel(queue)
        assert len(received) == 2
        assert received[0] == received[1]

    async def test_idempotent_replay_does_not_notify(self, connect):
        queue = await listen(connect)
        producer = await connect()
        first = await call_enqueue(producer, idempotency_key="k")
        assert await next_notification(queue) == await wakeup_key(producer)
        replay = await call_enqueue(producer, idempotency_key="k")
        assert (replay["run_id"], replay["created"]) == (first["run_id"], False)
        await send_sentinel(producer)
        assert await drain_until_sentinel(queue) == []

    async def test_rejected_enqueue_does_not_notify(self, connect):
        queue = await listen(connect)
        producer = await connect()
        with pytest.raises(asyncpg.PostgresError) as caught:
            await call_enqueue(producer, max_attempts=0)
        assert caught.value.sqlstate == "ZP008"
        await send_sentinel(producer)
        assert await drain_until_sentinel(queue) == []
        assert await producer.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_notification_comes_from_the_enqueuing_session(self, connect):
        listener = await connect()
        senders: asyncio.Queue[int] = asyncio.Queue()
        await listener.add_listener(
            "zeroth_wakeup", lambda _c, pid, _ch, _payload: senders.put_nowait(pid))
        await announce_idle(listener)
        producer = await connect()
        run_id: UUID = (await call_enqueue(producer))["run_id"]
        assert await asyncio.wait_for(senders.get(), NOTIFY_TIMEOUT) == producer.get_server_pid()
        assert await producer.fetchval(
            "SELECT status FROM zeroth.runs r WHERE r.run_id = $1", run_id) == "pending"
