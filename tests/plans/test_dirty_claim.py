"""Claims on a dirty table (issue 30): a claim reads past the dead head of its scope, and nothing
the claim floor hides waits longer than its bound.

The dirty table: every run claimed (pending → running is not a HOT update) or deleted since the
last VACUUM leaves its entry at the head of its scope in runs_claim_pending_idx, and while some
transaction pins the xmin horizon no scan may mark it dead. A claim used to fetch the heap row of
each before it reached the first live run (200,000 dead runs: claim p99 14 ms → 276 ms on
PostgreSQL 15). Now a session's claim starts at its claim floor (zeroth._claim_floor: the
position of the first run its last claim locked, kept in a session setting) and scans from the
head of the scope only at its first claim and once per bound (50 times the last full scan, 1 s to
60 s of the test clock).

Counts, not times: the first test holds the horizon with an open transaction, leaves DEAD dead
entries at the head of the scope and counts what a session's second claim (and the other claim
paths of a worker) read — index entries returned by runs_claim_pending_idx and blocks requested
from zeroth.runs and its indexes (pg_stat_get_xact_*) — under a bound that does not depend on
DEAD. The others put a run below a session's floor by each path that can (a hand-back, a release
or a lapse of a claim not yet started, a claim rolled back, a run_after in the past, a
transaction that commits after a newer run was claimed, a thread's next run) and check that the
session claims it once the bound has passed on the test clock, and that a run of a higher
priority is claimed at once. Runs on the session's server (PostgreSQL 18, embedded); point
ZEROTH_PG_TEST_DSN at a PostgreSQL 15 server to run it there (both checked for issue 30).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import save_report

DEPLOYMENT = "d"
DEAD = 6_000
LIVE = 10
# What one claim of a run reads from the floor: the descent of the index and the few entries of
# the runs claimed since the floor was set, the run's row, its lease; per relation.
ENTRIES_BOUND = 40
BLOCKS_BOUND = 40
# The longest bound of a floor (zeroth._claim_floor_bound), and a moment past it.
BOUND = timedelta(seconds=60)
PAST_BOUND = BOUND + timedelta(seconds=1)
T0 = datetime(2031, 3, 1, 12, 0, 0, tzinfo=UTC)

CLAIM_AND_START = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(
    deployment_ref => $1, worker_id => $2, batch_size => $3, lease_seconds => 600)"""
CLAIM_PENDING = """SELECT run_id, lease_generation FROM zeroth.claim_pending(
    deployment_ref => $1, worker_id => $2, batch_size => $3, lease_seconds => $4)"""
CLAIM_SCOPES = """SELECT run_id, lease_generation FROM zeroth.claim_and_start_scopes(
    deployment_refs => ARRAY[$1], worker_id => $2, tenant_ids => ARRAY['default'],
    workspace_ids => ARRAY[NULL], batch_size => $3, lease_seconds => 600)"""
COMPLETE_AND_CLAIM = """SELECT completed, (claimed).run_id, (claimed).lease_generation
    FROM zeroth.complete_and_claim(deployment_ref => $1, worker_id => $2, run_ids => $3,
                                   generations => $4, batch_size => $5, lease_seconds => 600)"""
# Entries runs_claim_pending_idx returned and blocks requested from zeroth.runs and each of its
# indexes, in this transaction so far.
COUNTERS = """SELECT c.relname, pg_stat_get_xact_tuples_returned(c.oid) AS entries,
                     pg_stat_get_xact_blocks_fetched(c.oid) AS blocks
                FROM pg_class c
               WHERE c.oid = 'zeroth.runs'::regclass
                  OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                WHERE i.indrelid = 'zeroth.runs'::regclass)"""


CLAIM_INDEX_ENTRIES = """SELECT pg_stat_get_xact_tuples_returned(
    'zeroth.runs_claim_pending_idx'::regclass)"""


@pytest.fixture
def database_dsn(clock_database_dsn: str) -> str:
    return clock_database_dsn


Connect = Callable[..., Awaitable[asyncpg.Connection]]


async def at(conn: asyncpg.Connection, when: datetime) -> None:
    """Sets this session's test clock."""
    await conn.execute("SELECT set_config('zeroth_test.now', $1, false)", when.isoformat())


