"""Code versions (issue 34, item 3): runs.code_version_id recorded by the claim that starts a run,
the deployment's version_policy (set_version_policy: any, same, compatible) deciding which
versions every claim may resume a started run with, zeroth.pinned_runs, and retire_code_version
(move, fail), the way out for the runs of a version no worker serves any more. Bad input is a
ZP008 that changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, T0, at, enqueue, run_row

V1, V2, V3 = "2026.12.05-abc123", "2026.12.06-def456", "v3+build.7"
LATER = at(1000)  # well past the factories' leases (60 s)


async def claim_start(conn: asyncpg.Connection, version: str | None, *, worker: str = "w",
                      now: Any = T0, batch_size: int = 10) -> list[UUID]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => $2,
               batch_size => $3, lease_seconds => $4, code_version => $5, now_override => $6)""",
        DEPLOYMENT, worker, batch_size, LEASE, version, now)
    return [r["run_id"] for r in rows if r["run_id"] is not None]


async def claim_only(conn: asyncpg.Connection, version: str | None, *, worker: str = "w",
                     now: Any = T0) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, batch_size => 10, lease_seconds => $3, code_version => $4,
               now_override => $5)""", DEPLOYMENT, worker, LEASE, version, now)
    return [r for r in rows if r["run_id"] is not None]


async def orphans(conn: asyncpg.Connection, version: str | None, *, worker: str = "rescuer",
                  now: Any = LATER) -> list[UUID]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
               lease_seconds => $3, code_version => $4, now_override => $5)""",
        DEPLOYMENT, worker, LEASE, version, now)
    return [r["run_id"] for r in rows if r["run_id"] is not None]


async def hand_back(conn: asyncpg.Connection, run_id: UUID, *, worker: str = "w",
                    now: Any = T0) -> None:
    generation = (await run_row(conn, run_id))["lease_generation"]
    assert await conn.fetchval(
        """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
               generation => $3, now_override => $4)""", run_id, worker, generation, now)


async def register(conn: asyncpg.Connection, deployment: str = DEPLOYMENT) -> None:
    await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", deployment)


async def set_policy(conn: asyncpg.Connection, policy: str, versions: list[str] | None = None,
                     deployment: str = DEPLOYMENT) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth_test.set_version_policy(deployment_ref => $1, version_policy => $2,
               compatible_versions => $3)""", deployment, policy, versions)


async def retire(conn: asyncpg.Connection, version: str, action: str, to_version: str | None = None,
                 message: str | None = None, now: Any = LATER) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth_test.retire_code_version(deployment_ref => $1, code_version => $2,
               action => $3, to_version => $4, message => $5, now_override => $6)""",
        DEPLOYMENT, version, action, to_version, message, now)


async def started_by(conn: asyncpg.Connection, version: str | None, now: Any = T0) -> UUID:
    """A run started by a worker of `version`, then handed back: pending again, started."""
    run_id = await enqueue(conn, now=now)
    claimed = await claim_start(conn, version, now=now)
    assert run_id in claimed
    for each in claimed:  # those started before are given back as they were
        await hand_back(conn, each, now=now)
    return run_id


async def version_of(conn: asyncpg.Connection, run_id: UUID) -> str | None:
    """The code version a run recorded (runs.code_version_id → zeroth.code_versions)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        """SELECT (SELECT v.code_version FROM zeroth.code_versions v
                    WHERE v.version_id = r.code_version_id LIMIT 1)
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)


async def state(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await conn.fetch(
        """SELECT r.run_id, r.status, r.lease_generation, r.code_version_id, r.attempts
             FROM zeroth.runs r ORDER BY r.run_id""")] + [tuple(r) for r in await conn.fetch(
        """SELECT deployment_ref, version_policy, compatible_versions FROM zeroth.deployments
            ORDER BY 1""")] + [(await conn.fetchval(
                "SELECT count(*) FROM zeroth.code_version_changes"),)]


