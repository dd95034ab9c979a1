"""zeroth.commit_fenced: the live lease holder writes output, error, metadata and progress; nothing
else is writable, and nobody else can write."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import WORKER, at, make_run, run_row

OTHER = "worker-b"
SOON = at(1)

COMMIT = """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                columns => $4::text::jsonb, now_override => $5)"""


async def commit(conn: asyncpg.Connection, run_id: UUID | None, columns: Any, *,
                 worker_id: str | None = WORKER, generation: int | None = 1,
                 now: datetime = SOON, raw: bool = False) -> bool:
    """commit_fenced; ``columns`` is JSON-encoded unless ``raw`` (then it is passed as text)."""
    text = columns if raw else json.dumps(columns)
    return await conn.fetchval(  # type: ignore[no-any-return]
        COMMIT, run_id, worker_id, generation, text, now)


async def rejected_with(conn: asyncpg.Connection, sqlstate: str, run_id: UUID | None,
                        columns: Any, **kwargs: Any) -> None:
    with pytest.raises(asyncpg.PostgresError) as raised:
        async with conn.transaction():
            await commit(conn, run_id, columns, **kwargs)
    assert raised.value.sqlstate == sqlstate


def loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


PROTECTED_SPELLINGS = [
    "lease_generation",
    "LEASE_GENERATION",
    '"lease_generation"',
    "'lease_generation'",
    " lease_worker_id ",
    "`status`",
    "\tstatus\n",
    "Lease_Expires_At",
    "lease_acquired_at",
    "admission_slot",
    "recovery_checkpoint_id",
    "run_id",
    "tenant_id",
    "workspace_id",
    "workspace_key",
    "deployment_ref",
    "attempts",
    "max_attempts",
    "finished_at",
    "dead_lettered_at",
    "cancel_requested_at",
    "checkpoint_seq",
    "run_after",
    "payload",
]

UNKNOWN_NAMES = [
    "output = '{}', lease_generation = 99 --",
    'output"; DROP TABLE zeroth.runs; --',
    "Output",
    "OUTPUT",
    " output",
    '"output"',
    "outputs",
    "r.output",
    "final_output",
    "",
]


class TestLiveHolderWrites:
    async def test_holder_writes_all_four_columns(self, conn):
        lease = await make_run(conn, "running")
        columns = {"output": {"answer": 42}, "error": {"reason": "partial"},
                   "metadata": {"step": "b"}, "progress": {"done": 3, "of": 7}}

        assert await commit(conn, lease.run_id, columns, now=at(5)) is True

        row = await run_row(conn, lease.run_id)
        assert {name: loads(row[name]) for name in columns} == columns
        assert row["updated_at"] == at(5)

    async def test_only_the_named_columns_change(self, conn):
        lease = await make_run(conn, "running", metadata={"keep": True})
        assert await commit(conn, lease.run_id, {"output": {"v": 1}}) is True
        before = await run_row(conn, lease.run_id)

        assert await commit(conn, lease.run_id, {"progress": {"pct": 50}}, now=at(2)) is True

        after = await run_row(conn, lease.run_id)
        assert loads(after["progress"]) == {"pct": 50}
        ignore = {"progress": None, "updated_at": None}
        assert {**dict(after), **ignore} == {**dict(before), **ignore}
        assert loads(after["metadata"]) == {"keep": True}

    async def test_metadata_is_replaced_not_merged(self, conn):
        lease = await make_run(conn, "running", metadata={"a": 1})

        assert await commit(conn, lease.run_id, {"metadata": {"b": 2}}) is True

        assert loads((await run_row(conn, lease.run_id))["metadata"]) == {"b": 2}

    @pytest.mark.parametrize("column", ["output", "error", "progress"])
    async def test_json_null_stores_sql_null(self, conn, column):
        lease = await make_run(conn, "running")
        assert await commit(conn, lease.run_id, {column: {"x": 1}}) is True

        assert await commit(conn, lease.run_id, {column: None}, now=at(2)) is True

        assert (await run_row(conn, lease.run_id))[column] is None

    async def test_non_object_values_are_stored_for_output(self, conn):
        lease = await make_run(conn, "running")

        assert await commit(conn, lease.run_id, {"output": [1, "two"]}) is True

        assert loads((await run_row(conn, lease.run_id))["output"]) == [1, "two"]

    async def test_expiry_exactly_equal_to_now_still_writes(self, conn):
        lease = await make_run(conn, "running")

        assert await commit(conn, lease.run_id, {"output": {"v": 1}}, now=at(60)) is True

        assert loads((await run_row(conn, lease.run_id))["output"]) == {"v": 1}

    # The same worker id's next generation writes: test_fenced_conformance.py (a lease taken
    # over, same_worker_id, commit_fenced: the new holder's call lands).


class TestProtectedColumns:
    @pytest.mark.parametrize("name", PROTECTED_SPELLINGS)
    async def test_protected_column_raises_protected_column_and_changes_nothing(
            self, conn, name):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP004", lease.run_id, {name: 99})

        assert await run_row(conn, lease.run_id) == before
        assert await commit(conn, lease.run_id, {"output": {"ok": True}}) is True

    async def test_protected_column_next_to_an_allowed_one_writes_neither(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP004", lease.run_id,
                            {"output": {"sneaky": True}, "lease_generation": 99})

        assert await run_row(conn, lease.run_id) == before

    async def test_protected_column_is_refused_even_for_a_fenced_out_caller(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP004", lease.run_id, {"status": "completed"},
                            worker_id=OTHER)

        assert await run_row(conn, lease.run_id) == before

    async def test_commit_fenced_refuses_to_write_the_fence_columns(self, conn):
        # Seed test: every bypass spelling raises, the row is unchanged, a legitimate write works.
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)
        bypasses = ["lease_generation", "LEASE_GENERATION", '"lease_generation"',
                    " lease_worker_id ", "`status`", "Lease_Expires_At",
                    "recovery_checkpoint_id", "run_id", "tenant_id", "'admission_slot'"]

        for name in bypasses:
            await rejected_with(conn, "ZP004", lease.run_id, {name: 99})

        assert await run_row(conn, lease.run_id) == before
        assert await commit(conn, lease.run_id, {"output": {"ok": True}}, now=at(2)) is True
        after = await run_row(conn, lease.run_id)
        assert loads(after["output"]) == {"ok": True}
        assert after["lease_generation"] == before["lease_generation"]
        assert after["lease_worker_id"] == before["lease_worker_id"]
        assert after["status"] == before["status"]


class TestUnknownColumns:
    @pytest.mark.parametrize("name", UNKNOWN_NAMES)
    async def test_unknown_name_raises_unknown_column_and_changes_nothing(self, conn, name):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP005", lease.run_id, {name: {"x": 1}})

        assert await run_row(conn, lease.run_id) == before
        assert await conn.fetchval("SELECT to_regclass('zeroth.runs') IS NOT NULL") is True
        assert await commit(conn, lease.run_id, {"output": {"ok": True}}) is True

    async def test_unknown_name_next_to_an_allowed_one_writes_neither(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP005", lease.run_id,
                            {"output": {"x": 1}, "current_step": "b"})

        assert await run_row(conn, lease.run_id) == before


class TestBadArguments:
    @pytest.mark.parametrize(
        "columns_text",
        [
            pytest.param("{}", id="empty-object"),
            pytest.param("[]", id="array"),
            pytest.param('[{"output": 1}]', id="array-of-object"),
            pytest.param('"output"', id="string"),
            pytest.param("42", id="number"),
            pytest.param("null", id="json-null"),
            pytest.param(None, id="sql-null"),
            pytest.param('{"metadata": [1]}', id="metadata-array"),
            pytest.param('{"metadata": "x"}', id="metadata-string"),
            pytest.param('{"metadata": null}', id="metadata-null"),
        ],
    )
    async def test_bad_columns_raise_invalid_argument_and_change_nothing(
            self, conn, columns_text):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await rejected_with(conn, "ZP008", lease.run_id, columns_text, raw=True)

        assert await run_row(conn, lease.run_id) == before
        assert await commit(conn, lease.run_id, {"progress": {"ok": 1}}) is True
