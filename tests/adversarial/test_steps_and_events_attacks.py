"""Durable steps and events hold against hostile callers and odd values, on a database exactly
as shipped (no test clock).

* an earlier attempt of the same worker id (a second process) sees and records no step;
* a wait replays only a result recorded for its own event; keys at the byte limits fail with
  ZP008, not an index error; a Python wait for a name holding '#' never replays another wait;
* an emit from a snapshot older than the wait (REPEATABLE READ, SERIALIZABLE) loses no wake-up;
  one that waited for the wait fails and its retry wakes;
* a waiting run frees its lease and slot; a cancel of a waiting run is final and a later emit
  wakes nothing; resume, emit and timeout together record exactly one outcome;
* only workers may call wake_due_waits, and bad deployment lists are ZP008;
* a step result, output or payload too deep to encode, and a value Python cannot decode, fail
  the run once (or raise a typed error) instead of looping.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from helpers import wait_until
from test_complete_and_claim_attacks import CLAIM, ENQUEUE, ORPHANED, everything, expire, held

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import InvalidArgumentError

WAIT = """SELECT outcome, payload::text AS payload, timeout_at FROM zeroth.wait_for_event(
              run_id => $1, worker_id => $2, generation => $3, step_key => $4, name => $5,
              timeout_seconds => $6, tenant_id => $7, workspace_id => $8)"""

EMIT = """SELECT emitted, woken FROM zeroth.emit_event(name => $1, payload => $2::text::jsonb,
              tenant_id => $3, workspace_id => $4)"""

RECORD = """SELECT recorded, recorded_result::text AS result FROM zeroth.record_step(
                run_id => $1, worker_id => $2, generation => $3, step_key => $4,
                result => $5::text::jsonb, tenant_id => $6, workspace_id => $7)"""

GET = """SELECT step_found, result::text AS result FROM zeroth.get_step(run_id => $1,
             worker_id => $2, generation => $3, step_key => $4, tenant_id => $5,
             workspace_id => $6)"""


class TestStepsSameWorkerIdElsewhere:
    async def test_an_earlier_attempt_of_the_same_worker_id_sees_and_records_nothing(
            self, login, admin):
        """Promises 1 and 2: process 1 of w1 (generation g) lost its lease to process 2 of w1
        (g+1), which recorded step s. Process 1 can neither read s nor record anything."""
        first, second = await login("worker"), await login("worker")
        run_id, gen = await held(admin, first)
        await expire(admin, run_id)
        (taken,) = await second.fetch(ORPHANED, "d", "w1", "acme", None)
        assert taken["lease_generation"] == gen + 1
        assert (await second.fetchrow(RECORD, run_id, "w1", gen + 1, "s", '"later"', "acme",
                                      None))["recorded"] is True
        before = await everything(admin)
        assert (await first.fetchrow(GET, run_id, "w1", gen, "s", "acme", None))[
            "step_found"] is None
        assert (await first.fetchrow(RECORD, run_id, "w1", gen, "s", '"stale"', "acme", None))[
            "recorded"] is None
        assert (await first.fetchrow(RECORD, run_id, "w1", gen, "t", '"stale"', "acme", None))[
            "recorded"] is None
        assert (await first.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", None, "acme",
                                     None))["outcome"] is None
        assert await everything(admin) == before


class TestEventKeys:
    async def test_a_wait_replays_only_a_result_recorded_for_its_own_event(self, login, admin):
        """Promise 2: a step key already holding another step's result (record_step, or a wait
        for another event) is not taken as this wait's outcome; the wait is refused (ZP008)
        rather than answer 'fenced out' (outcome NULL) or another event's payload."""
        worker = await login("worker")
        run_id, gen = await held(admin, worker)
        assert (await worker.fetchrow(RECORD, run_id, "w1", gen, "#event:k", '5', "acme",
                                      None))["recorded"] is True
        await worker.fetch(EMIT, "a", '"for a"', "acme", None)
        assert (await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:a", "a", None, "acme",
                                      None))["outcome"] == "received"
        before = await everything(admin)
        for key in ("#event:k", "#event:a"):
            with pytest.raises(asyncpg.PostgresError) as raised:
                await worker.fetch(WAIT, run_id, "w1", gen, key, "b", None, "acme", None)
            assert raised.value.sqlstate == "ZP008"
        assert await everything(admin) == before

    async def test_keys_at_the_byte_limits_fail_with_zp008_not_an_index_error(self, login,
                                                                             admin):
        """Bad input → ZP: a tenant, workspace and step key at their character limits, in
        four-byte characters that do not compress, make an index row PostgreSQL cannot hold.
        The step call must say so with ZP008, never 54000 (program limit exceeded)."""
        worker = await login("worker")
        wide = "".join(chr(0x1F300 + (i * 7919) % 0x2FF) for i in range(200))
        tenant, workspace = wide, wide[::-1]
        run_id, gen = await held(admin, worker, tenant=tenant, workspace=workspace)
        key = "".join(chr(0x20000 + (i * 104729) % 0xA000) for i in range(400))
        before = await everything(admin)
        for statement, args in ((RECORD, (run_id, "w1", gen, key, '1', tenant, workspace)),
                                (GET, (run_id, "w1", gen, key, tenant, workspace)),
                                (WAIT, (run_id, "w1", gen, key, "e", None, tenant, workspace))):
            with pytest.raises(asyncpg.PostgresError) as raised:
                await worker.fetch(statement, *args)
            assert raised.value.sqlstate == "ZP008", raised.value
        assert await everything(admin) == before


