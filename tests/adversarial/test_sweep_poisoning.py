"""A zeroth_worker member cannot poison the orphan sweep for other runs , on a
database exactly as shipped (no test clock, the real clock's lease expiry).

With its own grants only (enqueue_run, claim_and_start, start_child_run, wait_for_children,
request_cancel, renew_lease, fail_run), a worker builds the two runs that would make
every claim_orphaned of their scope raise — and with it the recovery of every innocent orphan
beside them:

* a root, out of attempts and asked to cancel, over a chain of children deeper than the cancel
  cascade's stack (each generation started one child and waits for it);
* a run that failed (retryable) with an error string near jsonb's limit, then died on its last
  attempt (its dead-lettering wrapped the error past the limit).

The sweep now recovers the innocent orphan in the same call and ends the attacker's run too:
the chain is cancelled (the cascade is iterative), the error is stored bounded.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

TENANT = "acme"
ENQUEUE = """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1,
                 max_attempts => $2)"""
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd',
               worker_id => $1, tenant_id => $2, lease_seconds => $3) WHERE run_id IS NOT NULL"""
SWEEP = """SELECT run_id FROM zeroth.claim_orphaned(deployment_ref => 'd', worker_id => 'rescuer',
               tenant_id => $1, grace_seconds => 0) WHERE run_id IS NOT NULL"""
SHORT = 0.3  # seconds: a lease that runs out on the real clock while the test waits


async def innocent_orphan(worker: asyncpg.Connection, tenant: str = TENANT) -> object:
    """Another run of the scope, out of attempts, whose worker died: the sweep dead-letters it."""
    run_id = await worker.fetchval(ENQUEUE, tenant, 1)
    (row,) = await worker.fetch(CLAIM, "innocent-worker", tenant, SHORT)
    assert row["run_id"] == run_id
    return run_id


async def status(admin: asyncpg.Connection, run_id: object) -> str:
    return await admin.fetchval(  # type: ignore[no-any-return]
        "SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1", run_id)


async def test_a_deep_child_chain_under_a_dead_root_stops_no_recovery(login, admin):
    attacker = await login("worker")
    root = await attacker.fetchval(ENQUEUE, TENANT, 1)
    (claimed,) = await attacker.fetch(CLAIM, "attacker", TENANT, 60)
    assert claimed["run_id"] == root
    # 400 generations under the root, each the previous one's child, waiting for its own child;
    # with its own grants only, in one DO block.
    await attacker.execute(f"""
        DO $$
        DECLARE
            v_run   uuid := '{root}';
            v_gen   bigint := {claimed["lease_generation"]};
            v_child uuid;
        BEGIN
            FOR i IN 1 .. 400 LOOP
                SELECT s.child_run_id INTO v_child FROM zeroth.start_child_run(
                    run_id => v_run, worker_id => 'attacker', generation => v_gen,
                    step_key => 'c', deployment_ref => 'chain', tenant_id => '{TENANT}') AS s;
                IF v_run <> '{root}' THEN
                    PERFORM zeroth.wait_for_children(
                        run_id => v_run, worker_id => 'attacker', generation => v_gen,
                        step_key => 'w', child_run_ids => ARRAY[v_child], tenant_id => '{TENANT}');
                END IF;
                SELECT c.run_id, c.lease_generation INTO v_run, v_gen
                  FROM zeroth.claim_and_start(deployment_ref => 'chain', worker_id => 'attacker',
                                              tenant_id => '{TENANT}') AS c
                 WHERE c.run_id IS NOT NULL;
            END LOOP;
        END
        $$""")
    assert await attacker.fetchval(
        "SELECT zeroth.request_cancel(run_id => $1, tenant_id => $2)", root, TENANT
    ) == "cancel_requested"
    # The root's worker "dies": its lease runs out (a renewal shortens it), out of attempts.
    assert await attacker.fetchval(
        """SELECT zeroth.renew_lease(run_id => $1, worker_id => 'attacker', generation => $2,
               tenant_id => $3, lease_seconds => $4)""",
        root, claimed["lease_generation"], TENANT, SHORT)
    innocent = await innocent_orphan(attacker)
    await asyncio.sleep(2 * SHORT)

    rescuer = await login("worker")
    assert await rescuer.fetch(SWEEP, TENANT) == []  # raised before: stack depth exceeded

    assert await status(admin, innocent) == "failed"
    assert await status(admin, root) == "cancelled"
    assert dict(await admin.fetch(
        """SELECT r.status::text, count(*) FROM zeroth.runs r WHERE r.deployment_ref = 'chain'
            GROUP BY r.status""")) == {"cancelled": 399, "running": 1}  # the leaf: lease live


