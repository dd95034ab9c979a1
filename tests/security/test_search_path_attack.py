"""CVE-2018-1058 replay: an unprivileged user plants lookalikes of now(), clock_timestamp(),
gen_random_uuid() and the text = operator in a schema that a caller puts first on its
search_path. The pinned search_path of the SECURITY DEFINER functions must make them invisible:
same results, and the attacker's code never runs (it would run as zeroth_owner).

Everything happens in the ``conn`` fixture's transaction (roles and grants are transactional),
so the attacker role and schema vanish with the rollback.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest

FAKE_TIME = datetime(1999, 1, 1, tzinfo=UTC)
FAKE_UUID = "00000000-0000-0000-0000-00000000beef"


@pytest.fixture
async def attacker_schema(conn):
    """An attacker's schema, made by an unprivileged role, usable by everyone. Each lookalike
    logs its call (and who made it) to evil.calls before returning its lie."""
    attacker = f"zp_attacker_{secrets.token_hex(4)}"
    await conn.execute(f"CREATE ROLE {attacker} NOLOGIN")
    await conn.execute(f"""DO $$ BEGIN
        EXECUTE format('GRANT CREATE ON DATABASE %I TO {attacker}', current_database());
        END $$""")
    await conn.execute(f"SET LOCAL ROLE {attacker}")
    await conn.execute(f"""
        CREATE SCHEMA evil;
        GRANT USAGE ON SCHEMA evil TO PUBLIC;
        CREATE TABLE evil.calls (fn text, called_as name);
        GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
        CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql VOLATILE AS $f$
            INSERT INTO evil.calls VALUES ('now', current_user);
            SELECT timestamptz '{FAKE_TIME.isoformat()}' $f$;
        CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE AS $f$
            INSERT INTO evil.calls VALUES ('clock_timestamp', current_user);
            SELECT timestamptz '{FAKE_TIME.isoformat()}' $f$;
        CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql VOLATILE AS $f$
            INSERT INTO evil.calls VALUES ('gen_random_uuid', current_user);
            SELECT uuid '{FAKE_UUID}' $f$;
        CREATE FUNCTION evil.texteq(a text, b text) RETURNS boolean LANGUAGE sql VOLATILE AS $f$
            INSERT INTO evil.calls VALUES ('=', current_user);
            SELECT true $f$;
        CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
    """)
    await conn.execute("RESET ROLE")
    return attacker


async def calls(conn) -> list[tuple[str, str]]:
    return [tuple(row) for row in await conn.fetch("SELECT fn, called_as::text FROM evil.calls")]


async def as_victim(conn, role: str) -> None:
    """Become ``role`` with the attacker's schema ahead of pg_catalog on the search_path."""
    await conn.execute(f"SET LOCAL ROLE {role}")
    await conn.execute("SET LOCAL search_path = evil, pg_catalog, public")


class TestTrapIsArmed:
    """Without the pin, the lookalikes win: the replay below is not vacuous."""

    async def test_unqualified_calls_and_text_equality_reach_the_attacker(self, conn,
                                                                        attacker_schema):
        await as_victim(conn, "zeroth_worker")
        assert await conn.fetchval("SELECT clock_timestamp()") == FAKE_TIME
        assert await conn.fetchval("SELECT 'a'::text = 'b'::text") is True
        assert [fn for fn, _ in await calls(conn)] == ["clock_timestamp", "="]

    async def test_an_unpinned_function_body_would_run_the_attackers_clock(self, conn,
                                                                         attacker_schema):
        # A PL/pgSQL body resolves its calls when it runs: unpinned, the attacker's search_path
        # decides which clock_timestamp() it gets. This is what the pin on every public
        # function prevents.
        await conn.execute("""CREATE FUNCTION pg_temp.unpinned_clock() RETURNS timestamptz
                                  LANGUAGE plpgsql AS $$ BEGIN RETURN clock_timestamp(); END $$""")
        await conn.execute("SET LOCAL search_path = evil, pg_catalog, public")
        assert await conn.fetchval("SELECT pg_temp.unpinned_clock()") == FAKE_TIME

    async def test_the_database_clock_is_bound_when_it_is_created(self, conn, attacker_schema):
        # zeroth._now() (every decision's clock) has a SQL-standard body: clock_timestamp() was
        # resolved to pg_catalog's when the migration created it, whatever search_path calls it.
        await conn.execute("SET LOCAL search_path = evil, pg_catalog, public")
        assert await conn.fetchval("SELECT zeroth._now()") != FAKE_TIME


class TestPinnedFunctionsIgnoreTheAttacker:
    @pytest.mark.parametrize("victim", ["zeroth_worker", "zeroth_owner"])
    async def test_a_run_lifecycle_gives_the_same_results(self, conn, attacker_schema, victim):
        tenant = f"t-{secrets.token_hex(4)}"
        await as_victim(conn, victim)
        before = datetime.now(UTC)
        run_id = await conn.fetchval(
            """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'dep-x',
                   tenant_id => $1, payload => '{"n": 1}')""", tenant)
        other = await conn.fetchval(
            """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'dep-y',
                   tenant_id => $1)""", tenant)
        assert str(run_id) != FAKE_UUID
        assert run_id != other
        # An always-true = would let the claim take dep-y's run as well.
        claimed = await conn.fetch(
            """SELECT run_id, lease_generation, lease_expires_at FROM zeroth.claim_pending(
                   deployment_ref => 'dep-x', worker_id => 'w', tenant_id => $1,
                   batch_size => 10, lease_seconds => 60)""", tenant)
        assert [row["run_id"] for row in claimed] == [run_id]
        lease_expires_at = claimed[0]["lease_expires_at"]
        assert before + timedelta(seconds=50) < lease_expires_at < before + timedelta(minutes=5)
        fence = (run_id, claimed[0]["lease_generation"], tenant)
        args = "run_id => $1, worker_id => 'w', generation => $2, tenant_id => $3"
        # A wrong worker must still be fenced out (the = operator decides it).
        assert await conn.fetchval(
            "SELECT zeroth.start_run(run_id => $1, worker_id => 'intruder', generation => $2, "
            "tenant_id => $3)", *fence) is False
        assert await conn.fetchval(f"SELECT zeroth.start_run({args})", *fence) is True
        checkpoint_id = await conn.fetchval(
            f"SELECT zeroth.save_checkpoint({args}, data => '{{\"step\": 1}}')", *fence)
        assert str(checkpoint_id) != FAKE_UUID
        assert await conn.fetchval(f"SELECT zeroth.complete_run({args}, output => '{{}}')",
                                   *fence) is True
        assert await conn.fetchval(
            "SELECT zeroth.current_generation(run_id => $1, tenant_id => $2)", run_id,
            tenant) == 1
        await conn.execute("RESET ROLE")
        await conn.execute("RESET search_path")
        assert await calls(conn) == []
        row = await conn.fetchrow(
            """SELECT r.status::text AS status, r.finished_at FROM zeroth.runs r
                WHERE r.run_id = $1""", run_id)
        assert row["status"] == "completed"
        assert row["finished_at"] > before - timedelta(minutes=1)
