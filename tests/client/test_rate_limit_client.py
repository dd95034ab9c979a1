"""LeaseManager and rate limits over a real pool: set_rate_limit (created or changed, ZP008 →
InvalidArgumentError), and the typed retry_at / retry_after of every claim result — a claim cut
short, a claim held back, a multi-scope claim's rate_limited scopes, an unlimited claim's None."""

from __future__ import annotations

from datetime import datetime

import pytest

from zeroth_pg import InvalidArgumentError, LeaseManager, RateLimited, Scope


async def limited(lm: LeaseManager, pool, deployment: str, max_starts: int = 2) -> None:
    assert await lm.set_rate_limit(f"{deployment}-key", max_starts, 3600.0, note="test")
    await pool.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, rate_limit) "
                       "VALUES ('default', $1, $2)", deployment, f"{deployment}-key")
    await lm.enqueue_runs(deployment, [{"payload": {"i": i}} for i in range(5)])


async def test_set_rate_limit_creates_then_changes_and_refuses_bad_values(pool):
    lm = LeaseManager(pool)
    assert await lm.set_rate_limit("k", 5, 1.0) is True
    assert await lm.set_rate_limit("k", 6, 2.0) is False
    assert tuple(await pool.fetchrow("SELECT max_starts, period_seconds FROM zeroth.rate_limits "
                                     "WHERE name = 'k'")) == (6, 2.0)
    with pytest.raises(InvalidArgumentError, match="max_starts"):
        await lm.set_rate_limit("k", 0, 1.0)
    with pytest.raises(InvalidArgumentError, match="period_seconds"):
        await lm.set_rate_limit("k", 5, -1.0)


async def test_a_claim_cut_short_then_held_back_says_when(pool):
    lm = LeaseManager(pool)
    await limited(lm, pool, "rl-client")
    first = await lm.claim_and_start("rl-client", "w", batch_size=10)
    assert len(first.runs) == 2
    assert isinstance(first.retry_at, datetime)
    assert first.retry_after is not None
    assert 3599 < first.retry_after <= 3600 + 3.6  # logged rounded up to period / 1000
    held = await lm.claim_and_start("rl-client", "w", batch_size=10)
    assert held.runs == ()
    assert held.run_id is None
    assert held.retry_at == first.retry_at
    assert not held.concurrency_saturated
    pending = await lm.claim_pending_result("rl-client", "w", batch_size=10)
    assert pending.retry_at == first.retry_at


async def test_an_unlimited_claim_has_no_retry(pool):
    lm = LeaseManager(pool)
    await lm.enqueue_run("rl-free", {})
    result = await lm.claim_and_start("rl-free", "w", batch_size=10)
    assert len(result.runs) == 1
    assert (result.retry_at, result.retry_after) == (None, None)
    orphans = await lm.claim_orphaned_result("rl-free", "w")
    assert (orphans.retry_at, orphans.retry_after) == (None, None)


async def test_a_multi_scope_claim_lists_its_rate_limited_scopes(pool):
    lm = LeaseManager(pool)
    await limited(lm, pool, "rl-a", max_starts=1)
    await lm.enqueue_runs("rl-b", [{"payload": {}} for _ in range(3)])
    result = await lm.claim_and_start_scopes(["rl-a", "rl-b"], "w", batch_size=10)
    per = sorted(r.scope.deployment_ref for r in result.runs)
    assert per == ["rl-a", "rl-b", "rl-b", "rl-b"]
    again = await lm.claim_and_start_scopes(["rl-a", "rl-b"], "w", batch_size=10)
    assert again.runs == ()
    assert again.saturated == ()
    (held,) = again.rate_limited
    assert isinstance(held, RateLimited)
    assert held.scope == Scope("rl-a", "default", None)
    assert held.retry_after > 3599
