"""Every lease a server hands out is above the generation floor of its WAL timeline
(internal/generations.sql, issue 35), admit_run's admit-and-own included.

The timeline is played by replacing zeroth._generation_floor() with the floor of timeline 2
(what a promoted standby computes): a lease handed out there must be above 2^32, or the lease an
old primary handed out for the same run_id in the lag before a lossy failover (admit_run takes a
caller's run_id) is handed out again — same run, same worker id, same generation — and the old
incarnation's fenced writes land on the new one."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from helpers import DEPLOYMENT, T0
from thread_calls import OWNER, admit

BAND = 2**32

TIMELINE_2 = """CREATE OR REPLACE FUNCTION zeroth._generation_floor() RETURNS bigint
                    LANGUAGE sql VOLATILE AS $$ SELECT (2::bigint - 1) << 32 $$"""


async def test_admit_and_own_on_a_later_timeline_is_above_the_floor(conn):
    await conn.execute(TIMELINE_2)
    run_id = uuid.uuid4()

    admitted = await admit(conn, worker_id=OWNER, run_id=run_id)

    assert admitted["outcome"] == "admitted"
    assert admitted["lease_generation"] == BAND + 1
    row = await conn.fetchrow(
        "SELECT lease_generation FROM zeroth.runs WHERE run_id = $1", run_id)
    assert row["lease_generation"] == BAND + 1
    slot = await conn.fetchval(
        "SELECT lease_generation FROM zeroth.admission_slots WHERE run_id = $1", run_id)
    assert slot in (None, BAND + 1)


async def test_a_claim_on_a_later_timeline_is_above_the_floor(conn):
    """The control: the claims already obey the floor."""
    await conn.execute(TIMELINE_2)
    await admit(conn)  # admitted unleased: generation 0
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, batch_size => 1, lease_seconds => 60, now_override => $3)""",
        DEPLOYMENT, OWNER, T0)
    assert [r["lease_generation"] for r in rows if r["run_id"] is not None] == [BAND + 1]


#: Timelines at the edges of the bands: 1, the last of the 2^32-wide bands (2^30 + 1) and its
#: neighbours, 2^31 and 2^31 + 1 (where (T - 1) << 32 wrapped to a negative floor), and
#: PostgreSQL's largest (a TimeLineID is a uint32).
EDGES = [1, 2, 3, 2**30, 2**30 + 1, 2**30 + 2, 2**30 + 3, 2**31, 2**31 + 1, 2**32 - 2, 2**32 - 1]


async def test_every_timeline_has_a_band_of_its_own_inside_a_bigint(conn):
    floors = {t: await conn.fetchval("SELECT zeroth._timeline_generation_floor($1::bigint)", t)
              for t in EDGES}
    # The bands as first released, for every timeline a real server reaches.
    assert [floors[t] for t in (1, 2, 3)] == [0, BAND, 2 * BAND]
    assert floors[2**30 + 1] == 2**30 * BAND
    # Each band ends where the next begins: 2^32 wide up to 2^30 + 1, 2^30 wide above.
    assert floors[2**30 + 2] - floors[2**30 + 1] == BAND
    assert floors[2**30 + 3] - floors[2**30 + 2] == 2**30
    assert floors[2**31 + 1] - floors[2**31] == 2**30
    assert floors[2**32 - 1] - floors[2**32 - 2] == 2**30
    assert [floors[t] for t in EDGES] == sorted(set(floors.values()))
    # The last band, and generation + 1 within it, stay far inside a bigint.
    assert floors[2**32 - 1] + 2**30 < 2**63 - 2**59


async def test_a_claim_on_a_timeline_above_2_to_the_31_is_above_every_earlier_band(conn):
    await conn.execute("""CREATE OR REPLACE FUNCTION zeroth._generation_floor() RETURNS bigint
                              LANGUAGE sql VOLATILE AS
                              $$ SELECT zeroth._timeline_generation_floor(2147483649::bigint) $$""")
    floor = await conn.fetchval("SELECT zeroth._timeline_generation_floor(2147483649::bigint)")
    below = await conn.fetchval("SELECT zeroth._timeline_generation_floor(2147483648::bigint)")
    await admit(conn)  # admitted unleased: generation 0
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, batch_size => 1, lease_seconds => 60, now_override => $3)""",
        DEPLOYMENT, OWNER, T0)
    assert [r["lease_generation"] for r in rows if r["run_id"] is not None] == [floor + 1]
    assert floor == below + 2**30 > 0


@pytest.mark.parametrize("timeline", [0, -1, 2**32])
async def test_a_number_that_is_no_wal_timeline_is_refused(conn, timeline):
    with pytest.raises(asyncpg.PostgresError) as raised:
        await conn.fetchval("SELECT zeroth._timeline_generation_floor($1::bigint)", timeline)
    assert raised.value.sqlstate == "ZP008"