async def enqueue(conn: asyncpg.Connection, items: list[dict[str, Any]]) -> list[UUID]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)
            ORDER BY ordinality""", DEPLOYMENT, json.dumps(items))
    return [row["run_id"] for row in rows]


async def counted_claim(conn: asyncpg.Connection, worker: str
                        ) -> tuple[dict[UUID, int], tuple[int, int, str]]:
    """One claim in a transaction of its own, with what it read: (the leases, (entries of
    runs_claim_pending_idx returned, the most blocks read of one relation, that relation))."""
    async with conn.transaction():
        before = {r["relname"]: (r["entries"], r["blocks"]) for r in await conn.fetch(COUNTERS)}
        held = await claim(conn, worker)
        after = {r["relname"]: (r["entries"], r["blocks"]) for r in await conn.fetch(COUNTERS)}
    return held, (
        after["runs_claim_pending_idx"][0] - before.get("runs_claim_pending_idx", (0, 0))[0],
        *max((after[r][1] - before.get(r, (0, 0))[1], r) for r in after))


def leases(rows: list[Any]) -> dict[UUID, int]:
    return {row["run_id"]: row["lease_generation"] for row in rows if row["run_id"] is not None}


async def claim(conn: asyncpg.Connection, worker: str, n: int = 1) -> dict[UUID, int]:
    return leases(list(await conn.fetch(CLAIM_AND_START, DEPLOYMENT, worker, n)))


@pytest.fixture
async def admin(connect: Connect) -> asyncpg.Connection:
    conn = await connect()
    # No autovacuum: the dead entries stay until the test ends (the pinned horizon keeps them
    # anyway; this keeps a vacuum's pass from changing the counts).
    await conn.execute("ALTER TABLE zeroth.runs SET (autovacuum_enabled = false)")
    return conn


async def test_a_claim_reads_past_the_dead_head_of_its_scope(
        admin: asyncpg.Connection, connect: Connect) -> None:
    pin = await connect()
    await pin.execute("BEGIN")
    await pin.fetchval("SELECT txid_current()")  # pins the xmin horizon for the whole test
    await at(admin, T0)
    await enqueue(admin, [{} for _ in range(DEAD)])
    assert await admin.execute("DELETE FROM zeroth.runs") == f"DELETE {DEAD}"
    await at(admin, T0 + timedelta(seconds=10))
    live = await enqueue(admin, [{} for _ in range(LIVE)])
    # One batch: equal (priority, run_after, created_at), so any order among them.
    taken: set[UUID] = set()

    def next_of_live(held: dict[UUID, int]) -> bool:
        fresh = len(held) == 1 and set(held) <= set(live) - taken
        taken.update(held)
        return fresh

    worker = await connect()
    await at(worker, T0 + timedelta(seconds=20))
    first = await claim(worker, "w")  # the session's first claim scans from the head
    assert next_of_live(first)

    readings: dict[str, tuple[int, int, str]] = {}

    async def measured(name: str, query: str, *args: Any) -> list[Any]:
        async with worker.transaction():
            before = {r["relname"]: (r["entries"], r["blocks"])
                      for r in await worker.fetch(COUNTERS)}
            rows = list(await worker.fetch(query, *args))
            after = {r["relname"]: (r["entries"], r["blocks"])
                     for r in await worker.fetch(COUNTERS)}
        entries = (after["runs_claim_pending_idx"][0]
                   - before.get("runs_claim_pending_idx", (0, 0))[0])
        blocks, relation = max((after[r][1] - before.get(r, (0, 0))[1], r) for r in after)
        readings[name] = (entries, blocks, relation)
        return rows

    await at(worker, T0 + timedelta(seconds=20, milliseconds=100))
    second = leases(await measured("claim_and_start", CLAIM_AND_START, DEPLOYMENT, "w", 1))
    assert next_of_live(second)
    third = leases(await measured("claim_and_start_scopes", CLAIM_SCOPES, DEPLOYMENT, "w", 1))
    assert next_of_live(third)
    rows = await measured("complete_and_claim", COMPLETE_AND_CLAIM, DEPLOYMENT, "w",
                          list(third), list(third.values()), 1)
    assert rows[0]["completed"] == [True]
    assert next_of_live(leases(rows))
    await pin.execute("ROLLBACK")

    version = await admin.fetchval("SHOW server_version")
    save_report(f"dirty_claim_pg{version.split('.')[0]}", {
        name: {"index_entries": e, "most_blocks": b, "of": rel}
        for name, (e, b, rel) in readings.items()})
    walked = {name: r for name, r in readings.items()
              if r[0] > ENTRIES_BOUND or r[1] > BLOCKS_BOUND}
    assert not walked, "\n".join(
        f"{name}: {entries} entries of runs_claim_pending_idx, {blocks} blocks of {relation} "
        f"with {DEAD} dead runs at the head of the scope"
        for name, (entries, blocks, relation) in walked.items())


CLAIM_EVERY_SCOPE = """SELECT run_id, lease_generation FROM zeroth.claim_and_start_scopes(
    deployment_refs => ARRAY[$1], worker_id => $2, batch_size => $3, lease_seconds => 600)"""


async def test_the_scopes_with_pending_runs_are_found_past_their_dead_heads(
        admin: asyncpg.Connection, connect: Connect) -> None:
    # claim_and_start_scopes with tenant_ids NULL finds the scopes that hold pending runs by a
    # skip scan of runs_claim_pending_idx (zeroth._pending_scopes): one probe per scope, which
    # used to read its scope from the head, every dead entry before the first live run.
    pin = await connect()
    await pin.execute("BEGIN")
    await pin.fetchval("SELECT txid_current()")
    await at(admin, T0)
    await enqueue(admin, [{} for _ in range(DEAD)])
    assert await admin.execute("DELETE FROM zeroth.runs") == f"DELETE {DEAD}"
    await at(admin, T0 + timedelta(seconds=10))
    live = await enqueue(admin, [{} for _ in range(LIVE)])
    worker = await connect()
    await at(worker, T0 + timedelta(seconds=20))
    assert set(await claim(worker, "w")) <= set(live)  # the first claim: a floor
    entries = []
    for n in range(1, 3):
        await at(worker, T0 + timedelta(seconds=20, milliseconds=100 * n))
        async with worker.transaction():
            before = await worker.fetchval(CLAIM_INDEX_ENTRIES)
            held = leases(list(await worker.fetch(CLAIM_EVERY_SCOPE, DEPLOYMENT, "w", 1)))
            entries.append(await worker.fetchval(CLAIM_INDEX_ENTRIES) - before)
        assert len(held) == 1
        assert set(held) <= set(live)
    await pin.execute("ROLLBACK")
    version = await admin.fetchval("SHOW server_version")
    save_report(f"dirty_claim_every_scope_pg{version.split('.')[0]}", {"index_entries": entries})
    assert max(entries) <= ENTRIES_BOUND, (
        f"claim_and_start_scopes over every scope read {entries} entries of "
        f"runs_claim_pending_idx with {DEAD} dead runs at the head of the scope")


BATCH = 2_000
TAKEN = 1_000


async def test_a_claim_reads_past_the_claimed_runs_of_its_own_enqueue_batch(
        admin: asyncpg.Connection, connect: Connect) -> None:
    # One enqueue_runs batch, half of it claimed while the horizon is pinned: every claimed run
    # leaves a dead entry in runs_claim_pending_idx, before the batch's first unclaimed run. A
    # session's floor is the claim-order position of the first run it locked; the runs of one
    # batch used to share it (priority, run_after, created_at), so a claim from the floor read
    # the batch from its first run, every claimed one of it again (the bench's dirty table:
    # ~2,800 entries a claim). Each run of a batch has its own position now, in input order.
    pin = await connect()
    await pin.execute("BEGIN")
    await pin.fetchval("SELECT txid_current()")
    await at(admin, T0)
    batch = await enqueue(admin, [{} for _ in range(BATCH)])
    other = await connect()
    await at(other, T0 + timedelta(seconds=20))
    taken: list[UUID] = []
    for _ in range(TAKEN // 500):
        taken += list(leases(list(await other.fetch(CLAIM_AND_START, DEPLOYMENT, "o", 500))))
    assert taken == batch[:TAKEN], "a batch is claimed in its input order"

    worker = await connect()
    await at(worker, T0 + timedelta(seconds=20))
    # The session's first claim reads from the head, past the claimed half: a floor.
    assert list(await claim(worker, "w")) == [batch[TAKEN]]
    readings = []
    for n in range(1, 4):
        await at(worker, T0 + timedelta(seconds=20, milliseconds=100 * n))
        held, reading = await counted_claim(worker, "w")
        assert list(held) == [batch[TAKEN + n]]
        readings.append(reading)
    await pin.execute("ROLLBACK")
    version = await admin.fetchval("SHOW server_version")
    save_report(f"dirty_claim_batch_pg{version.split('.')[0]}", {
        f"claim {n}": {"index_entries": e, "most_blocks": b, "of": rel}
        for n, (e, b, rel) in enumerate(readings, 1)})
    assert all(e <= ENTRIES_BOUND and b <= BLOCKS_BOUND for e, b, _ in readings), (
        f"claims from the floor with {TAKEN} claimed runs of their batch before it: "
        + "; ".join(f"{e} entries of runs_claim_pending_idx, {b} blocks of {rel}"
                    for e, b, rel in readings))


MARKED = 30_000
CLAIM_INDEX_PAGES = """SELECT pg_stat_get_xact_blocks_fetched(
    'zeroth.runs_claim_pending_idx'::regclass)"""


async def test_a_claim_reads_past_a_head_of_entries_already_marked_dead(
        admin: asyncpg.Connection, connect: Connect) -> None:
    # Nothing pins the horizon: the runs another worker claimed leave their entries at the head of
    # the scope, and its later scans mark them dead (LP_DEAD) as they pass, so no scan returns
    # them again — but their leaf pages stay until VACUUM, and every claim from the head read
    # them page by page (~150 pages here). Such a head looked clean to the floor (it counted
    # entries returned), so each claim walked it: between two autovacuums of the W = 64 bench the
    # claim's blocks grew from 116 to 680 a call with the dead tuples (issue 30, the PG 18
    # decay). A session now keeps a floor when its full scan read many pages too.
    for batch in range(MARKED // 5_000):  # each batch at its own time: distinct keys
        await at(admin, T0 + timedelta(milliseconds=10 * batch))
        await enqueue(admin, [{} for _ in range(5_000)])
    other = await connect()
    await at(other, T0 + timedelta(seconds=10))
    taken = 0
    while held := await claim(other, "o", 1_000):
        taken += len(held)
    assert taken == MARKED
    # Its claims that find none (from the head: a clean head keeps no floor) mark the rest dead
    # once their rows are dead to every snapshot.
    for _ in range(50):
        async with other.transaction():
            before = await other.fetchval(CLAIM_INDEX_ENTRIES)
            assert not await claim(other, "o", 1_000)
            returned = await other.fetchval(CLAIM_INDEX_ENTRIES) - before
        if returned == 0:
            break
        await asyncio.sleep(0.1)
    assert returned == 0, f"{returned} entries not yet marked dead"
    await at(admin, T0 + timedelta(seconds=10))
    live = await enqueue(admin, [{} for _ in range(LIVE)])
    worker = await connect()
    await at(worker, T0 + timedelta(seconds=20))
    async with worker.transaction():  # its first claim scans from the head, every page of it
        before_first = await worker.fetchval(CLAIM_INDEX_PAGES)
        assert set(await claim(worker, "w")) <= set(live)
        walked = await worker.fetchval(CLAIM_INDEX_PAGES) - before_first
    assert walked > 2 * BLOCKS_BOUND, f"the head is {walked} pages long: no test"
    readings = []
    for n in range(1, 4):
        await at(worker, T0 + timedelta(seconds=20, milliseconds=100 * n))
        held, reading = await counted_claim(worker, "w")
        assert len(held) == 1
        assert set(held) <= set(live)
        readings.append(reading)
    version = await admin.fetchval("SHOW server_version")
    save_report(f"dirty_claim_marked_pg{version.split('.')[0]}", {
        "first claim's pages": walked, **{
            f"claim {n}": {"index_entries": e, "most_blocks": b, "of": rel}
            for n, (e, b, rel) in enumerate(readings, 1)}})
    assert all(e <= ENTRIES_BOUND and b <= BLOCKS_BOUND for e, b, _ in readings), (
        f"claims with {MARKED} entries marked dead at the head of the scope: "
        + "; ".join(f"{e} entries of runs_claim_pending_idx, {b} blocks of {rel}"
                    for e, b, rel in readings))


# -- what the floor hides is claimed within its bound ---------------------------------------

# Dead runs at the head of the scope, more than the 100 wasted entries that make a session keep a
# floor (zeroth._claim_floor_after_full_scan): on a clean head every claim reads from the head.
DIRTY = 300


@pytest.fixture
async def dirty_head(admin: asyncpg.Connection, connect: Connect) -> None:
    """A session idle in a transaction pins the horizon for the test, and DIRTY runs enqueued an
    hour before T0 and deleted leave their entries at the head of the scope."""
    pin = await connect()
    await pin.execute("BEGIN")
    await pin.fetchval("SELECT txid_current()")
    await at(admin, T0 - timedelta(hours=1))
    await enqueue(admin, [{} for _ in range(DIRTY)])
    assert await admin.execute("DELETE FROM zeroth.runs") == f"DELETE {DIRTY}"



async def drain(conn: asyncpg.Connection, worker: str) -> set[UUID]:
    """Claims until the session's claim finds nothing; returns what it claimed."""
    got: set[UUID] = set()
    while held := await claim(conn, worker, 10):
        assert not got & set(held)
        got |= set(held)
    return got


