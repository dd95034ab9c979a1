"""Scoped lease reads: current_generation, current_holder, get_recovery_checkpoint_id."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from helpers import WORKER, at, make_run

READS = ("current_generation", "current_holder", "get_recovery_checkpoint_id")


async def read(conn: asyncpg.Connection, function: str, run_id: Any, *,
               tenant_id: str | None = None, workspace_id: str | None = None) -> Any:
    assert function in READS
    return await conn.fetchval(
        f"""SELECT zeroth.{function}(run_id => $1, tenant_id => $2, workspace_id => $3)""",
        run_id, tenant_id, workspace_id)


async def claim_orphans(conn: asyncpg.Connection, worker_id: str, now: Any, *,
                        tenant_id: str | None = None,
                        workspace_id: str | None = None) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT run_id, lease_generation, recovery_checkpoint_id FROM zeroth_test.claim_orphaned(
               deployment_ref => 'deploy-a', worker_id => $1, tenant_id => $2,
               workspace_id => $3, now_override => $4)""", worker_id, tenant_id, workspace_id, now)


async def save_checkpoint(conn: asyncpg.Connection, run_id: Any, worker_id: str, generation: int,
                          *, tenant_id: str | None = None,
                          workspace_id: str | None = None) -> Any:
    return await conn.fetchval(
        """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
               data => '{"step": 1}', tenant_id => $4, workspace_id => $5, now_override => $6)""",
        run_id, worker_id, generation, tenant_id, workspace_id, at(1))


class TestCurrentGeneration:
    async def test_zero_before_the_first_claim(self, conn):
        lease = await make_run(conn, "pending")
        assert await read(conn, "current_generation", lease.run_id) == 0

    async def test_follows_claims_and_takeovers(self, conn):
        lease = await make_run(conn, "running")
        assert await read(conn, "current_generation", lease.run_id) == 1
        await claim_orphans(conn, "worker-b", at(120))
        assert await read(conn, "current_generation", lease.run_id) == 2

    async def test_is_kept_after_the_lease_ends(self, conn):
        lease = await make_run(conn, "completed")
        assert await read(conn, "current_generation", lease.run_id) == 1

    async def test_null_for_an_unknown_run(self, conn):
        assert await read(conn, "current_generation", uuid4()) is None

    async def test_null_run_id_reads_null(self, conn):
        await make_run(conn, "running")
        assert await read(conn, "current_generation", None) is None


class TestCurrentHolder:
    async def test_null_before_the_first_claim(self, conn):
        lease = await make_run(conn, "pending")
        assert await read(conn, "current_holder", lease.run_id) is None

    async def test_the_claiming_worker_holds_the_run(self, conn):
        lease = await make_run(conn, "claimed")
        assert await read(conn, "current_holder", lease.run_id) == WORKER

    async def test_expired_lease_keeps_its_holder_until_taken_over(self, conn):
        lease = await make_run(conn, "running")
        # Reads take no clock: an expired, untaken lease still names its holder.
        assert await read(conn, "current_holder", lease.run_id) == WORKER
        await claim_orphans(conn, "worker-b", at(120))
        assert await read(conn, "current_holder", lease.run_id) == "worker-b"

    @pytest.mark.parametrize("status", ["waiting", "completed", "failed", "cancelled"])
    async def test_null_once_the_lease_is_given_up(self, conn, status):
        lease = await make_run(conn, status)
        assert await read(conn, "current_holder", lease.run_id) is None

    async def test_null_for_an_unknown_run(self, conn):
        assert await read(conn, "current_holder", uuid4()) is None


class TestRecoveryCheckpointId:
    async def test_null_when_the_run_has_no_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        assert await read(conn, "get_recovery_checkpoint_id", lease.run_id) is None
        await claim_orphans(conn, "worker-b", at(120))
        assert await read(conn, "get_recovery_checkpoint_id", lease.run_id) is None

    async def test_null_before_a_takeover_even_with_checkpoints(self, conn):
        lease = await make_run(conn, "running")
        assert await save_checkpoint(conn, lease.run_id, lease.worker_id, lease.generation)
        assert await read(conn, "get_recovery_checkpoint_id", lease.run_id) is None

    async def test_set_by_takeover_and_cleared_when_the_run_completes(self, conn):
        lease = await make_run(conn, "running")
        saved = await save_checkpoint(conn, lease.run_id, lease.worker_id, lease.generation)
        claimed = await claim_orphans(conn, "worker-b", at(120))
        assert claimed["recovery_checkpoint_id"] == saved
        assert await read(conn, "get_recovery_checkpoint_id", lease.run_id) == saved
        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => 'worker-b',
                   generation => $2,
                   now_override => $3)""", lease.run_id, claimed["lease_generation"], at(121))
        assert await read(conn, "get_recovery_checkpoint_id", lease.run_id) is None

    async def test_null_for_an_unknown_run(self, conn):
        assert await read(conn, "get_recovery_checkpoint_id", uuid4()) is None


class TestScopeQualified:
    """The reads see a run only through its exact (tenant, workspace) scope."""

    @pytest.fixture
    async def scoped_run(self, conn):
        lease = await make_run(conn, "running", tenant_id="t1", workspace_id="w1")
        saved = await save_checkpoint(conn, lease.run_id, lease.worker_id, lease.generation,
                                      tenant_id="t1", workspace_id="w1")
        await claim_orphans(conn, "worker-b", at(120), tenant_id="t1", workspace_id="w1")
        return lease.run_id, saved

    async def test_exact_scope_sees_the_run(self, conn, scoped_run):
        run_id, saved = scoped_run
        scope = {"tenant_id": "t1", "workspace_id": "w1"}
        assert await read(conn, "current_generation", run_id, **scope) == 2
        assert await read(conn, "current_holder", run_id, **scope) == "worker-b"
        assert await read(conn, "get_recovery_checkpoint_id", run_id, **scope) == saved

    @pytest.mark.parametrize(
        "scope",
        [
            pytest.param({}, id="omitted"),
            pytest.param({"tenant_id": "t1"}, id="tenant-only"),
            pytest.param({"workspace_id": "w1"}, id="workspace-without-tenant"),
            pytest.param({"tenant_id": "default", "workspace_id": "w1"}, id="default-tenant"),
            pytest.param({"tenant_id": "t2", "workspace_id": "w1"}, id="other-tenant"),
            pytest.param({"tenant_id": "t1", "workspace_id": "w2"}, id="other-workspace"),
            pytest.param({"tenant_id": "t1", "workspace_id": "W1"}, id="case-differs"),
        ])
    @pytest.mark.parametrize("function", READS)
    async def test_any_other_scope_reads_null(self, conn, scoped_run, scope, function):
        run_id, _ = scoped_run
        assert await read(conn, function, run_id, **scope) is None