class TestEmitIsolation:
    @pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
    async def test_an_emit_from_a_snapshot_older_than_the_wait_loses_no_wake_up(
            self, login, admin, isolation):
        """Promise 5 (nothing lost): an application emits from a REPEATABLE READ / SERIALIZABLE
        transaction whose snapshot predates a wait that committed meanwhile (the event's
        channel row existed already, from an earlier wait). Either the emit wakes the run or it
        fails with a serialization error (40001) that the application retries — never an
        emitted event with the run left waiting for ever."""
        worker, app = await login("worker"), await login("worker")
        # An earlier run waited on the same name: the channel row exists.
        old, gold = await held(admin, worker)
        assert (await worker.fetchrow(WAIT, old, "w1", gold, "#event:e", "e", None, "acme",
                                      None))["outcome"] == "waiting"
        run_id, gen = await held(admin, worker)
        transaction = app.transaction(isolation=isolation)
        await transaction.start()
        await app.fetchval("SELECT 1")  # the transaction's snapshot is taken
        assert (await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", None, "acme",
                                      None))["outcome"] == "waiting"
        try:
            row = await app.fetchrow(EMIT, "e", '"go"', "acme", None)
            await transaction.commit()
        except asyncpg.SerializationError:
            await transaction.rollback()
            row = await app.fetchrow(EMIT, "e", '"go"', "acme", None)  # the retry
        assert row["emitted"] is True
        statuses = dict(await admin.fetch(
            "SELECT run_id, status::text FROM zeroth.runs WHERE run_id = ANY($1::uuid[])",
            [old, run_id]))
        assert statuses == {old: "pending", run_id: "pending"}


    async def test_a_repeatable_read_emit_that_waited_for_the_wait_fails_and_its_retry_wakes(
            self, login, admin):
        """The same race with the emit blocked behind the wait's row lock: the emit's snapshot
        was taken before the wait committed, so once the wait commits the emit is refused
        (40001) rather than record the event and wake nothing."""
        worker, app = await login("worker"), await login("worker")
        old, gold = await held(admin, worker)
        assert (await worker.fetchrow(WAIT, old, "w1", gold, "#event:e", "e", None, "acme",
                                      None))["outcome"] == "waiting"
        run_id, gen = await held(admin, worker)
        waiting = worker.transaction()
        await waiting.start()
        assert (await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", None, "acme",
                                      None))["outcome"] == "waiting"
        transaction = app.transaction(isolation="repeatable_read")
        await transaction.start()
        emit = asyncio.ensure_future(app.fetchrow(EMIT, "e", '"go"', "acme", None))
        pid = app.get_server_pid()

        async def blocked() -> bool:
            return await admin.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid)

        await wait_until(blocked, "the emit waiting for the wait's row lock", within=30)
        await waiting.commit()
        with pytest.raises(asyncpg.SerializationError):
            await emit
        await transaction.rollback()
        assert tuple(await app.fetchrow(EMIT, "e", '"go"', "acme", None)) == (True, 2)


