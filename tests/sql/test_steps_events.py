"""zeroth.get_step / record_step (durable steps) and wait_for_event / emit_event /
wake_due_waits (external events), on the test clock.

A step's result is recorded once per (run, step key) by the live lease holder, first write wins;
a stale holder neither records nor reads (that fence, for get_step, record_step and
wait_for_event alike: tests/sql/test_fenced_conformance.py). A wait either finds its event
(recorded as the step result), times out (recorded), or takes the run to waiting; the first
emit_event of the name in the run's scope makes it pending again, and a replay finds the payload.
"""

from __future__ import annotations

import json

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row

GET = """SELECT step_found, result::text AS result FROM zeroth_test.get_step(run_id => $1,
             worker_id => $2, generation => $3, step_key => $4, tenant_id => $5,
             workspace_id => $6, now_override => $7)"""
RECORD = """SELECT recorded, recorded_result::text AS result FROM zeroth_test.record_step(
                run_id => $1, worker_id => $2, generation => $3, step_key => $4,
                result => $5::text::jsonb, tenant_id => $6, workspace_id => $7,
                now_override => $8)"""
WAIT = """SELECT outcome, payload::text AS payload, timeout_at FROM zeroth_test.wait_for_event(
              run_id => $1, worker_id => $2, generation => $3, step_key => $4, name => $5,
              timeout_seconds => $6, tenant_id => $7, workspace_id => $8, now_override => $9)"""
EMIT = """SELECT emitted, woken FROM zeroth_test.emit_event(name => $1, payload => $2::text::jsonb,
              tenant_id => $3, workspace_id => $4, now_override => $5)"""
WAKE = """SELECT zeroth_test.wake_due_waits(deployment_refs => $1::text[], batch_size => $2,
              now_override => $3)"""
CLAIM_START = """SELECT run_id, lease_generation, attempts FROM zeroth_test.claim_and_start(
                     deployment_ref => $1, worker_id => $2, tenant_id => $3, workspace_id => $4,
                     batch_size => $5, now_override => $6) WHERE run_id IS NOT NULL"""
STEPS = """SELECT s.step_key, s.result, s.lease_generation, s.attempt FROM zeroth.run_steps s
            WHERE s.run_id = $1 ORDER BY s.step_key"""


async def get(conn, lease, key, *, generation=None, worker=None, tenant=None, workspace=None,
              now=None):
    now = at(1) if now is None else now
    return await conn.fetchrow(GET, lease.run_id, worker or lease.worker_id,
                               lease.generation if generation is None else generation, key,
                               tenant, workspace, now)


async def record(conn, lease, key, value, *, generation=None, worker=None, tenant=None,
                 now=None):
    now = at(1) if now is None else now
    return await conn.fetchrow(RECORD, lease.run_id, worker or lease.worker_id,
                               lease.generation if generation is None else generation, key,
                               json.dumps(value), tenant, None, now)


DEFAULT_KEY = object()


async def wait(conn, run_id, generation, name, *, key=DEFAULT_KEY, seconds=None, worker=WORKER,
               tenant=None, now=None):
    step_key = f"#event:{name}" if key is DEFAULT_KEY else key
    return await conn.fetchrow(WAIT, run_id, worker, generation, step_key, name, seconds, tenant,
                               None, at(1) if now is None else now)


async def emit(conn, name, payload=None, *, tenant=None, workspace=None, now=None):
    return await conn.fetchrow(EMIT, name, json.dumps(payload), tenant, workspace,
                               at(2) if now is None else now)


async def reclaim(conn, run_id, *, now, tenant=None):
    rows = await conn.fetch(CLAIM_START, DEPLOYMENT, WORKER, tenant, None, 1000, now)
    mine = [r for r in rows if r["run_id"] == run_id]
    assert mine, f"{run_id} was not claimable at {now}"
    return mine[0]["lease_generation"]


async def sqlstate(conn, make_call):
    """The SQLSTATE a call raises, inside a savepoint (the test's transaction goes on)."""
    with pytest.raises(asyncpg.PostgresError) as err:
        async with conn.transaction():
            await make_call()
    return err.value.sqlstate


# -- steps ----------------------------------------------------------------------------------------

async def test_record_then_read_first_result_wins(clock_conn):
    lease = await make_run(clock_conn, "running")
    assert tuple(await get(clock_conn, lease, "fetch")) == (False, None)
    first = await record(clock_conn, lease, "fetch", {"n": 1})
    assert first["recorded"] is True
    assert json.loads(first["result"]) == {"n": 1}
    second = await record(clock_conn, lease, "fetch", {"n": 2})
    assert second["recorded"] is False
    assert json.loads(second["result"]) == {"n": 1}
    read = await get(clock_conn, lease, "fetch")
    assert read["step_found"] is True
    assert json.loads(read["result"]) == {"n": 1}
    rows = await clock_conn.fetch(STEPS, lease.run_id)
    assert [(r["step_key"], r["lease_generation"], r["attempt"]) for r in rows] == [
        ("fetch", lease.generation, 1)]


