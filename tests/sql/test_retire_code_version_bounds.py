"""retire_code_version's fail ends only what the code version pins, and only along the edge
zeroth.run_transitions lists (edge 60: pending --version_retired--> failed).

- A run never started is claimable by every version (the claims' filter: started_at NULL passes;
  zeroth.pinned_runs leaves it out), even when a worker of the retired version once claimed it
  and let the claim lapse, or an operator's clear_lease gave it back: claim_pending records the
  claimer's version on a run not yet started. Retiring that version must not dead-letter it.
- A DBA who removed edge 60 forbade that end: the fail ends nothing then (every other admin end
  — _settle's kinds, zeroth._end_past_run_deadline — is refused by a removed edge)."""

from __future__ import annotations

from helpers import T0, enqueue, run_row
from test_code_versions import (
    LATER,
    V1,
    claim_only,
    claim_start,
    register,
    retire,
    set_policy,
    started_by,
)
from test_orphan_recovery_isolation import POISON


async def test_retire_fail_leaves_a_lapsed_claim_never_started(conn):
    await register(conn)
    await set_policy(conn, "same")
    run_id = await enqueue(conn)
    assert [r["run_id"] for r in await claim_only(conn, V1)] == [run_id]  # lapses by LATER

    await retire(conn, V1, "fail")

    row = await run_row(conn, run_id)
    assert row["started_at"] is None
    assert (row["status"], row["dead_lettered_at"]) == ("pending", None)


async def test_retire_fail_leaves_a_cleared_claim_never_started(conn):
    await register(conn)
    await set_policy(conn, "same")
    run_id = await enqueue(conn)
    assert [r["run_id"] for r in await claim_only(conn, V1)] == [run_id]
    assert await conn.fetchval("SELECT zeroth.clear_lease(run_id => $1)", run_id)

    await retire(conn, V1, "fail")

    row = await run_row(conn, run_id)
    assert (row["status"], row["dead_lettered_at"]) == ("pending", None)


async def test_retire_fail_follows_the_listed_edge(conn):
    await register(conn)
    await set_policy(conn, "same")
    run_id = await started_by(conn, V1, now=T0)
    await conn.execute(
        "DELETE FROM zeroth.run_transitions "
        "WHERE from_status = 'pending' AND outcome = 'version_retired'")

    result = await retire(conn, V1, "fail", now=LATER)

    row = await run_row(conn, run_id)
    assert (row["status"], row["dead_lettered_at"]) == ("pending", None)
    assert (result["runs_changed"], result["runs_left"]) == (0, 1)


async def test_retire_fail_is_not_stopped_by_one_run_whose_takeover_raises(conn):
    """One bad row never stops the others: an expired run whose takeover raises (a trigger the
    test installs, as tests/sql/test_orphan_recovery_isolation.py does) is ended alone
    (recovery_failed) and the others are retired by the same call."""
    await register(conn)
    await set_policy(conn, "same")
    bad = await enqueue(conn, payload={"poison": "soft"})
    good = await enqueue(conn)
    assert set(await claim_start(conn, V1)) == {bad, good}  # both leases lapse by LATER
    await conn.execute(POISON)

    await retire(conn, V1, "fail", now=LATER)

    good_row = await run_row(conn, good)
    assert good_row["status"] == "failed"
    assert '"stop_reason": "code_version_retired"' in good_row["error"]
    bad_row = await run_row(conn, bad)
    assert bad_row["status"] == "failed"
    assert '"stop_reason": "recovery_failed"' in bad_row["error"]
