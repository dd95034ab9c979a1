"""Code versions (issue 34), the paths the claims did not cover: an admit-and-own admission and
start_run record the caller's code_version as a claim does; claim_and_start_scopes draws no
place for a scope whose only due runs are pinned to a version the worker cannot serve
(zeroth._scope_has_due_run applies the claims' filter); prune_runs deletes the code versions no
run references any more (bounded, old ones only). The meeting of a prune and a claim recording a
reference: tests/races/test_code_version_prune_races.py.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, T0, at, enqueue, run_row
from thread_calls import OWNER, admit, fenced

V1, V2 = "2026.12.05-abc123", "2026.12.06-def456"


async def version_of(conn: asyncpg.Connection, run_id: UUID) -> str | None:
    return await conn.fetchval(  # type: ignore[no-any-return]
        """SELECT (SELECT v.code_version FROM zeroth.code_versions v
                    WHERE v.version_id = r.code_version_id LIMIT 1)
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)


async def versions(conn: asyncpg.Connection) -> list[str]:
    return [r["code_version"] for r in await conn.fetch(
        "SELECT DISTINCT code_version FROM zeroth.code_versions ORDER BY 1")]


async def claim_start(conn: asyncpg.Connection, version: str | None, *, now: Any = T0,
                      deployment: str = DEPLOYMENT) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_and_start(
               deployment_ref => $1, worker_id => 'w', batch_size => 10, lease_seconds => $2,
               code_version => $3, now_override => $4)""", deployment, LEASE, version, now)
    return [r for r in rows if r["run_id"] is not None]


class TestAdmitAndOwnRecordsTheVersion:
    async def test_an_owned_admission_records_the_callers_version(self, conn):
        admitted = await admit(conn, worker_id=OWNER, code_version=V1)

        assert admitted["outcome"] == "admitted"
        assert admitted["lease_generation"] == 1
        assert await version_of(conn, admitted["run_id"]) == V1
        assert await versions(conn) == [V1]

    async def test_start_run_keeps_the_admissions_version_and_records_its_own_first(self, conn):
        kept = await admit(conn, "t1", worker_id=OWNER, code_version=V1)
        assert await fenced(conn, "start_run", kept["run_id"], OWNER, 1)
        assert await version_of(conn, kept["run_id"]) == V1

        fresh = await admit(conn, "t2", worker_id=OWNER)
        assert await fenced(conn, "start_run", fresh["run_id"], OWNER, 1, code_version=V2)
        assert await version_of(conn, fresh["run_id"]) == V2

    async def test_a_started_run_keeps_its_version_whatever_start_run_says(self, conn):
        admitted = await admit(conn, worker_id=OWNER, code_version=V1)
        assert await fenced(conn, "start_run", admitted["run_id"], OWNER, 1, code_version=V1)

        # idempotent for the holder of a running run: the version stays
        assert await fenced(conn, "start_run", admitted["run_id"], OWNER, 1, code_version=V2)
        assert await version_of(conn, admitted["run_id"]) == V1

    async def test_an_unowned_admission_records_no_version(self, conn):
        admitted = await admit(conn, code_version=V1)

        assert admitted["outcome"] == "admitted"
        assert admitted["lease_generation"] is None
        assert (await run_row(conn, admitted["run_id"]))["code_version_id"] is None
        assert await versions(conn) == []

    async def test_a_stale_start_records_nothing(self, conn):
        admitted = await admit(conn, worker_id=OWNER)

        assert not await fenced(conn, "start_run", admitted["run_id"], "intruder", 1,
                                code_version=V2)
        assert not await fenced(conn, "start_run", admitted["run_id"], OWNER, 1,
                                code_version=V2, now=at(10_000))
        assert (await run_row(conn, admitted["run_id"]))["code_version_id"] is None
        assert await versions(conn) == []

    @pytest.mark.parametrize("version", ["", "bad version", "x" * 129, "-lead"])
    async def test_a_bad_version_is_refused_and_changes_nothing(self, conn, version):
        admitted = await admit(conn, "t0", worker_id=OWNER)
        before = await conn.fetchval("SELECT count(*) FROM zeroth.runs")
        for call in (admit(conn, "t9", worker_id=OWNER, code_version=version),
                     fenced(conn, "start_run", admitted["run_id"], OWNER, 1,
                            code_version=version)):
            with pytest.raises(asyncpg.PostgresError) as info:
                async with conn.transaction():
                    await call
            assert info.value.sqlstate == "ZP008"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == before
        assert (await run_row(conn, admitted["run_id"]))["status"] == "pending"
        assert await versions(conn) == []


class TestScopePicksApplyTheVersionFilter:
    async def test_a_scope_whose_due_runs_are_all_pinned_elsewhere_is_no_candidate(self, conn):
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
        await conn.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => $1, "
                           "version_policy => 'same')", DEPLOYMENT)
        for tenant in ("a", "b", "c"):  # a run per scope, started by V1, handed back (pinned)
            run_id = await enqueue(conn, tenant_id=tenant)
            (row,) = await conn.fetch(
                """SELECT run_id, lease_generation FROM zeroth_test.claim_and_start(
                       deployment_ref => $1, worker_id => 'w', tenant_id => $2,
                       lease_seconds => $3, code_version => $4, now_override => $5)
                   WHERE run_id IS NOT NULL""", DEPLOYMENT, tenant, LEASE, V1, T0)
            assert row["run_id"] == run_id
            assert await conn.fetchval(
                """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => 'w',
                       generation => $2, tenant_id => $3, now_override => $4)""",
                run_id, row["lease_generation"], tenant, T0)
        await conn.execute("SET track_functions = 'all'")
        async with conn.transaction():
            rows = await conn.fetch(
                """SELECT run_id FROM zeroth_test.claim_and_start_scopes(
                       deployment_refs => ARRAY[$1], worker_id => 'v2-worker', batch_size => 3,
                       lease_seconds => $2, code_version => $3, now_override => $4)""",
                DEPLOYMENT, LEASE, V2, at(1))
            picks = await conn.fetchval(
                """SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
                    WHERE schemaname = 'zeroth' AND funcname = '_claim_in_scope'""")

        assert rows == []
        assert picks == 0  # no place drawn for a scope it cannot serve

    async def test_the_scopes_it_can_serve_are_still_drawn(self, conn):
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
        await conn.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => $1, "
                           "version_policy => 'same')", DEPLOYMENT)
        fresh = await enqueue(conn, tenant_id="a")

        rows = await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_and_start_scopes(
                   deployment_refs => ARRAY[$1], worker_id => 'v2-worker', batch_size => 3,
                   lease_seconds => $2, code_version => $3, now_override => $4)
               WHERE run_id IS NOT NULL""", DEPLOYMENT, LEASE, V2, at(1))

        assert [r["run_id"] for r in rows] == [fresh]


