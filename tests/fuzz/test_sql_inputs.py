"""Bad input: every public zeroth.* function, found in the catalog at test time (so functions
added by later migrations are covered without touching this file), is called with
hypothesis-generated arguments — NULL, empty and 10,000-character strings, SQL and dollar-quote
injection, over-long identifiers, integer bounds, negative and huge generations, NaN and
infinite durations, ±infinity timestamps, unknown and foreign uuids, another tenant's real run
ids and leases — against a database seeded with runs in every status in three scopes.

Arguments are typed parameters (``name => $n::type``), so each value reaches the function
itself; a malformed literal cast by the caller (22P02 on ``'x'::uuid``) is the caller's error and
is not what this tests. Most examples start from a valid call on a real lease and spoil a few of
its arguments, so the checks run deep inside the functions, not only at their first guard.

For every call:

* an error carries a SQLSTATE the function documents — the ZP codes its COMMENT ON FUNCTION
  names, plus ZP008 (every function, sql/README.md); never XX000, 42601, 42P01, 42883, a 23xxx
  constraint violation, or 57014 (the statement_timeout: one argument made it run away);
* an error leaves every row of every zeroth table as it was (checksums of whole rows);
* a call in scope (tenant, workspace) changes rows of that scope only, and every uuid it returns
  is one it was given or one of that scope — no cross-tenant write or read;
* a scalar function given a run_id that does not exist in its scope reports nothing (NULL,
  false, 'unknown' or ZP001) and changes nothing.

Each example runs inside a transaction that is rolled back, so every call sees the same seed.

The Python client gets the same treatment: every ``LeaseManager`` coroutine method is called with
ill-typed Python values and must either succeed or raise a non-retryable ``ZerothError``.

CI runs a few dozen examples per function; ZEROTH_PG_HYPOTHESIS_EXAMPLES asks for more.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import asyncpg
import pytest
from catalog import CATALOG_SQL, Function, Parameter, checksum_sql, checksums, function_from_row
from helpers import T0, BlockingConnection, make_run, property_settings, save_report
from hypothesis import given
from hypothesis import strategies as st

from zeroth_pg import LeaseManager
from zeroth_pg.errors import ZerothError

T = TypeVar("T")

# Scopes of the seed: (tenant_id argument, workspace_id argument).
SCOPES = ((None, None), ("tenant-a", None), ("tenant-b", "ws-b"))
WORKER = "worker-a"
DEPLOYMENT = "deploy-a"
LIVE = T0 + timedelta(seconds=30)  # inside every seed lease
EXPIRED = T0 + timedelta(seconds=1000)  # after every seed lease
STATEMENT_TIMEOUT = "5s"

# Known SQL bugs (reported; each has a regression test in tests/fuzz/test_input_regressions.py).
# The fuzz does not send these inputs while a bug is open: add an entry with its regression test,
# delete it when the fix lands.
KNOWN_BUGS: dict[str, Callable[[str, dict[str, Any]], bool]] = {}
NON_FINITE = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


def _idempotency_keys(args: dict[str, Any]) -> Iterator[str]:
    if isinstance(args.get("idempotency_key"), str):
        yield args["idempotency_key"]
    try:
        items = json.loads(args.get("runs") or "null")
    except ValueError:
        return
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("idempotency_key"), str):
            yield item["idempotency_key"]


# ---------------------------------------------------------------------------------------------
# The catalog


# ---------------------------------------------------------------------------------------------
# Argument strategies

_rng = random.Random(1058)
NOISE_10K = "".join(chr(_rng.choice([_rng.randint(0x21, 0x7E), _rng.randint(0xA1, 0x2FFF)]))
                    for _ in range(10_000))
NASTY_TEXT = [
    "", " ", "'", "''", '"', "\\", "$$", "$x$ $$ $x$", "'; DROP TABLE zeroth.runs; --",
    "\"; DROP SCHEMA zeroth CASCADE; --", "%s %I %L", "{}", "null", "NULL", "default",
    "a" * 63, "b" * 64, "c" * 200, "d" * 201, "e" * 10_000, NOISE_10K, "ü ☃ 😀", "\t\r\n",
    "tenant-a", "tenant-b", "ws-b", WORKER, "worker-b", DEPLOYMENT,
]
# What a text argument's name says about it: values the seed uses, so spoiled calls hit rows.
TEXT_BY_NAME = {
    "tenant_id": ["tenant-a", "tenant-b", "default", "TENANT-A", "tenant-a "],
    "workspace_id": ["ws-b", "WS-B", ""],
    "worker_id": [WORKER, "worker-b"],
    "deployment_ref": [DEPLOYMENT, "deploy-b"],
    "action": ["cancel", "interrupt", "rollback", "CANCEL"],
}
INT4 = (-(2**31), 2**31 - 1)
INT8 = (-(2**63), 2**63 - 1)
PROTECTED_SPELLINGS = ["status", "Lease_Generation", " lease_worker_id", '"status"', "`run_id`",
                       "'tenant_id'", "payload", "updated_at", "output", "metadata", "progress",
                       "error", "outputs", "output; DROP TABLE zeroth.runs", ""]
RUNS_ITEM_KEYS = ["payload", "priority", "run_after", "max_attempts", "idempotency_key",
                  "metadata", "run_id", "thread_id", "status", "lease_generation"]


def _pick(values: list[T]) -> st.SearchStrategy[T]:
    """sampled_from, without a 10 kB string in the strategy's repr."""
    return st.integers(0, len(values) - 1).map(values.__getitem__)


