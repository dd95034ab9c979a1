"""prune_runs meeting a claim that records a reference to the code version it is pruning (issue
34): the claim tries the version's advisory lock shared and holds it until its commit, the prune
tries it exclusive; neither waits on it. Whichever comes first, a run never references a version
whose text is gone:

* a claim in flight (its reference not committed, invisible to the prune): the prune skips the
  version without waiting, and deletes nothing of it;
* a prune in flight (the version deleted, not committed): the claim's try fails, it goes on
  without waiting and writes a second row of the text, which the prune cannot see.
"""

from __future__ import annotations

from helpers import DEPLOYMENT, LEASE, T0, at, enqueue
from interleave import finished, finishes_without_waiting

V = "2026.12.05-abc123"
CLAIM = """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1,
               worker_id => 'w', lease_seconds => $2, code_version => $3, now_override => $4)
           WHERE run_id IS NOT NULL"""
PRUNE = """SELECT zeroth_test.prune_runs(older_than => '1 hour'::interval, batch_size => 1000,
               now_override => $1)"""
TEXT_OF = """SELECT (SELECT v.code_version FROM zeroth.code_versions v
                      WHERE v.version_id = r.code_version_id LIMIT 1)
               FROM zeroth.runs r WHERE r.run_id = $1"""


async def old_unreferenced_version(db) -> None:
    """V first seen long ago, no run referencing it any more (its runs were pruned)."""
    await db.execute("""INSERT INTO zeroth.code_versions (version_id, code_version, first_seen_at)
                        VALUES (('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))
                                ::bit(64)::bigint, $1, $2)""", V, T0)


async def test_a_prune_skips_a_version_a_claim_in_flight_is_recording(sessions):
    claimer, pruner, db = sessions
    await old_unreferenced_version(db)
    run_id = await enqueue(db, now=at(86400))
    await claimer.begin()
    claimed = await claimer.rows(CLAIM, DEPLOYMENT, LEASE, V, at(86400))
    assert [r["run_id"] for r in claimed.value] == [run_id]

    prune = pruner.spawn(PRUNE, at(86400))
    assert (await finishes_without_waiting(db, pruner, prune)).value == 0
    await claimer.commit()

    assert await db.fetchval(TEXT_OF, run_id) == V
    assert await db.fetchval(PRUNE, at(86400)) == 0  # referenced now: kept


async def test_a_claim_meeting_a_prune_in_flight_writes_the_version_again(sessions):
    claimer, pruner, db = sessions
    await old_unreferenced_version(db)
    run_id = await enqueue(db, now=at(86400))
    await pruner.begin()
    assert (await pruner.call(PRUNE, at(86400))).value == 1  # V deleted, not committed

    # The claim does not wait for the prune (nothing in zeroth waits on an advisory lock: a
    # stranger could hold one): it writes a second row of V, which the prune cannot see.
    claim = claimer.spawn(CLAIM, DEPLOYMENT, LEASE, V, at(86400), rows=True)
    assert [r["run_id"] for r in (await finished(claim)).value] == [run_id]
    await pruner.commit()

    assert await db.fetchval(TEXT_OF, run_id) == V
