"""Least privilege read from the catalog: each role executes, reads and writes only what
sql/README.md ("Roles and grants") grants it, and no role writes any relation directly.
"""

from __future__ import annotations

import pytest
from roles import readme_grants


class TestLeastPrivilege:
    @pytest.mark.parametrize("kind", ["nobody", "reader", "worker"])
    async def test_each_role_has_exactly_its_documented_rights(self, login, admin, kind):
        """The catalog as each hostile role sees it: the functions it may execute and the
        relations it may write are those sql/README.md grants, nothing more (new 0014-0016
        objects included)."""
        hostile = await login(kind)
        name = await hostile.fetchval("SELECT current_user")
        executable = {r["proname"] for r in await admin.fetch(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace "
            "AND has_function_privilege($1, p.oid, 'EXECUTE')", name)}
        writable = {r["relname"] for r in await admin.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace "
            "AND c.relkind IN ('r', 'v', 'p') AND (has_table_privilege($1, c.oid, "
            "'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))", name)}
        readable = {r["relname"] for r in await admin.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace "
            "AND c.relkind IN ('r', 'v', 'p', 'm', 'S') AND has_table_privilege($1, c.oid, "
            "'SELECT')", name)}
        assert writable == set()
        if kind == "nobody":
            assert (executable, readable) == (set(), set())
        elif kind == "worker":
            assert executable <= readme_grants("zeroth_worker"), executable - readme_grants(
                "zeroth_worker")
            assert readable == set()
        else:
            granted = {g.removeprefix("zeroth.") for g in readme_grants("zeroth_reader")}
            assert executable <= granted, executable - granted
            assert readable <= granted, readable - granted
            assert not any(n.startswith("_") for n in executable)
