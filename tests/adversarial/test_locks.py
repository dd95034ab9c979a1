"""Nobody outside the package can hold a lock the package waits on.

Advisory locks need no privilege and, when admissions of a thread were serialised by a transaction
advisory lock and a scope's slot rows created under a non-blocking one, their keys were computable
(hashtext of tenant, workspace and thread), so a LOGIN role with no grant at all held
``pg_advisory_lock(1516464242, hashtext(...))`` and every admission of that thread blocked for as
long as it liked; holding a scope's key made that scope's first claims report saturation with no
slot rows created. A thread's admissions now lock its row of zeroth.thread_locks (0009; the
stripes of zeroth.lock_stripes before it, dropped in 0024), which only zeroth_owner can read or
lock, and slot creation takes no shared lock.

Played on a shipped database as ``nobody`` (no grant) and ``worker`` (zeroth_worker): the
stranger holds the keys the old code used (and every advisory key it likes), and the package's
calls go through; neither role can lock a thread's row itself.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

THREAD = "conversation-42"
DEPLOYMENT = "d"
TENANT = "acme"
#: Generous: a call that waits on the stranger's lock fails here instead of hanging the suite.
TIMEOUT_MS = 5000


async def hold_the_old_keys(stranger: asyncpg.Connection) -> None:
    """The advisory keys the package used to wait on, held at session level by the stranger."""
    for tenant, wskey in (("default", ""), (TENANT, "")):
        await stranger.execute(
            "SELECT pg_advisory_lock(1516464242, hashtext($1 || chr(31) || $2 || chr(31) || $3))",
            tenant, wskey, THREAD)
        await stranger.execute(
            "SELECT pg_advisory_lock(hashtextextended($1 || chr(31) || $2 || chr(31) || $3, 7230))",
            tenant, wskey, DEPLOYMENT)


@pytest.fixture
async def bounded(admin: asyncpg.Connection) -> asyncpg.Connection:
    await admin.execute(f"SET statement_timeout = {TIMEOUT_MS}")
    return admin


@pytest.mark.parametrize("kind", ["nobody", "worker"])
async def test_a_stranger_holding_the_old_advisory_keys_blocks_no_admission(
        login, bounded, kind):
    stranger = await login(kind)
    await hold_the_old_keys(stranger)

    admitted = await bounded.fetchrow(
        """SELECT outcome, run_id FROM zeroth.admit_run(deployment_ref => $1, thread_id => $2,
               strategy => 'enqueue')""", DEPLOYMENT, THREAD)
    assert admitted["outcome"] == "admitted"
    queued = await bounded.fetchrow(
        "SELECT status::text FROM zeroth.enqueue_run(deployment_ref => $1, thread_id => $2)",
        DEPLOYMENT, THREAD)
    assert queued["status"] == "waiting"
    batch = await bounded.fetch(
        """SELECT status::text FROM zeroth.enqueue_runs(deployment_ref => $1,
               runs => $2::text::jsonb)""",
        DEPLOYMENT, json.dumps([{"thread_id": THREAD}, {"thread_id": "another"}]))
    assert sorted(row["status"] for row in batch) == ["pending", "waiting"]
    assert await bounded.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE thread_id = $1", THREAD) == 3


@pytest.mark.parametrize("kind", ["nobody", "worker"])
async def test_a_stranger_holding_the_old_slot_key_does_not_saturate_a_new_scope(
        login, bounded, kind):
    stranger = await login(kind)
    await hold_the_old_keys(stranger)
    run_id = await bounded.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2)",
        DEPLOYMENT, TENANT)

    rows = await bounded.fetch(
        """SELECT run_id, concurrency_saturated FROM zeroth.claim_and_start(
               deployment_ref => $1, worker_id => 'w', tenant_id => $2, max_concurrency => 5)""",
        DEPLOYMENT, TENANT)
    assert [(row["run_id"], row["concurrency_saturated"]) for row in rows] == [(run_id, False)]
    assert await bounded.fetchval(
        "SELECT count(*) FROM zeroth.admission_slots WHERE tenant_id = $1", TENANT) == 5


@pytest.mark.parametrize("kind", ["nobody", "worker", "reader"])
async def test_no_role_can_lock_a_threads_row_itself(login, kind):
    session = await login(kind)
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await session.execute("SELECT 1 FROM zeroth.thread_locks FOR UPDATE")
    with pytest.raises(asyncpg.InsufficientPrivilegeError):
        await session.execute(
            "SELECT 1 FROM zeroth.thread_locks WHERE thread_id = $1 FOR KEY SHARE", THREAD)


async def test_no_zeroth_function_waits_on_an_advisory_lock(admin):
    """The guard that keeps it so: migrations serialise on one (the DBA's tool), the runtime
    never waits on one. The wakeup gate (sql/functions/internal/notify.sql) only *tries* them:
    a stranger holding its keys changes whether a NOTIFY is sent, never whether a call goes
    through (tests/adversarial/test_wakeup_gate.py)."""
    waiting = await admin.fetch(
        """SELECT p.oid::regprocedure::text AS function
             FROM pg_proc p
            WHERE p.pronamespace = 'zeroth'::regnamespace
              AND pg_get_functiondef(p.oid) ~* 'pg_advisory_(xact_)?lock'""")
    assert [row["function"] for row in waiting] == []
    trying = await admin.fetch(
        """SELECT p.proname::text AS function
             FROM pg_proc p
            WHERE p.pronamespace = 'zeroth'::regnamespace
              AND pg_get_functiondef(p.oid) ~* 'pg_try_advisory'
            ORDER BY 1""")
    # The wakeup gate, and the code versions' prune lock: a code version's record and its prune
    # only try (a stranger holding a version's key must not stall every claim of that version).
    assert [row["function"] for row in trying] == [
        "_code_version_id", "_notify_wakeup", "_take_wakeup_stripes", "prune_runs"]


@pytest.mark.parametrize("kind", ["nobody", "worker"])
async def test_a_stranger_holding_a_code_versions_lock_stalls_no_claim_of_that_version(
        login, admin, bounded, kind):
    """The key of a code version's advisory lock follows from the version's text: a LOGIN role
    (no grant needed) holding it exclusive must not make the claims of that version wait."""
    stranger = await login(kind)
    await stranger.execute(
        """SELECT pg_advisory_lock(1936029554, (('x' || left(encode(sha256(
               convert_to('v-held', 'UTF8')), 'hex'), 16))::bit(64)::bigint
               & 2147483647)::integer)""")
    run_id = await bounded.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2)",
        DEPLOYMENT, TENANT)
    rows = await bounded.fetch(
        """SELECT run_id FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'w',
               tenant_id => $2, code_version => 'v-held')""", DEPLOYMENT, TENANT)
    assert [row["run_id"] for row in rows] == [run_id]
    assert await admin.fetchval(
        """SELECT v.code_version FROM zeroth.runs r
             JOIN zeroth.code_versions v ON v.version_id = r.code_version_id
            WHERE r.run_id = $1""", run_id) == "v-held"


async def colliding_thread(admin: asyncpg.Connection, tenant: str, thread: str) -> str:
    """A thread id of tenant 'evil' whose 0008 stripe is the stripe of (tenant, '', thread)."""
    return str(await admin.fetchval(
        """SELECT 't' || g FROM generate_series(1, 400000) g
            WHERE hashtextextended(ARRAY['evil', '', 't' || g]::text, 1516464242) & 16383
                = hashtextextended(ARRAY[$1, '', $2]::text, 1516464242) & 16383
            LIMIT 1""", tenant, thread))


async def colliding_workspace(admin: asyncpg.Connection, tenant: str, deployment: str) -> str:
    """A workspace of tenant 'evil' whose 0008 scope stripe is that of (tenant, '', deployment)."""
    return str(await admin.fetchval(
        """SELECT g::text FROM generate_series(1, 400000) g
            WHERE hashtextextended(ARRAY['evil', 'w:' || g, $2]::text, 7230) & 1023
                = hashtextextended(ARRAY[$1, '', $2]::text, 7230) & 1023
            LIMIT 1""", tenant, deployment))


async def test_a_worker_holding_its_own_threads_and_scopes_stalls_no_other_tenant(
        login, bounded, admin):
    """The locks are exact (zeroth.thread_locks; slot creation shares no lock), not stripes
    shared by every tenant and computable: a worker acting only in its own tenant, holding in an
    open transaction what would be the stripes of another tenant's thread and scope (here: the
    very ones the victim uses), makes only its own threads wait; the victim's admissions do not
    wait and its first claims do not report saturation."""
    evil_thread = await colliding_thread(admin, TENANT, THREAD)
    evil_workspace = await colliding_workspace(admin, TENANT, DEPLOYMENT)

    attacker = await login("worker")
    hold = attacker.transaction()
    await hold.start()
    try:
        await attacker.execute(
            "SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => 'evil', thread_id => $2)",
            DEPLOYMENT, evil_thread)
        await attacker.execute(
            """SELECT * FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'evil',
                   tenant_id => 'evil', workspace_id => $2, max_concurrency => 5)""",
            DEPLOYMENT, evil_workspace)

        admitted = await bounded.fetchrow(
            """SELECT outcome FROM zeroth.admit_run(deployment_ref => $1, thread_id => $2,
                   tenant_id => $3)""", DEPLOYMENT, THREAD, TENANT)
        assert admitted["outcome"] == "admitted"
        run_id = await bounded.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2)",
            DEPLOYMENT, TENANT)
        rows = await bounded.fetch(
            """SELECT run_id, concurrency_saturated FROM zeroth.claim_and_start(
                   deployment_ref => $1, worker_id => 'w', tenant_id => $2, max_concurrency => 5,
                   batch_size => 5)""", DEPLOYMENT, TENANT)
        assert run_id in {row["run_id"] for row in rows}
        assert not any(row["concurrency_saturated"] for row in rows)
    finally:
        await hold.rollback()


@pytest.mark.parametrize("kind", ["nobody", "worker", "reader"])
async def test_no_role_can_lock_a_thread_lock_row(login, admin, kind):
    await admin.execute("SELECT zeroth.enqueue_run(deployment_ref => 'd', thread_id => 't')")
    session = await login(kind)
    for statement in ("SELECT 1 FROM zeroth.thread_locks FOR UPDATE",
                      "SELECT 1 FROM zeroth.thread_locks FOR KEY SHARE",
                      "INSERT INTO zeroth.thread_locks VALUES ('default', '', 't') "
                      "ON CONFLICT DO NOTHING"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await session.execute(statement)