async def test_json_null_is_a_result(clock_conn):
    lease = await make_run(clock_conn, "running")
    assert (await record(clock_conn, lease, "nothing", None))["recorded"] is True
    read = await get(clock_conn, lease, "nothing")
    assert read["step_found"] is True
    assert read["result"] == "null"


@pytest.mark.parametrize("key", [None, "", "x" * 401])
async def test_bad_step_key_is_zp008(clock_conn, key):
    lease = await make_run(clock_conn, "running")
    assert await sqlstate(clock_conn, lambda: record(clock_conn, lease, key, 1)) == "ZP008"
    assert await sqlstate(clock_conn, lambda: get(clock_conn, lease, key)) == "ZP008"
    assert await sqlstate(clock_conn, lambda: wait(clock_conn, lease.run_id, lease.generation,
                                                   "e", key=key)) == "ZP008"
    assert await clock_conn.fetch(STEPS, lease.run_id) == []


async def test_sql_null_result_is_zp008(clock_conn):
    lease = await make_run(clock_conn, "running")
    assert await sqlstate(clock_conn, lambda: clock_conn.fetchrow(
        RECORD, lease.run_id, WORKER, lease.generation, "s", None, None, None, at(1))) == "ZP008"


async def test_steps_are_pruned_with_their_run(clock_conn):
    lease = await make_run(clock_conn, "running")
    await record(clock_conn, lease, "s", 1)
    assert await clock_conn.fetchval(
        """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", lease.run_id, WORKER, lease.generation, at(2))
    assert await clock_conn.fetchval(
        "SELECT zeroth_test.prune_runs(older_than => interval '1 second', now_override => $1)",
        at(100)) == 1
    assert await clock_conn.fetch(STEPS, lease.run_id) == []


# -- events ---------------------------------------------------------------------------------------

async def test_wait_emit_resume(clock_conn):
    lease = await make_run(clock_conn, "running")
    waited = await wait(clock_conn, lease.run_id, lease.generation, "approval:42")
    assert waited["outcome"] == "waiting"
    assert waited["timeout_at"] is None
    row = await run_row(clock_conn, lease.run_id)
    assert (row["status"], row["wait_reason"], row["lease_worker_id"], row["attempts"]) == (
        "waiting", "event:approval:42", None, 0)
    emitted = await emit(clock_conn, "approval:42", {"ok": True})
    assert tuple(emitted) == (True, 1)
    row = await run_row(clock_conn, lease.run_id)
    assert (row["status"], row["wait_reason"]) == ("pending", None)
    generation = await reclaim(clock_conn, lease.run_id, now=at(3))
    again = await wait(clock_conn, lease.run_id, generation, "approval:42", now=at(4))
    assert again["outcome"] == "received"
    assert json.loads(again["payload"]) == {"ok": True}
    steps = await clock_conn.fetch(STEPS, lease.run_id)
    assert [(s["step_key"], json.loads(s["result"])["outcome"]) for s in steps] == [
        ("#event:approval:42", "received")]
    # The wait row is gone once its result is recorded; a replay reads the recorded step.
    assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.event_waits") == 0
    replay = await wait(clock_conn, lease.run_id, generation, "approval:42", now=at(5))
    assert replay["outcome"] == "received"


async def test_emit_before_wait_is_seen_without_leaving_the_worker(clock_conn):
    assert tuple(await emit(clock_conn, "early", [1, 2], now=at(0))) == (True, 0)
    lease = await make_run(clock_conn, "running")
    waited = await wait(clock_conn, lease.run_id, lease.generation, "early")
    assert waited["outcome"] == "received"
    assert json.loads(waited["payload"]) == [1, 2]
    assert (await run_row(clock_conn, lease.run_id))["status"] == "running"


async def test_emit_twice_first_wins(clock_conn):
    assert tuple(await emit(clock_conn, "e", "first")) == (True, 0)
    assert tuple(await emit(clock_conn, "e", "second", now=at(3))) == (False, 0)
    lease = await make_run(clock_conn, "running")
    waited = await wait(clock_conn, lease.run_id, lease.generation, "e", now=at(4))
    assert json.loads(waited["payload"]) == "first"


async def test_second_emit_wakes_nothing(clock_conn):
    lease = await make_run(clock_conn, "running")
    await wait(clock_conn, lease.run_id, lease.generation, "e")
    assert tuple(await emit(clock_conn, "e", 1)) == (True, 1)
    generation = await reclaim(clock_conn, lease.run_id, now=at(3))
    waited = await wait(clock_conn, lease.run_id, generation, "e", now=at(4))
    assert waited["outcome"] == "received"
    assert tuple(await emit(clock_conn, "e", 2, now=at(5))) == (False, 0)
    assert (await run_row(clock_conn, lease.run_id))["status"] == "running"


async def test_timeout(clock_conn):
    lease = await make_run(clock_conn, "running")
    waited = await wait(clock_conn, lease.run_id, lease.generation, "slow", seconds=30, now=at(10))
    assert waited["outcome"] == "waiting"
    assert waited["timeout_at"] == at(40)
    assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(39)) == 0
    assert (await run_row(clock_conn, lease.run_id))["status"] == "waiting"
    assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(41)) == 1
    assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(42)) == 0  # once
    generation = await reclaim(clock_conn, lease.run_id, now=at(43))
    # The replay keeps the first wait's deadline, whatever timeout it passes now.
    again = await wait(clock_conn, lease.run_id, generation, "slow", seconds=3600, now=at(44))
    assert again["outcome"] == "timed_out"
    assert again["payload"] is None
    # An emit after the timeout wakes nothing and changes no recorded outcome.
    assert tuple(await emit(clock_conn, "slow", 1, now=at(45))) == (True, 0)
    replay = await wait(clock_conn, lease.run_id, generation, "slow", now=at(46))
    assert replay["outcome"] == "timed_out"


async def test_event_after_deadline_but_before_the_sweep_is_a_timeout(clock_conn):
    lease = await make_run(clock_conn, "running")
    await wait(clock_conn, lease.run_id, lease.generation, "e", seconds=10, now=at(0))
    assert tuple(await emit(clock_conn, "e", 1, now=at(20))) == (True, 1)  # wakes it, too late
    generation = await reclaim(clock_conn, lease.run_id, now=at(21))
    waited = await wait(clock_conn, lease.run_id, generation, "e", now=at(22))
    assert waited["outcome"] == "timed_out"


async def test_event_by_the_deadline_is_received(clock_conn):
    lease = await make_run(clock_conn, "running")
    await wait(clock_conn, lease.run_id, lease.generation, "e", seconds=10, now=at(0))
    assert tuple(await emit(clock_conn, "e", 1, now=at(10))) == (True, 1)
    generation = await reclaim(clock_conn, lease.run_id, now=at(30))
    waited = await wait(clock_conn, lease.run_id, generation, "e", now=at(31))
    assert waited["outcome"] == "received"


async def test_zero_timeout_times_out_at_once(clock_conn):
    lease = await make_run(clock_conn, "running")
    waited = await wait(clock_conn, lease.run_id, lease.generation, "e", seconds=0)
    assert waited["outcome"] == "timed_out"
    assert (await run_row(clock_conn, lease.run_id))["status"] == "running"


async def test_emit_in_another_tenant_or_workspace_wakes_nothing(clock_conn):
    lease = await make_run(clock_conn, "running", tenant_id="acme")
    await wait(clock_conn, lease.run_id, lease.generation, "e", tenant="acme")
    assert tuple(await emit(clock_conn, "e", 1, tenant="evil")) == (True, 0)
    assert tuple(await emit(clock_conn, "e", 1)) == (True, 0)  # tenant 'default'
    assert tuple(await emit(clock_conn, "e", 1, tenant="acme", workspace="w1")) == (True, 0)
    row = await run_row(clock_conn, lease.run_id, tenant_id="acme")
    assert row["status"] == "waiting"
    assert tuple(await emit(clock_conn, "e", 2, tenant="acme")) == (True, 1)


async def test_workspace_without_tenant_is_zp006(clock_conn):
    assert await sqlstate(clock_conn, lambda: emit(clock_conn, "e", 1, workspace="w1")) == "ZP006"


@pytest.mark.parametrize("name", [None, "", "x" * 201])
async def test_bad_event_name_is_zp008(clock_conn, name):
    assert await sqlstate(clock_conn, lambda: emit(clock_conn, name, 1)) == "ZP008"
    lease = await make_run(clock_conn, "running")
    assert await sqlstate(clock_conn, lambda: wait(clock_conn, lease.run_id, lease.generation,
                                                   name, key="k")) == "ZP008"
    assert (await run_row(clock_conn, lease.run_id))["status"] == "running"


@pytest.mark.parametrize("bad", [-1, float("nan"), 366 * 86400 + 1])
async def test_bad_timeout_is_zp008(clock_conn, bad):
    lease = await make_run(clock_conn, "running")
    assert await sqlstate(clock_conn, lambda: wait(clock_conn, lease.run_id, lease.generation,
                                                   "e", seconds=bad)) == "ZP008"
    assert (await run_row(clock_conn, lease.run_id))["status"] == "running"


async def test_cancel_of_a_waiting_run(clock_conn):
    lease = await make_run(clock_conn, "running")
    await wait(clock_conn, lease.run_id, lease.generation, "e")
    assert await clock_conn.fetchval(
        "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
        lease.run_id, at(2)) == "cancelled"
    assert tuple(await emit(clock_conn, "e", 1, now=at(3))) == (True, 0)
    assert (await run_row(clock_conn, lease.run_id))["status"] == "cancelled"


async def test_pending_cancel_request_wins_over_waiting(clock_conn):
    lease = await make_run(clock_conn, "running")
    assert await clock_conn.fetchval(
        "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
        lease.run_id, at(1)) == "cancel_requested"
    waited = await wait(clock_conn, lease.run_id, lease.generation, "e", now=at(2))
    assert waited["outcome"] == "cancelled"
    row = await run_row(clock_conn, lease.run_id)
    assert (row["status"], row["lease_worker_id"]) == ("cancelled", None)


async def test_resume_run_of_an_event_wait_keeps_the_deadline(clock_conn):
    lease = await make_run(clock_conn, "running")
    first = await wait(clock_conn, lease.run_id, lease.generation, "e", seconds=100, now=at(0))
    assert await clock_conn.fetchval(
        "SELECT zeroth_test.resume_run(run_id => $1, now_override => $2)", lease.run_id, at(5))
    generation = await reclaim(clock_conn, lease.run_id, now=at(6))
    again = await wait(clock_conn, lease.run_id, generation, "e", seconds=5, now=at(7))
    assert again["outcome"] == "waiting"
    assert again["timeout_at"] == first["timeout_at"] == at(100)


async def test_pause_and_resume_still_work(clock_conn):
    lease = await make_run(clock_conn, "waiting")
    row = await run_row(clock_conn, lease.run_id)
    assert (row["status"], row["wait_reason"]) == ("waiting", "approval")
    assert tuple(await emit(clock_conn, "approval", 1)) == (True, 0)  # not an event wait
    assert (await run_row(clock_conn, lease.run_id))["status"] == "waiting"
    assert await clock_conn.fetchval(
        "SELECT zeroth_test.resume_run(run_id => $1, now_override => $2)", lease.run_id, at(5))


async def test_wait_frees_the_admission_slot(clock_conn):
    lease = await make_run(clock_conn, "running", max_concurrency=1)
    second = await make_run(clock_conn, "pending")
    assert await clock_conn.fetch(CLAIM_START + " AND false", DEPLOYMENT, WORKER, None, None, 1,
                                  at(1)) == []
    await wait(clock_conn, lease.run_id, lease.generation, "e")
    rows = await clock_conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => $2,
               max_concurrency => 1, now_override => $3) WHERE run_id IS NOT NULL""",
        DEPLOYMENT, WORKER, at(2))
    assert [r["run_id"] for r in rows] == [second.run_id]


