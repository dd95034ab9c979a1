"""Scope isolation (seed-spec §4 and §10 test_lease_scope_isolation): a duplicate run_id in another
tenant or workspace is never touched, a workspace without a tenant matches nothing, and an omitted
or partial scope cannot reach a run in a named workspace."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, clock_schema, make_run, run_row

NOW = at(30)  # inside the factories' lease (T0 .. at(60))
LATER = at(120)  # every factory lease has expired


@dataclass(frozen=True)
class Scope:
    tenant_id: str | None
    workspace_id: str | None

    @property
    def kwargs(self) -> dict[str, str | None]:
        return {"tenant_id": self.tenant_id, "workspace_id": self.workspace_id}

    @property
    def row_kwargs(self) -> dict[str, str | None]:
        return {"tenant_id": self.tenant_id or "default", "workspace_id": self.workspace_id}


PAIRS = [
    pytest.param((Scope("t1", None), Scope("t2", None)), id="cross-tenant"),
    pytest.param((Scope("t1", "w1"), Scope("t1", "w2")), id="cross-workspace"),
    pytest.param((Scope("t1", None), Scope("t1", "w1")), id="null-vs-named-workspace"),
    pytest.param((Scope("t1", "w1"), Scope("t1", None)), id="named-vs-null-workspace"),
    pytest.param((Scope(None, None), Scope("t2", None)), id="default-vs-other-tenant"),
    pytest.param((Scope("t1", "w1"), Scope("t2", "w1")), id="same-workspace-other-tenant"),
]


async def call(conn: asyncpg.Connection, function: str, scope: Scope, **kwargs: Any) -> Any:
    """zeroth.<function>(**kwargs, tenant_id, workspace_id) in named notation."""
    kwargs = {**kwargs, **scope.kwargs}
    args = ", ".join(
        f"{name} => ${i + 1}{'::text::jsonb' if name in ('columns', 'data') else ''}"
        for i, name in enumerate(kwargs))
    values = [json.dumps(v) if name in ("columns", "data") else v for name, v in kwargs.items()]
    return await conn.fetchval(f"SELECT {clock_schema(kwargs)}.{function}({args})", *values)


async def fenced(conn: asyncpg.Connection, function: str, scope: Scope, run_id: UUID,
                 generation: int = 1, now: Any = NOW, **kwargs: Any) -> Any:
    return await call(conn, function, scope, run_id=run_id, worker_id=WORKER,
                      generation=generation, now_override=now, **kwargs)


async def claim_pending(conn: asyncpg.Connection, scope: Scope, now: Any = NOW) -> list[Any]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
               tenant_id => $3, workspace_id => $4, batch_size => 100, now_override => $5)""",
        DEPLOYMENT, WORKER, scope.tenant_id, scope.workspace_id, now)
    return [row["run_id"] for row in rows if row["run_id"] is not None]


