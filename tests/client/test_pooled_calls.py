"""A connection given back to a pool of ``zeroth_pg.create_pool`` after one zeroth_pg call skips
asyncpg's reset round trip; any other use of a pooled connection is reset in full
(zeroth_pg/_bounded.py ``pooled_call``, zeroth_pg/_connect.py ``released_as_found``).

asyncpg resets a connection on every release (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
RESET ALL``): a second round trip before each call's answer, and its RESET ALL dropped the
claims' claim floors, which are session settings. Who could abuse the skip: code sharing the
pool (a handler) that changes its session — ``SET ROLE``, ``search_path``, a session advisory
lock, a claim floor of its own, ``LISTEN`` — and gives the connection back, hoping the worker's
next call runs with it. It cannot: only a connection that served one of zeroth_pg's own calls,
answered or refused by the server, skips the reset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from roles import dsn_as, login_role

import zeroth_pg
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import InvalidArgumentError, RetryableError

DEPLOYMENT = "pooled-calls"
RESET_MARK = "RESET ALL"


class Sent:
    """Every statement asyncpg sent on the pool's connections (a query logger per connection,
    added when it opens: the reset's statements included)."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def init(self, conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: self.queries.append(record.query))

    def resets(self) -> int:
        return sum(RESET_MARK in q for q in self.queries)


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
async def one_connection(database_dsn: str, sent: Sent) -> AsyncIterator[asyncpg.Pool]:
    """A pool of one connection, so every call below meets the same session."""
    pool = await zeroth_pg.create_pool(database_dsn, min_size=1, max_size=1, init=sent.init)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.mark.parametrize("call_timeout", [None, 5.0], ids=["unbounded", "bounded"])
async def test_a_zeroth_call_gives_its_connection_back_without_the_reset(
        one_connection: asyncpg.Pool, sent: Sent, call_timeout: float | None) -> None:
    lm = LeaseManager(one_connection, call_timeout=call_timeout)
    pid = await one_connection.fetchval("SELECT pg_backend_pid()")
    before = sent.resets()
    await lm.enqueue_run(DEPLOYMENT, {"n": 1})
    assert await lm.count_pending(DEPLOYMENT) == 1
    claimed = await lm.claim_and_start(DEPLOYMENT, "w")
    assert len(claimed.runs) == 1
    assert sent.resets() == before, "a zeroth_pg call's connection was reset on release"
    # The same session served them all: nothing closed it either.
    assert await one_connection.fetchval("SELECT pg_backend_pid()") == pid


@pytest.mark.parametrize("call_timeout", [None, 5.0], ids=["unbounded", "bounded"])
async def test_a_call_the_server_refused_gives_its_connection_back_without_the_reset(
        one_connection: asyncpg.Pool, sent: Sent, call_timeout: float | None) -> None:
    lm = LeaseManager(one_connection, call_timeout=call_timeout)
    before = sent.resets()
    with pytest.raises(InvalidArgumentError) as refused:
        # An empty worker id: refused by zeroth.claim_and_start itself (ZP class), rolled back.
        await lm.claim_and_start(DEPLOYMENT, "")
    assert isinstance(refused.value.__cause__, asyncpg.PostgresError)
    assert sent.resets() == before
    await lm.enqueue_run(DEPLOYMENT, {"n": 1})
    assert await lm.count_pending(DEPLOYMENT) == 1


async def test_a_callers_own_session_changes_are_reset_before_the_next_zeroth_call(
        one_connection: asyncpg.Pool, sent: Sent, database_dsn: str) -> None:
    lm = LeaseManager(one_connection, call_timeout=5.0)
    login = await one_connection.fetchval("SELECT session_user")
    async with one_connection.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock(4242)")
        await conn.execute("SELECT set_config('zeroth.claim_floor_0', 'planted', false)")
        await conn.execute("SET search_path = pg_catalog")
        await conn.execute("LISTEN planted_channel")
        await conn.execute("SET ROLE zeroth_reader")
    assert sent.resets() >= 1, "a caller's own use of the connection was not reset"
    # As zeroth_reader the enqueue would be refused (no EXECUTE on enqueue_run): it lands.
    await lm.enqueue_run(DEPLOYMENT, {"n": 1})
    async with one_connection.acquire() as conn:
        state = await conn.fetchrow(
            """SELECT current_user AS role, current_setting('search_path') AS search_path,
                      current_setting('zeroth.claim_floor_0', true) AS floor,
                      (SELECT count(*) FROM pg_locks
                        WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS locks,
                      (SELECT count(*) FROM pg_listening_channels()) AS channels""")
    assert state["role"] == login
    assert state["search_path"] != "pg_catalog"
    assert not state["floor"]
    assert state["locks"] == 0
    assert state["channels"] == 0


