"""The public SQL API as the catalog describes it, and whole-row checksums of every table by
scope: shared by the tiers that call every function with generated arguments (tests/fuzz, the
hostile caller of tests/adversarial). Functions added by later migrations are covered without
touching this file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # format_type(), e.g. "text", "bigint", "uuid[]", "timestamp with time zone"
    has_default: bool
    labels: tuple[str, ...]  # enum labels, when the type is an enum


@dataclass(frozen=True)
class Function:
    name: str
    signature: str
    parameters: tuple[Parameter, ...]
    returns_scalar: bool  # a base type, one row: the "reports nothing" check applies
    documented: frozenset[str]  # SQLSTATEs it may raise

    def has(self, name: str) -> bool:
        return any(p.name == name for p in self.parameters)


CATALOG_SQL = r"""
SELECT p.oid::regprocedure::text AS signature, p.proname AS name, p.pronargs, p.pronargdefaults,
       coalesce(p.proargnames, '{}') AS names, coalesce(p.proargmodes::text[], '{}') AS modes,
       array(SELECT format_type(a.t, NULL) FROM unnest(p.proargtypes) WITH ORDINALITY a(t, i)
              ORDER BY a.i) AS types,
       array(SELECT coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                FROM pg_enum e WHERE e.enumtypid = a.t), '')
               FROM unnest(p.proargtypes) WITH ORDINALITY a(t, i) ORDER BY a.i) AS labels,
       NOT p.proretset AND rt.typtype = 'b' AS returns_scalar,
       coalesce(obj_description(p.oid, 'pg_proc'), '') AS comment
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_type rt ON rt.oid = p.prorettype
 WHERE n.nspname = 'zeroth' AND p.proname !~ '^_' AND p.prokind = 'f'
   AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
 ORDER BY 1"""


def function_from_row(row: asyncpg.Record) -> Function:
    names = list(row["names"])
    if row["modes"]:  # OUT and TABLE columns are not arguments
        names = [n for n, m in zip(names, row["modes"], strict=True) if m in ("i", "b", "v")]
    first_default = row["pronargs"] - row["pronargdefaults"]
    parameters = tuple(
        Parameter(name, type_, i >= first_default, tuple(filter(None, labels.split(","))))
        for i, (name, type_, labels) in enumerate(
            zip(names, row["types"], row["labels"], strict=True)))
    return Function(row["name"], row["signature"], parameters, row["returns_scalar"],
                    frozenset(re.findall(r"ZP\d{3}", row["comment"])) | {"ZP008"})


async def checksum_sql(conn: asyncpg.Connection) -> str:
    """One query: a checksum of whole rows per (table, tenant, workspace) for every table of
    schema zeroth (tables added by later migrations included). A table without a tenant column
    is one group (tenant and workspace NULL).

    The checksum of a group is a checksum of the multiset of its rows (as text): their count and
    the sum of a 64-bit hash of each, so no sort is needed. Two states of a group get the same
    checksum only when they hold the same rows (or by a 64-bit hash coincidence). It is called
    before and after every call of the fuzz and hostile-caller searches: the 17,408 static rows
    of zeroth.lock_stripes (unused since 0009, dropped in 0024) made a sorted string_agg of every
    group cost most of each example, and then, summed, still 97% of each checksum."""
    tables = await conn.fetch(
        """SELECT c.relname, array_agg(a.attname::text) AS columns
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE n.nspname = 'zeroth' AND c.relkind IN ('r', 'p')
            GROUP BY c.relname ORDER BY c.relname""")
    parts = []
    for table in tables:
        columns = set(table["columns"])
        tenant = "t.tenant_id" if "tenant_id" in columns else "NULL::text"
        if "workspace_key" in columns:
            workspace = "t.workspace_key"
        elif "workspace_id" in columns:
            workspace = "zeroth._workspace_key(t.workspace_id)"
        else:
            workspace = "NULL::text"  # the whole tenant
        parts.append(
            f"""SELECT '{table["relname"]}' AS tbl, {tenant} AS tenant_id,
                       {workspace} AS workspace_key,
                       count(*)::text || ':'
                           || sum(hashtextextended(t::text, 0)::numeric)::text AS digest
                  FROM zeroth.{table["relname"]} t GROUP BY 2, 3""")
    return "\nUNION ALL\n".join(parts)


async def checksums(conn: asyncpg.Connection, sql: str) -> dict[tuple[str, str | None, str | None],
                                                                  str]:
    """(table, tenant_id, workspace_key) → md5 of its rows, from :func:`checksum_sql`."""
    return {(r["tbl"], r["tenant_id"], r["workspace_key"]): r["digest"]
            for r in await conn.fetch(sql)}