async def floor_past(conn: asyncpg.Connection, admin: asyncpg.Connection, when: datetime
                     ) -> tuple[dict[UUID, int], list[UUID]]:
    """Runs a (enqueued at T0) and b (T0 + 5 s); the session claims a then b at `when`, so its
    floor is b's position, past a's (returned: a's lease, and b)."""
    await at(admin, T0)
    (a,) = await enqueue(admin, [{}])
    await at(admin, T0 + timedelta(seconds=5))
    (b,) = await enqueue(admin, [{}])
    await at(conn, when)
    held_a = await claim(conn, "w")
    assert list(held_a) == [a]
    held_b = await claim(conn, "w")
    assert list(held_b) == [b]
    return held_a, [b]


async def claimed_within_bound(conn: asyncpg.Connection, run_id: UUID, when: datetime,
                               hidden: bool = True) -> None:
    """run_id is below the session's floor (hidden): its claims do not see it (this shows the
    test put it there; sql/README.md documents it) until the bound has passed since `when`, and
    then its next claim takes it."""
    if hidden:
        await at(conn, when + timedelta(milliseconds=500))
        assert run_id not in await claim(conn, "w", 10)
    await at(conn, when + PAST_BOUND)
    held = await claim(conn, "w", 10)
    assert run_id in held, f"{run_id} not claimed {PAST_BOUND} after it was put below the floor"


