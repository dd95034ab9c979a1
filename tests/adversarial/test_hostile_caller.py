"""A hostile zeroth_worker member, driven by hypothesis, on a database exactly as shipped (no
test clock, no setting the harness enabled), against victims that hold live leases.

The seed (committed, real clock): in four scopes (the default one, a tenant, a tenant's
workspace, another tenant's workspace of the same name) and two deployments, pending runs,
claimed and running runs leased for an hour by victim workers, a deployment full under
max_concurrency = 2, orphans (running, lease expired by an operator), an owned non-resumable
thread run, and finished runs. Each example is a sequence of calls of any worker function, with
arguments drawn from the seed (real run ids, the victims' worker ids and generations, stale and
future generations, every scope, an impossible scope), made as the LOGIN role (``SET ROLE``
inside one transaction that is rolled back at the end, so every example meets the same seed).

After every call, checked on the database itself:

* **no live lease changes hands, expiry or status** unless the call presented exactly that lease:
  its run in its scope, its worker id and its generation (worker ids are labels and generations
  fencing tokens, not secrets: a zeroth_worker credential may act as any worker —
  docs/security.md; what it can never do is take a lease it does not name);
* **a stale or foreign lease writes nothing**: a fenced call that presents a (worker,
  generation) other than the run's live lease leaves the run and its checkpoints as they were;
* **at most K live leases** under max_concurrency per (scope, deployment), K the largest limit
  any call used there, and every live slotted lease named by its slot;
* **nothing outside the call's scope** is changed (whole-row checksums per tenant and
  workspace), and every uuid it returns was given to it or belongs to its scope.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from catalog import CATALOG_SQL, Function, checksum_sql, checksums, function_from_row
from helpers import BlockingConnection, property_settings, save_report
from hypothesis import given
from hypothesis import strategies as st
from roles import login_role, readme_grants

# (tenant_id, workspace_id) as a caller names them; the last one can match nothing.
SCOPES = ((None, None), ("acme", None), ("acme", "ws-1"), ("globex", "ws-1"))
IMPOSSIBLE = (None, "ws-1")
DEPLOYMENTS = ("d1", "d2")
VICTIMS = ("victim-1", "victim-2", "victim-3")
HOSTILE = "hostile"
THREAD = "t-1"
LEASE = 3600.0
# Cancels may end a claimed run that has not started (its holder is fenced out before it starts);
# a running run with a live lease is only asked to stop.
CANCELS = {"request_cancel", "request_cancel_v2", "admit_run"}
FENCED = {"commit_fenced", "update_run_progress", "start_run", "save_checkpoint", "complete_run",
          "fail_run", "cancel_run", "pause_run", "release_lease", "hand_back_to_pending",
          "expire_recovery_lease", "renew_lease", "record_step", "wait_for_event",
          "start_child_run", "wait_for_children"}


def scope_key(tenant_id: str | None, workspace_id: str | None) -> tuple[str | None, str]:
    tenant = None if tenant_id is None and workspace_id is not None else (tenant_id or "default")
    return tenant, "" if workspace_id is None else f"w:{workspace_id}"


@dataclass(frozen=True)
class Lease:
    scope: tuple[str, str]  # (tenant_id, workspace_key)
    run_id: UUID
    worker_id: str
    generation: int


RUNS_SQL = """SELECT r.tenant_id, r.workspace_key, r.run_id, r.deployment_ref, r.status::text,
                     r.lease_worker_id, r.lease_generation, r.lease_expires_at, r.admission_slot,
                     r.lease_expires_at >= clock_timestamp() AS live, r::text AS whole,
                     (SELECT md5(coalesce(string_agg(k::text, '|' ORDER BY k::text), ''))
                        FROM zeroth.checkpoints k WHERE k.tenant_id = r.tenant_id
                         AND k.workspace_key = r.workspace_key AND k.run_id = r.run_id) AS marks
                FROM zeroth.runs r"""
SLOTS_SQL = """SELECT s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no, s.run_id,
                      s.lease_generation FROM zeroth.admission_slots s"""


class Hostile(BlockingConnection):
    """A superuser connection that plays the hostile role for each call (SET LOCAL ROLE) and
    reads the truth between calls, all in one transaction per example."""

    def __init__(self, dsn: str, role: str) -> None:
        super().__init__(dsn, server_settings={"statement_timeout": "10s"})
        self.role = role
        catalog = self.run(self.conn.fetch(CATALOG_SQL))
        self.functions = {f.name: f for f in map(function_from_row, catalog)
                          if f.name in readme_grants("zeroth_worker")}
        self.checksum_sql = self.run(checksum_sql(self.conn))
        self.seed = self.run(seed(self.conn))
        self.figures: Counter[str] = Counter()

    def state(self) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            runs = {(r["tenant_id"], r["workspace_key"], r["run_id"]): r
                    for r in await self.conn.fetch(RUNS_SQL)}
            slots = {(s["tenant_id"], s["workspace_key"], s["deployment_ref"], s["slot_no"]):
                     (s["run_id"], s["lease_generation"]) for s in await self.conn.fetch(SLOTS_SQL)}
            return {"runs": runs, "slots": slots,
                    "checksums": await checksums(self.conn, self.checksum_sql)}
        return self.run(read())  # type: ignore[no-any-return]

    def call(self, function: Function, args: dict[str, Any]) -> list[Any] | str:
        """The call as the hostile role, in a savepoint; an error comes back as its SQLSTATE."""
        types = {p.name: p.type for p in function.parameters}
        named = ", ".join(f"{name} => ${i}::{types[name]}" for i, name in enumerate(args, 1))

        async def attempt() -> list[Any] | str:
            try:
                async with self.conn.transaction():
                    await self.conn.execute(f'SET LOCAL ROLE "{self.role}"')
                    rows = list(await self.conn.fetch(
                        f"SELECT * FROM zeroth.{function.name}({named})", *args.values()))
                    await self.conn.execute("RESET ROLE")
                    return rows
            except asyncpg.PostgresError as exc:
                return exc.sqlstate or "?"
        return self.run(attempt())  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Seed:
    runs: list[UUID]
    leases: list[Lease]  # the victims' live leases
    generations: list[int]


async def seed(conn: asyncpg.Connection) -> Seed:
    """The victims' world, committed (see the module docstring)."""
    leases: list[Lease] = []

    async def claim(scope: tuple[str | None, str | None], deployment: str, worker: str,
                    start: bool, limit: int | None = None) -> Lease:
        function = "claim_and_start" if start else "claim_pending"
        row = await conn.fetchrow(
            f"""SELECT run_id, lease_generation FROM zeroth.{function}(deployment_ref => $1,
                    worker_id => $2, tenant_id => $3, workspace_id => $4, max_concurrency => $5,
                    lease_seconds => $6) WHERE run_id IS NOT NULL""",
            deployment, worker, *scope, limit, LEASE)
        assert row is not None
        return Lease(scope_key(*scope), row["run_id"], worker, row["lease_generation"])

    async def enqueue(scope: tuple[str | None, str | None], deployment: str, **extra: Any) -> UUID:
        names = ", ".join(f"{k} => ${i}" for i, k in enumerate(extra, 4))
        return await conn.fetchval(  # type: ignore[no-any-return]
            f"""SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2,
                    workspace_id => $3{', ' + names if names else ''})""",
            deployment, *scope, *extra.values())

    for scope in SCOPES:
        for _ in range(5):  # claimed, running, orphan, finished, and one left pending
            await enqueue(scope, "d1")
        leases.append(await claim(scope, "d1", VICTIMS[0], start=False))  # claimed
        running = await claim(scope, "d1", VICTIMS[0], start=True)
        leases.append(running)
        assert await conn.fetchval(
            """SELECT zeroth.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
                   data => '{"step": 1}', tenant_id => $4, workspace_id => $5) IS NOT NULL""",
            running.run_id, running.worker_id, running.generation, *scope)
        for _ in range(3):  # d2 is full under max_concurrency = 2: one run waits
            await enqueue(scope, "d2")
        for _ in range(2):
            leases.append(await claim(scope, "d2", VICTIMS[1], start=True, limit=2))
        orphan = await claim(scope, "d1", VICTIMS[1], start=True)
        assert await conn.fetchval(
            "SELECT zeroth.clear_lease(run_id => $1, tenant_id => $2, workspace_id => $3)",
            orphan.run_id, *scope)
        if scope[0] is not None:  # an owned, non-resumable thread run
            owned = await conn.fetchrow(
                """SELECT run_id, lease_generation FROM zeroth.admit_run(deployment_ref => 'd1',
                       thread_id => $1, worker_id => $2, tenant_id => $3, workspace_id => $4,
                       lease_seconds => $5)""", THREAD, VICTIMS[2], *scope, LEASE)
            assert await conn.fetchval(
                """SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3,
                       tenant_id => $4, workspace_id => $5)""",
                owned["run_id"], VICTIMS[2], owned["lease_generation"], *scope)
            leases.append(Lease(scope_key(*scope), owned["run_id"], VICTIMS[2],
                                owned["lease_generation"]))
        done = await claim(scope, "d1", HOSTILE, start=True)
        assert await conn.fetchval(
            """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   tenant_id => $4, workspace_id => $5)""",
            done.run_id, HOSTILE, done.generation, *scope)
    runs = [r["run_id"] for r in await conn.fetch("SELECT run_id FROM zeroth.runs")]
    return Seed(runs, leases, sorted({0, 1, 2, 3, *(le.generation for le in leases)}))


