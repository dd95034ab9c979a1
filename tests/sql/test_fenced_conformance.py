"""Every lease-fenced function keeps the same fence: one module, the same cases over each.

A fenced function writes (or, get_step, reads) for the live lease (worker_id, generation) only.
Each case below runs over every one of them (River's driver-test pattern), so a new fenced
function gets the whole set by adding one row to FENCED, and a function whose fence is broken
fails here whatever its own module checks:

* the holder's call lands (so the refusals below are not vacuous);
* another worker, another generation, an expired lease, a lease taken over (by another worker or
  by the same worker id at the next generation; the new holder's call still lands), a lease an
  admin cleared, a run with no live lease (pending, waiting, ended), an unknown run and another
  scope are refused, and the refused call changes no row of any table;
* the holder calling in a state the function does not take raises ZP003 (or is refused) and
  changes nothing;
* a NULL, empty or over-long fence argument raises ZP008 and changes nothing;
* only zeroth_worker may call it: a role with no grant and a zeroth_reader get 42501.

The batch functions (complete_runs, renew_leases, complete_and_claim, settle_runs) are called
with a batch of one run, so the same cases apply to their per-run fence.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import WORKER, at, claim, make_run

OTHER = "worker-b"
NOW = at(10)
EXPIRED = at(61)  # make_run's leases last 60 s from T0
#: $1 run_id, $2 worker_id, $3 generation, $4 tenant_id, $5 workspace_id, $6 now_override.
ONE = "run_id => $1, worker_id => $2, generation => $3"
SCOPE = "tenant_id => $4, workspace_id => $5, now_override => $6"
BATCH = "worker_id => $2, run_ids => ARRAY[$1::uuid], generations => ARRAY[$3::bigint]"


@dataclass(frozen=True)
class Fenced:
    """One fenced function: a call of it for one run, and what it returns when fenced out."""

    name: str
    call: str  # a query of one value, with the parameters above
    statuses: tuple[str, ...] = ("running",)  # the leased states its holder's call lands in
    refused: Any = False
    #: what the holder's call in a leased state it does not take gets: this SQLSTATE, or (None)
    #: refused like a stale holder
    wrong_state: str | None = "ZP003"
    #: run first, by the holder of a running run, so that the call can land (its arguments)
    prepare: str | None = None
    #: the fence arguments it refuses with ZP008 (renew_lease takes generation NULL: owner only)
    bad: tuple[str, ...] = ("run_id_null", "worker_null", "worker_empty", "worker_too_long",
                            "generation_null")

    def __str__(self) -> str:
        return self.name


def fenced(name: str, arguments: str = "", *, column: str | None = None, **kwargs: Any) -> Fenced:
    """A function called as zeroth_test.<name>(run_id, worker_id, generation, <arguments>,
    scope), its value (or the result column ``column``)."""
    extra = f", {arguments}" if arguments else ""
    call = f"zeroth_test.{name}({ONE}{extra}, {SCOPE})"
    query = f"SELECT ({call}).{column}" if column else f"SELECT {call}"
    return Fenced(name, query, **kwargs)


#: The child held() started (kept in a transaction-local setting: a worker may not read
#: zeroth.child_runs), or a run that is nobody's child (a fenced-out call never looks).
CHILDREN = """ARRAY[coalesce(nullif(current_setting('zp_conformance.child', true), '')::uuid,
                              gen_random_uuid())]"""
START_CHILD = """SELECT set_config('zp_conformance.child', (zeroth_test.start_child_run(
                     run_id => $1, worker_id => $2, generation => $3, step_key => 'child',
                     deployment_ref => 'deploy-child', tenant_id => $4, workspace_id => $5,
                     now_override => $6)).child_run_id::text, true)"""

FENCED = [
    fenced("cancel_run", statuses=("claimed", "running")),
    fenced("commit_fenced", """columns => '{"output": {"x": 1}}'""",
           statuses=("claimed", "running")),
    Fenced("complete_and_claim",
           f"""SELECT c.completed[1] FROM zeroth_test.complete_and_claim(
                   deployment_ref => 'deploy-nothing-to-claim', {BATCH}, {SCOPE}) c""",
           wrong_state=None),
    fenced("complete_run", """output => '{"x": 1}'"""),
    Fenced("complete_runs",
           f"SELECT c.completed FROM zeroth_test.complete_runs({BATCH}, {SCOPE}) c",
           wrong_state=None),
    fenced("expire_recovery_lease", wrong_state=None),
    fenced("fail_run", """error => '{"x": 1}'""", refused=None),
    fenced("get_step", "step_key => 'step'", column="step_found", refused=None),
    fenced("hand_back_to_pending", wrong_state=None),
    fenced("pause_run", "reason => 'approval'"),
    fenced("record_step", "step_key => 'step', result => '1'", column="recorded",
           refused=None),
    fenced("release_lease", statuses=("claimed", "running")),
    fenced("renew_lease", statuses=("claimed", "running"),
           bad=("run_id_null", "worker_null", "worker_empty", "worker_too_long")),
    Fenced("renew_leases",
           f"SELECT l.renewed FROM zeroth_test.renew_leases({BATCH}, {SCOPE}) l",
           statuses=("claimed", "running")),
    fenced("save_checkpoint", """data => '{"x": 1}'""", refused=None),
    Fenced("settle_runs",
           f"""SELECT s.outcome FROM zeroth_test.settle_runs({BATCH}, outcomes => '{{complete}}',
                   {SCOPE}) s""",
           refused=None, wrong_state=None),
    fenced("sleep_run", """delay_seconds => 5, checkpoint => '{"x": 1}'""", column="outcome",
           refused=None),
    fenced("start_child_run", "step_key => 'child', deployment_ref => 'deploy-child'",
           column="child_run_id", refused=None),
    fenced("start_run", statuses=("claimed", "running")),
    fenced("update_run_progress", """progress => '{"x": 1}'"""),
    fenced("wait_for_children", f"step_key => 'wait', child_run_ids => {CHILDREN}",
           column="outcome", refused=None, prepare=START_CHILD),
    fenced("wait_for_event", "step_key => 'wait', name => 'event'", column="outcome",
           refused=None),
]


def test_every_fenced_function_is_in_the_module(conn_catalog: list[str]) -> None:
    """A function taking a lease generation is fenced, and gets every case of this module."""
    assert sorted(conn_catalog) == sorted(f.name for f in FENCED)


@pytest.fixture
async def conn_catalog(conn: asyncpg.Connection) -> list[str]:
    return [row["proname"] for row in await conn.fetch(
        """SELECT DISTINCT p.proname FROM pg_proc p
            WHERE p.pronamespace = 'zeroth'::regnamespace AND left(p.proname, 1) <> '_'
              AND p.proargnames && ARRAY['generation', 'generations']::text[]
              AND 'worker_id' = ANY (p.proargnames)""")]


async def call(conn: asyncpg.Connection, function: Fenced, run_id: UUID | None,
               worker_id: str | None = WORKER, generation: int | None = 1, *,
               tenant_id: str | None = None, workspace_id: str | None = None,
               now: datetime = NOW) -> Any:
    return await conn.fetchval(function.call, run_id, worker_id, generation, tenant_id,
                               workspace_id, now)


async def held(conn: asyncpg.Connection, function: Fenced, status: str | None = None,
               **kwargs: Any) -> UUID:
    """A run of WORKER's lease (generation 1, live until 60 s) in ``status`` (the function's
    first), prepared for ``function``. It holds an admission slot (max_concurrency 1, a
    deployment per status), so a refused call is also seen to leave the slot alone."""
    status = status or function.statuses[0]
    kwargs.setdefault("deployment_ref", f"deploy-{status}")
    kwargs.setdefault("max_concurrency", 1)
    lease = await make_run(conn, status, **kwargs)
    if function.prepare and status == "running":
        await conn.execute(function.prepare, lease.run_id, WORKER, 1, kwargs.get("tenant_id"),
                           kwargs.get("workspace_id"), NOW)
    return lease.run_id


EVERYTHING = """SELECT string_agg(format(
                       '(SELECT %L, array(SELECT t::text FROM %I.%I t ORDER BY 1))',
                       c.relname, 'zeroth', c.relname), ' UNION ALL ' ORDER BY c.relname)
                  FROM pg_class c
                 WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind IN ('r', 'p')
                   AND NOT c.relispartition"""


#: EVERYTHING's answer, built once (the tables do not change under the tests).
_SNAPSHOT: dict[str, str] = {}


async def everything(conn: asyncpg.Connection) -> dict[str, list[str]]:
    """Every row of every table of schema zeroth: what a refused call must leave as it was."""
    if "query" not in _SNAPSHOT:
        _SNAPSHOT["query"] = await conn.fetchval(EVERYTHING)
    return dict(await conn.fetch(_SNAPSHOT["query"]))


async def assert_refused(conn: asyncpg.Connection, function: Fenced, run_id: UUID,
                         *args: Any, **kwargs: Any) -> None:
    before = await everything(conn)
    assert await call(conn, function, run_id, *args, **kwargs) == function.refused
    assert await everything(conn) == before


async def assert_raises(conn: asyncpg.Connection, sqlstate: str, function: Fenced,
                        run_id: UUID | None, *args: Any, **kwargs: Any) -> None:
    before = await everything(conn)
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await call(conn, function, run_id, *args, **kwargs)
    assert info.value.sqlstate == sqlstate, info.value
    assert await everything(conn) == before


@pytest.mark.parametrize("function", FENCED, ids=str)
class TestTheHolder:
    async def test_the_holders_call_lands(self, conn, function):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            assert await call(conn, function, run_id) not in (function.refused, None)

    async def test_the_holder_in_a_scope_lands_there(self, conn, function):
        run_id = await held(conn, function, tenant_id="acme", workspace_id="ws")
        result = await call(conn, function, run_id, tenant_id="acme", workspace_id="ws")
        assert result not in (function.refused, None)



@pytest.mark.parametrize(("function", "status"), [
    pytest.param(f, s, id=f"{f}-{s}") for f in FENCED for s in ("claimed", "running")
    if s not in f.statuses])
async def test_the_holder_in_a_state_the_function_does_not_take_changes_nothing(
        conn, function, status):
    run_id = await held(conn, function, status)
    if function.wrong_state is None:
        await assert_refused(conn, function, run_id)
    else:
        await assert_raises(conn, function.wrong_state, function, run_id)


@pytest.mark.parametrize("function", FENCED, ids=str)
class TestAStaleOrForeignHolderIsRefused:
    @pytest.mark.parametrize(("worker_id", "generation"), [(OTHER, 1), (WORKER, 0), (WORKER, 2)],
                             ids=["another_worker", "an_older_generation", "a_newer_generation"])
    async def test_anyone_but_the_exact_holder_is_refused(self, conn, function, worker_id,
                                                          generation):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            await assert_refused(conn, function, run_id, worker_id, generation)

    @pytest.mark.parametrize("now", [at(60.000001), at(600)], ids=["just_expired", "long_expired"])
    async def test_an_expired_lease_is_refused(self, conn, function, now):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            await assert_refused(conn, function, run_id, now=now)

    @pytest.mark.parametrize("taker", [WORKER, OTHER], ids=["same_worker_id", "another_worker"])
    async def test_a_lease_taken_over_is_refused_and_the_new_holder_keeps_it(
            self, conn, function, taker):
        for status in function.statuses:
            deployment = f"deploy-{status}"
            run_id = await held(conn, function, status, deployment_ref=deployment)
            if status == "claimed":
                taken = await claim(conn, deployment_ref=deployment, worker_id=taker,
                                    max_concurrency=1, now=EXPIRED)
            else:
                taken = await conn.fetch(
                    """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                           deployment_ref => $1, worker_id => $2, now_override => $3)
                        WHERE run_id IS NOT NULL""", deployment, taker, EXPIRED)
            assert [(r["run_id"], r["lease_generation"]) for r in taken] == [(run_id, 2)]
            # Refused at the time of the takeover, before the new lease expires ...
            await assert_refused(conn, function, run_id, now=at(62))
            # ... which is still the new holder's to use.
            result = await call(conn, function, run_id, taker, 2, now=at(62))
            assert result not in (function.refused, None)

    @pytest.mark.parametrize("status", ["pending", "waiting", "completed", "failed", "cancelled"])
    async def test_a_run_without_a_live_lease_is_refused(self, conn, function, status):
        lease = await make_run(conn, status)
        await assert_refused(conn, function, lease.run_id, WORKER, lease.generation)

    async def test_an_unknown_run_is_refused(self, conn, function):
        await assert_refused(conn, function, UUID(int=7))

    async def test_a_lease_an_admin_cleared_is_refused(self, conn, function):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            assert await conn.fetchval(
                "SELECT zeroth_test.clear_lease(run_id => $1, now_override => $2)", run_id, at(5))
            await assert_refused(conn, function, run_id)

    async def test_the_holder_naming_another_scope_is_refused(self, conn, function):
        scopes = [(None, None), ("acme", None), ("acme", "ws-1"), ("acme", "ws-2"),
                  ("globex", None), ("globex", "ws-1")]
        for tenant_id, workspace_id in [("acme", None), ("acme", "ws-1")]:
            run_id = await held(conn, function, tenant_id=tenant_id, workspace_id=workspace_id)
            before = await everything(conn)
            for other in scopes:
                if other != (tenant_id, workspace_id):
                    assert await call(conn, function, run_id, tenant_id=other[0],
                                      workspace_id=other[1]) == function.refused, other
            assert await everything(conn) == before


BAD = {
    "run_id_null": {"run_id": None},
    "worker_null": {"worker_id": None},
    "worker_empty": {"worker_id": ""},
    "worker_too_long": {"worker_id": "w" * 201},
    "generation_null": {"generation": None},
}


@pytest.mark.parametrize(("function", "bad"),
                         [pytest.param(f, b, id=f"{f}-{b}") for f in FENCED for b in f.bad])
async def test_a_bad_fence_argument_raises_zp008_and_changes_nothing(conn, function, bad):
    run_id = await held(conn, function)
    arguments: dict[str, Any] = {"run_id": run_id, "worker_id": WORKER, "generation": 1}
    arguments.update(BAD[bad])
    await assert_raises(conn, "ZP008", function, arguments.pop("run_id"), **arguments)


@pytest.mark.parametrize("function", FENCED, ids=str)
class TestOnlyTheWorkerRoleMayCall:
    async def as_role(self, conn: asyncpg.Connection, role: str, function: Fenced,
                      run_id: UUID) -> Any:
        """The holder's call made as ``role``, in a savepoint rolled back after."""
        savepoint = conn.transaction()
        await savepoint.start()
        try:
            await conn.execute(f'SET LOCAL ROLE "{role}"')
            return await call(conn, function, run_id)
        finally:
            await savepoint.rollback()

    @pytest.mark.parametrize("role", ["nobody", "zeroth_reader"])
    async def test_a_role_without_the_worker_grant_gets_42501(self, conn, function, role):
        if role == "nobody":
            role = f"zp_conformance_{secrets.token_hex(4)}"
            await conn.execute(f'CREATE ROLE "{role}" NOLOGIN')  # rolled back with the test
        run_id = await held(conn, function)
        before = await everything(conn)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await self.as_role(conn, role, function, run_id)
        assert await everything(conn) == before

    async def test_zeroth_worker_may_call(self, conn, function):
        run_id = await held(conn, function)
        result = await self.as_role(conn, "zeroth_worker", function, run_id)
        assert result not in (function.refused, None)