@pytest.fixture
async def worker(connect: Connect, dirty_head: None) -> asyncpg.Connection:
    return await connect()


async def test_a_run_handed_back_below_the_floor_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    when = T0 + timedelta(seconds=30)
    held_a, _ = await floor_past(worker, admin, when)
    ((a, generation),) = held_a.items()
    assert await worker.fetchval(
        """SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'w',
               generation => $2)""", a, generation)
    await claimed_within_bound(worker, a, when)


async def test_a_released_or_lapsed_unstarted_claim_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    await at(admin, T0)
    released, lapsed = await enqueue(admin, [{}, {}])
    await at(admin, T0 + timedelta(seconds=5))
    (later,) = await enqueue(admin, [{}])
    when = T0 + timedelta(seconds=30)
    await at(worker, when)
    unstarted = leases(list(await worker.fetch(CLAIM_PENDING, DEPLOYMENT, "w", 2, 5.0)))
    assert set(unstarted) == {released, lapsed}
    assert list(await claim(worker, "w")) == [later]  # the floor is past both
    assert await worker.fetchval(
        """SELECT zeroth.release_lease(run_id => $1, worker_id => 'w', generation => $2)""",
        released, unstarted[released])
    # The other lapses (lease 5 s); both are claimed once the bound has passed.
    await at(worker, when + PAST_BOUND)
    held = await claim(worker, "w", 10)
    assert {released, lapsed} <= set(held)


