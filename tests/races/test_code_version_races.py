"""Races of code versions (issue 34, item 3): workers of two versions meeting the same runs, with
real sessions and the real clock, under version_policy same.

What must hold: a started run is claimed only by a worker of the version it recorded, a run never
started by exactly one worker of either version (recording that worker's version), each run by
one holder at a time; and a retire_code_version that moves runs while a claimer of the new
version runs takes them from the old version at once: the old version's next claim gets none,
the new one's gets each exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
from interleave import assert_waits_for, finishes_without_waiting

DEPLOYMENT = "version-race"
V1, V2 = "v1", "v2"

CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
    worker_id => $2, batch_size => $3, lease_seconds => 60, code_version => $4)"""
COMPLETE = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
    output => '{}')"""


async def setup(db: asyncpg.Connection, pinned: int, fresh: int) -> tuple[list[Any], list[Any]]:
    """`pinned` runs started by v1 and handed back (pending, pinned to v1), `fresh` never
    started, under policy same."""
    await db.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await db.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => $1, "
                     "version_policy => 'same')", DEPLOYMENT)
    started = []
    for _ in range(pinned):
        await db.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)",
                          DEPLOYMENT)
    for row in await db.fetch(CLAIM, DEPLOYMENT, "setup", 1000, V1):
        if row["run_id"] is None:  # nothing to claim: the empty answer's marker row
            continue
        assert await db.fetchval(
            "SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'setup', "
            "generation => $2)", row["run_id"], row["lease_generation"])
        started.append(row["run_id"])
    assert len(started) == pinned
    new = [await db.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)",
                             DEPLOYMENT) for _ in range(fresh)]
    return started, new


class TestTwoVersionsClaimTogether:
    async def test_each_run_goes_to_one_worker_of_a_version_allowed_to_serve_it(self, connect):
        db = await connect()
        pinned, fresh = await setup(db, pinned=30, fresh=30)
        claims: list[tuple[str, Any]] = []

        async def claimer(version: str, n: int) -> None:
            conn = await connect()
            worker = f"{version}-{n}"
            for _ in range(40):
                rows = await conn.fetch(CLAIM, DEPLOYMENT, worker, 3, version)
                for row in rows:
                    if row["run_id"] is None:
                        continue
                    claims.append((version, row["run_id"]))
                    assert await conn.fetchval(COMPLETE, row["run_id"], worker,
                                               row["lease_generation"])
                if all(row["run_id"] is None for row in rows):
                    await asyncio.sleep(0)

        await asyncio.gather(*(claimer(version, n) for version in (V1, V2) for n in range(3)))

        counted = Counter(run_id for _, run_id in claims)
        assert set(counted) == set(pinned) | set(fresh)
        assert max(counted.values()) == 1  # one holder, one completion per run
        by_run = dict((run_id, version) for version, run_id in claims)
        assert {by_run[r] for r in pinned} == {V1}
        rows = await db.fetch("SELECT r.run_id, r.status::text AS status, v.code_version "
                              "FROM zeroth.runs r JOIN zeroth.code_versions v "
                              "ON v.version_id = r.code_version_id WHERE r.run_id = ANY ($1)",
                              fresh)
        assert all(row["status"] == "completed" for row in rows)
        assert all(row["code_version"] == by_run[row["run_id"]] for row in rows)


class TestANewVersionNeverMakesAClaimWait:
    async def test_two_first_claims_of_a_version_do_not_wait_for_each_other(self, sessions):
        a, b, db = sessions
        await setup(db, pinned=0, fresh=2)
        # A's claim sees version v9 first and records its text, in a transaction it keeps open.
        await a.begin()
        first = await a.rows(CLAIM, DEPLOYMENT, "a-v9", 1, "v9")
        assert len([r for r in first.value if r["run_id"]]) == 1
        # B's first claim of v9 neither waits for A (no unique constraint to wait on) nor fails.
        task = b.spawn(CLAIM, DEPLOYMENT, "b-v9", 1, "v9", rows=True)
        second = await finishes_without_waiting(db, b, task)
        assert len([r for r in second.value if r["run_id"]]) == 1
        await a.commit()
        keys = await db.fetch("SELECT DISTINCT r.code_version_id FROM zeroth.runs r "
                              "WHERE r.code_version_id IS NOT NULL")
        assert len(keys) == 1  # one version, whichever claim recorded its text
        assert await db.fetchval("SELECT DISTINCT v.code_version FROM zeroth.code_versions v "
                                 "WHERE v.version_id = $1", keys[0]["code_version_id"]) == "v9"


class TestAMoveMeetsClaimers:
    async def test_a_move_in_flight_hands_the_runs_over_exactly_once(self, sessions):
        a, b, db = sessions
        pinned, _ = await setup(db, pinned=5, fresh=0)
        # A (the operator) moves v1's runs to v2 and keeps its transaction open: the rows are
        # its own until it commits.
        await a.begin()
        moved = await a.rows("SELECT * FROM zeroth.retire_code_version(deployment_ref => $1, "
                             "code_version => 'v1', action => 'move', to_version => 'v2')",
                             DEPLOYMENT)
        assert moved.value == [{"runs_changed": 5, "runs_left": 0}]
        # Claimers of either version skip the locked rows (never wait on the operator).
        for version in (V1, V2):
            rows = await b.rows(CLAIM, DEPLOYMENT, f"b-{version}", 10, version)
            assert [r["run_id"] for r in rows.value if r["run_id"]] == []
        # The registry is not held: a registration goes through.
        changed = b.spawn("SELECT zeroth.register_deployment(deployment_ref => $1, "
                          "max_attempts => 4)", DEPLOYMENT)
        assert (await asyncio.wait_for(changed, 5)).sqlstate is None
        await a.commit()
        old = await b.rows(CLAIM, DEPLOYMENT, "b-v1", 10, V1)
        assert [r["run_id"] for r in old.value if r["run_id"]] == []
        new = await b.rows(CLAIM, DEPLOYMENT, "b-v2", 10, V2)
        assert sorted(r["run_id"] for r in new.value if r["run_id"]) == sorted(pinned)
        again = await b.rows(CLAIM, DEPLOYMENT, "b-v2-again", 10, V2)
        assert [r["run_id"] for r in again.value if r["run_id"]] == []

    async def test_a_policy_change_waits_for_nothing_but_the_deployment_row(self, sessions):
        a, b, db = sessions
        await setup(db, pinned=1, fresh=0)
        await a.begin()
        await a.rows("SELECT * FROM zeroth.set_version_policy(deployment_ref => $1, "
                     "version_policy => 'any')", DEPLOYMENT)
        # Another policy change queues behind it (the deployment row); a claim does not.
        task = b.spawn("SELECT outcome FROM zeroth.set_version_policy(deployment_ref => $1, "
                       "version_policy => 'compatible', compatible_versions => ARRAY['v1', 'v2'])",
                       DEPLOYMENT)
        await assert_waits_for(db, b, a, task)
        claimer = await db.fetch(CLAIM, DEPLOYMENT, "c-v2", 10, V2)
        assert [r["run_id"] for r in claimer if r["run_id"]] == []  # still "same" until commit
        await a.commit()
        assert (await task).value == "updated"