# PostgreSQL text cannot hold NUL (nor jsonb a \u0000 escape): the server refuses such a
# parameter before any function runs, so it is never generated.
CHARACTERS = st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False), _pick(NASTY_TEXT),
    st.text(alphabet=CHARACTERS, max_size=30),
    st.sampled_from(["infinity", "-infinity", "2030-01-01T00:00:00Z", "not a date",
                     "00000000-0000-0000-0000-000000000000", "not-a-uuid", "1e400"]))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        _pick(NASTY_TEXT[:20]) | st.text(alphabet=CHARACTERS, max_size=10), inner, max_size=4),
    max_leaves=12)


def _json(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    return strategy.map(lambda value: json.dumps(value, allow_nan=False))


JSON_BY_NAME = {
    "columns": _json(st.dictionaries(st.sampled_from(PROTECTED_SPELLINGS), json_values,
                                     max_size=3) | json_values),
    "runs": _json(st.lists(st.dictionaries(st.sampled_from(RUNS_ITEM_KEYS), json_values,
                                           max_size=4) | json_values, max_size=4)
                  | json_values),
}


def text_strategy(name: str) -> st.SearchStrategy[str | None]:
    return st.one_of(
        st.none(), _pick(TEXT_BY_NAME.get(name, []) + NASTY_TEXT),
        st.text(alphabet=CHARACTERS, max_size=300))


def integer_strategy(bounds: tuple[int, int], known: list[int]) -> st.SearchStrategy[int | None]:
    low, high = bounds
    edges = [0, 1, -1, 2, low, high, low + 1, high - 1, 999, 1000, 1001, 10_000, 2**31, *known]
    return st.one_of(st.none(), st.integers(-2, 2),
                     st.sampled_from([e for e in edges if low <= e <= high]),
                     st.integers(low, high))


FLOATS = st.none() | st.sampled_from(
    [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-9, 1e308, -1.0, 1.0, 60.0, 86400.0,
     86400.000001, 2_592_000.0, 2_592_001.0]) | st.floats()
# datetime.min/max with a timezone are how asyncpg spells -infinity/infinity.
TIMESTAMPS = st.none() | st.sampled_from(
    [*NON_FINITE, datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC),
     T0, LIVE, EXPIRED]) | st.datetimes(timezones=st.just(UTC))


@dataclass(frozen=True)
class Seed:
    """What the seeded database holds, for strategies and checks."""

    runs: dict[UUID, tuple[str, str]]  # run_id -> scope key (tenant_id, workspace_key)
    checkpoints: list[UUID]
    leases: list[dict[str, Any]]  # a valid call's arguments: run, worker, generation, scope
    generations: list[int]