async def test_a_sessions_claim_floor_stays_between_a_pools_zeroth_calls(
        one_connection: asyncpg.Pool, database_dsn: str) -> None:
    # The floor (sql/functions/internal/claim_floor.sql) is kept by a claim whose scan from the
    # head passed over more than 100 + 2 x batch entries it could not take: dead runs whose
    # entries no scan may mark dead while a transaction pins the horizon.
    lm = LeaseManager(one_connection, call_timeout=5.0)
    pin = await asyncpg.connect(zeroth_pg.asyncpg_dsn(database_dsn))
    try:
        await pin.execute("BEGIN")
        await pin.fetchval("SELECT txid_current()")
        admin = await asyncpg.connect(zeroth_pg.asyncpg_dsn(database_dsn))
        try:
            assert await admin.fetchval(
                """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
                       runs => (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 300)))""",
                DEPLOYMENT) == 300
            assert await admin.execute("DELETE FROM zeroth.runs") == "DELETE 300"
            name = await admin.fetchval(
                "SELECT zeroth._claim_floor_setting('default', zeroth._workspace_key(NULL), $1)",
                DEPLOYMENT)
        finally:
            await admin.close()
        await lm.enqueue_run(DEPLOYMENT, {"n": 1})
        await lm.enqueue_run(DEPLOYMENT, {"n": 2})
        assert len((await lm.claim_and_start(DEPLOYMENT, "w")).runs) == 1
        # The claim's call gave its connection back without RESET ALL: the session still
        # holds the floor its claim kept.
        async with one_connection.acquire() as conn:
            floor = await conn.fetchval("SELECT current_setting($1, true)", name)
        assert floor, f"the claim floor {name} was dropped between calls"
    finally:
        await pin.close()


async def test_a_pool_with_skip_reset_sends_nothing_on_release_and_keeps_the_client_check(
        database_dsn: str, sent: Sent) -> None:
    from zeroth_pg.worker import skip_reset

    pool = await zeroth_pg.create_pool(database_dsn, min_size=1, max_size=1, init=sent.init,
                                       reset=skip_reset)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SELECT 1")
        before = len(sent.queries)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW client_connection_check_interval") == "1s"
        assert len(sent.queries) == before + 1, sent.queries[before:]
    finally:
        await pool.close()


@pytest.mark.parametrize("call_timeout", [None, 5.0], ids=["unbounded", "bounded"])
async def test_a_pooled_announce_idle_leaves_no_wakeup_gate_lock_on_the_pools_connection(
        one_connection: asyncpg.Pool, call_timeout: float | None) -> None:
    # announce_idle takes the scope's wakeup-gate stripes as *session* advisory locks (they are
    # meant for the LISTEN connection). Made through the pool (conn=None), the connection went
    # back without asyncpg's reset, whose pg_advisory_unlock_all() let them go: the pool's idle
    # connection then held the gate for as long as it lived, so no worker could take those
    # stripes and writers on that connection never notified.
    lm = LeaseManager(one_connection, call_timeout=call_timeout)
    assert await lm.announce_idle(DEPLOYMENT)
    assert await lm.announce_idle_deployment(DEPLOYMENT)
    async with one_connection.acquire() as conn:
        held = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
    assert held == 0, f"a pooled connection kept {held} wakeup-gate lock(s) after the call"


async def test_a_callers_session_authorization_is_reset_before_the_next_zeroth_call(
        one_connection: asyncpg.Pool) -> None:
    # The embedded server's DSN (an App's default) logs in as a superuser, who may SET SESSION
    # AUTHORIZATION: RESET ALL leaves session_authorization alone, as it does role, and RESET
    # ROLE only goes back to the session user, which is then the role the caller chose.
    lm = LeaseManager(one_connection, call_timeout=5.0)
    login = await one_connection.fetchval("SELECT session_user")
    if not await one_connection.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = $1",
                                         login):
        pytest.fail("the test database's DSN is expected to log in as a superuser")
    async with one_connection.acquire() as conn:
        await conn.execute("SET SESSION AUTHORIZATION zeroth_reader")
    # As zeroth_reader the enqueue would be refused (no EXECUTE on enqueue_run): it lands.
    await lm.enqueue_run(DEPLOYMENT, {"n": 1})
    async with one_connection.acquire() as conn:
        assert await conn.fetchval("SELECT session_user") == login


