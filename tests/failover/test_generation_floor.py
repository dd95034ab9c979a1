"""No lease generation is handed out twice across a failover, lossy or not.

A claim gives a run ``max(generation + 1, (timeline - 1) * 2^32 + 1)`` (internal/generations.sql):
every promotion starts a new WAL timeline, so a promoted server hands out generations above any
the old primary could have granted — also those of claims it never received. The lossy case is
made by hand: with the standby stopped a claim lands on the primary only, the primary is killed,
the standby started and promoted. Before the floor the promoted
server handed out the lost claim's number again, to the same worker id: two incarnations of one
run the fence could not tell apart (docs/reliability.md, "Findings (failover)").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest
from failover_support import zeroth_pair
from replication import ReplicatedPair

from zeroth_pg.client import LeaseManager

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]

BAND = 2**32
WORKER = "worker-a"
DEPLOYMENT = "generation-floor"


@pytest.fixture
def async_pair() -> Iterator[tuple[ReplicatedPair, str]]:
    with zeroth_pair("async") as found:
        yield found


async def _claim_one(dsn: str, worker: str = WORKER) -> tuple[object, int]:
    conn = await asyncpg.connect(dsn)
    try:
        claimed = await LeaseManager(conn).claim_and_start(DEPLOYMENT, worker, batch_size=1)  # type: ignore[arg-type]
        assert len(claimed.runs) == 1, claimed
        return claimed.runs[0].run_id, claimed.runs[0].lease_generation
    finally:
        await conn.close()


async def _enqueue(dsn: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return (await LeaseManager(conn).enqueue_run(DEPLOYMENT, {})).run_id  # type: ignore[arg-type]
    finally:
        await conn.close()


async def _expire_lease(dsn: str, run_id: object) -> None:
    """The lost lease is past its expiry on the promoted server (as it is after a lease's
    length): made by hand, a DBA's UPDATE, so the test needs no wall-clock wait."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "UPDATE zeroth.runs SET lease_expires_at = now() - interval '1 hour' "
            "WHERE run_id = $1", run_id)
    finally:
        await conn.close()


def _timeline(pair: ReplicatedPair) -> int:
    row = pair.standby.execute("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
                               dbname="zeroth")
    return int(str(row[0][0]), 16)


def test_a_claim_lost_in_a_lossy_failover_is_not_handed_out_again(
        async_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _dsn = async_pair

    async def scenario() -> None:
        run_id = await _enqueue(pair.primary.dsn("zeroth"))
        pair.wait_replayed()  # the run itself reached the standby
        # The first attempt: claimed on both sides (generation 1), then its lease lapses.
        claimed, first = await _claim_one(pair.primary.dsn("zeroth"))
        assert (claimed, first) == (run_id, 1)  # timeline 1: the floor is 0, nothing changes
        await _expire_lease(pair.primary.dsn("zeroth"), run_id)
        pair.wait_replayed()
        # The lost claim: the same worker re-claims its own orphan on the primary while the
        # standby is down (a frozen WAL receiver can still read what the socket buffered), and
        # the primary dies before the standby is back.
        pair.standby.stop()
        conn = await asyncpg.connect(pair.primary.dsn("zeroth"))
        try:
            orphans = await LeaseManager(conn).claim_orphaned_result(DEPLOYMENT, WORKER)  # type: ignore[arg-type]
        finally:
            await conn.close()
        assert [(o.run_id, o.lease_generation) for o in orphans.runs] == [(run_id, 2)]
        pair.kill_primary()
        pair.standby.start()
        pair.promote()
        # The promoted server never saw generation 2. Its claim of the orphan, by the same
        # worker id, must not be generation 2 again.
        promoted = pair.standby.dsn("zeroth")
        await _expire_lease(promoted, run_id)
        conn = await asyncpg.connect(promoted)
        try:
            before = await conn.fetchval(
                "SELECT lease_generation FROM zeroth.runs WHERE run_id = $1", run_id)
            retaken = await LeaseManager(conn).claim_orphaned_result(DEPLOYMENT, WORKER)  # type: ignore[arg-type]
        finally:
            await conn.close()
        assert before == 1, "the lost claim must not have reached the standby"
        timeline = _timeline(pair)
        assert timeline >= 2
        assert [(o.run_id, o.lease_generation) for o in retaken.runs] == [
            (run_id, (timeline - 1) * BAND + 1)]
        # And counting goes on by one within the new timeline.
        await _expire_lease(promoted, run_id)
        conn = await asyncpg.connect(promoted)
        try:
            again = await LeaseManager(conn).claim_orphaned_result(DEPLOYMENT, WORKER)  # type: ignore[arg-type]
        finally:
            await conn.close()
        assert [o.lease_generation for o in again.runs] == [(timeline - 1) * BAND + 2]

    asyncio.run(scenario())