class TestWaitingRunsLeaveTheirSlot:
    async def test_a_waiting_run_frees_its_lease_and_slot(self, login, admin):
        worker = await login("worker")
        run_id, gen = await held(admin, worker, max_concurrency=1)
        other = await admin.fetchval(ENQUEUE, "d", "acme", None)
        assert (await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", None, "acme",
                                      None))["outcome"] == "waiting"
        row = await admin.fetchrow("SELECT status, lease_worker_id, lease_expires_at, "
                                   "admission_slot FROM zeroth.runs WHERE run_id = $1", run_id)
        assert tuple(row) == ("waiting", None, None, None)
        assert [r["run_id"] for r in await worker.fetch(CLAIM, "d", "w1", "acme", None, 1,
                                                        60)] == [other]

    async def test_cancel_of_a_waiting_run_is_final_and_a_later_emit_wakes_nothing(
            self, login, admin):
        worker = await login("worker")
        run_id, gen = await held(admin, worker)
        assert (await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", 3600, "acme",
                                      None))["outcome"] == "waiting"
        await admin.fetch("SELECT * FROM zeroth.request_cancel(run_id => $1, tenant_id => "
                          "'acme')", run_id)
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    run_id) == "cancelled"
        assert tuple(await worker.fetchrow(EMIT, "e", '1', "acme", None)) == (True, 0)
        await admin.execute("UPDATE zeroth.event_waits SET timeout_at = clock_timestamp() - "
                            "interval '1 s'")
        assert await worker.fetchval("SELECT zeroth.wake_due_waits()") == 0
        assert await admin.fetchval("SELECT status FROM zeroth.runs WHERE run_id = $1",
                                    run_id) == "cancelled"

    async def test_resume_then_emit_then_timeout_records_exactly_one_outcome(self, login,
                                                                             admin):
        """Promise 2: an operator resumes a waiting run (resume_run), the replay waits again on
        the same deadline, an emit wakes it, the deadline passes before the replay: the event
        came before the deadline, so received is recorded, once, and every replay sees it."""
        worker = await login("worker")
        run_id, gen = await held(admin, worker)
        first = await worker.fetchrow(WAIT, run_id, "w1", gen, "#event:e", "e", 3600, "acme",
                                      None)
        assert first["outcome"] == "waiting"
        await worker.fetch("SELECT zeroth.resume_run(run_id => $1, tenant_id => 'acme')", run_id)
        (claimed,) = await worker.fetch(CLAIM, "d", "w1", "acme", None, None, 60)
        again = await worker.fetchrow(WAIT, run_id, "w1", claimed["lease_generation"],
                                      "#event:e", "e", 3600, "acme", None)
        assert (again["outcome"], again["timeout_at"]) == ("waiting", first["timeout_at"])
        assert tuple(await worker.fetchrow(EMIT, "e", '"yes"', "acme", None)) == (True, 1)
        await admin.execute("UPDATE zeroth.event_waits SET timeout_at = clock_timestamp() "
                            "+ interval '1 ms'")
        await asyncio.sleep(0.01)
        (claimed,) = await worker.fetch(CLAIM, "d", "w1", "acme", None, None, 60)
        outcomes = []
        for _ in range(2):
            got = await worker.fetchrow(WAIT, run_id, "w1", claimed["lease_generation"],
                                        "#event:e", "e", 3600, "acme", None)
            outcomes.append((got["outcome"], json.loads(got["payload"])))
        assert outcomes == [("received", "yes")] * 2
        assert await admin.fetchval("SELECT count(*) FROM zeroth.run_steps WHERE run_id = $1",
                                    run_id) == 1


class TestWakeDueWaitsRoles:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_only_workers_may_wake(self, login, admin, kind):
        outsider = await login(kind)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await outsider.fetch("SELECT zeroth.wake_due_waits(deployment_refs => '{d}')")

    @pytest.mark.parametrize("refs", ["{}", "{NULL}"])
    async def test_bad_deployment_lists_are_zp008(self, login, refs):
        worker = await login("worker")
        with pytest.raises(asyncpg.PostgresError) as raised:
            await worker.fetch("SELECT zeroth.wake_due_waits(deployment_refs => $1::text[])",
                               [] if refs == "{}" else [None])
        assert raised.value.sqlstate == "ZP008"


class TestEventNamesInPython:
    async def test_a_wait_for_a_name_holding_hash_never_replays_another_wait(self, app, pool,
                                                                            serve):
        """Promise 2: the second wait for "a" is the step "#event:a#2", so a wait for the event
        "a#2" once replayed it and returned a's payload. The name's "#" is escaped in its step
        key now: the wait for "a#2" is a wait of its own and receives the event "a#2"."""

        @app.deployment("hash-events", max_attempts=1)
        async def hash_events(run) -> Any:
            first = await run.wait_for_event("a")
            second = await run.wait_for_event("a")
            third = await run.wait_for_event("a#2")
            return {"first": first, "second": second, "third": third}

        lm = LeaseManager(pool)
        await lm.emit_event("a", "A")
        await lm.emit_event("a#2", "B")
        queued = await hash_events.enqueue()
        await serve()

        async def done() -> Any:
            return await pool.fetchval(
                "SELECT output::text FROM zeroth.runs WHERE run_id = $1 AND status = 'completed'",
                queued.run_id)

        output = await wait_until(done, "the run completed", within=30)
        assert json.loads(output) == {"first": "A", "second": "A", "third": "B"}
        keys = await pool.fetch("SELECT step_key FROM zeroth.run_steps WHERE run_id = $1",
                                queued.run_id)
        assert {row["step_key"] for row in keys} == {"#event:a", "#event:a#2", "#event:a%232"}