async def test_the_full_reset_keeps_a_zeroth_worker_logins_connection(
        pg_server_dsn: str, database_dsn: str, sent: Sent) -> None:
    # The reset goes back to the authenticated user (SET SESSION AUTHORIZATION DEFAULT), which
    # any role may do: a worker's own login (no superuser) keeps its pooled session after a
    # caller's own use, and that use's SET ROLE does not outlive it.
    with login_role(pg_server_dsn, "zeroth_worker") as (name, password):
        pool = await zeroth_pg.create_pool(dsn_as(database_dsn, name, password), min_size=1,
                                           max_size=1, init=sent.init)
        try:
            lm = LeaseManager(pool, call_timeout=5.0)
            async with pool.acquire() as conn:
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                await conn.execute("SET ROLE zeroth_worker")
            assert sent.resets() == 1
            await lm.enqueue_run(DEPLOYMENT, {"n": 1})
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT pg_backend_pid()") == pid
                assert await conn.fetchval("SELECT current_user") == name
        finally:
            await pool.close()


async def test_a_callers_temporary_objects_are_gone_before_the_next_zeroth_call(
        one_connection: asyncpg.Pool) -> None:
    # A session's temporary schema is searched first for type names: a temporary table named
    # like a type (its row type) shadows it in the text of every later statement of the
    # session, so each call's $n::text cast met the table's row type ("cannot cast type text to
    # jsonb") on that pooled connection for as long as it lived. asyncpg's reset leaves
    # temporary objects alone.
    lm = LeaseManager(one_connection, call_timeout=5.0)
    async with one_connection.acquire() as conn:
        await conn.execute("CREATE TEMPORARY TABLE text (a integer)")
    await lm.enqueue_run(DEPLOYMENT, {"n": 1})
    assert await lm.count_pending(DEPLOYMENT) == 1


async def test_the_role_a_session_starts_with_survives_the_full_reset(database_dsn: str) -> None:
    # A DSN may start its sessions in a role (options=-c role=..., asyncpg's server_settings):
    # the reset goes back to that role, not past it to the login (RESET ROLE returns to the
    # session's starting value; SET SESSION AUTHORIZATION DEFAULT comes before it).
    pool = await zeroth_pg.create_pool(database_dsn, min_size=1, max_size=1,
                                       server_settings={"role": "zeroth_worker"})
    try:
        assert await pool.fetchval("SELECT current_user") == "zeroth_worker"
        async with pool.acquire() as conn:
            await conn.execute("SET ROLE zeroth_reader")
        assert await pool.fetchval("SELECT current_user") == "zeroth_worker"
    finally:
        await pool.close()


@pytest.mark.parametrize("statement", ["DEALLOCATE ALL", "DISCARD ALL"])
@pytest.mark.parametrize("call_timeout", [None, 5.0], ids=["unbounded", "bounded"])
async def test_a_callers_deallocate_all_costs_at_most_one_retryable_zeroth_call(
        one_connection: asyncpg.Pool, statement: str, call_timeout: float | None) -> None:
    # asyncpg keeps each statement prepared in the session (its statement cache); code sharing
    # the pool that drops them (DEALLOCATE ALL, or DISCARD ALL, a common "reset my session")
    # left every later zeroth_pg call on that connection refused with 26000 "prepared
    # statement ... does not exist", a non-retryable DatabaseError, for as long as it lived:
    # a worker's renewals, claims and completions on it all failed. asyncpg's reset does not
    # notice. Nothing of such a call ran: at most it fails as retryable, and the next lands.
    lm = LeaseManager(one_connection, call_timeout=call_timeout)
    await lm.enqueue_run(DEPLOYMENT, {"n": 0})  # enqueue_run's statement, prepared in the session
    async with one_connection.acquire() as conn:
        await conn.execute(statement)
    landed = 1
    try:
        await lm.enqueue_run(DEPLOYMENT, {"n": 1})
        landed += 1
    except RetryableError:
        pass
    await lm.enqueue_run(DEPLOYMENT, {"n": 2})
    assert await lm.count_pending(DEPLOYMENT) == landed + 1