def arguments(function: Function, world: Seed) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments built from the victims' world: mostly a victim's lease (presented exactly,
    stale, or with the wrong worker or scope), sometimes anything from the pools."""
    uuids = st.sampled_from([*world.runs, uuid4()])
    generation = st.sampled_from([*world.generations, -1, 2**62])
    pools: dict[str, st.SearchStrategy[Any]] = {
        "run_id": uuids, "worker_id": st.sampled_from([HOSTILE, *VICTIMS]),
        "generation": generation, "deployment_ref": st.sampled_from(DEPLOYMENTS),
        "deployment_refs": st.lists(st.sampled_from(DEPLOYMENTS), min_size=1, max_size=2),
        "max_concurrency": st.sampled_from([None, 1, 2, 3]),
        "batch_size": st.sampled_from([1, 2, 1000]), "claim_limit": st.sampled_from([1, 2, None]),
        "lease_seconds": st.sampled_from([1.0, 60.0, 86400.0]),
        "grace_seconds": st.sampled_from([0.0, 10.0]),
        "run_ids": st.lists(uuids, max_size=3), "generations": st.lists(generation, max_size=3),
        "strategy": st.sampled_from(["reject", "interrupt", "rollback", "enqueue"]),
        "thread_id": st.sampled_from([THREAD, "t-new"]),
        "owner_generation": st.sampled_from([None, *world.generations]),
        "action": st.sampled_from(["cancel", "interrupt", "rollback"]),
        "columns": st.sampled_from(['{"output": {"x": 1}}', '{"metadata": {}}']),
        "data": st.just('{"step": 9}'), "payload": st.just("{}"), "metadata": st.just("{}"),
        "output": st.sampled_from([None, '{"stolen": true}']), "error": st.just('{"e": 1}'),
        "progress": st.just('{"p": 1}'), "accounting": st.just('{"t": 1}'),
        "retryable": st.booleans(), "reason": st.just("approval"),
        "runs": st.sampled_from(['[{}]', f'[{{"thread_id": "{THREAD}"}}, {{}}]']),
        "retry_base_seconds": st.just(0.0), "retry_max_seconds": st.just(1.0),
        "stop_reason": st.just("orphan_recovered"), "idempotency_key": st.sampled_from([None, "k"]),
        # Schedules (register_schedule needs a name and a timing; the rest are drawn or default).
        "name": st.sampled_from(["s-1", "s-2"]),
        "cron": st.sampled_from([None, "* * * * *", "*/0 * * * *"]),
        "interval_seconds": st.sampled_from([None, 1, 0]),
        "time_zone": st.sampled_from(["UTC", "Nowhere/Atlantis"]),
        "missed_fire_policy": st.sampled_from(["skip", "catch_up"]),
        "catch_up_limit": st.sampled_from([None, 5]),
        "max_schedules": st.sampled_from([1, 100]), "max_fires": st.sampled_from([1, 1000]),
        # Steps and events (a step of a victim's run, a wait on a schedule-named event).
        "step_key": st.sampled_from(["s-1", "#event:s-1", "#child:d1", "#children"]),
        "result": st.sampled_from(['{"stolen": true}', "null"]),
        "timeout_seconds": st.sampled_from([None, 0.0, 60.0]),
        # Child runs (any run id of the world as a "child", a mode that is none).
        "child_run_ids": st.lists(uuids, max_size=3), "mode": st.sampled_from(["all", "any", "x"]),
        "detached": st.booleans(),
        # settle_runs: one outcome per run (mostly as many as the one run a lease names), an
        # internal kind among them now and then.
        "outcomes": st.one_of(
            st.lists(st.sampled_from(["complete", "retry", "fail", "cancel", "hand_back"]),
                     min_size=1, max_size=1),
            st.lists(st.sampled_from(["complete", "cancel", "release", "sleep"]), max_size=3)),
    }

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        args: dict[str, Any] = {}
        names = {p.name for p in function.parameters}
        lease = draw(st.sampled_from(world.leases))
        scope = draw(st.sampled_from([*SCOPES, IMPOSSIBLE]))
        tamper = draw(st.sampled_from(["exact", "stale", "future", "worker", "scope", "free"]))
        if tamper != "free":
            tenant, wskey = lease.scope
            scope = (None if tenant == "default" else tenant,
                     None if wskey == "" else wskey.removeprefix("w:"))
            args |= {"run_id": lease.run_id, "worker_id": lease.worker_id,
                     "generation": lease.generation, "run_ids": [lease.run_id],
                     "generations": [lease.generation], "owner_generation": lease.generation}
            if tamper in ("stale", "future"):
                step = -1 if tamper == "stale" else 1
                args |= {"generation": lease.generation + step,
                         "generations": [lease.generation + step]}
            elif tamper == "worker":
                args["worker_id"] = HOSTILE
            elif tamper == "scope":
                scope = draw(st.sampled_from([s for s in SCOPES if scope_key(*s) != lease.scope]))
        args |= {"tenant_id": scope[0], "workspace_id": scope[1]}
        for parameter in function.parameters:
            # A required argument the pools cannot draw would make every call 42883 (no such
            # function): the function would never be attacked.
            assert parameter.has_default or parameter.name in args or parameter.name in pools, (
                f"{function.name}: no pool for its required argument {parameter.name}")
            if parameter.name in args or parameter.name not in pools:
                continue
            if parameter.has_default and draw(st.booleans()):
                continue
            args[parameter.name] = draw(pools[parameter.name])
        return {k: v for k, v in args.items() if k in names}

    return build()


def presented(function: Function, args: dict[str, Any], lease: Lease) -> bool:
    """The call named exactly this lease: its scope, run, worker and generation."""
    if scope_key(args.get("tenant_id"), args.get("workspace_id")) != lease.scope:
        return False
    if args.get("worker_id") != lease.worker_id:
        return False
    if function.name in ("renew_leases", "complete_runs", "complete_and_claim", "settle_runs"):
        pairs = zip(args.get("run_ids") or [], args.get("generations") or [], strict=False)
        return (lease.run_id, lease.generation) in set(pairs)
    if function.name == "admit_run":  # the owner interrupting its own thread run
        return args.get("owner_generation") == lease.generation
    generation = args.get("generation")
    return args.get("run_id") == lease.run_id and generation in (lease.generation, None)


def _uuids(rows: Any) -> Iterator[UUID]:
    if isinstance(rows, asyncpg.Record):
        rows = tuple(rows.values())
    if isinstance(rows, list | tuple):
        for item in rows:
            yield from _uuids(item)
    elif isinstance(rows, UUID):
        yield rows
    elif isinstance(rows, str) and rows.startswith("["):  # admit_run's displaced list
        for item in json.loads(rows):
            if isinstance(item, dict) and item.get("run_id"):
                yield UUID(item["run_id"])


#: Functions a zeroth_worker may call that write rows of no scope, and the tables they write.
GLOBAL_WRITES = {"register_deployment": frozenset({"deployments", "deployment_changes"})}


def check(hostile: Hostile, function: Function, args: dict[str, Any], result: list[Any] | str,
          before: dict[str, Any], after: dict[str, Any]) -> None:
    where = f"{function.name}({args})"
    runs_before, runs_after = before["runs"], after["runs"]
    # 1. No live lease of a victim moves unless the call named it exactly.
    for lease in hostile.seed.leases:
        key = (*lease.scope, lease.run_id)
        old, new = runs_before.get(key), runs_after.get(key)
        if old is None or not old["live"] or old["lease_generation"] != lease.generation:
            continue
        moved = new is None or (new["lease_worker_id"], new["lease_generation"],
                                new["lease_expires_at"], new["status"]) != (
            old["lease_worker_id"], old["lease_generation"], old["lease_expires_at"],
            old["status"])
        cancelled_before_start = (function.name in CANCELS and new is not None
                                  and old["status"] == "pending" and new["status"] == "cancelled")
        assert not moved or cancelled_before_start or presented(function, args, lease), (
            f"{where} moved the live lease {lease} without naming it: {dict(old)} -> "
            f"{dict(new) if new else None}")
    # 2. A fenced call that presents anything but a run's live lease writes nothing to it.
    if function.name in FENCED and isinstance(args.get("run_id"), UUID):
        key = (*scope_key(args.get("tenant_id"), args.get("workspace_id")), args["run_id"])
        old = runs_before.get(key)
        holds = old is not None and old["live"] and old["lease_worker_id"] == args.get(
            "worker_id") and args.get("generation") in (old["lease_generation"], None)
        if old is not None and not holds:
            new = runs_after.get(key)
            assert new is not None
            assert (new["whole"], new["marks"]) == (old["whole"], old["marks"]), (
                f"{where} wrote with a lease it does not hold")
    # 3. Admission: K bounds the live slotted leases, and every one is named by its slot.
    limits = Counter[tuple[str, str, str]]()
    for (tenant, wskey, deployment, number) in after["slots"]:
        limits[(tenant, wskey, deployment)] = max(limits[(tenant, wskey, deployment)], number)
    live = Counter[tuple[str, str, str]]()
    for (tenant, wskey, run_id), row in runs_after.items():
        if row["admission_slot"] is not None and row["live"]:
            live[(tenant, wskey, row["deployment_ref"])] += 1
            slot = after["slots"].get((tenant, wskey, row["deployment_ref"],
                                       row["admission_slot"]))
            assert slot == (run_id, row["lease_generation"]), (
                f"{where}: run {run_id} holds a live lease in a slot that does not name it")
    for scope, count in live.items():
        assert count <= limits[scope], f"{where}: {count} live leases in {scope}, K {limits}"
    # 4. Scope: nothing else changed; nothing of another scope came back. The multi-scope
    # claims (claim_and_start_scopes, claim_orphaned_scopes, sql/README.md) serve many scopes
    # by design, as the fleet-wide zeroth_worker role may: their guarantees are the lease and
    # slot checks above, not a single scope.
    if function.name.endswith("_scopes"):
        return
    # register_deployment writes the global registry of deployments (zeroth.deployments and its
    # audit log: no scope) by design; its guarantees — another login's registration and a DBA's
    # setting are kept — are tests/adversarial/test_registry_and_admin_attacks.py's.
    global_rows = GLOBAL_WRITES.get(function.name, frozenset())
    call_scope = scope_key(args.get("tenant_id"), args.get("workspace_id"))
    changed = {k for k in after["checksums"].keys() | before["checksums"].keys()
               if after["checksums"].get(k) != before["checksums"].get(k)}
    foreign = {k for k in changed if (k[1], k[2]) != call_scope and k[0] not in global_rows}
    assert not foreign, f"{where} changed rows outside its scope: {sorted(foreign, key=str)}"
    if isinstance(result, list):
        given_ids = {v for v in args.values() if isinstance(v, UUID)} | {
            v for value in args.values() if isinstance(value, list) for v in value}
        owners = {run_id: (t, w) for (t, w, run_id) in runs_after}
        leaked = {u for u in set(_uuids(result)) - given_ids
                  if u in owners and owners[u] != call_scope}
        assert not leaked, f"{where} returned runs of another scope: {leaked}"


@pytest.fixture
def hostile(pg_server_dsn: str, database_dsn: str) -> Iterator[Hostile]:
    with login_role(pg_server_dsn, "zeroth_worker") as (role, _password):
        connection = Hostile(database_dsn, role)
        try:
            yield connection
        finally:
            connection.close()


EXAMPLES_PER_FUNCTION = 15
#: The target functions are split into this many tests (each target in one, with all its
#: examples; the calls before it are drawn from every function), which a parallel run spreads.
SHARDS = 8


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda s: f"targets-{s + 1}-of-{SHARDS}")
def test_a_hostile_worker_member_cannot_break_the_promises(hostile: Hostile, shard: int) -> None:
    """Per function, sequences of a few calls of anything that end with a call of it, so
    every function is attacked after the state was stirred (and on the seed as it is)."""
    functions = sorted(hostile.functions.values(), key=lambda f: f.name)
    assert len(functions) >= 30
    # Each function's strategy built once (flatmap would build every pool again for each draw).
    calls = {f.name: arguments(f, hostile.seed).map(lambda a, f=f: (f, a)) for f in functions}
    anything = st.sampled_from(functions).flatmap(lambda f: calls[f.name])
    failures = []
    targets = functions[shard::SHARDS]
    assert targets, f"no target functions in shard {shard + 1} of {SHARDS}"
    for target in targets:
        steps = st.tuples(st.lists(anything, max_size=3), calls[target.name])

        @given(steps)
        @property_settings(ci_examples=EXAMPLES_PER_FUNCTION)
        def search(drawn: tuple[list[tuple[Function, dict[str, Any]]],
                                tuple[Function, dict[str, Any]]]) -> None:
            prefix, last = drawn
            transaction = hostile.conn.transaction()
            hostile.run(transaction.start())
            try:
                before = hostile.state()
                for function, args in [*prefix, last]:
                    result = hostile.call(function, args)
                    after = hostile.state()
                    outcome = result if isinstance(result, str) else "ok"
                    hostile.figures[f"{function.name}:{outcome}"] += 1
                    assert result != "42501", f"the worker role may run {function.name}"
                    if isinstance(result, str):  # an error: documented, and nothing changed
                        assert result in function.documented, (function.name, args, result)
                        assert after["checksums"] == before["checksums"], (function.name, args)
                    check(hostile, function, args, result, before, after)
                    before = after
            finally:
                hostile.run(transaction.rollback())

        try:
            search()
        except AssertionError as exc:  # report every function that broke, not just the first
            failures.append(f"{target.name}: {exc}")
    save_report(f"adversarial_hostile_caller.{shard + 1}-of-{SHARDS}",
                dict(sorted(hostile.figures.items())))
    assert not failures, "\n".join(failures)
