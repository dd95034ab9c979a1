"""Concurrent retries of one admission (same idempotency key or run_id, different payloads) are
each ``reused``, never ``busy`` for their own run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from helpers import DEPLOYMENT


class TestConcurrentRetriesOfOneAdmission:
    async def test_twelve_retries_with_one_key_all_get_the_one_run(self, connect):
        sessions = [await connect() for _ in range(12)]

        async def admit(conn: Any, n: int) -> Any:
            return await conn.fetchrow(
                """SELECT outcome, run_id FROM zeroth.admit_run(deployment_ref => $1,
                       thread_id => 'retried', strategy => 'reject', idempotency_key => 'req-1',
                       payload => $2::text::jsonb)""", DEPLOYMENT, json.dumps({"body": n}))

        results = await asyncio.gather(*(admit(c, n) for n, c in enumerate(sessions)))

        assert sorted(r["outcome"] for r in results) == ["admitted"] + ["reused"] * 11
        assert len({r["run_id"] for r in results}) == 1
        db = sessions[0]
        assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 1

    async def test_twelve_retries_with_one_run_id_all_get_the_one_run(self, connect):
        sessions = [await connect() for _ in range(12)]
        run_id = "6f1c1b0e-7d2a-4f7e-9c57-1e0cfb2b2a10"

        async def admit(conn: Any) -> Any:
            return await conn.fetchrow(
                """SELECT outcome, run_id FROM zeroth.admit_run(deployment_ref => $1,
                       thread_id => 'retried', strategy => 'reject', run_id => $2::uuid)""",
                DEPLOYMENT, run_id)

        results = await asyncio.gather(*(admit(c) for c in sessions))

        assert sorted(r["outcome"] for r in results) == ["admitted"] + ["reused"] * 11
        assert {str(r["run_id"]) for r in results} == {run_id}
