"""zeroth.prune_runs: finished runs older than the cut-off → deleted, one batch per call.

Only completed, failed (dead letters included) and cancelled runs whose finished_at is before
now - older_than go, oldest first, at most batch_size per call; checkpoints follow by ON DELETE
CASCADE. tenant_id NULL prunes every tenant; a tenant names exactly (tenant, workspace). The
doomed rows are locked FOR UPDATE SKIP LOCKED, so a prune never waits on a worker or an operator:
tests/races/test_prune_races.py plays those sessions out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from helpers import T0, at, make_run, run_row

PRUNE = """SELECT zeroth_test.prune_runs(older_than => $1, batch_size => $2, tenant_id => $3,
               workspace_id => $4, now_override => $5)"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => '{"step": 1}', now_override => $4)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  now_override => $4)"""
FAIL_RETRYABLE = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                        retryable => true, now_override => $4)"""
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"
ALL_RUNS = "SELECT r.run_id FROM zeroth.runs r"

DAY = timedelta(days=1)
# "Now" for the prunes: ten days after the factories' T0, so a run finished at T0 is 10 days old.
NOW = at(10 * 86400)


async def prune(conn: asyncpg.Connection, older_than: Any = DAY, *, batch_size: Any = 1000,
                tenant_id: str | None = None, workspace_id: str | None = None,
                now: Any = NOW) -> int:
    return await conn.fetchval(  # type: ignore[no-any-return]
        PRUNE, older_than, batch_size, tenant_id, workspace_id, now)


async def run_ids(conn: asyncpg.Connection) -> set[Any]:
    return {row["run_id"] for row in await conn.fetch(ALL_RUNS)}


async def finished_run(conn: asyncpg.Connection, status: str = "completed", *,
                       finished: Any = None, **kwargs: Any) -> Any:
    """A run driven to a terminal status; it finishes at ``finished`` (default T0)."""
    return (await make_run(conn, status, now=finished or T0, **kwargs)).run_id


async def snapshot(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    runs = await conn.fetch("SELECT * FROM zeroth.runs r ORDER BY r.run_id")
    checkpoints = await conn.fetch(
        "SELECT * FROM zeroth.checkpoints k ORDER BY k.checkpoint_id")
    return [dict(r) for r in runs], [dict(k) for k in checkpoints]


class TestPruneDeletesOldFinishedRuns:
    @pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
    async def test_a_finished_run_older_than_the_cut_off_is_deleted(self, conn, status):
        run_id = await finished_run(conn, status)

        assert await prune(conn) == 1

        assert await run_ids(conn) == set()
        assert await run_row(conn, run_id) is None

    async def test_a_dead_lettered_run_is_a_failed_run_and_is_deleted(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)
        assert await conn.fetchval(FAIL_RETRYABLE, *lease_args(lease), at(1)) == "dead_lettered"

        assert await prune(conn) == 1

        assert await conn.fetchval("SELECT count(*) FROM zeroth.dead_letters") == 0

    async def test_a_run_finished_after_the_cut_off_is_kept(self, conn):
        young = await finished_run(conn, finished=NOW - DAY + timedelta(microseconds=1))
        boundary = await finished_run(conn, finished=NOW - DAY)
        old = await finished_run(conn, finished=NOW - DAY - timedelta(microseconds=1))

        assert await prune(conn) == 1

        assert await run_ids(conn) == {young, boundary}
        assert await run_row(conn, old) is None

    @pytest.mark.parametrize("status", ["pending", "claimed", "running", "waiting"])
    async def test_an_unfinished_run_is_never_deleted_however_old(self, conn, status):
        # Created at T0 (ten days before NOW); running and claimed leases have long expired.
        lease = await make_run(conn, status)
        before = await snapshot(conn)

        assert await prune(conn, timedelta(0)) == 0

        assert await snapshot(conn) == before
        assert (await run_row(conn, lease.run_id))["status"] == (
            "pending" if status == "claimed" else status)

    async def test_a_run_retried_after_a_failure_is_not_finished_and_is_kept(self, conn):
        lease = await make_run(conn, "running", max_attempts=3)
        assert await conn.fetchval(FAIL_RETRYABLE, *lease_args(lease), at(1)) == (
            "retry_scheduled")

        assert await prune(conn, timedelta(0)) == 0

        assert await run_ids(conn) == {lease.run_id}

    async def test_a_redriven_run_is_pending_again_and_is_kept(self, conn):
        run_id = await finished_run(conn, "failed")
        assert await conn.fetchval(REDRIVE, run_id, at(2)) is True

        assert await prune(conn, timedelta(0)) == 0

        assert await run_ids(conn) == {run_id}

    async def test_checkpoints_of_a_pruned_run_go_with_it_and_others_stay(self, conn):
        doomed = await make_run(conn, "running")
        kept = await make_run(conn, "running")
        for lease in (doomed, kept):
            assert await conn.fetchval(SAVE_CHECKPOINT, *lease_args(lease), at(1)) is not None
        assert await conn.fetchval(COMPLETE, *lease_args(doomed), at(2)) is True

        assert await prune(conn) == 1

        owners = await conn.fetch("SELECT k.run_id FROM zeroth.checkpoints k")
        assert [row["run_id"] for row in owners] == [kept.run_id]

    async def test_older_than_zero_prunes_every_finished_run(self, conn):
        await finished_run(conn, finished=NOW)

        assert await prune(conn, timedelta(0), now=NOW + timedelta(microseconds=1)) == 1

    async def test_an_empty_table_prunes_nothing(self, conn):
        assert await prune(conn) == 0


class TestPruneBatches:
    async def test_each_call_deletes_one_batch_oldest_first_until_zero(self, conn):
        ids = [await finished_run(conn, finished=at(seconds)) for seconds in (50, 10, 40, 20, 30)]
        by_age = [ids[1], ids[3], ids[4], ids[2], ids[0]]

        counts, left = [], []
        while (count := await prune(conn, batch_size=2)) > 0:
            counts.append(count)
            left.append(await run_ids(conn))

        assert counts == [2, 2, 1]
        assert left == [set(by_age[2:]), set(by_age[4:]), set()]

    async def test_batch_size_defaults_to_1000(self, conn):
        await finished_run(conn)

        assert await conn.fetchval(
            "SELECT zeroth_test.prune_runs(older_than => '1 day', now_override => $1)", NOW) == 1


class TestPruneScope:
    SCOPES = ((None, None), ("acme", None), ("acme", "ws-1"), ("other", None))

    async def _one_run_per_scope(self, conn):
        return {scope: await finished_run(conn, tenant_id=scope[0], workspace_id=scope[1])
                for scope in self.SCOPES}

    async def test_no_tenant_prunes_every_tenant_and_workspace(self, conn):
        await self._one_run_per_scope(conn)

        assert await prune(conn) == len(self.SCOPES)

        assert await run_ids(conn) == set()

    async def test_a_tenant_alone_prunes_only_its_null_workspace(self, conn):
        runs = await self._one_run_per_scope(conn)

        assert await prune(conn, tenant_id="acme") == 1

        assert await run_ids(conn) == set(runs.values()) - {runs["acme", None]}

    async def test_a_tenant_and_workspace_prune_only_that_workspace(self, conn):
        runs = await self._one_run_per_scope(conn)

        assert await prune(conn, tenant_id="acme", workspace_id="ws-1") == 1

        assert await run_ids(conn) == set(runs.values()) - {runs["acme", "ws-1"]}

    async def test_the_default_tenant_is_a_tenant_like_any_other(self, conn):
        runs = await self._one_run_per_scope(conn)

        assert await prune(conn, tenant_id="default") == 1

        assert await run_ids(conn) == set(runs.values()) - {runs[None, None]}

    async def test_a_workspace_without_a_tenant_raises_zp006_and_changes_nothing(self, conn):
        await self._one_run_per_scope(conn)
        before = await snapshot(conn)

        await assert_raises(conn, "ZP006", workspace_id="ws-1")

        assert await snapshot(conn) == before


class TestPruneRefusals:
    @pytest.mark.parametrize(("name", "value"), [
        ("older_than", None),
        ("older_than", timedelta(seconds=-1)),
        ("older_than", timedelta(days=3_000_000)),  # now - older_than: before 4713 BC
        ("batch_size", None),
        ("batch_size", 0),
        ("batch_size", 10001),
        ("tenant_id", ""),
        ("tenant_id", "t" * 201),
    ])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, name, value):
        await finished_run(conn)
        before = await snapshot(conn)

        await assert_raises(conn, "ZP008", **{name: value})

        assert await snapshot(conn) == before

    async def test_an_infinite_older_than_raises_zp008(self, conn):
        if conn.get_server_version().major < 17:
            pytest.skip("infinite intervals exist from PostgreSQL 17 on")
        await assert_raises(conn, "ZP008", older_than="infinity")

    async def test_an_empty_workspace_raises_zp008(self, conn):
        await assert_raises(conn, "ZP008", tenant_id="acme", workspace_id="")


def lease_args(lease: Any) -> tuple[Any, str, int]:
    return lease.run_id, lease.worker_id, lease.generation


async def assert_raises(conn: asyncpg.Connection, sqlstate: str, **arguments: Any) -> None:
    values = {"older_than": DAY, "batch_size": 1000, "tenant_id": None, "workspace_id": None,
              **arguments}
    older_than = values.pop("older_than")
    sql = PRUNE.replace("older_than => $1", "older_than => $1::text::interval") \
        if isinstance(older_than, str) else PRUNE
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await conn.fetchval(sql, older_than, values["batch_size"], values["tenant_id"],
                                values["workspace_id"], NOW)
    assert info.value.sqlstate == sqlstate


class TestThreadLockRows:
    """zeroth.thread_locks holds one row per thread that was admitted to (0009); prune_runs deletes
    the row once the thread has no run left, so the table does not grow with the history."""

    LOCKS = "SELECT thread_id FROM zeroth.thread_locks ORDER BY 1"

    async def test_the_row_goes_with_the_threads_last_run_and_stays_while_one_is_left(self, conn):
        kept_old = await finished_run(conn, "completed", thread_id="kept")
        await finished_run(conn, "cancelled", thread_id="gone")
        await make_run(conn, "pending", thread_id="kept", now=NOW)  # a newer run of "kept"
        assert [r["thread_id"] for r in await conn.fetch(self.LOCKS)] == ["gone", "kept"]

        assert await prune(conn) == 2

        assert kept_old not in await run_ids(conn)
        assert [r["thread_id"] for r in await conn.fetch(self.LOCKS)] == ["kept"]


class TestEvents:
    """zeroth.events is keyed by scope and name, not by run, so its rows outlive the runs that
    waited on them; prune_runs deletes the rows older than its cutoff that no run waits on, at
    most batch_size per call (per-run names must not grow the table for ever)."""

    WAIT = """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
                  generation => $3, step_key => 'k', name => $4, tenant_id => $5,
                  now_override => $6)"""
    EMIT = """SELECT emitted FROM zeroth_test.emit_event(name => $1, payload => '{}',
                  tenant_id => $2, now_override => $3)"""
    CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, tenant_id => $2, now_override => $3)"
    EVENTS = "SELECT e.tenant_id, e.name FROM zeroth.events e ORDER BY 1, 2"

    async def waiting_run(self, conn: asyncpg.Connection, name: str, *,
                          tenant_id: str | None = None) -> Any:
        lease = await make_run(conn, "running", tenant_id=tenant_id)
        assert await conn.fetchval(self.WAIT, lease.run_id, lease.worker_id, lease.generation,
                                   name, tenant_id, T0) == "waiting"
        return lease.run_id

    async def events(self, conn: asyncpg.Connection) -> list[tuple[str, str]]:
        return [tuple(r) for r in await conn.fetch(self.EVENTS)]

    async def test_runs_waiting_on_their_own_names_leave_no_event_once_cancelled_and_pruned(
            self, conn):
        for i in range(50):
            run_id = await self.waiting_run(conn, f"approval:{i}")
            assert await conn.fetchval(self.CANCEL, run_id, None, T0) == "cancelled"
        assert len(await self.events(conn)) == 50
        assert await prune(conn) == 100  # 50 runs and their 50 event rows
        assert await run_ids(conn) == set()
        assert await self.events(conn) == []
        assert await prune(conn) == 0

    async def test_an_awaited_or_recent_event_stays_and_an_old_unawaited_one_goes(self, conn):
        await self.waiting_run(conn, "still-awaited")  # waiting since T0, ten days ago
        assert await conn.fetchval(self.EMIT, "old-emitted", None, T0) is True
        assert await conn.fetchval(self.EMIT, "recent", None, NOW - DAY / 2) is True
        # A channel a cancelled run waited on, and whose run is not old enough to prune.
        young = await self.waiting_run(conn, "young-run")
        assert await conn.fetchval(self.CANCEL, young, None, NOW - DAY / 2) == "cancelled"

        assert await prune(conn) == 1

        assert await self.events(conn) == [("default", "recent"), ("default", "still-awaited"),
                                           ("default", "young-run")]

    async def test_an_emit_after_the_prune_is_a_new_event_that_wakes_a_later_wait(self, conn):
        assert await conn.fetchval(self.EMIT, "e", None, T0) is True
        assert await prune(conn) == 1
        run_id = await self.waiting_run(conn, "e")  # the old emit is forgotten: it waits
        assert await conn.fetchval(self.EMIT, "e", None, NOW) is True
        assert (await run_row(conn, run_id))["status"] == "pending"

    async def test_at_most_batch_size_events_per_call_and_the_loop_ends_with_none(self, conn):
        for i in range(5):
            assert await conn.fetchval(self.EMIT, f"e{i}", None, T0 + i * DAY / 10) is True
        counts = []
        while count := await prune(conn, batch_size=2):
            counts.append(count)
        assert counts == [2, 2, 1]
        assert await self.events(conn) == []

    async def test_a_tenants_prune_deletes_only_its_own_events(self, conn):
        assert await conn.fetchval(self.EMIT, "e", "acme", T0) is True
        assert await conn.fetchval(self.EMIT, "e", "globex", T0) is True
        assert await prune(conn, tenant_id="acme") == 1
        assert await self.events(conn) == [("globex", "e")]

    async def test_one_long_awaited_event_does_not_block_the_others(self, conn):
        # The awaited rows are skipped, not selected and kept: a batch of 1 still makes progress.
        await self.waiting_run(conn, "awaited-a")
        await self.waiting_run(conn, "awaited-b")
        assert await conn.fetchval(self.EMIT, "gone", None, T0 + DAY) is True
        assert await prune(conn, batch_size=1) == 1
        assert await self.events(conn) == [("default", "awaited-a"), ("default", "awaited-b")]


SET_DEFAULTS = """SELECT version FROM zeroth_test.set_deployment_defaults(deployment_ref => $1,
    max_attempts => $2, now_override => $3)"""


async def changes(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    rows = await conn.fetch("SELECT deployment_ref, version FROM zeroth.deployment_changes "
                            "ORDER BY deployment_ref, version")
    return [(r["deployment_ref"], r["version"]) for r in rows]


class TestDeploymentChanges:
    """issue 31: the registry's audit (zeroth.deployment_changes, one row per change of a
    deployment's defaults) is pruned with the runs: the changes older than the cutoff go, each
    deployment's latest change stays, and the versions continue after it."""

    async def test_old_changes_go_and_each_deployments_latest_stays(self, conn):
        for ref, attempts, when in (("a", 2, T0), ("a", 3, at(3600)), ("a", 4, at(7200)),
                                    ("b", 2, T0),
                                    ("c", 2, T0), ("c", 3, NOW - timedelta(hours=1))):
            await conn.fetchval(SET_DEFAULTS, ref, attempts, when)
        assert await prune(conn) == 3  # a 1, a 2, c 1
        assert await changes(conn) == [("a", 3), ("b", 1), ("c", 2)]
        assert await prune(conn) == 0
        # The version numbering continues after the latest change, even once a DBA deleted the
        # deployment's row.
        await conn.execute("DELETE FROM zeroth.deployments WHERE deployment_ref = 'a'")
        assert await conn.fetchval(SET_DEFAULTS, "a", 9, NOW) == 4

    async def test_a_recent_change_stays_whatever_it_follows(self, conn):
        await conn.fetchval(SET_DEFAULTS, "a", 2, NOW - timedelta(hours=2))
        await conn.fetchval(SET_DEFAULTS, "a", 3, NOW - timedelta(hours=1))
        assert await prune(conn) == 0
        assert await changes(conn) == [("a", 1), ("a", 2)]

    async def test_a_prune_of_one_scope_leaves_the_global_audit_alone(self, conn):
        await conn.fetchval(SET_DEFAULTS, "a", 2, T0)
        await conn.fetchval(SET_DEFAULTS, "a", 3, at(60))
        assert await prune(conn, tenant_id="default") == 0
        assert await changes(conn) == [("a", 1), ("a", 2)]

    async def test_at_most_batch_size_changes_a_call_oldest_first(self, conn):
        for i in range(6):
            await conn.fetchval(SET_DEFAULTS, "a", 2 + i, at(60 * i))
        assert await prune(conn, batch_size=2) == 2
        assert await changes(conn) == [("a", 3), ("a", 4), ("a", 5), ("a", 6)]
        assert await prune(conn, batch_size=2) == 2
        assert await prune(conn, batch_size=2) == 1
        assert await prune(conn, batch_size=2) == 0
        assert await changes(conn) == [("a", 6)]

    async def test_a_generic_plan_over_a_table_with_statistics_deletes_at_most_batch_size(
            self, conn):
        # A long-lived session (a pooled connection) runs prune_runs on a generic plan; with
        # statistics of a table that is mostly dead rows, one DELETE ... IN (SELECT ... LIMIT
        # FOR UPDATE SKIP LOCKED) re-ran its subquery per row and went on past batch_size.
        aborted = conn.transaction()
        await aborted.start()
        await conn.execute(
            "INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at,"
            " changed_by, via, new_values) SELECT 'gone-' || g, 1, $1, 'test',"
            " 'register_deployment', '{}' FROM generate_series(1, 2000) g", T0)
        await aborted.rollback()
        await conn.execute("ANALYZE zeroth.deployment_changes")
        for i in range(6):
            await conn.fetchval(SET_DEFAULTS, "a", 2 + i, at(60 * i))
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")

        assert await prune(conn, batch_size=2) == 2
        assert await changes(conn) == [("a", 3), ("a", 4), ("a", 5), ("a", 6)]
        assert await prune(conn, batch_size=2) == 2
        assert await changes(conn) == [("a", 5), ("a", 6)]