@pytest.mark.slow
async def test_an_error_near_the_jsonb_limit_stops_no_recovery(login, admin):
    attacker = await login("worker")
    run_id = await attacker.fetchval(ENQUEUE, TENANT, 2)
    (first,) = await attacker.fetch(CLAIM, "attacker", TENANT, 60)
    assert await attacker.fetchval(
        """SELECT zeroth.fail_run(run_id => $1, worker_id => 'attacker', generation => $2,
               error => jsonb_build_object('message', repeat('x', 268435400)), retryable => true,
               retry_base_seconds => 0, retry_max_seconds => 0, tenant_id => $3)""",
        run_id, first["lease_generation"], TENANT) == "retry_scheduled"
    (last,) = await attacker.fetch(CLAIM, "attacker", TENANT, SHORT)  # its last attempt
    assert last["run_id"] == run_id
    innocent = await innocent_orphan(attacker)
    await asyncio.sleep(2 * SHORT)

    rescuer = await login("worker")
    assert await rescuer.fetch(SWEEP, TENANT) == []  # raised before: jsonb too large

    assert await status(admin, innocent) == "failed"
    size, error = await admin.fetchrow(
        "SELECT pg_column_size(r.error #> '{}'), r.error FROM zeroth.runs r WHERE r.run_id = $1",
        run_id)
    assert size <= 1_048_576
    error = json.loads(error)
    assert error["stop_reason"] == "attempts_exhausted"
    assert error["previous_error"]["truncated"] is True


async def test_a_row_no_function_accepts_stops_no_other_scopes_recovery(login, admin):
    """A DBA's INSERT of a running run under a tenant_id longer than any function accepts (no
    table constraint refuses it) made every claim_orphaned_scopes with a max_concurrency (the fleet
    worker's sweep) raise ZP008 from that scope's slot rows, and the ZP error was raised for the
    whole call, not skipped with its scope: no orphan of any tenant was recovered again. The
    arguments are checked before any scope now; that scope is skipped with a WARNING. Such a row
    is refused since 0018 (runs_scope_names_bounded, NOT VALID): one made before is played here by
    planting it with the constraint dropped, then putting it back as the upgrade does."""
    await admin.execute("ALTER TABLE zeroth.runs DROP CONSTRAINT runs_scope_names_bounded")
    planted = await admin.fetchval(
        """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, lease_worker_id,
               lease_acquired_at, lease_expires_at, lease_generation, attempts, max_attempts,
               created_at, updated_at, started_at, run_after)
           VALUES (gen_random_uuid(), repeat('t', 201), 'd', 'running', 'gone',
                   now() - interval '2 hours', now() - interval '1 hour', 1, 1, 3,
                   now(), now(), now(), now())
           RETURNING run_id""")
    await admin.execute(
        """ALTER TABLE zeroth.runs ADD CONSTRAINT runs_scope_names_bounded
               CHECK (length(tenant_id) <= 200 AND length(deployment_ref) <= 200
                      AND (workspace_id IS NULL OR length(workspace_id) <= 200)) NOT VALID""")
    worker = await login("worker")
    run_id = await worker.fetchval(ENQUEUE, TENANT, 3)
    (row,) = await worker.fetch(CLAIM, "innocent-worker", TENANT, SHORT)
    assert row["run_id"] == run_id
    await asyncio.sleep(2 * SHORT)

    rescuer = await login("worker")
    rows = await rescuer.fetch(
        """SELECT tenant_id, run_id FROM zeroth.claim_orphaned_scopes(
               deployment_refs => ARRAY['d'], worker_id => 'rescuer', max_concurrency => 5,
               grace_seconds => 0) WHERE run_id IS NOT NULL""")

    assert [(r["tenant_id"], r["run_id"]) for r in rows] == [(TENANT, run_id)]
    assert await admin.fetchval(
        "SELECT lease_worker_id FROM zeroth.runs WHERE run_id = $1", run_id) == "rescuer"
    assert await status(admin, planted) == "running"  # its scope skipped, nothing changed