async def test_a_run_left_pending_by_a_rolled_back_claim_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection, connect: Connect) -> None:
    await at(admin, T0)
    (a,) = await enqueue(admin, [{}])
    await at(admin, T0 + timedelta(seconds=5))
    (b,) = await enqueue(admin, [{}])
    when = T0 + timedelta(seconds=30)
    other = await connect()
    await at(other, when)
    await at(worker, when)
    await other.execute("BEGIN")
    assert list(await claim(other, "other")) == [a]
    assert list(await claim(worker, "w")) == [b]  # skips a (locked): the floor is past it
    await other.execute("ROLLBACK")
    await claimed_within_bound(worker, a, when)


async def test_a_run_enqueued_below_the_floor_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    when = T0 + timedelta(seconds=30)
    await floor_past(worker, admin, when)
    await at(admin, when)
    (old,) = await enqueue(admin, [{"run_after": (T0 - timedelta(hours=1)).isoformat()}])
    await claimed_within_bound(worker, old, when)


async def test_a_run_committed_after_a_newer_one_was_claimed_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection, connect: Connect) -> None:
    slow = await connect()
    await slow.execute("BEGIN")
    await at(slow, T0)  # its run's run_after and created_at: the transaction's time
    (late,) = await enqueue(slow, [{}])
    await at(admin, T0 + timedelta(seconds=5))
    (newer,) = await enqueue(admin, [{}])
    when = T0 + timedelta(seconds=30)
    await at(worker, when)
    assert list(await claim(worker, "w")) == [newer]
    await slow.execute("COMMIT")
    await claimed_within_bound(worker, late, when)