def _deep(depth: int = 5000) -> list[Any]:
    """JSON nested deeper than Python's json encoder can write (RecursionError, not ValueError)."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


class TestTooDeepJson:
    async def test_a_step_result_too_deep_to_encode_is_a_step_result_error(self, app, pool,
                                                                         serve):
        """Bad input → a typed exception that changes nothing: the step's value cannot be
        encoded, so the run fails for good (StepResultError, no retry that would run the step's
        side effect again) and nothing is recorded."""
        calls: list[int] = []

        @app.deployment("deep-step", max_attempts=3)
        async def deep_step(run) -> None:
            await run.step("deep", lambda: calls.append(1) or _deep())

        queued = await deep_step.enqueue()
        await serve()

        async def failed() -> Any:
            return await pool.fetchrow(
                "SELECT error::text AS error, attempts FROM zeroth.runs WHERE run_id = $1 "
                "AND status = 'failed'", queued.run_id)

        row = await wait_until(failed, "the run failed", within=30)
        assert json.loads(row["error"])["type"] == "StepResultError"
        assert (row["attempts"], calls) == (1, [1])
        assert await pool.fetchval("SELECT count(*) FROM zeroth.run_steps") == 0

    async def test_an_output_too_deep_to_encode_fails_the_run_without_a_retry(self, app, pool,
                                                                            serve):
        calls: list[int] = []

        @app.deployment("deep-output", max_attempts=3)
        async def deep_output(run) -> Any:
            calls.append(1)
            return _deep()

        queued = await deep_output.enqueue()
        await serve()

        async def failed() -> Any:
            return await pool.fetchrow(
                "SELECT error::text AS error, attempts FROM zeroth.runs WHERE run_id = $1 "
                "AND status = 'failed'", queued.run_id)

        row = await wait_until(failed, "the run failed", within=30)
        assert (row["attempts"], calls) == (1, [1])

    async def test_a_payload_too_deep_to_encode_is_an_invalid_argument(self, pool):
        with pytest.raises(InvalidArgumentError):
            await LeaseManager(pool).enqueue_run("d", {"deep": _deep()})
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 0


class TestUndecodableStepValues:
    """JSON PostgreSQL holds but Python cannot decode (an integer of 5,000 digits: Python refuses
    more than 4,300; nesting deeper than its decoder goes), written by another language's client
    or by psql: an event payload, a step result. The run must fail for good with a typed error
    (StepResultError), not retry a ValueError / RecursionError until it is dead-lettered."""

    @pytest.mark.parametrize("value", ["1e5000", "[" * 3000 + "]" * 3000])
    async def test_an_event_payload_python_cannot_decode_fails_the_run_once(
            self, app, pool, serve, value):
        @app.deployment("undecodable-event", max_attempts=3)
        async def waits(run) -> Any:
            return await run.wait_for_event("big")

        queued = await waits.enqueue()
        await pool.fetch("SELECT * FROM zeroth.emit_event(name => 'big', payload => $1::jsonb)",
                         value)
        await serve()

        async def failed() -> Any:
            return await pool.fetchrow(
                "SELECT error::text AS error, attempts FROM zeroth.runs WHERE run_id = $1 "
                "AND status = 'failed'", queued.run_id)

        row = await wait_until(failed, "the run failed", within=30)
        assert json.loads(row["error"])["type"] == "StepResultError"
        assert row["attempts"] == 1

    async def test_a_step_result_python_cannot_decode_fails_the_run_once(self, app, pool,
                                                                       serve):
        calls: list[int] = []

        @app.deployment("undecodable-step", max_attempts=3)
        async def stepper(run) -> Any:
            if run.attempt == 1:  # another client recorded the step (psql, another language)
                await pool.fetch(
                    """SELECT * FROM zeroth.record_step(run_id => $1, worker_id => $2,
                           generation => $3, step_key => 's', result => '1e5000')""",
                    run.run_id, run.worker_id, run.lease_generation)
            return await run.step("s", lambda: calls.append(1) or 1)

        queued = await stepper.enqueue()
        await serve()

        async def failed() -> Any:
            return await pool.fetchrow(
                "SELECT error::text AS error, attempts FROM zeroth.runs WHERE run_id = $1 "
                "AND status = 'failed'", queued.run_id)

        row = await wait_until(failed, "the run failed", within=30)
        assert json.loads(row["error"])["type"] == "StepResultError"
        assert (row["attempts"], calls) == (1, [])