def typed_strategy(parameter: Parameter, seed: Seed) -> st.SearchStrategy[Any] | None:
    """Anything a caller could pass for this parameter, biased toward trouble; None for a type
    this file does not know (such a parameter gets NULL only, and the report lists it)."""
    uuids = st.none() | st.sampled_from(
        [*seed.runs, *seed.checkpoints, UUID(int=0), UUID(int=2**128 - 1)]) | st.uuids()
    by_type: dict[str, st.SearchStrategy[Any]] = {
        "text": text_strategy(parameter.name),
        "uuid": uuids,
        "bigint": integer_strategy(INT8, seed.generations),
        "integer": integer_strategy(INT4, []),
        "smallint": integer_strategy((-(2**15), 2**15 - 1), []),
        "double precision": FLOATS,
        "boolean": st.none() | st.booleans(),
        "timestamp with time zone": TIMESTAMPS,
        "interval": st.none() | st.timedeltas(),
        "jsonb": st.none() | JSON_BY_NAME.get(parameter.name, _json(json_values)),
        "json": st.none() | _json(json_values),
        "uuid[]": st.none() | st.lists(uuids, max_size=5),
        "bigint[]": st.none() | st.lists(integer_strategy(INT8, seed.generations), max_size=5),
        "integer[]": st.none() | st.lists(integer_strategy(INT4, []), max_size=5),
        "text[]": st.none() | st.lists(text_strategy(parameter.name), max_size=5),
    }
    if parameter.labels:
        return st.none() | st.sampled_from(parameter.labels)
    return by_type.get(parameter.type)


# A valid value for each argument name the functions use; a seed lease adds run_id, worker_id,
# generation, scope and clock.
VALID_ARGUMENTS: dict[str, Any] = {
    "deployment_ref": DEPLOYMENT, "lease_seconds": 60.0, "batch_size": 2, "claim_limit": 2,
    "max_attempts": 3, "priority": 0, "retryable": True, "retry_base_seconds": 1.0,
    "retry_max_seconds": 300.0, "reason": "approval", "action": "cancel",
    "payload": '{"k": 1}', "metadata": "{}", "data": '{"step": 2}',
    "columns": '{"output": {"ok": true}}', "output": '{"ok": true}', "error": '{"e": 1}',
    "input": '{"approved": true}', "runs": '[{"payload": {}}, {"priority": 1}]',
    "idempotency_key": "key-1", "thread_id": "thread-1", "older_than": timedelta(days=1),
}


def arguments(function: Function, seed: Seed) -> st.SearchStrategy[dict[str, Any]]:
    """A valid call on a real lease with a few arguments spoiled (often none or one, so the
    checks reach deep into the function), some optional ones left to their defaults."""
    names = [p.name for p in function.parameters]
    # Built once per function, not once per drawn argument: building every type's strategy for
    # each draw was a third of this tier's CPU; the same strategies draw the same examples.
    typed = {p.name: st.none() if (strategy := typed_strategy(p, seed)) is None else strategy
             for p in function.parameters}

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        base = {**VALID_ARGUMENTS, **draw(st.sampled_from(seed.leases))}
        spoiled = set(draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
                      if names else [])
        args: dict[str, Any] = {}
        for parameter in function.parameters:
            if parameter.has_default and draw(st.integers(0, 5)) == 0:
                continue  # left to its default
            if parameter.name in base and parameter.name not in spoiled:
                args[parameter.name] = base[parameter.name]
            else:
                args[parameter.name] = draw(typed[parameter.name])
        return args

    return build()


# ---------------------------------------------------------------------------------------------
# The database side


def workspace_key(workspace_id: str | None) -> str:
    return "" if workspace_id is None else f"w:{workspace_id}"


# Documented exceptions to "scope fails closed": with tenant_id NULL these act on every tenant.
EVERY_TENANT_WHEN_NULL = {"prune_runs"}  # a DBA function (its header comment says so)


def call_scope(function: Function, args: dict[str, Any]) -> tuple[str | None, str] | None:
    """The (tenant_id, workspace_key) a call may touch — tenant None: none at all — or None
    when the function takes no scope (zeroth._scope_tenant's rule)."""
    tenant_id, workspace_id = args.get("tenant_id"), args.get("workspace_id")
    if not function.has("tenant_id") or (
            tenant_id is None and function.name in EVERY_TENANT_WHEN_NULL):
        return None
    if tenant_id is None and workspace_id is not None:
        return None, ""
    return ("default" if tenant_id is None else tenant_id), workspace_key(workspace_id)