PRUNE = """SELECT zeroth_test.prune_runs(older_than => $1::text::interval, batch_size => $2,
               tenant_id => $3, now_override => $4)"""


class TestPruneCodeVersions:
    async def finished_run(self, conn: asyncpg.Connection, version: str) -> UUID:
        run_id = await enqueue(conn)
        (row,) = await claim_start(conn, version)
        assert row["run_id"] == run_id
        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => 'w', generation => $2,
                   output => '{}', now_override => $3)""", run_id, row["lease_generation"], T0)
        return run_id

    async def test_a_version_no_run_references_goes_with_its_last_run(self, conn):
        await self.finished_run(conn, V1)
        await enqueue(conn)
        (active,) = await claim_start(conn, V2)
        assert await versions(conn) == [V1, V2]

        # a day later: the finished run of V1 goes, and V1 with it; V2 is referenced
        deleted = await conn.fetchval(PRUNE, "1 hour", 1000, None, at(86400))

        assert deleted == 2  # the run and the version
        assert await versions(conn) == [V2]
        assert await version_of(conn, active["run_id"]) == V2
        assert await conn.fetchval(PRUNE, "1 hour", 1000, None, at(86400)) == 0

    async def test_a_version_referenced_by_a_finished_run_is_kept(self, conn):
        await self.finished_run(conn, V1)

        # the run is younger than the cutoff: it stays, and so does its version
        assert await conn.fetchval(PRUNE, "2 days", 1000, None, at(86400)) == 0
        assert await versions(conn) == [V1]

    async def test_a_version_first_seen_after_the_cutoff_is_kept(self, conn):
        await conn.execute("""INSERT INTO zeroth.code_versions (version_id, code_version,
                                  first_seen_at)
                              VALUES (1, 'orphan-old', $1), (2, 'orphan-new', $2)""",
                           T0, at(86400))

        assert await conn.fetchval(PRUNE, "1 hour", 1000, None, at(86400)) == 1
        assert await versions(conn) == ["orphan-new"]

    async def test_a_tenants_prune_leaves_the_global_table_alone(self, conn):
        await conn.execute("""INSERT INTO zeroth.code_versions (version_id, code_version,
                                  first_seen_at) VALUES (1, 'orphan-old', $1)""", T0)

        assert await conn.fetchval(PRUNE, "1 hour", 1000, "acme", at(86400)) == 0
        assert await versions(conn) == ["orphan-old"]

    async def test_a_batch_deletes_at_most_a_hundred_versions(self, conn):
        await conn.execute("""INSERT INTO zeroth.code_versions (version_id, code_version,
                                  first_seen_at)
                              SELECT g, 'v' || g, $1 FROM generate_series(1, 130) g""", T0)

        assert await conn.fetchval(PRUNE, "1 hour", 1000, None, at(86400)) == 100
        assert await conn.fetchval(PRUNE, "1 hour", 5, None, at(86400)) == 5
        assert await conn.fetchval("SELECT count(*) FROM zeroth.code_versions") == 25

    async def test_duplicate_rows_of_one_version_go_together(self, conn):
        await conn.execute("""INSERT INTO zeroth.code_versions (version_id, code_version,
                                  first_seen_at) VALUES (7, 'twice', $1), (7, 'twice', $1)""", T0)

        assert await conn.fetchval(PRUNE, "1 hour", 1000, None, at(86400)) == 2
        assert await versions(conn) == []


class TestARestartRecordsNoStrayVersion:
    async def test_start_run_of_a_run_started_before_writes_no_version_it_does_not_record(
            self, conn):
        """A retried run keeps the version that started it; its next start_run with another
        version must not write that version's text either (a row no run references: a worker
        could add one per claim)."""
        kept = await admit(conn, worker_id=OWNER, code_version=V1)
        run_id = kept["run_id"]
        assert await fenced(conn, "start_run", run_id, OWNER, 1)
        assert await fenced(conn, "fail_run", run_id, OWNER, 1, error='{"e": 1}',
                            retryable=True, retry_base_seconds=0,
                            retry_max_seconds=0) == "retry_scheduled"
        later = at(5)
        (claimed,) = [r for r in await conn.fetch(
            """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(
                   deployment_ref => $1, worker_id => 'w2', batch_size => 10,
                   lease_seconds => $2, now_override => $3)""", DEPLOYMENT, LEASE, later)
            if r["run_id"] == run_id]

        assert await fenced(conn, "start_run", run_id, "w2", claimed["lease_generation"],
                            now=later, code_version=V2)
        assert await version_of(conn, run_id) == V1
        assert await versions(conn) == [V1]
