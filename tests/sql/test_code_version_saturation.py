"""claim_orphaned reports saturation ("an orphan is waiting but no slot is free") only for an
orphan the calling worker could re-lease. An orphan pinned to another code version (its
deployment's version_policy same) is no work for this worker: reported as saturation it makes the
worker's sweep "look again soon" (worker/_claims.py) and counts a guardrail rejection, for as
long as the pinned orphan waits for its own version or retire_code_version."""

from __future__ import annotations

from helpers import DEPLOYMENT, LEASE, at, enqueue
from test_code_versions import V1, V2, claim_start, register, set_policy


async def test_an_orphan_of_another_version_is_not_saturation(conn):
    await register(conn)
    await set_policy(conn, "same")
    orphan = await enqueue(conn)
    assert await claim_start(conn, V1) == [orphan]  # lease runs out at T0 + LEASE
    busy = await enqueue(conn, now=at(LEASE + 10))
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => 'w2',
               max_concurrency => 1, lease_seconds => $2, code_version => $3,
               now_override => $4)""",
        DEPLOYMENT, LEASE, V2, at(LEASE + 10))
    assert [r["run_id"] for r in rows] == [busy]  # the one slot is busy's

    marker = await conn.fetch(
        """SELECT run_id, concurrency_saturated FROM zeroth_test.claim_orphaned(
               deployment_ref => $1, worker_id => 'w2', max_concurrency => 1, lease_seconds => $2,
               grace_seconds => 0, code_version => $3, now_override => $4)""",
        DEPLOYMENT, LEASE, V2, at(LEASE + 20))

    assert [tuple(r) for r in marker] == [(None, False)]


async def test_an_orphan_of_its_own_version_is_saturation(conn):
    """The control: the same orphan is saturation for a worker of its version."""
    await register(conn)
    await set_policy(conn, "same")
    orphan = await enqueue(conn)
    assert await claim_start(conn, V1) == [orphan]
    busy = await enqueue(conn, now=at(LEASE + 10))
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => 'w2',
               max_concurrency => 1, lease_seconds => $2, code_version => $3,
               now_override => $4)""",
        DEPLOYMENT, LEASE, V2, at(LEASE + 10))
    assert [r["run_id"] for r in rows] == [busy]

    marker = await conn.fetch(
        """SELECT run_id, concurrency_saturated FROM zeroth_test.claim_orphaned(
               deployment_ref => $1, worker_id => 'w1', max_concurrency => 1, lease_seconds => $2,
               grace_seconds => 0, code_version => $3, now_override => $4)""",
        DEPLOYMENT, LEASE, V1, at(LEASE + 20))

    assert [tuple(r) for r in marker] == [(None, True)]
