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
with a batch of one run, so the same cases apply to their per-run fence; besides, in one batch
every refused run is reported refused in input order and left as it was while the live run lands,
and a malformed batch (arrays NULL, of unequal lengths, two-dimensional, a run repeated, over
1000 runs) raises ZP008 and changes nothing. renew_lease also takes generation NULL (the
holder's lease, whatever its generation): that key is refused wherever the worker id alone
does not name a live lease.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import WORKER, at, claim, enqueue, make_run

OTHER = "worker-b"
NOW = at(10)
EXPIRED = at(61)  # make_run's leases last 60 s from T0
#: $1 run_id, $2 worker_id, $3 generation, $4 tenant_id, $5 workspace_id, $6 now_override.
ONE = "run_id => $1, worker_id => $2, generation => $3"
SCOPE = "tenant_id => $4, workspace_id => $5, now_override => $6"
#: A batch function's runs: one run (as ONE), or ($1 uuid[], $3 bigint[]) many.
ONE_RUN = {"ids": "ARRAY[$1::uuid]",
           "runs": "worker_id => $2, run_ids => ARRAY[$1::uuid], generations => ARRAY[$3::bigint]"}
MANY_RUNS = {"ids": "$1::uuid[]",
             "runs": "worker_id => $2, run_ids => $1::uuid[], generations => $3::bigint[]"}


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
    #: a batch function: a query of rows (run_id, ok) for the runs $1 uuid[], generations $3
    batch: str | None = None
    #: generation NULL is a key: the holder's lease whatever its generation (renew_lease)
    null_generation: bool = False

    def __str__(self) -> str:
        return self.name


def fenced(name: str, arguments: str = "", *, column: str | None = None, **kwargs: Any) -> Fenced:
    """A function called as zeroth_test.<name>(run_id, worker_id, generation, <arguments>,
    scope), its value (or the result column ``column``)."""
    extra = f", {arguments}" if arguments else ""
    call = f"zeroth_test.{name}({ONE}{extra}, {SCOPE})"
    query = f"SELECT ({call}).{column}" if column else f"SELECT {call}"
    return Fenced(name, query, **kwargs)


def batch(name: str, query: str, **kwargs: Any) -> Fenced:
    """A batch function: ``query`` gives rows (run_id, ok) for {ids} (its runs, in input
    order) called with {runs}; called for one run, its ok is the value the cases check."""
    return Fenced(name, f"SELECT b.ok FROM ({query.format(**ONE_RUN)}) b",
                  batch=query.format(**MANY_RUNS), wrong_state=None, **kwargs)


#: The child held() started (kept in a transaction-local setting: a worker may not read
#: zeroth.child_runs), or a run that is nobody's child (a fenced-out call never looks).
CHILDREN = """ARRAY[coalesce(nullif(current_setting('zp_conformance.child', true), '')::uuid,
                              gen_random_uuid())]"""
START_CHILD = """SELECT set_config('zp_conformance.child', (zeroth_test.start_child_run(
                     run_id => $1, worker_id => $2, generation => $3, step_key => 'child',
                     deployment_ref => 'deploy-child', tenant_id => $4, workspace_id => $5,
                     now_override => $6)).child_run_id::text, true)"""

#: get_step reads a step that exists (a refused reader sees not even its own earlier step).
RECORD_STEP = """SELECT zeroth_test.record_step(run_id => $1, worker_id => $2, generation => $3,
                     step_key => 'step', result => '1', tenant_id => $4, workspace_id => $5,
                     now_override => $6)"""
#: complete_and_claim's claim: a deployment with no run (a refused or bad call with a run there
#: to claim: test_a_malformed_batch_... and test_a_bad_fence_argument_...).
CLAIM_ALONG = "deploy-claim-along"

FENCED = [
    # A refused append returns NULL (no event id).
    fenced("append_run_event", """name => 'token', data => '{"x": 1}'""", refused=None),
    fenced("cancel_run", statuses=("claimed", "running")),
    fenced("commit_fenced", """columns => '{"output": {"x": 1}}'""",
           statuses=("claimed", "running")),
    batch("complete_and_claim",
          f"""SELECT u.run_id, u.ok
                FROM (SELECT c.completed FROM zeroth_test.complete_and_claim(
                          deployment_ref => '{CLAIM_ALONG}', {{runs}}, {SCOPE}) c LIMIT 1) c,
                     unnest({{ids}}, c.completed) AS u(run_id, ok)"""),
    fenced("complete_run", """output => '{"x": 1}'"""),
    batch("complete_runs", f"""SELECT c.run_id, c.completed AS ok
                                   FROM zeroth_test.complete_runs({{runs}}, {SCOPE}) c"""),
    fenced("expire_recovery_lease", wrong_state=None),
    fenced("fail_run", """error => '{"x": 1}'""", refused=None),
    fenced("get_step", "step_key => 'step'", column="step_found", refused=None,
           prepare=RECORD_STEP),
    fenced("hand_back_to_pending", wrong_state=None),
    fenced("pause_run", "reason => 'approval'"),
    fenced("record_step", "step_key => 'step', result => '1'", column="recorded",
           refused=None),
    fenced("release_lease", statuses=("claimed", "running")),
    fenced("renew_lease", statuses=("claimed", "running"), null_generation=True,
           bad=("run_id_null", "worker_null", "worker_empty", "worker_too_long")),
    # A refused row: not renewed, no expiry, no cancel reported.
    batch("renew_leases", f"""SELECT l.run_id,
                                     row(l.renewed, l.lease_expires_at, l.cancel_requested)::text
                                     AS ok
                                FROM zeroth_test.renew_leases({{runs}}, {SCOPE}) l""",
          statuses=("claimed", "running"), refused="(f,,f)"),
    fenced("save_checkpoint", """data => '{"x": 1}'""", refused=None),
    # Every run of the batch completed; a refused row's outcome is NULL.
    batch("settle_runs", f"""SELECT s.run_id, s.outcome AS ok
                               FROM zeroth_test.settle_runs({{runs}}, outcomes => array_fill(
                                        'complete'::text, ARRAY[coalesce(cardinality({{ids}}), 0)]),
                                        {SCOPE}) s""",
          refused=None),
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
                         worker_id: str | None = WORKER, generation: int | None = 1, *,
                         any_generation: bool = False, **kwargs: Any) -> None:
    """The call is refused and changes no row; with ``any_generation`` (the worker id alone
    names no live lease) so is the call with generation NULL where that is a key."""
    generations = [generation]
    if any_generation and function.null_generation:
        generations.append(None)
    before = await everything(conn)
    for key in generations:
        assert await call(conn, function, run_id, worker_id, key, **kwargs) == function.refused
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

    async def test_the_holders_call_at_the_instant_its_lease_ends_lands(self, conn, function):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            assert await call(conn, function, run_id, now=at(60)) not in (function.refused, None)


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
            await assert_refused(conn, function, run_id, worker_id, generation,
                                 any_generation=worker_id != WORKER)

    @pytest.mark.parametrize("now", [at(60.000001), at(600)], ids=["just_expired", "long_expired"])
    async def test_an_expired_lease_is_refused(self, conn, function, now):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            await assert_refused(conn, function, run_id, now=now, any_generation=True)

    async def test_an_expired_lease_whose_slot_went_to_another_run_is_refused(self, conn,
                                                                             function):
        """The run is still running, but its admission slot (max_concurrency 1) is another
        run's now: the expired holder neither acts on its run nor touches that slot."""
        run_id = await held(conn, function, "running")
        other = await enqueue(conn, deployment_ref="deploy-running")
        taken = await claim(conn, deployment_ref="deploy-running", worker_id=OTHER,
                            max_concurrency=1, now=EXPIRED)
        assert [r["run_id"] for r in taken] == [other]
        await assert_refused(conn, function, run_id, now=EXPIRED, any_generation=True)

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
            await assert_refused(conn, function, run_id, now=at(62),
                                 any_generation=taker != WORKER)
            # ... which is still the new holder's to use.
            result = await call(conn, function, run_id, taker, 2, now=at(62))
            assert result not in (function.refused, None)

    @pytest.mark.parametrize("status", ["pending", "waiting", "completed", "failed", "cancelled"])
    async def test_a_run_without_a_live_lease_is_refused(self, conn, function, status):
        lease = await make_run(conn, status)
        await assert_refused(conn, function, lease.run_id, WORKER, lease.generation,
                             any_generation=True)

    async def test_an_unknown_run_is_refused(self, conn, function):
        await assert_refused(conn, function, UUID(int=7), any_generation=True)

    async def test_a_lease_an_admin_cleared_is_refused(self, conn, function):
        for status in function.statuses:
            run_id = await held(conn, function, status)
            assert await conn.fetchval(
                "SELECT zeroth_test.clear_lease(run_id => $1, now_override => $2)", run_id, at(5))
            await assert_refused(conn, function, run_id, any_generation=True)

    async def test_the_holder_naming_another_scope_is_refused(self, conn, function):
        scopes = [(None, None), ("acme", None), ("acme", "ws-1"), ("acme", "ws-2"),
                  ("globex", None), ("globex", "ws-1")]
        for tenant_id, workspace_id in [("acme", None), ("acme", "ws-1")]:
            run_id = await held(conn, function, tenant_id=tenant_id, workspace_id=workspace_id)
            before = await everything(conn)
            for other in scopes:
                for generation in (1, None) if function.null_generation else (1,):
                    if other != (tenant_id, workspace_id):
                        assert await call(conn, function, run_id, WORKER, generation,
                                          tenant_id=other[0],
                                          workspace_id=other[1]) == function.refused, other
            assert await everything(conn) == before


BATCHES = [f for f in FENCED if f.batch]


async def call_batch(conn: asyncpg.Connection, function: Fenced, run_ids: Any,
                     generations: Any, *, tenant_id: str | None = None,
                     now: datetime = NOW) -> list[tuple[UUID, Any]]:
    assert function.batch
    rows = await conn.fetch(function.batch, run_ids, WORKER, generations, tenant_id, None, now)
    return [(row["run_id"], row["ok"]) for row in rows]


def rows_of(snapshot: dict[str, list[str]], run_id: UUID) -> dict[str, list[str]]:
    """The rows of every table that name the run (its run row, its slot, its steps ...)."""
    return {table: [row for row in rows if str(run_id) in row]
            for table, rows in snapshot.items()}


@pytest.mark.parametrize("function", BATCHES, ids=str)
async def test_in_a_batch_each_refused_run_is_reported_and_left_as_it_was(conn, function):
    """One batch of WORKER's: one live run among runs refused for each reason of the cases
    above. The live run lands; every other row is refused, in input order, and every row that
    names a refused run (its run, its slot) is as it was: one bad row stops nothing."""
    now = at(100)  # the 60 s leases have expired; the 600 s ones live
    refused: list[tuple[UUID, int]] = []

    async def run(name: str, status: str = "running", lease_seconds: float = 600,
                  **kwargs: Any) -> UUID:
        lease = await make_run(conn, status, deployment_ref=f"deploy-{name}",
                               lease_seconds=lease_seconds, max_concurrency=1, **kwargs)
        return lease.run_id

    refused.append((await run("other", worker_id=OTHER), 1))
    refused.append((await run("older"), 0))
    refused.append((await run("newer"), 2))
    refused.append((await run("expired", lease_seconds=60), 1))
    for taker in (WORKER, OTHER):
        run_id = await run(f"taken-{taker}", lease_seconds=60)
        taken = await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1,
                   worker_id => $2, lease_seconds => 600, now_override => $3)
                WHERE run_id IS NOT NULL""", f"deploy-taken-{taker}", taker, EXPIRED)
        assert [r["run_id"] for r in taken] == [run_id]
        refused.append((run_id, 1))
    cleared = await run("cleared")
    assert await conn.fetchval(
        "SELECT zeroth_test.clear_lease(run_id => $1, now_override => $2)", cleared, at(5))
    refused.append((cleared, 1))
    for status in ("pending", "completed"):
        refused.append((await run(status, status), 1))
    if "claimed" not in function.statuses:
        refused.append((await run("claimed", "claimed"), 1))
    refused.append((await run("scope", tenant_id="acme"), 1))
    refused.append((UUID(int=7), 1))
    live = await run("live")
    runs = [*refused[:4], (live, 1), *refused[4:]]
    before = await everything(conn)

    result = await call_batch(conn, function, [r for r, _ in runs], [g for _, g in runs],
                              now=now)

    assert [run_id for run_id, _ in result] == [run_id for run_id, _ in runs]
    assert [ok for run_id, ok in result if run_id != live] == [function.refused] * len(refused)
    assert dict(result)[live] not in (function.refused, None)
    after = await everything(conn)
    for run_id, _ in refused:
        assert rows_of(after, run_id) == rows_of(before, run_id), run_id
    assert rows_of(after, live) != rows_of(before, live)


BAD_BATCHES = {
    "run_ids_null": lambda a, b: (None, [1]),
    "generations_null": lambda a, b: ([a], None),
    "run_ids_longer": lambda a, b: ([a, b], [1]),
    "generations_longer": lambda a, b: ([a], [1, 1]),
    "a_run_repeated": lambda a, b: ([a, a], [1, 1]),
    "over_1000_runs": lambda a, b: ([a, *(UUID(int=n) for n in range(1, 1001))], [1] * 1001),
    "two_dimensional": lambda a, b: ([[a, b]], [[1, 1]]),
}


@pytest.mark.parametrize(("function", "shape"), [
    pytest.param(f, s, id=f"{f}-{s}") for f in BATCHES for s in BAD_BATCHES])
async def test_a_malformed_batch_raises_zp008_and_changes_nothing(conn, function, shape):
    """Two live runs of WORKER's, and a run complete_and_claim's claim would start: a malformed
    batch lands none of it (a claim along is undone with the completions)."""
    a, b = await held(conn, function), await held(conn, function, deployment_ref="deploy-b")
    await enqueue(conn, deployment_ref=CLAIM_ALONG)
    run_ids, generations = BAD_BATCHES[shape](a, b)
    before = await everything(conn)
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await call_batch(conn, function, run_ids, generations)
    assert info.value.sqlstate == "ZP008", info.value
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
    await enqueue(conn, deployment_ref=CLAIM_ALONG)  # complete_and_claim's claim takes nothing
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
