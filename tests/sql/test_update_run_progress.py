"""zeroth.update_run_progress: the owner merges progress and accounting while running, fenced.

Ports deer-flow's update_run_progress cases (seed spec §17): the status stays running, omitted
fields are kept, terminal runs are skipped. Accounting is a JSON object the caller defines.
"""

from __future__ import annotations

import json

import asyncpg
import pytest
from helpers import at, run_row
from thread_calls import OWNER, fenced, own_running


async def progress(conn, run_id, worker=OWNER, generation=1, *, now=None, **kwargs):
    return await fenced(conn, "update_run_progress", run_id, worker, generation,
                        now=now or at(5), **kwargs)


class TestMerge:
    async def test_update_run_progress_keeps_status_running_and_preserves_omitted_fields(
            self, conn):
        run_id = await own_running(conn)
        assert await progress(conn, run_id, progress={"step": 1, "note": "a"},
                              accounting={"input_tokens": 10, "message_count": 1})

        assert await progress(conn, run_id, now=at(6), progress={"step": 2},
                              accounting={"input_tokens": 25})

        row = await run_row(conn, run_id)
        assert row["status"] == "running"
        assert json.loads(row["progress"]) == {"step": 2, "note": "a"}
        assert json.loads(row["accounting"]) == {"input_tokens": 25, "message_count": 1}
        assert row["updated_at"] == at(6)

    async def test_progress_alone_leaves_accounting_alone(self, conn):
        run_id = await own_running(conn)
        await progress(conn, run_id, accounting={"total_tokens": 3})

        await progress(conn, run_id, progress={"step": 1})

        assert json.loads((await run_row(conn, run_id))["accounting"]) == {"total_tokens": 3}

    async def test_a_progress_that_was_not_an_object_is_replaced(self, conn):
        run_id = await own_running(conn)
        assert await fenced(conn, "commit_fenced", run_id, OWNER, 1, now=at(1),
                            columns=json.dumps({"progress": [1, 2]}))

        await progress(conn, run_id, progress={"step": 3})

        assert json.loads((await run_row(conn, run_id))["progress"]) == {"step": 3}

    async def test_accounting_survives_completion(self, conn):
        run_id = await own_running(conn)
        await progress(conn, run_id, accounting={"llm_call_count": 4})

        assert await fenced(conn, "complete_run", run_id, OWNER, 1, now=at(7))

        assert json.loads((await run_row(conn, run_id))["accounting"]) == {"llm_call_count": 4}


class TestBadArguments:
    @pytest.mark.parametrize("kwargs", [
        {}, {"progress": [1]}, {"accounting": "x"}, {"progress": {"big": "x" * 70000}}])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, kwargs):
        run_id = await own_running(conn)
        before = await run_row(conn, run_id)

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await progress(conn, run_id, kwargs.pop("worker", OWNER),
                               kwargs.pop("generation", 1), **kwargs)

        assert info.value.sqlstate == "ZP008"
        assert dict(await run_row(conn, run_id)) == dict(before)