async def test_claim_orphaned_scopes_checks_max_concurrency_before_any_scope(login):
    rescuer = await login("worker")
    with pytest.raises(asyncpg.PostgresError) as raised:
        await rescuer.fetch(
            """SELECT * FROM zeroth.claim_orphaned_scopes(deployment_refs => ARRAY['d'],
                   worker_id => 'rescuer', max_concurrency => 10001)""")
    assert raised.value.sqlstate == "ZP008"


async def held_child(attacker: asyncpg.Connection, tenant: str
                     ) -> tuple[tuple[object, object], object]:
    """A parent of the attacker's tenant and its one child (one attempt), the child claimed on a
    lease that runs out: the sweep will end the child, which counts it down in the parent's
    wait, taking its child_runs row FOR UPDATE. Returns (parent, its generation, child)."""
    parent = await attacker.fetchval(ENQUEUE, tenant, 1)
    (claimed,) = await attacker.fetch(CLAIM, "attacker", tenant, 60)
    assert claimed["run_id"] == parent
    child = await attacker.fetchval(
        """SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'attacker',
               generation => $2, step_key => 'c', deployment_ref => 'd', max_attempts => 1,
               tenant_id => $3)""", parent, claimed["lease_generation"], tenant)
    (leased,) = await attacker.fetch(CLAIM, "attacker-2", tenant, SHORT)
    assert leased["run_id"] == child
    return (parent, claimed["lease_generation"]), child


@pytest.mark.parametrize("sweep", ["claim_orphaned_scopes", "claim_orphaned"])
async def test_a_worker_holding_a_row_open_stalls_no_other_recovery(login, admin, sweep):
    """A zeroth_worker member entered its own parent's wait_for_children in a transaction it left
    open (its child's child_runs row held FOR SHARE), its child orphaned beside innocent ones. The
    sweep's end of that child waited for the row as long as the transaction stayed open (no
    lock_timeout): claim_orphaned_scopes held every other scope's recovery with it, uncommitted.
    The sweeps run under lock_timeout 2 s now, and a run whose recovery timed out on a lock is
    left for the next pass (neither dead-lettered nor failing the pass); the others are
    recovered."""
    attacker = await login("worker")
    (parent, generation), child = await held_child(attacker, "evil")
    same_scope = await innocent_orphan(await login("worker"), "evil")
    other_scope = await innocent_orphan(await login("worker"), TENANT)
    await asyncio.sleep(2 * SHORT)
    hold = attacker.transaction()
    await hold.start()
    try:
        (waited,) = await attacker.fetch(
            """SELECT outcome FROM zeroth.wait_for_children(run_id => $1, worker_id => 'attacker',
                   generation => $2, step_key => 'w', child_run_ids => ARRAY[$3]::uuid[],
                   tenant_id => 'evil')""", parent, generation, child)
        assert waited["outcome"] == "waiting"

        rescuer = await login("worker")
        await rescuer.execute("SET statement_timeout = '60s'")  # a stall fails, never hangs
        if sweep == "claim_orphaned_scopes":
            await rescuer.fetch(
                """SELECT * FROM zeroth.claim_orphaned_scopes(deployment_refs => ARRAY['d'],
                       worker_id => 'rescuer', grace_seconds => 0)""")
        else:
            await rescuer.fetch(
                """SELECT * FROM zeroth.claim_orphaned(deployment_ref => 'd',
                       worker_id => 'rescuer', tenant_id => 'evil', grace_seconds => 0)""")
            await rescuer.fetch(SWEEP, TENANT)

        assert await status(admin, same_scope) == "failed"
        assert await status(admin, other_scope) == "failed"
        assert await status(admin, child) == "running"  # left as it was, for the next pass
    finally:
        await hold.rollback()