async def claim_orphaned(conn: asyncpg.Connection, scope: Scope,
                         now: Any = LATER) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT run_id, lease_generation, recovery_checkpoint_id, checkpoint_data
             FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => 'worker-b',
                  tenant_id => $2, workspace_id => $3, now_override => $4)""",
        DEPLOYMENT, scope.tenant_id, scope.workspace_id, now)
    return [row for row in rows if row["run_id"] is not None]


async def row_of(conn: asyncpg.Connection, run_id: UUID, scope: Scope) -> dict[str, Any]:
    row = await run_row(conn, run_id, **scope.row_kwargs)  # type: ignore[arg-type]
    assert row is not None, f"no run {run_id} in {scope}"
    return dict(row)


async def snapshot(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    tables = {
        "runs": "SELECT * FROM zeroth.runs r ORDER BY r.tenant_id, r.workspace_key, r.run_id",
        "slots": """SELECT * FROM zeroth.admission_slots s
                     ORDER BY s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no""",
        "checkpoints": "SELECT * FROM zeroth.checkpoints k ORDER BY k.checkpoint_id",
    }
    return {name: [dict(row) for row in await conn.fetch(sql)] for name, sql in tables.items()}


async def raises(conn: asyncpg.Connection, sqlstate: str, function: str, scope: Scope,
                 **kwargs: Any) -> None:
    with pytest.raises(asyncpg.PostgresError) as caught:
        async with conn.transaction():
            await call(conn, function, scope, **kwargs)
    assert caught.value.sqlstate == sqlstate


class TestDuplicateRunIdIsScopeIsolated:
    """The same run_id exists in scopes `mine` and `twin`; calls in `mine` never touch `twin`.
    Both leases are held by the same worker with the same generation, so only scope tells them
    apart."""

    @pytest.fixture(params=PAIRS)
    def scopes(self, request: pytest.FixtureRequest) -> tuple[Scope, Scope]:
        return request.param  # type: ignore[no-any-return]

    async def _twins(self, conn: asyncpg.Connection, scopes: tuple[Scope, Scope],
                     status: str) -> UUID:
        run_id = uuid4()
        for scope in scopes:
            lease = await make_run(conn, status, run_id=run_id, **scope.kwargs)
            assert lease.run_id == run_id
        return run_id

    async def test_claim_takes_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "pending")
        twin_before = await row_of(conn, run_id, twin)
        assert await claim_pending(conn, mine) == [run_id]
        assert await row_of(conn, run_id, twin) == twin_before
        assert (await row_of(conn, run_id, mine))["lease_worker_id"] == WORKER
        # The twin is still claimable in its own scope, with its own generation.
        assert await claim_pending(conn, twin) == [run_id]
        assert (await row_of(conn, run_id, twin))["lease_generation"] == 1

    async def test_holder_and_generation_are_read_per_scope(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "pending")
        await claim_pending(conn, mine)
        assert await call(conn, "current_holder", mine, run_id=run_id) == WORKER
        assert await call(conn, "current_holder", twin, run_id=run_id) is None
        assert await call(conn, "current_generation", mine, run_id=run_id) == 1
        assert await call(conn, "current_generation", twin, run_id=run_id) == 0

    async def test_renew_extends_only_the_scoped_lease(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "claimed")
        twin_before = await row_of(conn, run_id, twin)
        assert await fenced(conn, "renew_lease", mine, run_id, lease_seconds=600) is True
        assert (await row_of(conn, run_id, mine))["lease_expires_at"] == at(630)
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_commit_fenced_writes_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "running")
        twin_before = await row_of(conn, run_id, twin)
        assert await fenced(conn, "commit_fenced", mine, run_id,
                            columns={"output": {"scope": "mine"}}) is True
        assert json.loads((await row_of(conn, run_id, mine))["output"]) == {"scope": "mine"}
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_start_and_complete_touch_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "claimed")
        twin_before = await row_of(conn, run_id, twin)
        assert await fenced(conn, "start_run", mine, run_id) is True
        assert await fenced(conn, "complete_run", mine, run_id) is True
        assert (await row_of(conn, run_id, mine))["status"] == "completed"
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_release_frees_only_the_scoped_lease(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "claimed")
        twin_before = await row_of(conn, run_id, twin)
        assert await fenced(conn, "release_lease", mine, run_id) is True
        assert (await row_of(conn, run_id, mine))["lease_worker_id"] is None
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_clear_lease_clears_only_the_scoped_lease(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "claimed")
        twin_before = await row_of(conn, run_id, twin)
        assert await call(conn, "clear_lease", mine, run_id=run_id, now_override=NOW) is True
        assert (await row_of(conn, run_id, mine))["lease_worker_id"] is None
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_admin_cancel_cancels_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "claimed")
        twin_before = await row_of(conn, run_id, twin)
        outcome = await call(conn, "request_cancel", mine, run_id=run_id, now_override=NOW)
        assert outcome == "cancelled"
        assert (await row_of(conn, run_id, mine))["status"] == "cancelled"
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_cancel_request_on_a_live_run_flags_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "running")
        twin_before = await row_of(conn, run_id, twin)
        outcome = await call(conn, "request_cancel", mine, run_id=run_id, now_override=NOW)
        assert outcome == "cancel_requested"
        assert (await row_of(conn, run_id, mine))["cancel_requested_at"] == NOW
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_redrive_requeues_only_the_scoped_row(self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "failed")
        twin_before = await row_of(conn, run_id, twin)
        assert await call(conn, "redrive_run", mine, run_id=run_id, now_override=NOW) is True
        mine_after = await row_of(conn, run_id, mine)
        assert (mine_after["status"], mine_after["attempts"]) == ("pending", 0)
        assert await row_of(conn, run_id, twin) == twin_before

    async def test_orphan_recovery_takes_only_the_scoped_run_and_its_checkpoint(
            self, conn, scopes):
        mine, twin = scopes
        run_id = await self._twins(conn, scopes, "running")
        saved = {}
        for name, scope in (("mine", mine), ("twin", twin)):
            saved[name] = await fenced(conn, "save_checkpoint", scope, run_id, data={"of": name})
        twin_before = await row_of(conn, run_id, twin)
        rows = await claim_orphaned(conn, mine)
        assert [row["run_id"] for row in rows] == [run_id]
        assert rows[0]["recovery_checkpoint_id"] == saved["mine"]
        assert json.loads(rows[0]["checkpoint_data"]) == {"of": "mine"}
        assert await row_of(conn, run_id, twin) == twin_before


class TestDefaultTenant:
    async def test_null_tenant_is_the_default_tenant(self, conn):
        lease = await make_run(conn, "claimed")
        explicit = Scope("default", None)
        assert await call(conn, "current_holder", explicit, run_id=lease.run_id) == WORKER
        assert await fenced(conn, "renew_lease", explicit, lease.run_id) is True
        assert (await row_of(conn, lease.run_id, Scope(None, None)))["lease_expires_at"] == at(90)


class TestWorkspaceWithoutTenantMatchesNothing:
    """tenant_id NULL with a workspace named is an impossible scope (seed-spec §4: `AND 1 = 0`)."""

    IMPOSSIBLE = Scope(None, "x")

    async def test_every_function_sees_nothing_and_changes_nothing(self, conn):
        run_id = uuid4()
        for tenant in ("default", "t1"):
            await make_run(conn, "running", run_id=run_id, tenant_id=tenant, workspace_id="x")
        await make_run(conn, "running", run_id=run_id)  # default tenant, null workspace
        await make_run(conn, "pending", tenant_id="default", workspace_id="x")
        await assert_unreachable(conn, run_id, self.IMPOSSIBLE)


class TestPartialScopeCannotReachNamedWorkspace:
    @pytest.mark.parametrize(
        "scope",
        [
            pytest.param(Scope(None, None), id="omitted"),
            pytest.param(Scope("t1", None), id="tenant-only"),
            pytest.param(Scope(None, "w1"), id="workspace-only"),
            pytest.param(Scope("default", "w1"), id="default-tenant"),
            pytest.param(Scope("t2", "w1"), id="wrong-tenant"),
        ])
    async def test_unique_run_id_in_a_named_workspace_is_unreachable(self, conn, scope):
        lease = await make_run(conn, "running", tenant_id="t1", workspace_id="w1")
        await make_run(conn, "pending", tenant_id="t1", workspace_id="w1")
        await assert_unreachable(conn, lease.run_id, scope)
        # The exact scope does reach it.
        exact = Scope("t1", "w1")
        assert await call(conn, "current_holder", exact, run_id=lease.run_id) == WORKER
        assert await fenced(conn, "renew_lease", exact, lease.run_id) is True


async def assert_unreachable(conn: asyncpg.Connection, run_id: UUID, scope: Scope) -> None:
    """Every public function called in `scope` misses `run_id` (and every other run) and changes
    nothing. The runs are held by (WORKER, generation 1) until at(60)."""
    before = await snapshot(conn)

    for read in ("current_generation", "current_holder", "get_recovery_checkpoint_id"):
        assert await call(conn, read, scope, run_id=run_id) is None, read
    assert await fenced(conn, "renew_lease", scope, run_id) is False
    renewals = await conn.fetch(
        """SELECT renewed FROM zeroth_test.renew_leases(worker_id => $1, run_ids => $2,
               generations => $3, tenant_id => $4, workspace_id => $5, now_override => $6)""",
        WORKER, [run_id], [1], scope.tenant_id, scope.workspace_id, NOW)
    assert [row["renewed"] for row in renewals] == [False]
    assert await fenced(conn, "commit_fenced", scope, run_id, columns={"output": {"x": 1}}) is False
    assert await fenced(conn, "start_run", scope, run_id) is False
    assert await fenced(conn, "save_checkpoint", scope, run_id, data={"x": 1}) is None
    assert await fenced(conn, "complete_run", scope, run_id) is False
    assert await fenced(conn, "fail_run", scope, run_id) is None
    assert await fenced(conn, "cancel_run", scope, run_id) is False
    assert await fenced(conn, "pause_run", scope, run_id, reason="approval") is False
    assert await fenced(conn, "release_lease", scope, run_id) is False
    assert await fenced(conn, "hand_back_to_pending", scope, run_id) is False
    assert await fenced(conn, "expire_recovery_lease", scope, run_id) is False
    assert await call(conn, "request_cancel", scope, run_id=run_id, now_override=NOW) == "unknown"
    await raises(conn, "ZP001", "clear_lease", scope, run_id=run_id, now_override=NOW)
    await raises(conn, "ZP001", "redrive_run", scope, run_id=run_id, now_override=NOW)
    await raises(conn, "ZP001", "resume_run", scope, run_id=run_id, now_override=NOW)
    assert await claim_pending(conn, scope, now=LATER) == []
    assert await claim_orphaned(conn, scope, now=LATER) == []

    assert await snapshot(conn) == before