@pytest.mark.slow
async def test_thousand_runs_on_thousand_events_each_resume_once(clock_conn):
    items = json.dumps([{"payload": {"i": i}} for i in range(1000)])
    ids = [r["run_id"] for r in await clock_conn.fetch(
        """SELECT run_id FROM zeroth_test.enqueue_runs(deployment_ref => $1,
               runs => $2::text::jsonb, now_override => $3)""", DEPLOYMENT, items, at(0))]
    claimed = await clock_conn.fetch(CLAIM_START, DEPLOYMENT, WORKER, None, None, 1000, at(1))
    assert len(claimed) == 1000
    name_of = {run_id: f"ev-{i}" for i, run_id in enumerate(ids)}
    for row in claimed:
        waited = await wait(clock_conn, row["run_id"], row["lease_generation"],
                            name_of[row["run_id"]])
        assert waited["outcome"] == "waiting"
    woken = [tuple(await emit(clock_conn, name, i)) for i, name in enumerate(name_of.values())]
    assert woken == [(True, 1)] * 1000
    assert await clock_conn.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE status = 'pending'") == 1000
    again = await clock_conn.fetch(CLAIM_START, DEPLOYMENT, WORKER, None, None, 1000, at(3))
    assert len(again) == 1000
    payloads = {}
    for row in again:
        waited = await wait(clock_conn, row["run_id"], row["lease_generation"],
                            name_of[row["run_id"]], now=at(4))
        assert waited["outcome"] == "received"
        payloads[row["run_id"]] = json.loads(waited["payload"])
    assert payloads == {run_id: i for i, run_id in enumerate(ids)}
    assert await clock_conn.fetchval(
        "SELECT count(*) FROM zeroth.run_steps WHERE step_key LIKE '#event:%'") == 1000
