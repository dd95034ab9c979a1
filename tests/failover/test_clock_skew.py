"""A lease across a failover to a server whose clock is another machine's (issue 35, item 3).

Leases are decided on the database clock: a lease the old primary granted ends at its
``lease_expires_at`` *as the new primary's clock reads it*. Here the standby's postmaster runs
under libfaketime, SKEW_S seconds ahead of the machine's clock, and the test fails over to it and
back:

* **to a clock ahead**: a lease granted by the primary (the machine's clock), the primary killed,
  the standby promoted. The lease ends SKEW_S early in real time: the orphan sweep takes the run
  over while, by the clock that granted the lease, its holder still had time — and the generation
  fence refuses every write of that holder all the same; the new holder's completion is the one
  outcome.
* **to a clock behind**: the killed primary re-cloned as the new primary's standby (the
  machine's clock), a lease granted by the skewed primary, the skewed primary killed and the
  other promoted. The lease lasts SKEW_S longer in real time: after it has run out by the clock
  that granted it, the new primary still finds it live — the holder's write is accepted (it is
  still the only holder: no claim can take a live lease) and the sweep takes nothing — until
  the new clock passes the expiry: recovery is later, nothing stale is accepted.

The bound (docs/dba-guide.md "High availability"): skew between nodes adds to or subtracts
from every lease live across a failover; the fence keeps one outcome per run whatever the clocks.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from failover_support import retrying, zeroth_pair
from replication import LIBFAKETIME, Node

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]

SKEW_S = 3.0
#: Longer than the skew plus a failover (SIGKILL and ``pg_ctl promote``) takes on a loaded
#: machine, so that the sweep's early takeover comes after the promotion.
LEASE_S = 8.0
DEPLOYMENT = "clock-skew"
BAND = 2**32


def _require_libfaketime() -> None:
    if LIBFAKETIME.exists():
        return
    reason = "needs libfaketime: apt-get install faketime (Debian 12; .ci/run installs it)"
    if os.environ.get("ZEROTH_PG_REQUIRE_HA") == "1":
        pytest.fail(f"ZEROTH_PG_REQUIRE_HA=1 but the clock skew test {reason}")
    pytest.skip(reason)


def clock_offset(node: Node) -> timedelta:
    """How far the server's clock reads from this machine's (midpoint of the round trip)."""
    before = time.time()
    (now,), = node.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
    after = time.time()
    return timedelta(seconds=float(now) - (before + after) / 2)  # type: ignore[arg-type]


async def _call(dsn: str, query: str, *args: Any) -> Any:
    """One statement on whichever server is the primary (retried through a failover)."""
    async def once() -> Any:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchrow(query, *args)
        finally:
            await conn.close()

    return await retrying(once)


async def _claim(dsn: str, worker: str) -> tuple[Any, int, datetime]:
    """A run enqueued, claimed and started by ``worker``: (run id, generation, expiry)."""
    run_id = (await _call(dsn, "SELECT (zeroth.enqueue_run($1)).run_id", DEPLOYMENT))[0]
    claimed = await _call(
        dsn, """SELECT run_id, lease_generation, lease_expires_at FROM zeroth.claim_pending(
                   deployment_ref => $1, worker_id => $2, lease_seconds => $3)""",
        DEPLOYMENT, worker, LEASE_S)
    assert claimed["run_id"] == run_id, claimed
    generation = claimed["lease_generation"]
    assert (await _call(dsn, "SELECT zeroth.start_run($1, $2, $3)", run_id, worker,
                        generation))[0]
    return run_id, generation, claimed["lease_expires_at"]


async def _sweep(dsn: str, worker: str) -> list[Any]:
    async def once() -> list[Any]:
        conn = await asyncpg.connect(dsn)
        try:
            return [row for row in await conn.fetch(
                """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(
                       deployment_ref => $1, worker_id => $2, lease_seconds => $3)""",
                DEPLOYMENT, worker, LEASE_S) if row["run_id"] is not None]
        finally:
            await conn.close()

    return await retrying(once)


async def _taken_over(dsn: str, worker: str) -> tuple[Any, int, datetime]:
    """The orphan sweep, as a worker runs it, until it takes a run over: (run id, new
    generation, the new primary's time of the takeover)."""
    deadline = time.monotonic() + 120
    while not (taken := await _sweep(dsn, worker)):
        assert time.monotonic() < deadline, "the sweep never took the run over"
        await asyncio.sleep(0.05)
    (row,) = taken
    acquired = (await _call(dsn, "SELECT lease_acquired_at FROM zeroth.runs WHERE run_id = $1",
                            row["run_id"]))[0]
    return row["run_id"], row["lease_generation"], acquired


async def _checkpoint(dsn: str, run_id: Any, worker: str, generation: int) -> bool:
    row = await _call(dsn, "SELECT zeroth.save_checkpoint($1, $2, $3, '{\"step\": 1}')",
                      run_id, worker, generation)
    return row[0] is not None


async def _complete(dsn: str, run_id: Any, worker: str, generation: int) -> bool:
    return bool((await _call(dsn, "SELECT zeroth.complete_run($1, $2, $3)", run_id, worker,
                             generation))[0])


async def test_a_lease_across_failovers_to_a_clock_ahead_and_to_a_clock_behind() -> None:
    _require_libfaketime()
    with zeroth_pair("sync", standby_clock_offset_s=SKEW_S) as (pair, dsn):
        skew = clock_offset(pair.standby) - clock_offset(pair.primary)
        assert abs(skew.total_seconds() - SKEW_S) < 0.5, f"libfaketime did not skew: {skew}"

        # -- to a clock ahead: the lease ends early; the fence refuses its holder ------------
        run_a, held_a, expires_a = await _claim(dsn, "w1")
        await asyncio.to_thread(pair.failover)
        taken_run, taken_a, acquired_a = await _taken_over(dsn, "w2")
        assert taken_run == run_a
        assert taken_a > BAND  # in the new timeline's band
        assert acquired_a > expires_a  # lapsed by the clock of the server that took it over
        # ... while, by the clock that granted it, the lease still had time to run:
        assert acquired_a - skew < expires_a, (acquired_a, skew, expires_a)
        # The holder, whose lease had not run out by its own reckoning, writes in vain.
        assert not await _checkpoint(dsn, run_a, "w1", held_a)
        assert not await _complete(dsn, run_a, "w1", held_a)
        assert await _complete(dsn, run_a, "w2", taken_a)

        # -- to a clock behind: the lease lasts longer; nobody else can take it meanwhile ----
        pair = await asyncio.to_thread(pair.reclone_old_primary)  # the machine's clock
        run_b, held_b, expires_b = await _claim(dsn, "w3")  # granted by the skewed clock
        await asyncio.to_thread(pair.failover)
        behind = clock_offset(pair.standby) - skew  # the new primary's clock against the old
        assert behind.total_seconds() < -(SKEW_S - 0.5), behind
        # Wait until the lease has run out by the clock that granted it (+ 0.5 s).
        deadline = time.monotonic() + 120
        while datetime.now(expires_b.tzinfo) - behind < expires_b + timedelta(seconds=0.5):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert await _sweep(dsn, "w4") == []  # still live on the new primary's clock
        assert await _checkpoint(dsn, run_b, "w3", held_b)  # the only holder: accepted
        taken_run, taken_b, acquired_b = await _taken_over(dsn, "w4")
        assert taken_run == run_b
        assert taken_b > 2 * BAND  # the third timeline's band
        assert acquired_b > expires_b
        assert not await _checkpoint(dsn, run_b, "w3", held_b)
        assert not await _complete(dsn, run_b, "w3", held_b)
        assert await _complete(dsn, run_b, "w4", taken_b)

        # One accepted outcome each, the new holders'; the old holders' attempts ended with
        # the takeovers.
        attempts = (await _call(dsn, """SELECT array_agg(a.worker_id || ':' || a.outcome
                                                           ORDER BY a.ended_at)
                                          FROM zeroth.run_attempts a"""))[0]
        assert [attempt.split(":")[0] for attempt in attempts] == ["w1", "w2", "w3", "w4"]
        assert attempts[1::2] == ["w2:completed", "w4:completed"], attempts
        assert "completed" not in attempts[0] + attempts[2], attempts