class Fuzzer(BlockingConnection):
    """The seeded database, its catalog, and the checks around one call."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, server_settings={"statement_timeout": STATEMENT_TIMEOUT})
        self.functions = [function_from_row(r) for r in self.run(self.conn.fetch(CATALOG_SQL))]
        self.checksum_sql = self.run(checksum_sql(self.conn))
        self.seed = self.run(self._seed())
        self.baseline = self.run(self._checksums())
        self.figures: Counter[str] = Counter()

    async def _checksums(self) -> dict[tuple[str, str | None, str | None], str]:
        return await checksums(self.conn, self.checksum_sql)

    async def _seed(self) -> Seed:
        """Runs in every status in each scope, held by WORKER (generation 1) where leased, and an
        orphan claimed under max_concurrency. Live leases appear several times among the seed's
        valid calls, so spoiling a few arguments of one still often reaches a fenced write."""
        leases: list[dict[str, Any]] = []
        weights = {"claimed": 2, "running": 3}
        for tenant_id, workspace_id in SCOPES:
            scope = {"tenant_id": tenant_id, "workspace_id": workspace_id}
            for status in ("pending", "claimed", "running", "waiting", "completed", "failed",
                           "cancelled", "orphan"):
                lease = await make_run(
                    self.conn, "running" if status == "orphan" else status, worker_id=WORKER,
                    **scope, **({"max_concurrency": 2, "lease_seconds": 1}
                                if status == "orphan" else {}))
                leases += [{**scope, "run_id": lease.run_id, "worker_id": WORKER,
                            "generation": lease.generation, "run_ids": [lease.run_id],
                            "generations": [lease.generation], "max_concurrency": 2,
                            "now_override": EXPIRED if status == "orphan" else LIVE}
                           ] * weights.get(status, 1)
                if status == "running":
                    await self.conn.execute(
                        """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                               generation => $3, data => '{"step": 1}', tenant_id => $4,
                               workspace_id => $5, now_override => $6)""",
                        lease.run_id, WORKER, lease.generation, tenant_id, workspace_id, LIVE)
        runs = {r["run_id"]: (r["tenant_id"], r["workspace_key"]) for r in await self.conn.fetch(
            "SELECT r.run_id, r.tenant_id, r.workspace_key FROM zeroth.runs r")}
        checkpoints = [r["checkpoint_id"] for r in await self.conn.fetch(
            "SELECT k.checkpoint_id FROM zeroth.checkpoints k")]
        return Seed(runs, checkpoints, leases, sorted({1, 2, *(x["generation"] for x in leases)}))

    async def _ids_by_scope(self) -> dict[UUID, set[tuple[str, str]]]:
        ids: dict[UUID, set[tuple[str, str]]] = {}
        for row in await self.conn.fetch(
                """SELECT r.run_id AS id, r.tenant_id, r.workspace_key FROM zeroth.runs r
                   UNION ALL
                   SELECT k.checkpoint_id, k.tenant_id, k.workspace_key
                     FROM zeroth.checkpoints k"""):
            ids.setdefault(row["id"], set()).add((row["tenant_id"], row["workspace_key"]))
        return ids

    def check_call(self, function: Function, args: dict[str, Any]) -> None:
        self.run(self._check_call(function, args))

    async def _check_call(self, function: Function, args: dict[str, Any]) -> None:
        types = {p.name: p.type for p in function.parameters}
        named = ", ".join(f"{name} => ${i}::{types[name]}" for i, name in enumerate(args, start=1))
        sql = f"SELECT * FROM zeroth.{function.name}({named})"
        where = f"zeroth.{function.name}({args!r:.2000})"
        scope = call_scope(function, args)
        transaction = self.conn.transaction()
        await transaction.start()
        try:
            error: asyncpg.PostgresError | None = None
            try:
                async with self.conn.transaction():
                    rows = await self.conn.fetch(sql, *args.values())
            except asyncpg.PostgresError as exc:
                error = exc
            if error is None:
                self.figures[f"{function.name}: {_outcome(function, rows)}"] += 1
                await self._check_success(function, args, rows, scope, where)
                return
            self.figures[f"{function.name}: {error.sqlstate}"] += 1
            assert "invalid input for query argument" not in str(error), (
                f"the fuzz generated a value asyncpg cannot send: {error}")
            assert error.sqlstate in function.documented, (
                f"{where} raised {error.sqlstate} ({error}), not one of its documented "
                f"{sorted(function.documented)}")
            assert await self._checksums() == self.baseline, f"{where} failed but wrote"
        finally:
            await transaction.rollback()

    async def _check_success(self, function: Function, args: dict[str, Any],
                             rows: list[asyncpg.Record], scope: tuple[str | None, str] | None,
                             where: str) -> None:
        after = await self._checksums()
        changed = {k for k in after.keys() | self.baseline.keys()
                   if after.get(k) != self.baseline.get(k)}
        if scope is not None:
            foreign = {k for k in changed if k[1] is not None
                       and (k[1] != scope[0] or k[2] not in (None, scope[1]))}
            assert not foreign, f"{where} wrote outside its scope {scope}: {sorted(foreign)}"
            self.figures["unscoped table rows changed"] += len(
                {k for k in changed if k[1] is None})
            returned = {v for v in _leaves(rows) if isinstance(v, UUID)}
            given_ids = {v for v in _leaves(list(args.values())) if isinstance(v, UUID)}
            ids = await self._ids_by_scope() if returned - given_ids else {}
            leaked = {v for v in returned - given_ids
                      if v in ids and (scope[0], scope[1]) not in ids[v]}
            assert not leaked, f"{where} returned ids of another scope: {leaked}"
            run_id = args.get("run_id")
            # run_finished_key and run_events_key are pure functions of (scope, run id): they
            # read no run, so their answer says nothing about whether the run exists
            # (tests/adversarial).
            if (function.returns_scalar and isinstance(run_id, UUID)
                    and function.name not in ("run_finished_key", "run_events_key")
                    and (scope[0], scope[1]) != self.seed.runs.get(run_id)):
                value = rows[0][0]
                assert value in (None, False, "unknown"), (
                    f"{where}: run {run_id} is not in scope {scope}, yet it returned {value!r}")
                assert not changed, f"{where}: run not in scope, yet rows changed: {changed}"


def _outcome(function: Function, rows: list[asyncpg.Record]) -> str:
    """A short name for a successful call's result, for the report."""
    if function.returns_scalar and len(rows) == 1:
        value = rows[0][0]
        if value is None or isinstance(value, bool) or (isinstance(value, str) and len(value) < 30):
            return f"returned {value!r}"
        return "returned a value"
    return f"returned {len(rows)} rows"