async def test_a_takeover_that_waits_on_a_held_row_returns_nothing_and_changes_nothing(
        login, admin):
    """claim_for_takeover of the held child (as above) waited as long as the attacker's
    transaction stayed open; under lock_timeout 2 s it returns no row, the run left as it was."""
    attacker = await login("worker")
    (parent, generation), child = await held_child(attacker, "evil")
    await asyncio.sleep(2 * SHORT)
    hold = attacker.transaction()
    await hold.start()
    try:
        await attacker.fetch(
            """SELECT outcome FROM zeroth.wait_for_children(run_id => $1, worker_id => 'attacker',
                   generation => $2, step_key => 'w', child_run_ids => ARRAY[$3]::uuid[],
                   tenant_id => 'evil')""", parent, generation, child)
        rescuer = await login("worker")
        await rescuer.execute("SET statement_timeout = '60s'")  # a stall fails, never hangs
        assert await rescuer.fetch(
            """SELECT * FROM zeroth.claim_for_takeover(run_id => $1, tenant_id => 'evil',
                   grace_seconds => 0)""", child) == []
        assert await status(admin, child) == "running"
    finally:
        await hold.rollback()


@pytest.mark.parametrize("column", ["tenant_id", "deployment_ref", "workspace_id"])
async def test_a_dba_cannot_insert_a_run_whose_scope_names_no_function_accepts(admin, column):
    names = {"tenant_id": "'acme'", "deployment_ref": "'d'", "workspace_id": "NULL"}
    names[column] = "repeat('x', 201)"
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(
            f"""INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref, status,
                    created_at, updated_at, run_after)
                VALUES (gen_random_uuid(), {names['tenant_id']}, {names['workspace_id']},
                        {names['deployment_ref']}, 'pending', now(), now(), now())""")
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0


async def test_a_worker_holding_a_row_open_stalls_no_run_deadline_sweep(login, admin):
    """wake_due_waits (every RunWorker's sweep, every scope) ends the runs nobody holds past their
    run deadline, each through the settle path. A zeroth_worker member entered its own parent's
    wait_for_children in a transaction it left open (its pending child's child_runs row held FOR
    SHARE) and the child passed its run deadline: the sweep's end of that child waited for the row
    as long as the transaction stayed open (the function ran under no lock_timeout), or raised
    55P03 under the caller's, failing the whole sweep — every other scope's deadline ends and event
    wake-ups with it. Under lock_timeout 2 s, a run whose end timed out on a lock is left for the
    next pass (WARNING) and the others are ended."""
    attacker = await login("worker")
    parent = await attacker.fetchval(ENQUEUE, "evil", 1)
    (claimed,) = await attacker.fetch(CLAIM, "attacker", "evil", 60)
    assert claimed["run_id"] == parent
    child = await attacker.fetchval(
        """SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'attacker',
               generation => $2, step_key => 'c', deployment_ref => 'd', max_attempts => 1,
               tenant_id => 'evil')""", parent, claimed["lease_generation"])
    innocent = await (await login("worker")).fetchval(ENQUEUE, TENANT, 1)
    # Both past their run deadline (a DBA's UPDATE: no wall-clock wait), the child's the older,
    # so the sweep meets it first.
    await admin.execute("UPDATE zeroth.runs SET run_deadline_at = now() - interval '2 minutes' "
                        "WHERE run_id = $1", child)
    await admin.execute("UPDATE zeroth.runs SET run_deadline_at = now() - interval '1 minute' "
                        "WHERE run_id = $1", innocent)
    hold = attacker.transaction()
    await hold.start()
    try:
        (waited,) = await attacker.fetch(
            """SELECT outcome FROM zeroth.wait_for_children(run_id => $1, worker_id => 'attacker',
                   generation => $2, step_key => 'w', child_run_ids => ARRAY[$3]::uuid[],
                   tenant_id => 'evil')""", parent, claimed["lease_generation"], child)
        assert waited["outcome"] == "waiting"

        rescuer = await login("worker")
        # a stall fails, never hangs; a caller's own lock_timeout is no excuse to fail the pass
        await rescuer.execute("SET statement_timeout = '60s'; SET lock_timeout = '3s'")
        warnings: list[str] = []
        rescuer.add_log_listener(lambda _c, message: warnings.append(message.message))

        assert await rescuer.fetchval(
            "SELECT zeroth.wake_due_waits(deployment_refs => ARRAY['d'])") == 1

        assert await status(admin, innocent) == "failed"
        assert await status(admin, child) == "pending"  # left as it was, for the next pass
        assert any(str(child) in w for w in warnings)
    finally:
        await hold.rollback()
    # The row let go, the next pass ends it.
    assert await (await login("worker")).fetchval(
        "SELECT zeroth.wake_due_waits(deployment_refs => ARRAY['d'])") == 1
    assert await status(admin, child) == "failed"