class TestTheStartingVersionIsRecorded:
    async def test_claim_and_start_records_the_workers_version(self, conn):
        run_id = await enqueue(conn)
        assert await claim_start(conn, V1) == [run_id]
        assert await version_of(conn, run_id) == V1

    async def test_an_unversioned_worker_records_nothing(self, conn):
        run_id = await enqueue(conn)
        assert await claim_start(conn, None) == [run_id]
        assert await version_of(conn, run_id) is None

    async def test_a_started_run_keeps_the_version_that_started_it(self, conn):
        run_id = await started_by(conn, V1)
        assert await claim_start(conn, V2, now=at(1)) == [run_id]  # policy any: v2 resumes it
        assert await version_of(conn, run_id) == V1

    async def test_a_lapsed_unstarted_claim_takes_the_next_claimers_version(self, conn):
        run_id = await enqueue(conn)
        assert [r["run_id"] for r in await claim_only(conn, V1)] == [run_id]
        assert await version_of(conn, run_id) == V1
        assert await claim_start(conn, V2, worker="other", now=at(LEASE + 1)) == [run_id]
        assert await version_of(conn, run_id) == V2

    async def test_orphan_recovery_keeps_the_recorded_version(self, conn):
        run_id = await enqueue(conn)
        await claim_start(conn, V1)
        assert await orphans(conn, V2) == [run_id]
        assert await version_of(conn, run_id) == V1


class TestPolicyAny:
    async def test_every_version_resumes_every_run_by_default(self, conn):
        await register(conn)
        run_id = await started_by(conn, V1)
        assert await claim_start(conn, V2, now=at(1)) == [run_id]