def _leaves(data: Any) -> Iterator[Any]:
    """Every leaf value of nested rows, lists and tuples."""
    if isinstance(data, asyncpg.Record):
        data = tuple(data.values())
    if isinstance(data, list | tuple):
        for item in data:
            yield from _leaves(item)
    else:
        yield data


# ---------------------------------------------------------------------------------------------
# Tests


def fuzz_each(items: Iterable[T], strategy: Callable[[T], st.SearchStrategy[Any]],
              check: Callable[[T, Any], None], label: Callable[[T], str]) -> None:
    """Run a hypothesis search per item; report every item that failed, not just the first."""
    def search_for(item: T) -> Callable[[], None]:
        @property_settings(ci_examples=EXAMPLES_PER_FUNCTION)
        @given(drawn=strategy(item))
        def search(drawn: Any) -> None:
            check(item, drawn)

        return search  # type: ignore[no-any-return]

    failures: list[str] = []
    for item in items:
        try:
            search_for(item)()
        except Exception as exc:  # collected, reported together below
            for error in exc.exceptions if isinstance(exc, ExceptionGroup) else [exc]:
                notes = "\n".join(getattr(error, "__notes__", []))
                failures.append(f"{label(item)}: {type(error).__name__}: {error}\n{notes}")
    assert not failures, "\n\n".join(failures)


EXAMPLES_PER_FUNCTION = 40
#: The functions are split into this many tests (each function in one, with all its examples),
#: which a parallel run spreads over its workers.
SHARDS = 4


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda s: f"functions-{s + 1}-of-{SHARDS}")
def test_every_public_function_survives_bad_input(database_dsn: str, shard: int) -> None:
    fuzzer = Fuzzer(database_dsn)
    try:
        assert fuzzer.functions, "no public functions found in schema zeroth"
        functions = sorted(fuzzer.functions, key=lambda f: f.signature)[shard::SHARDS]
        assert functions, f"no public functions in shard {shard + 1} of {SHARDS}"

        def check(function: Function, args: dict[str, Any]) -> None:
            held_back = [bug for bug, known in KNOWN_BUGS.items() if known(function.name, args)]
            if held_back:
                fuzzer.figures[f"held back (known bug): {held_back[0]}"] += 1
            else:
                fuzzer.check_call(function, args)

        try:
            fuzz_each(functions, lambda f: arguments(f, fuzzer.seed), check,
                      lambda f: f.signature)
        finally:
            save_report(f"fuzz_sql_inputs.{shard + 1}-of-{SHARDS}", {
                "functions": [f.signature for f in functions],
                "parameters_fuzzed_with_null_only": sorted(
                    f"{f.name}.{p.name} ({p.type})" for f in functions
                    for p in f.parameters if typed_strategy(p, fuzzer.seed) is None),
                "outcomes": dict(sorted(fuzzer.figures.items()))})
    finally:
        fuzzer.close()


# ---------------------------------------------------------------------------------------------
# The Python client