async def test_a_worker_holding_a_row_open_stalls_no_claim_meeting_a_run_past_its_deadline(
        login, admin):
    """A claim ends the pending runs past their run deadline it meets (through the settle path,
    whose child-run trigger takes the child's child_runs row FOR UPDATE). The attacker's child, as
    above, held by its parent's wait_for_children in a transaction left open: a claim of its scope
    (claim_and_start runs under no lock_timeout of its own, nor does a RunWorker's session set one)
    waited for the row as long as the transaction stayed open, and claimed nothing. The end now
    waits at most 2 s for a lock; then the run is left for the next claim (WARNING) and the claim
    goes on."""
    attacker = await login("worker")
    parent = await attacker.fetchval(ENQUEUE, "evil", 1)
    (claimed,) = await attacker.fetch(CLAIM, "attacker", "evil", 60)
    assert claimed["run_id"] == parent
    child = await attacker.fetchval(
        """SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'attacker',
               generation => $2, step_key => 'c', deployment_ref => 'd', max_attempts => 1,
               tenant_id => 'evil')""", parent, claimed["lease_generation"])
    innocent = await (await login("worker")).fetchval(ENQUEUE, "evil", 1)
    await admin.execute("UPDATE zeroth.runs SET run_deadline_at = now() - interval '1 minute' "
                        "WHERE run_id = $1", child)
    hold = attacker.transaction()
    await hold.start()
    try:
        (waited,) = await attacker.fetch(
            """SELECT outcome FROM zeroth.wait_for_children(run_id => $1, worker_id => 'attacker',
                   generation => $2, step_key => 'w', child_run_ids => ARRAY[$3]::uuid[],
                   tenant_id => 'evil')""", parent, claimed["lease_generation"], child)
        assert waited["outcome"] == "waiting"

        rescuer = await login("worker")
        await rescuer.execute("SET statement_timeout = '30s'")  # a stall fails, never hangs
        async with rescuer.transaction():
            rows = await rescuer.fetch(CLAIM, "rescuer", "evil", 60)
            # the bound was the end's only: the caller's transaction is as it was
            assert await rescuer.fetchval("SHOW lock_timeout") == "0"

        assert [r["run_id"] for r in rows] == [innocent]
        assert await status(admin, child) == "pending"  # left as it was, for the next claim
    finally:
        await hold.rollback()


@pytest.mark.parametrize(("tenant_ids", "workspace_ids", "sqlstate"), [
    (["acme", None], ["w1", "w2"], "ZP006"),  # a workspace without a tenant
    (["acme", "t" * 201], None, "ZP008"),  # a tenant no scope may have
    (["acme", "other"], ["w1"], "ZP008"),  # lists of different lengths
])
async def test_a_worker_sweeping_bad_scopes_is_refused_after_autovacuum_saw_no_runs(
        login, admin, tenant_ids, workspace_ids, sqlstate):
    # As autovacuum leaves a table it found empty: the planner believes zeroth.runs empty. The
    # sweep checked its scopes only when its plan read them, and with nothing on the runs side
    # of a hash semi-join it never did: bad scopes were no error and the call returned nothing.
    await admin.execute("VACUUM ANALYZE zeroth.runs")
    worker = await login("worker")
    with pytest.raises(asyncpg.PostgresError) as caught:
        await worker.fetch(
            """SELECT * FROM zeroth.claim_orphaned_scopes(deployment_refs => ARRAY['d'],
                   worker_id => 'rescuer', tenant_ids => $1::text[],
                   workspace_ids => $2::text[])""", tenant_ids, workspace_ids)
    assert caught.value.sqlstate == sqlstate
