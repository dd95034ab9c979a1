"""Rate limits (zeroth.rate_limits, zeroth.set_rate_limit): every claim of a scope whose
zeroth.scope_limits row names a key takes its starts from the key's exact rolling window — at most
max_starts starts in any window of period_seconds — on the database clock (here the test clock),
and a claim the limit held back or cut short says when a start becomes possible (retry_at,
retry_after). Bad input changes nothing."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, enqueue, make_run

CLAIM_AND_START = """SELECT * FROM zeroth_test.claim_and_start(deployment_ref => $1,
    worker_id => $2, tenant_id => $3, max_concurrency => $4, batch_size => $5,
    now_override => $6)"""

CLAIM_PENDING = """SELECT * FROM zeroth_test.claim_pending(deployment_ref => $1,
    worker_id => $2, tenant_id => $3, max_concurrency => $4, batch_size => $5,
    now_override => $6)"""

CLAIM_SCOPES = """SELECT * FROM zeroth_test.claim_and_start_scopes(deployment_refs => $1,
    worker_id => $2, batch_size => $3, now_override => $4)"""

CLAIM_ORPHANED = """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => $1,
    worker_id => $2, tenant_id => $3, claim_limit => $4, now_override => $5)"""


async def set_rate(conn: asyncpg.Connection, name: str = "llm", max_starts: int = 10,
                   period: float = 1.0) -> None:
    await conn.execute("SELECT zeroth.set_rate_limit(name => $1, max_starts => $2, "
                       "period_seconds => $3)", name, max_starts, period)


async def use_rate(conn: asyncpg.Connection, name: str | None = "llm", *,
                   tenant: str = "default", deployment: str = DEPLOYMENT,
                   max_concurrency: int | None = None) -> None:
    await conn.execute(
        """INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, rate_limit, max_concurrency)
           VALUES ($1, $2, $3, $4)
           ON CONFLICT (tenant_id, workspace_key, deployment_ref) DO UPDATE
              SET rate_limit = EXCLUDED.rate_limit,
                  max_concurrency = EXCLUDED.max_concurrency""",
        tenant, deployment, name, max_concurrency)


async def start(conn: asyncpg.Connection, seconds: float, *, batch_size: int = 100,
                deployment: str = DEPLOYMENT, tenant: str | None = None,
                max_concurrency: int | None = None,
                sql: str = CLAIM_AND_START) -> list[asyncpg.Record]:
    return await conn.fetch(sql, deployment, WORKER, tenant, max_concurrency,  # type: ignore[no-any-return]
                            batch_size, at(seconds))


async def complete(conn: asyncpg.Connection, rows: list[asyncpg.Record], seconds: float) -> None:
    for r in rows:
        assert await conn.fetchval(
            "SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3, "
            "now_override => $4)", r["run_id"], WORKER, r["lease_generation"], at(seconds))


def runs(rows: list[asyncpg.Record]) -> list[asyncpg.Record]:
    return [r for r in rows if r["run_id"] is not None]


async def backlog(conn: asyncpg.Connection, n: int, **kwargs: object) -> None:
    for _ in range(n):
        await enqueue(conn, **kwargs)  # type: ignore[arg-type]


class TestWindow:
    async def test_a_batch_takes_only_the_starts_left(self, conn):
        await backlog(conn, 120)
        await set_rate(conn, max_starts=100, period=50)
        await use_rate(conn)
        assert len(runs(await start(conn, 1, batch_size=90))) == 90
        rows = await start(conn, 2, batch_size=100)
        assert len(runs(rows)) == 10  # batch_size 100 with 10 starts left leases 10
        # Cut short by the limit: every row says when the next start is possible (the first
        # start leaves the window at 1 + 50).
        assert {r["retry_at"] for r in rows} == {at(51)}
        assert {r["retry_after"] for r in rows} == {49.0}

    async def test_a_full_window_holds_the_claim_back_with_the_time_of_the_next_start(self, conn):
        await backlog(conn, 20)
        await set_rate(conn, max_starts=3, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1, batch_size=1))) == 1
        assert len(runs(await start(conn, 2, batch_size=2))) == 2
        (marker,) = await start(conn, 5)
        assert marker["run_id"] is None
        assert not marker["concurrency_saturated"]
        assert (marker["retry_at"], marker["retry_after"]) == (at(11), 6.0)

    async def test_the_window_is_rolling_not_fixed(self, conn):
        await backlog(conn, 20)
        await set_rate(conn, max_starts=3, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1, batch_size=1))) == 1
        assert len(runs(await start(conn, 9, batch_size=2))) == 2
        # At 10.5 a fixed window [10, 20) would allow 3 more; the rolling (0.5, 10.5] holds 3.
        assert runs(await start(conn, 10.5)) == []
        # 11: the start at 1 left the window (exactly: (1, 11] excludes 1): one more.
        assert len(runs(await start(conn, 11))) == 1
        (marker,) = await start(conn, 12)
        assert marker["retry_at"] == at(19)  # the two of 9 leave at 19

    async def test_the_boundary_instant_belongs_to_the_next_window(self, conn):
        await backlog(conn, 5)
        await set_rate(conn, max_starts=1, period=2)
        await use_rate(conn)
        assert len(runs(await start(conn, 1))) == 1
        assert runs(await start(conn, 2.999999)) == []
        assert len(runs(await start(conn, 3))) == 1

    async def test_starts_are_logged_once_per_claim_and_pruned_by_the_claims(self, conn):
        await backlog(conn, 30)
        await set_rate(conn, max_starts=100, period=5)
        await use_rate(conn)
        for t in (1, 2, 3):
            await start(conn, t, batch_size=5)
        log = await conn.fetch("SELECT started_at, starts FROM zeroth.rate_limit_starts "
                               "ORDER BY started_at")
        assert [(r["started_at"], r["starts"]) for r in log] == [(at(1), 5), (at(2), 5), (at(3), 5)]
        await start(conn, 7.5, batch_size=1)
        log = await conn.fetch("SELECT started_at FROM zeroth.rate_limit_starts ORDER BY 1")
        assert [r["started_at"] for r in log] == [at(3), at(7.5)]
        assert await conn.fetchval("SELECT last_start_at FROM zeroth.rate_limits") == at(7.5)

    async def test_an_empty_scope_is_a_definitive_empty_answer_not_a_hold_back(self, conn):
        await backlog(conn, 2)
        await set_rate(conn, max_starts=2, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1))) == 2
        (marker,) = await start(conn, 2)  # full window, but nothing waits
        assert (marker["run_id"], marker["retry_at"], marker["retry_after"]) == (None, None, None)

    async def test_claim_pending_counts_too(self, conn):
        await backlog(conn, 5)
        await set_rate(conn, max_starts=2, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1, sql=CLAIM_PENDING))) == 2
        (marker,) = await start(conn, 2, sql=CLAIM_PENDING)
        assert marker["retry_at"] == at(11)


    async def test_a_start_is_logged_rounded_up_to_a_thousandth_of_the_period(self, conn):
        # It counts up to period / 1000 longer (never shorter): a key has about 1000 log rows
        # at most, whatever max_starts and the batch sizes, and no window holds more.
        await backlog(conn, 5)
        await set_rate(conn, max_starts=1, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1.0001))) == 1
        assert await conn.fetchval("SELECT started_at FROM zeroth.rate_limit_starts") == at(1.01)
        (marker,) = await start(conn, 11.005)
        assert marker["retry_at"] == at(11.01)
        assert len(runs(await start(conn, 11.01))) == 1


class TestSharedKeysAndScopes:
    async def test_two_deployments_share_one_key(self, conn):
        await backlog(conn, 5, deployment_ref="embed")
        await backlog(conn, 5, deployment_ref="chat")
        await set_rate(conn, max_starts=4, period=10)
        await use_rate(conn, deployment="embed")
        await use_rate(conn, deployment="chat")
        assert len(runs(await start(conn, 1, deployment="embed", batch_size=3))) == 3
        assert len(runs(await start(conn, 2, deployment="chat"))) == 1
        (marker,) = await start(conn, 3, deployment="embed")
        assert marker["retry_at"] == at(11)

    async def test_a_scope_without_the_key_is_not_limited(self, conn):
        await backlog(conn, 5, tenant_id="capped")
        await backlog(conn, 5, tenant_id="free")
        await set_rate(conn, max_starts=1, period=10)
        await use_rate(conn, tenant="capped")
        assert len(runs(await start(conn, 1, tenant="capped"))) == 1
        assert len(runs(await start(conn, 1, tenant="free"))) == 5

    async def test_the_limit_combines_with_max_concurrency(self, conn):
        await backlog(conn, 10)
        await set_rate(conn, max_starts=5, period=10)
        await use_rate(conn, max_concurrency=2)
        rows = await start(conn, 1)
        assert len(runs(rows)) == 2  # the slots bind first
        (marker,) = await start(conn, 2)
        assert marker["concurrency_saturated"]
        assert marker["retry_at"] is None
        # Free the slots: then the rate limit binds (2 + 2 = 4 of 5, then 1 with 2 slots free).
        await complete(conn, runs(rows), 3)
        second = runs(await start(conn, 4))
        assert len(second) == 2
        await complete(conn, second, 4.5)
        rows = await start(conn, 5)
        assert len(runs(rows)) == 1
        assert {r["retry_at"] for r in rows} == {at(11)}
        (marker,) = await start(conn, 6)
        assert not marker["concurrency_saturated"]
        assert marker["retry_at"] == at(11)

    async def test_the_multi_scope_claim_reports_each_held_back_scope(self, conn):
        await backlog(conn, 5, deployment_ref="embed")
        await backlog(conn, 5, deployment_ref="chat")
        await set_rate(conn, max_starts=2, period=10)
        await use_rate(conn, deployment="embed")
        rows = await conn.fetch(CLAIM_SCOPES, ["embed", "chat"], WORKER, 20, at(1))
        got = {d: len([r for r in rows if r["deployment_ref"] == d and r["run_id"]])
               for d in ("embed", "chat")}
        assert got == {"embed": 2, "chat": 5}
        rows = await conn.fetch(CLAIM_SCOPES, ["embed", "chat"], WORKER, 20, at(2))
        assert [(r["deployment_ref"], r["run_id"], r["retry_at"]) for r in rows] == [
            ("embed", None, at(11))]

    async def test_a_changed_limit_applies_to_the_next_claim(self, conn):
        await backlog(conn, 10)
        await set_rate(conn, max_starts=1, period=10)
        await use_rate(conn)
        assert len(runs(await start(conn, 1))) == 1
        assert runs(await start(conn, 2)) == []
        await conn.execute("UPDATE zeroth.rate_limits SET max_starts = 4 WHERE name = 'llm'")
        assert len(runs(await start(conn, 3))) == 3
        await use_rate(conn, None)  # the scope no longer draws from the key
        assert len(runs(await start(conn, 4))) == 6


class TestOrphans:
    async def test_a_re_lease_is_a_start_of_the_key(self, conn):
        for _ in range(3):
            await make_run(conn, "running", lease_seconds=1, max_attempts=3)
        await set_rate(conn, max_starts=2, period=100)
        await use_rate(conn)
        rows = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "rescuer", None, None, at(50))
        assert len(runs(rows)) == 2
        (marker,) = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "rescuer", None, None, at(51))
        assert marker["run_id"] is None
        assert marker["retry_at"] == at(150)


    async def test_the_multi_scope_sweep_reports_a_held_back_scope(self, conn):
        for _ in range(2):
            await make_run(conn, "running", lease_seconds=1, max_attempts=3)
        await set_rate(conn, max_starts=1, period=100)
        await use_rate(conn)
        sweep = """SELECT * FROM zeroth_test.claim_orphaned_scopes(deployment_refs => $1,
            worker_id => 'rescuer', now_override => $2)"""
        rows = await conn.fetch(sweep, [DEPLOYMENT], at(50))
        assert len(runs(rows)) == 1
        (marker,) = await conn.fetch(sweep, [DEPLOYMENT], at(51))
        assert marker["run_id"] is None
        assert marker["deployment_ref"] == DEPLOYMENT
        assert (marker["retry_at"], marker["retry_after"]) == (at(150), 99.0)

    async def test_claim_limit_zero_still_ends_orphans_under_a_full_window(self, conn):
        await set_rate(conn, max_starts=1, period=100)
        await use_rate(conn)
        # Its own start (claimed at T0) filled the window; ending it needs none.
        dead = await make_run(conn, "running", lease_seconds=1, max_attempts=1)
        rows = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "rescuer", None, 0, at(50))
        assert runs(rows) == []
        assert await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                   dead.run_id) == "failed"
        assert await conn.fetchval("SELECT sum(starts) FROM zeroth.rate_limit_starts") == 1


class TestSetRateLimit:
    async def test_creates_then_changes(self, conn):
        assert await conn.fetchval("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 5, "
                                   "period_seconds => 1, note => 'openai')")
        assert not await conn.fetchval("SELECT zeroth.set_rate_limit(name => 'k', "
                                       "max_starts => 7, period_seconds => 2)")
        row = await conn.fetchrow("SELECT * FROM zeroth.rate_limits WHERE name = 'k'")
        assert (row["max_starts"], row["period_seconds"], row["note"]) == (7, 2.0, "openai")

    @pytest.mark.parametrize(("name", "max_starts", "period", "message"), [
        ("", 5, 1.0, "name"),
        (None, 5, 1.0, "name"),
        ("k", 0, 1.0, "max_starts"),
        ("k", None, 1.0, "max_starts"),
        ("k", 1000001, 1.0, "max_starts"),
        ("k", 5, 0.0, "period_seconds"),
        ("k", 5, None, "period_seconds"),
        ("k", 5, 86401.0, "period_seconds"),
        ("k", 5, float("nan"), "period_seconds"),
        ("k", 5, float("inf"), "period_seconds"),
    ])
    async def test_bad_input_is_zp008_and_changes_nothing(self, conn, name, max_starts, period,
                                                          message):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.execute("SELECT zeroth.set_rate_limit(name => $1, max_starts => $2, "
                                   "period_seconds => $3)", name, max_starts, period)
        assert caught.value.sqlstate == "ZP008"
        assert message in str(caught.value)
        assert await conn.fetchval("SELECT count(*) FROM zeroth.rate_limits") == 0

    async def test_a_scope_cannot_name_a_missing_key_and_a_used_key_cannot_go(self, conn):
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            async with conn.transaction():
                await use_rate(conn, "nope")
        await set_rate(conn)
        await use_rate(conn)
        # Refused by the RESTRICT foreign key: PostgreSQL 18 says restrict_violation (23001),
        # 15 foreign_key_violation (23503), as measured on both.
        with pytest.raises((asyncpg.RestrictViolationError, asyncpg.ForeignKeyViolationError)):
            async with conn.transaction():
                await conn.execute("DELETE FROM zeroth.rate_limits WHERE name = 'llm'")