class TestPolicySame:
    async def test_only_the_starting_version_resumes_a_started_run(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, V1)
        assert await claim_start(conn, V2, now=at(1)) == []
        assert await claim_start(conn, None, now=at(1)) == []
        assert await claim_start(conn, V1, now=at(1)) == [run_id]

    async def test_a_run_never_started_is_claimable_by_any_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        pinned = await started_by(conn, V1)
        fresh = await enqueue(conn, now=at(1))
        assert await claim_start(conn, V2, now=at(2)) == [fresh]
        assert await version_of(conn, fresh) == V2
        assert (await run_row(conn, pinned))["status"] == "pending"

    async def test_a_run_started_unversioned_is_resumed_by_every_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, None)
        assert await claim_start(conn, V2, now=at(1)) == [run_id]

    async def test_claim_pending_obeys_the_policy(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, V1)
        assert await claim_only(conn, V2, now=at(1)) == []
        assert [r["run_id"] for r in await claim_only(conn, V1, now=at(1))] == [run_id]

    async def test_an_orphan_is_recovered_only_by_its_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await enqueue(conn)
        await claim_start(conn, V1)
        assert await orphans(conn, V2) == []
        assert (await run_row(conn, run_id))["status"] == "running"
        assert await orphans(conn, V1) == [run_id]

    async def test_an_orphan_out_of_attempts_is_ended_by_any_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await enqueue(conn, max_attempts=1)
        await claim_start(conn, V1)
        assert await orphans(conn, V2) == []
        row = await run_row(conn, run_id)
        assert (row["status"], row["dead_lettered_at"] is not None) == ("failed", True)

    async def test_claim_and_start_scopes_obeys_the_policy(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, V1)
        query = """SELECT run_id FROM zeroth_test.claim_and_start_scopes(deployment_refs => $1,
                       worker_id => 'w', batch_size => 5, lease_seconds => 60, code_version => $2,
                       now_override => $3)"""
        assert [r["run_id"] for r in await conn.fetch(query, [DEPLOYMENT], V2, at(1))
                if r["run_id"]] == []
        assert [r["run_id"] for r in await conn.fetch(query, [DEPLOYMENT], V1, at(1))
                if r["run_id"]] == [run_id]

    async def test_claim_orphaned_scopes_obeys_the_policy(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await enqueue(conn)
        await claim_start(conn, V1)
        query = """SELECT run_id FROM zeroth_test.claim_orphaned_scopes(deployment_refs => $1,
                       worker_id => 'rescuer', lease_seconds => 60, code_version => $2,
                       now_override => $3)"""
        assert [r["run_id"] for r in await conn.fetch(query, [DEPLOYMENT], V2, at(1000))
                if r["run_id"]] == []
        assert [r["run_id"] for r in await conn.fetch(query, [DEPLOYMENT], V1, at(1000))
                if r["run_id"]] == [run_id]

    async def test_complete_and_claim_obeys_the_policy(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        pinned = await started_by(conn, V1)
        mine = await enqueue(conn, now=at(1))
        assert await claim_start(conn, V2, now=at(2)) == [mine]
        generation = (await run_row(conn, mine))["lease_generation"]
        rows = await conn.fetch(
            """SELECT completed, (claimed).run_id AS run_id FROM zeroth_test.complete_and_claim(
                   deployment_ref => $1, worker_id => 'w', run_ids => $2, generations => $3,
                   lease_seconds => 60, code_version => $4, now_override => $5)""",
            DEPLOYMENT, [mine], [generation], V2, at(3))
        assert [(r["completed"], r["run_id"]) for r in rows] == [([True], None)]
        assert (await run_row(conn, pinned))["lease_worker_id"] is None


class TestPolicyCompatible:
    async def test_versions_of_the_set_resume_each_others_runs(self, conn):
        await register(conn)
        await set_policy(conn, "compatible", [V1, V2])
        run_id = await started_by(conn, V1)
        assert await claim_start(conn, V3, now=at(1)) == []
        assert await claim_start(conn, V2, now=at(1)) == [run_id]

    async def test_a_version_outside_the_set_resumes_only_its_own(self, conn):
        await register(conn)
        await set_policy(conn, "compatible", [V1, V2])
        run_id = await started_by(conn, V3)
        assert await claim_start(conn, V1, now=at(1)) == []
        assert await claim_start(conn, V3, now=at(1)) == [run_id]


class TestSetVersionPolicy:
    async def test_a_change_is_audited_and_a_repeat_changes_nothing(self, conn):
        await register(conn)
        first = await set_policy(conn, "compatible", [V2, V1, V1])
        assert (first["outcome"], first["policy"], first["versions"]) == (
            "updated", "compatible", sorted([V1, V2]))
        again = await set_policy(conn, "compatible", [V1, V2])
        assert again["outcome"] == "unchanged"
        audit = await conn.fetch(
            """SELECT action, version_policy, compatible_versions, changed_by
                 FROM zeroth.code_version_changes ORDER BY change_id""")
        assert [tuple(r)[:3] for r in audit] == [("set_policy", "compatible", sorted([V1, V2]))]
        assert audit[0]["changed_by"] == await conn.fetchval("SELECT session_user")

    @pytest.mark.parametrize(("policy", "versions"), [
        ("sometimes", None), (None, None), ("compatible", None), ("compatible", []),
        ("compatible", ["ok", None]), ("compatible", ["bad version"]), ("same", [V1]),
        ("compatible", ["x" * 129]), ("compatible", [f"v{i}" for i in range(101)]),
    ])
    async def test_bad_input_is_refused_and_changes_nothing(self, conn, policy, versions):
        await register(conn)
        before = await state(conn)
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await set_policy(conn, policy, versions)
        assert raised.value.sqlstate == "ZP008"
        assert await state(conn) == before

    async def test_an_unregistered_deployment_is_refused(self, conn):
        before = await state(conn)
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await set_policy(conn, "same")
        assert raised.value.sqlstate == "ZP008"
        assert await state(conn) == before

    async def test_a_registration_keeps_the_policy(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        await conn.execute(
            "SELECT zeroth.register_deployment(deployment_ref => $1, max_attempts => 9)",
            DEPLOYMENT)
        assert await conn.fetchval(
            "SELECT version_policy FROM zeroth.deployments WHERE deployment_ref = $1",
            DEPLOYMENT) == "same"


class TestBadCodeVersion:
    @pytest.mark.parametrize("version", ["", " v1", "v1 ", "a b", "x" * 129, "v1\n", "-v1",
                                         "v1;drop", "é"])
    async def test_every_claim_refuses_it_and_changes_nothing(self, conn, version):
        await enqueue(conn)
        before = await state(conn)
        tail = "worker_id => 'w', code_version => $2, now_override => $3)"
        calls = [f"SELECT * FROM zeroth_test.{call}, {tail}" for call in (
            "claim_and_start(deployment_ref => $1", "claim_pending(deployment_ref => $1",
            "claim_orphaned(deployment_ref => $1",
            "claim_and_start_scopes(deployment_refs => ARRAY[$1]",
            "claim_orphaned_scopes(deployment_refs => ARRAY[$1]",
            "complete_and_claim(deployment_ref => $1, run_ids => '{}', generations => '{}'",
        )]
        for call in calls:
            with pytest.raises(asyncpg.PostgresError) as raised:
                async with conn.transaction():
                    await conn.fetch(call, DEPLOYMENT, version, T0)
            assert raised.value.sqlstate == "ZP008", call
        assert await state(conn) == before

    async def test_the_longest_version_is_accepted(self, conn):
        run_id = await enqueue(conn)
        version = "v" + "1.a_b-c+d:e/" * 10 + "x" * 7
        assert len(version) == 128
        assert await claim_start(conn, version) == [run_id]
        assert await version_of(conn, run_id) == version


class TestPinnedRuns:
    async def test_the_view_counts_runs_waiting_for_their_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        # zeroth.pinned_runs reads the real clock (clock_timestamp()): these runs are due now.
        past = datetime(2020, 1, 1, tzinfo=UTC)
        await started_by(conn, V1, now=past)
        await started_by(conn, V1, now=past)
        running = await enqueue(conn, now=past)
        await claim_start(conn, V2, batch_size=1, now=datetime.now(UTC))
        rows = [dict(r) for r in await conn.fetch(
            """SELECT code_version, version_policy, pending, running, waiting_for_version
                 FROM zeroth.pinned_runs ORDER BY code_version""")]
        assert rows == [
            {"code_version": V1, "version_policy": "same", "pending": 2, "running": 0,
             "waiting_for_version": 2},
            {"code_version": V2, "version_policy": "same", "pending": 0, "running": 1,
             "waiting_for_version": 0},
        ]
        assert await version_of(conn, running) == V2

    async def test_under_policy_any_nothing_is_pinned(self, conn):
        await register(conn)
        await started_by(conn, V1)
        assert await conn.fetch("SELECT * FROM zeroth.pinned_runs") == []


class TestRetireCodeVersion:
    async def test_move_hands_the_runs_to_another_version(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, V1)
        result = await retire(conn, V1, "move", V2)
        assert (result["runs_changed"], result["runs_left"]) == (1, 0)
        assert await version_of(conn, run_id) == V2
        assert await claim_start(conn, V2, now=at(1001)) == [run_id]
        audit = await conn.fetchrow(
            """SELECT action, code_version, to_version, run_count FROM zeroth.code_version_changes
                WHERE action = 'move'""")
        assert tuple(audit) == ("move", V1, V2, 1)

    async def test_move_to_no_version_lets_every_worker_resume_them(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        run_id = await started_by(conn, V1)
        await retire(conn, V1, "move", None)
        assert await claim_start(conn, V3, now=at(1001)) == [run_id]

    async def test_fail_ends_pending_runs_and_takes_over_expired_ones(self, conn):
        await register(conn)
        await set_policy(conn, "same")
        orphan = await enqueue(conn)
        assert await claim_start(conn, V1) == [orphan]
        pending = await started_by(conn, V1)
        live = await enqueue(conn, now=at(3))
        # The lease of `live` lives past at(1000); `pending` comes first and is given back.
        assert await claim_start(conn, V1, now=at(990)) == [pending, live]
        await hand_back(conn, pending, now=at(990))
        result = await retire(conn, V1, "fail", message="v1 is gone")
        assert (result["runs_changed"], result["runs_left"]) == (2, 1)
        for run_id in (pending, orphan):
            row = await run_row(conn, run_id)
            assert (row["status"], row["dead_lettered_at"] is not None) == ("failed", True)
            assert '"stop_reason": "code_version_retired"' in row["error"]
            assert "v1 is gone" in row["error"]
        assert (await run_row(conn, live))["status"] == "running"

    @pytest.mark.parametrize(("version", "action", "to_version", "message"), [
        (None, "move", V2, None), ("bad version", "move", V2, None), (V1, "delete", None, None),
        (V1, "move", V1, None), (V1, "fail", V2, None), (V1, "move", "x" * 129, None),
        (V1, "fail", None, "m" * 1001),
    ])
    async def test_bad_input_is_refused_and_changes_nothing(self, conn, version, action,
                                                            to_version, message):
        await register(conn)
        await set_policy(conn, "same")
        await started_by(conn, V1)
        before = await state(conn)
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await retire(conn, version, action, to_version, message)
        assert raised.value.sqlstate == "ZP008"
        assert await state(conn) == before
