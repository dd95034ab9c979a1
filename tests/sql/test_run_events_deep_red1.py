"""Adversarial review (red1): an event whose JSON nests deeper than a Python reader can decode.
Any language may append through SQL; the Python readers (LeaseManager.stream, the SSE endpoint)
decode every event with json.loads, so one such event would stop every subscriber of the run
at it, for ever (each re-read meets it again)."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import WORKER, at, make_run

from zeroth_pg import streams


@pytest.mark.parametrize("depth", [257, 5000])
async def test_an_event_nested_deeper_than_a_reader_can_decode_is_refused(conn, depth):
    lease = await make_run(conn, "running")
    deep = "[" * depth + "]" * depth

    try:
        async with conn.transaction():
            await conn.fetchval(
                """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2,
                       generation => 1, name => 'deep', data => $3::text::jsonb,
                       now_override => $4)""", lease.run_id, WORKER, deep, at(5))
    except asyncpg.PostgresError as exc:
        assert exc.sqlstate == "ZP008"
    else:
        pytest.fail("stored: every reader of the run stops at it")


async def test_an_event_nested_256_levels_is_stored_and_read(conn):
    lease = await make_run(conn, "running")
    deep = "[" * 256 + "]" * 256

    assert await conn.fetchval(
        """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => 1,
               name => 'deep', data => $3::text::jsonb, now_override => $4)""",
        lease.run_id, WORKER, deep, at(5)) == 1
    rows = await conn.fetch(
        """SELECT event_id, kind, name, data::text AS data, lease_generation, created_at
             FROM zeroth.read_run_events(run_id => $1)""", lease.run_id)
    assert [streams.run_event(r).event_id for r in rows] == [1]
