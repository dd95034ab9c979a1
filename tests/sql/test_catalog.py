"""The catalog agrees with the docs and the Python mirror: function comments, the run_status enum,
the ZP SQLSTATE table, enum-typed index predicates, and SECURITY DEFINER hygiene."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg
import pytest

import zeroth_pg
import zeroth_pg.errors
from zeroth_pg import migrate

ROOT = Path(__file__).resolve().parents[2]
#: The SQL that runs: the migrations (state) and the function files (code).
SQL_SOURCES = migrate.sql_files() + migrate.function_files()
README = (ROOT / "sql" / "README.md").read_text(encoding="utf-8")

PUBLIC_FUNCTIONS = """
    SELECT p.proname, p.oid::regprocedure::text AS signature,
           obj_description(p.oid, 'pg_proc') AS comment
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'zeroth' AND left(p.proname, 1) <> '_'
     ORDER BY p.oid::regprocedure::text"""


def raised_sqlstates() -> set[str]:
    codes: set[str] = set()
    for path in SQL_SOURCES:
        codes |= set(re.findall(r"ERRCODE = '(ZP[0-9A-Z]{3})'", path.read_text(encoding="utf-8")))
    return codes


def readme_sqlstates() -> set[str]:
    return set(re.findall(r"^\|\s*(ZP[0-9A-Z]{3})\s*\|", README, flags=re.MULTILINE))


def readme_functions() -> set[str]:
    section = README.split("## Public functions", 1)[1]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([a-z_0-9]+)`", first_cell))
    return names


def error_classes() -> dict[str, type[zeroth_pg.errors.ZerothError]]:
    classes = {}
    for name in zeroth_pg.errors.__all__:
        cls = getattr(zeroth_pg.errors, name)
        if isinstance(cls, type) and issubclass(cls, zeroth_pg.errors.ZerothError) \
                and cls.sqlstate is not None:
            classes[cls.sqlstate] = cls
    return classes


class TestFunctionComments:
    async def test_every_public_function_has_a_comment_naming_it(self, conn):
        functions = await conn.fetch(PUBLIC_FUNCTIONS)
        assert functions, "no public functions found in schema zeroth"
        missing = [f["signature"] for f in functions if not (f["comment"] or "").strip()]
        assert missing == []
        unnamed = [f["signature"] for f in functions
                   if not f["comment"].startswith(f"{f['proname']}:")]
        assert unnamed == []

    async def test_public_functions_are_exactly_those_in_the_readme_table(self, conn):
        in_catalog = {f["proname"] for f in await conn.fetch(PUBLIC_FUNCTIONS)}
        assert in_catalog == readme_functions()


class TestRunStatusEnum:
    async def test_python_run_status_equals_the_sql_enum_in_order(self, conn):
        labels = await conn.fetchval("SELECT enum_range(NULL::zeroth.run_status)::text[]")
        assert [status.value for status in zeroth_pg.RunStatus] == labels


class TestSqlStates:
    def test_migrations_raise_zp_codes(self):
        # Guards the regex: an empty set would make the checks below vacuous.
        assert {"ZP001", "ZP006", "ZP008"} <= raised_sqlstates()

    def test_every_raised_code_is_in_the_readme_table(self):
        assert raised_sqlstates() - readme_sqlstates() == set()

    def test_every_raised_code_has_an_error_class(self):
        assert raised_sqlstates() - set(error_classes()) == set()

    def test_readme_table_and_error_classes_list_the_same_codes(self):
        assert readme_sqlstates() == set(error_classes())

    @pytest.mark.parametrize("code", sorted(readme_sqlstates()))
    async def test_translate_maps_a_real_server_error_to_its_class(self, conn, code):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.execute(
                    f"DO $$ BEGIN RAISE EXCEPTION 'probe' USING ERRCODE = '{code}'; END $$")
        assert caught.value.sqlstate == code
        translated = zeroth_pg.errors.translate(caught.value)
        assert type(translated) is error_classes()[code]

    async def test_a_function_error_translates_to_invalid_argument(self, conn):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => '')")
        assert isinstance(zeroth_pg.errors.translate(caught.value),
                          zeroth_pg.InvalidArgumentError)


class TestIndexPredicates:
    async def _partial_indexes(self, conn: asyncpg.Connection) -> dict[str, str]:
        rows = await conn.fetch(
            """SELECT i.indexrelid::regclass::text AS name, pg_get_indexdef(i.indexrelid) AS def
                 FROM pg_index i
                WHERE i.indrelid = 'zeroth.runs'::regclass AND i.indpred IS NOT NULL""")
        return {row["name"]: row["def"] for row in rows}

    async def test_claim_index_predicate_uses_the_stored_enum_value(self, conn):
        indexes = await self._partial_indexes(conn)
        assert "'pending'::zeroth.run_status" in indexes["zeroth.runs_claim_pending_idx"]
        assert "'running'::zeroth.run_status" in indexes["zeroth.runs_running_idx"]

    async def test_every_status_predicate_compares_with_enum_labels(self, conn):
        # Upstream's index compared status with the lowercase string of an uppercase value and
        # never matched; here a status literal must be a label of the enum itself.
        labels = set(await conn.fetchval("SELECT enum_range(NULL::zeroth.run_status)::text[]"))
        status_indexes = {name: definition
                          for name, definition in (await self._partial_indexes(conn)).items()
                          if "status" in definition.split(" WHERE ", 1)[1]}
        assert status_indexes
        for name, definition in status_indexes.items():
            predicate = definition.split(" WHERE ", 1)[1]
            literals = re.findall(r"'([^']*)'::([a-z_.]+)", predicate)
            assert literals, name
            for value, type_name in literals:
                assert (type_name, value in labels) == ("zeroth.run_status", True), name


class TestSecurity:
    async def test_no_security_definer_function_without_a_pinned_search_path(self, conn):
        rows = await conn.fetch(
            """SELECT p.oid::regprocedure::text AS signature, p.proconfig
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'zeroth' AND p.prosecdef""")
        unpinned = [row["signature"] for row in rows
                    if not any(setting.startswith("search_path=")
                               for setting in row["proconfig"] or [])]
        assert unpinned == []


class TestJit:
    """A function that turns a plan node off turns JIT off too (issue 35). Before PostgreSQL 18
    the planner costs a disabled node that a statement cannot avoid at 1e10 (disable_cost), far
    above ``jit_above_cost``, so where the server has JIT (LLVM: Debian's and PGDG's packages, jit
    on by default) every execution of such a statement was JIT-compiled, inlining and optimizing
    included: renew_leases, settle_runs and complete_and_claim took 0.3-1.8 s each in the HA soak
    on PostgreSQL 15 (docs/performance.md, "JIT"). PostgreSQL 18 counts disabled nodes instead."""

    async def test_every_function_that_turns_a_plan_node_off_turns_jit_off(self, conn):
        rows = await conn.fetch(
            r"""SELECT p.oid::regprocedure::text AS signature, p.proconfig
                  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'zeroth'
                   AND EXISTS (SELECT 1 FROM unnest(p.proconfig) c
                                WHERE c ~* '^enable_[a-z_]+=(off|false|no|0)$')""")
        signatures = {row["signature"].split("(")[0] for row in rows}
        assert {"zeroth.renew_leases", "zeroth._settle"} <= signatures
        # (A boolean setting is stored as written: off, false, no or 0 all turn it off.)
        assert [row["signature"] for row in rows
                if not {"jit=off", "jit=false", "jit=no", "jit=0"} & set(row["proconfig"])] == []

    async def test_an_unavoidable_disabled_node_costs_more_than_jit_above_cost_before_18(
            self, conn):
        # renew_leases' lock: a LATERAL row lock per requested run, which only a nested loop does.
        async with conn.transaction():
            await conn.execute("SET LOCAL enable_nestloop = off")
            plan = await conn.fetchval(
                "EXPLAIN (FORMAT JSON) SELECT count(*) FROM unnest('{}'::uuid[]) AS q(run_id)"
                " CROSS JOIN LATERAL (SELECT r.run_id FROM zeroth.runs r"
                " WHERE r.run_id = q.run_id FOR UPDATE OF r SKIP LOCKED) AS l")
            threshold = float(await conn.fetchval("SELECT current_setting('jit_above_cost')"))
        cost = json.loads(plan)[0]["Plan"]["Total Cost"]
        if conn.get_server_version().major < 18:
            assert cost > threshold
        else:
            assert cost < threshold