JSON_ARGUMENTS = {"payload", "metadata", "data", "output", "error", "input", "runs"}
PYTHON_GARBAGE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.uuids(),
    _pick(["", "not-a-uuid", "00000000-0000-0000-0000-00000000000g", "e" * 10_000,
           "'; DROP TABLE zeroth.runs; --", "$$", "1", "{}"]),
    st.binary(max_size=4), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(alphabet=CHARACTERS, max_size=3), st.integers(), max_size=2),
    st.sampled_from([object(), {1, 2}, {"k": {1, 2}}, {"k": math.nan}, [object()], (1, 2, 3),
                     datetime.max, timedelta(days=1), math.nan, math.inf, 10**30]))


@dataclass(frozen=True)
class Method:
    name: str
    signature: inspect.Signature


def client_methods() -> list[Method]:
    """Every public coroutine method of LeaseManager (methods added later are covered too)."""
    return [Method(name, inspect.signature(method))
            for name, method in inspect.getmembers(LeaseManager, inspect.iscoroutinefunction)
            if not name.startswith("_")]


def client_arguments(method: Method, seed: Seed) -> st.SearchStrategy[dict[str, Any]]:
    """A valid call of ``method`` on a real lease, with a few arguments replaced by ill-typed
    Python values; ``lease_duration_seconds`` (the manager's) is one of the candidates."""
    parameters = [p for p in method.signature.parameters.values()
                  if p.name not in ("self", "conn")]
    names = [p.name for p in parameters] + ["lease_duration_seconds"]

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        lease = draw(st.sampled_from(seed.leases))
        base = {**{k: json.loads(v) if k in JSON_ARGUMENTS else v
                   for k, v in VALID_ARGUMENTS.items()},
                **lease, "leases": {lease["run_id"]: lease["generation"]},
                "lease_duration_seconds": 60.0}
        spoiled = set(draw(st.lists(st.sampled_from(names), max_size=3, unique=True)))
        args = {"lease_duration_seconds": draw(PYTHON_GARBAGE)
                if "lease_duration_seconds" in spoiled else 60.0}
        for parameter in parameters:
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:  # commit_fenced(**columns)
                args.update(draw(st.dictionaries(_pick(PROTECTED_SPELLINGS), PYTHON_GARBAGE,
                                                 max_size=2))
                            if parameter.name in spoiled else {"output": {"ok": True}})
            elif parameter.name in base and parameter.name not in spoiled:
                args[parameter.name] = base[parameter.name]
            elif parameter.default is not inspect.Parameter.empty and not draw(st.booleans()):
                continue
            else:
                args[parameter.name] = draw(PYTHON_GARBAGE)
        return args

    return build()


@pytest.mark.slow
def test_client_raises_only_its_own_errors_on_bad_arguments(database_dsn: str) -> None:
    """Each LeaseManager method either works or raises a ZerothError that is not retryable:
    never a bare TypeError, ValueError or driver exception, and never "retry me" for a bad
    argument."""
    fuzzer = Fuzzer(database_dsn)
    methods = client_methods()
    outcomes: Counter[str] = Counter()

    async def call(method: Method, args: dict[str, Any]) -> None:
        args = dict(args)
        manager = LeaseManager(fuzzer.conn, lease_duration_seconds=args.pop(
            "lease_duration_seconds"))
        if "conn" in method.signature.parameters:
            args["conn"] = fuzzer.conn
        transaction = fuzzer.conn.transaction()
        await transaction.start()
        error: Exception | None = None
        try:
            await asyncio.wait_for(getattr(manager, method.name)(**args), timeout=30)
        except Exception as exc:
            error = exc
        finally:
            await transaction.rollback()
        outcomes[f"{method.name}: {type(error).__name__ if error else 'ok'}"] += 1
        where = f"{method.name}({args!r:.500})"
        assert error is None or isinstance(error, ZerothError), (
            f"{where} raised {type(error).__name__}, not a ZerothError: {error!r:.300}")
        assert error is None or not error.retryable, f"{where} says retry: {error!r}"

    try:
        assert methods, "LeaseManager has no public coroutine methods"
        try:
            fuzz_each(methods, lambda m: client_arguments(m, fuzzer.seed),
                      lambda m, args: fuzzer.run(call(m, args)),
                      lambda m: f"LeaseManager.{m.name}")
        finally:
            save_report("fuzz_client_inputs", {"methods": [m.name for m in methods],
                                               "outcomes": dict(sorted(outcomes.items()))})
    finally:
        fuzzer.close()