async def test_a_threads_next_run_is_claimed_within_the_bound(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    await at(admin, T0)
    head, queued = await enqueue(admin, [{"thread_id": "t"}, {"thread_id": "t"}])
    await at(admin, T0 + timedelta(seconds=5))
    (other,) = await enqueue(admin, [{}])
    when = T0 + timedelta(seconds=30)
    await at(worker, when)
    held = await claim(worker, "w")
    assert list(held) == [head]  # the queued one waits for its thread
    assert list(await claim(worker, "w")) == [other]  # the floor: other's position
    assert await worker.fetchval(
        """SELECT zeroth.complete_run(run_id => $1, worker_id => 'w', generation => $2)""",
        head, held[head])
    # Promoted to pending with its own run_after (T0): below the floor.
    await claimed_within_bound(worker, queued, when)


async def test_a_retried_run_is_claimed_once_its_backoff_has_passed(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    when = T0 + timedelta(seconds=30)
    held_a, _ = await floor_past(worker, admin, when)
    ((a, generation),) = held_a.items()
    assert await worker.fetchval(
        """SELECT zeroth.fail_run(run_id => $1, worker_id => 'w', generation => $2,
               retry_base_seconds => 1, retry_max_seconds => 1)""", a, generation) is not None
    # Back to pending with run_after = now + backoff: above any floor, due within a second.
    await claimed_within_bound(worker, a, when, hidden=False)


async def test_a_run_of_a_higher_priority_is_claimed_at_once(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    when = T0 + timedelta(seconds=30)
    await floor_past(worker, admin, when)
    await at(admin, T0 + timedelta(seconds=6))
    rest = await enqueue(admin, [{}, {}])
    (urgent,) = await enqueue(admin, [{"priority": 5, "run_after": T0.isoformat()}])
    # Above the floor's level: read from the head of its level, in claim order, at once.
    await at(worker, when + timedelta(milliseconds=10))
    assert list(await claim(worker, "w")) == [urgent]
    assert await drain(worker, "w") == set(rest)


# -- the floor's own value: the session's setting, which any client of the session may write ---

# (a placeholder setting: not in pg_settings)
FLOOR_NAME = """SELECT zeroth._claim_floor_setting('default', zeroth._workspace_key(NULL), $1)"""


async def floor_value(conn: asyncpg.Connection) -> tuple[str, list[str]]:
    """The session's kept claim floor of the scope: its setting's name and its fields (serves,
    priority, run_after, created_at, run_id, full_at in microseconds since the epoch, bound_ms,
    the md5 of the scope)."""
    name = await conn.fetchval(FLOOR_NAME, DEPLOYMENT)
    value = await conn.fetchval("SELECT current_setting($1, true)", name)
    assert value, f"no floor kept in {name}"
    return name, value.split(" ")


async def write_floor(conn: asyncpg.Connection, name: str, fields: list[str]) -> None:
    await conn.execute("SELECT set_config($1, $2, false)", name, " ".join(fields))


async def hidden_run(admin: asyncpg.Connection, worker: asyncpg.Connection, when: datetime
                     ) -> UUID:
    """A run handed back below the worker session's floor, kept at `when`."""
    held_a, _ = await floor_past(worker, admin, when)
    ((a, generation),) = held_a.items()
    assert await worker.fetchval(
        """SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'w',
               generation => $2)""", a, generation)
    return a


@pytest.mark.parametrize("path", ["claim_and_start", "claim_and_start_scopes", "claim_pending"])
async def test_a_hidden_run_is_claimed_exactly_when_the_floors_bound_has_passed(
        admin: asyncpg.Connection, worker: asyncpg.Connection, path: str) -> None:
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    _, fields = await floor_value(worker)
    full_at = datetime.fromtimestamp(0, UTC) + timedelta(microseconds=int(fields[5]))
    bound = timedelta(milliseconds=int(fields[6]))
    assert timedelta(seconds=1) <= bound <= BOUND
    query = {"claim_and_start": CLAIM_AND_START, "claim_and_start_scopes": CLAIM_SCOPES,
             "claim_pending": CLAIM_PENDING}[path]
    args = (600.0,) if path == "claim_pending" else ()
    await at(worker, full_at + bound - timedelta(microseconds=1))
    assert a not in leases(list(await worker.fetch(query, DEPLOYMENT, "w", 10, *args)))
    await at(worker, full_at + bound)
    assert a in leases(list(await worker.fetch(query, DEPLOYMENT, "w", 10, *args))), (
        f"{a} not claimed when the floor's bound {bound} had passed")


async def test_a_floor_value_with_a_longer_bound_hides_no_run_past_60_seconds(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    # A client of the session (behind a transaction pooler: any client of the login) writes the
    # floor's bound_ms itself: the claims must still read from the head within 60 s.
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    name, fields = await floor_value(worker)
    fields[6] = "999999999"  # 11.6 days
    await write_floor(worker, name, fields)
    await claimed_within_bound(worker, a, when, hidden=False)


async def test_a_floor_kept_for_another_scope_of_its_setting_is_no_floor(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    # 64 settings hold the floors of every scope (zeroth._claim_floor_setting): two scopes of one
    # setting overwrite each other's, and a claim takes a value only when it names its own scope.
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    name, fields = await floor_value(worker)
    assert fields[7] == await worker.fetchval(
        "SELECT zeroth._claim_floor_scope('default', zeroth._workspace_key(NULL), $1)", DEPLOYMENT)
    fields[7] = await worker.fetchval(
        "SELECT zeroth._claim_floor_scope('default', zeroth._workspace_key(NULL), 'other')")
    await write_floor(worker, name, fields)
    await at(worker, when + timedelta(milliseconds=500))
    assert a in await claim(worker, "w", 10), "another scope's floor hid a run of this one"


async def test_a_session_claiming_many_scopes_keeps_at_most_64_floor_settings(
        worker: asyncpg.Connection) -> None:
    names = await worker.fetchval(
        """SELECT count(DISTINCT zeroth._claim_floor_setting('t' || g, 'w', 'd'))
             FROM generate_series(1, 5000) AS g""")
    assert names == 64


@pytest.mark.parametrize("field", [2, 3, 5])
@pytest.mark.parametrize("value", ["-999999999999999999", "999999999999999999"])
async def test_a_floor_value_out_of_the_timestamp_range_fails_no_claim(
        admin: asyncpg.Connection, worker: asyncpg.Connection, field: int, value: str) -> None:
    # Well-formed digits, but a time far outside what a claim could have kept (before 4713 BC,
    # the limit of timestamptz, or tens of thousands of years ahead): never an error in the
    # claims of the session, and the hidden run is still claimed within the bound.
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    name, fields = await floor_value(worker)
    fields[field] = value
    await write_floor(worker, name, fields)
    await at(worker, when + timedelta(milliseconds=500))
    held = set(await claim(worker, "w", 10))
    await at(worker, when + PAST_BOUND)
    held |= set(await claim(worker, "w", 10))
    assert a in held


async def test_a_run_with_an_infinite_run_after_stops_no_claim_of_its_scope(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    # A DBA's manual UPDATE (enqueue refuses an infinite run_after). The run sorts first in its
    # level; a lower level than the dirty head's, so a claim locks it after passing the dead
    # entries (or from a floor) and would keep its position as the next floor.
    await at(admin, T0)
    (other,) = await enqueue(admin, [{}])
    (odd,) = await enqueue(admin, [{"priority": -1}])
    assert await admin.execute(
        "UPDATE zeroth.runs SET run_after = '-infinity' WHERE run_id = $1", odd) == "UPDATE 1"
    await at(worker, T0 + timedelta(seconds=30))
    assert list(await claim(worker, "w")) == [other]  # past the dead head: a floor
    assert list(await claim(worker, "w")) == [odd]
    (later,) = await enqueue(admin, [{"priority": -1}])
    await at(worker, T0 + timedelta(seconds=31))
    assert list(await claim(worker, "w")) == [later]


@pytest.mark.parametrize("value", [
    "", "garbage", "any 0 0 0 00000000-0000-0000-0000-000000000000 0 60000'; DROP TABLE x; --",
    "any 99999999999 0 0 00000000-0000-0000-0000-000000000000 0 60000",
    "x" * 100_000])
async def test_a_malformed_floor_value_is_no_floor(
        admin: asyncpg.Connection, worker: asyncpg.Connection, value: str) -> None:
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    name, _ = await floor_value(worker)
    await worker.execute("SELECT set_config($1, $2, false)", name, value)
    await at(worker, when + timedelta(milliseconds=500))
    assert a in await claim(worker, "w", 10)  # read from the head


# One field off in a value that is otherwise the session's own floor (fields: serves, priority,
# run_after, created_at, run_id, full_at, bound_ms, scope): _claim_floor checks each field
# before any cast.
OFF_BY_ONE_FIELD = {
    "a trailing space": lambda f: " ".join(f) + " ",
    "two spaces apart": lambda f: "  ".join(f),
    "a nine-field value": lambda f: " ".join([*f, "0"]),
    "a signed priority": lambda f: " ".join([f[0], "+" + f[1], *f[2:]]),
    "an 11-digit priority": lambda f: " ".join([f[0], "1" * 11, *f[2:]]),
    "an 18-digit run_after": lambda f: " ".join([*f[:2], "1" * 18, *f[3:]]),
    "a newline in created_at": lambda f: " ".join([*f[:3], f[3] + "\n", *f[4:]]),
    "an upper-case run_id": lambda f: " ".join([*f[:4], f[4].upper(), *f[5:]]),
    "a run_id without dashes": lambda f: " ".join([*f[:4], f[4].replace("-", ""), *f[5:]]),
    "a 10-digit bound": lambda f: " ".join([*f[:6], "1" * 10, *f[7:]]),
    "a negative bound": lambda f: " ".join([*f[:6], "-5000", *f[7:]]),
    "another scope's md5": lambda f: " ".join([*f[:7], "0" * 32]),
}


@pytest.mark.parametrize("mutate", OFF_BY_ONE_FIELD.values(), ids=OFF_BY_ONE_FIELD.keys())
async def test_a_floor_value_with_one_field_off_is_no_floor(
        admin: asyncpg.Connection, worker: asyncpg.Connection,
        mutate: Callable[[list[str]], str]) -> None:
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    name, fields = await floor_value(worker)
    await worker.execute("SELECT set_config($1, $2, false)", name, mutate(fields))
    await at(worker, when + timedelta(milliseconds=500))
    assert a in await claim(worker, "w", 10)  # read from the head


async def test_a_floor_kept_at_a_later_time_is_no_floor_once_the_clock_goes_back(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    # zeroth._now() going backwards (a failover to a server whose clock is behind, a step of the
    # system clock): the claims read from the head, not from a floor kept in the future.
    when = T0 + timedelta(seconds=30)
    a = await hidden_run(admin, worker, when)
    await at(worker, when - timedelta(seconds=10))
    assert a in await claim(worker, "w", 10)


# -- the rate limit's "is work waiting" reads the claimer's floor --------------------------

CLAIM_VERSIONED = """SELECT run_id, lease_generation, retry_at FROM zeroth.claim_and_start(
    deployment_ref => $1, worker_id => $2, batch_size => $3, lease_seconds => 600,
    code_version => 'v1')"""


async def test_a_rate_limited_claim_reads_from_the_claimers_own_floor(
        admin: asyncpg.Connection, worker: asyncpg.Connection) -> None:
    # A claimer of a versioned deployment (serves: the versions it may resume) whose rate limit
    # has no start left asks zeroth._scope_has_due_run whether work is waiting, to answer "retry
    # at" rather than "nothing". That look used to name no versions: the claimer's floor (kept
    # for its versions) was no floor for it, so each such claim walked the dirty head from the
    # start, and a look that found nothing replaced the claimer's floor with its own.
    await admin.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await admin.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => $1, "
                        "version_policy => 'same')", DEPLOYMENT)
    await admin.execute("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 1, "
                        "period_seconds => 3600)")
    await admin.execute("SELECT * FROM zeroth.set_scope_limits(deployment_ref => $1, "
                        "tenant_id => 'default', rate_limit => 'k')", DEPLOYMENT)
    await at(admin, T0)
    (a,) = await enqueue(admin, [{}])
    await at(admin, T0 + timedelta(seconds=5))
    (b,) = await enqueue(admin, [{}])
    await at(worker, T0 + timedelta(seconds=30))
    rows = await worker.fetch(CLAIM_VERSIONED, DEPLOYMENT, "w", 1)
    assert [r["run_id"] for r in rows] == [a]  # past the dirty head: a floor, for v1's claims
    _, kept = await floor_value(worker)
    entries = []
    for n in range(1, 4):
        await at(worker, T0 + timedelta(seconds=30, milliseconds=100 * n))
        async with worker.transaction():
            before = await worker.fetchval(CLAIM_INDEX_ENTRIES)
            rows = await worker.fetch(CLAIM_VERSIONED, DEPLOYMENT, "w", 1)
            entries.append(await worker.fetchval(CLAIM_INDEX_ENTRIES) - before)
        # b is waiting: held back by the rate limit, with the time it may start
        assert [(r["run_id"], r["retry_at"] is not None) for r in rows] == [(None, True)]
    # Nothing waiting any more: a definitive empty answer, and the claimer keeps its floor.
    assert await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", b) == "DELETE 1"
    await at(worker, T0 + timedelta(seconds=31))
    rows = await worker.fetch(CLAIM_VERSIONED, DEPLOYMENT, "w", 1)
    assert [(r["run_id"], r["retry_at"]) for r in rows] == [(None, None)]
    _, fields = await floor_value(worker)
    version = await admin.fetchval("SHOW server_version")
    save_report(f"dirty_claim_rate_limited_pg{version.split('.')[0]}", {"index_entries": entries})
    assert fields[0] == kept[0], "the rate limit's look replaced the claimer's floor"
    assert max(entries) <= ENTRIES_BOUND, (
        f"a rate-limited claim read {entries} entries of runs_claim_pending_idx "
        f"with {DIRTY} dead runs at the head of the scope")


# -- count_pending on a table that grew after its statistics were taken ------------------------

QUEUED = 2_000
CYCLED = 20_000
COUNT_PENDING = "SELECT zeroth.count_pending(deployment_ref => $1)"


async def test_count_pending_reads_the_pending_runs_not_the_table(
        admin: asyncpg.Connection, connect: Connect) -> None:
    # Statistics taken while the table held only pending runs (an autoanalyze early in a cold
    # start), then many runs enqueued, claimed and completed: the table grows, its statistics
    # still say "all pending". count_pending — the depth gauge a worker or a producer reads
    # several times a second — then counted by a sequential scan of the whole table (PostgreSQL
    # 15 in the W = 64 bench: 3,661 blocks a call at 66,000 runs, growing with the table; issue
    # 30), or, with sequential scans off, through runs_created_not_running_idx, every finished
    # run's entry and row included.
    await at(admin, T0)
    await enqueue(admin, [{} for _ in range(QUEUED)])
    await admin.execute("ANALYZE zeroth.runs")
    worker = await connect()
    await at(worker, T0 + timedelta(seconds=10))
    for batch in range(CYCLED // 1_000):
        await at(admin, T0 + timedelta(seconds=1, milliseconds=batch))
        await enqueue(admin, [{"priority": 1} for _ in range(1_000)])
        held = await claim(worker, "w", 1_000)
        assert len(held) == 1_000
        completed = await worker.fetchval(
            """SELECT count(*) FILTER (WHERE c.completed) FROM zeroth.complete_runs(
                   worker_id => 'w', run_ids => $1, generations => $2) c""",
            list(held), list(held.values()))
        assert completed == 1_000
    heap = await admin.fetchval("SELECT pg_relation_size('zeroth.runs') / 8192")
    readings = []
    for _ in range(3):  # the first marks the claimed entries dead; then what a gauge reads
        async with worker.transaction():
            before = {r["relname"]: r["blocks"] for r in await worker.fetch(COUNTERS)}
            assert await worker.fetchval(COUNT_PENDING, DEPLOYMENT) == QUEUED
            after = {r["relname"]: r["blocks"] for r in await worker.fetch(COUNTERS)}
        readings.append({r: after[r] - before.get(r, 0) for r in after
                         if after[r] > before.get(r, 0)})
    version = await admin.fetchval("SHOW server_version")
    save_report(f"count_pending_grown_pg{version.split('.')[0]}",
                {"heap_pages": heap, "blocks_per_call": readings})
    # The pending runs' rows (2,000 of them, ~150 heap pages: 53 blocks read, as an index scan
    # reads consecutive rows of one page once), not the table's pages; of the other indexes only
    # what planning reads (their metapage). The claim index's own pages still include those of
    # the claimed runs' entries until VACUUM: a count must pass every entry of its range.
    last = readings[-1]
    assert last.get("runs", 0) < heap // 10, (
        f"count_pending read {last} blocks ({heap} heap pages) to count {QUEUED} pending runs")
    assert all(blocks <= 1 for name, blocks in last.items()
               if name not in ("runs", "runs_claim_pending_idx")), (
        f"count_pending read other indexes: {last}")
