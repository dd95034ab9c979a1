"""The schema as the catalog holds it, for comparing two databases object by object; and the
released migrations, for installing a database exactly as an older release left it.

``snapshot(dsn)`` lists every object of schema ``zeroth`` with what defines it (function
definitions, owners, ACLs, comments, columns, defaults, constraints, indexes, triggers, policies,
types, view definitions and options, default privileges). Two databases with equal snapshots
behave alike; unlike a dump comparison it does not depend on pg_dump's text.

``install_released(dsn, revision)`` applies the migration files as they were released
(tests/migrations/released/, frozen when the functions moved to sql/functions) up to
``revision`` and stamps alembic there: the state a database of that release is in.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import psycopg

from zeroth_pg import migrate

RELEASED = Path(__file__).parent / "migrations" / "released" / "migrations-0001-0008.tar.gz"

_QUERIES: dict[str, str] = {
    "schema": """
        SELECT n.nspname, pg_get_userbyid(n.nspowner), n.nspacl::text,
               obj_description(n.oid, 'pg_namespace')
          FROM pg_namespace n WHERE n.nspname = 'zeroth'""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), pg_get_userbyid(p.proowner),
               p.proacl::text, obj_description(p.oid, 'pg_proc')
          FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace""",
    "relations": """
        SELECT c.relname, c.relkind::text, pg_get_userbyid(c.relowner), c.relacl::text,
               c.reloptions::text, c.relrowsecurity, c.relforcerowsecurity,
               obj_description(c.oid, 'pg_class'),
               CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END
          FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace
           AND c.relname <> 'alembic_version'
           AND c.relname <> 'alembic_version_pkc'""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated, a.attacl::text,
               col_description(c.oid, a.attnum)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'zeroth'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relname NOT IN ('alembic_version', 'alembic_version_pkc')""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid),
               obj_description(oid, 'pg_constraint')
          FROM pg_constraint WHERE connamespace = 'zeroth'::regnamespace
           AND conrelid::regclass::text <> 'zeroth.alembic_version'""",
    "indexes": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
          FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
         WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relname <> 'alembic_version'""",
    "triggers": """
        SELECT t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text,
               obj_description(t.oid, 'pg_trigger')
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'zeroth'::regnamespace AND NOT t.tgisinternal""",
    "policies": """
        SELECT p.polname, p.polrelid::regclass::text, p.polcmd::text, p.polpermissive,
               array(SELECT pg_get_userbyid(r) FROM unnest(p.polroles) r ORDER BY 1)::text,
               pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid),
               obj_description(p.oid, 'pg_policy')
          FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
         WHERE c.relnamespace = 'zeroth'::regnamespace""",
    "types": """
        SELECT t.typname, t.typtype::text, pg_get_userbyid(t.typowner), t.typacl::text,
               obj_description(t.oid, 'pg_type'),
               array(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid
                      ORDER BY e.enumsortorder)::text
          FROM pg_type t WHERE t.typnamespace = 'zeroth'::regnamespace
           AND t.typname NOT IN ('alembic_version', '_alembic_version')""",
    "default_privileges": """
        SELECT pg_get_userbyid(d.defaclrole), d.defaclnamespace::regnamespace::text,
               d.defaclobjtype::text, d.defaclacl::text
          FROM pg_default_acl d""",
}


#: Tables a migration fills: their row counts are compared (the secret itself is random).
_FILLED_TABLES = ("lock_stripes", "notification_secret")


def snapshot(dsn: str) -> dict[str, list[tuple[object, ...]]]:
    """Every object of schema zeroth and what defines it, per kind, sorted."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = {
            kind: sorted(
                (tuple(row) for row in conn.execute(query).fetchall()),
                key=lambda row: tuple("" if v is None else str(v) for v in row),
            )
            for kind, query in _QUERIES.items()
        }
        present = [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace "
            "AND c.relname = ANY(%s) ORDER BY 1", (list(_FILLED_TABLES),))]
        out["filled_rows"] = [
            (name, conn.execute(f"SELECT count(*) FROM zeroth.{name}".encode()).fetchone())
            for name in present
        ]
    return out


def differences(left: dict[str, list[tuple[object, ...]]],
                right: dict[str, list[tuple[object, ...]]]) -> list[str]:
    """What one snapshot has and the other lacks, one line per object (empty: identical)."""
    lines: list[str] = []
    for kind in left.keys() | right.keys():
        only_left = [row for row in left.get(kind, []) if row not in right.get(kind, [])]
        only_right = [row for row in right.get(kind, []) if row not in left.get(kind, [])]
        lines += [f"{kind}: only in the first: {row[0]!r}: {row!r:.300}" for row in only_left]
        lines += [f"{kind}: only in the second: {row[0]!r}: {row!r:.300}" for row in only_right]
    return lines


def released_files() -> dict[str, str]:
    """The released migration files, ``{"0001_schema.sql": text, ...}``."""
    with tarfile.open(RELEASED) as archive:
        out: dict[str, str] = {}
        for member in archive.getmembers():
            handle = archive.extractfile(member)
            assert handle is not None
            out[member.name] = io.TextIOWrapper(handle, encoding="utf-8").read()
    return dict(sorted(out.items()))


def released_revisions() -> list[str]:
    return [name[:4] for name in released_files()]


def install_released(dsn: str, revision: str) -> None:
    """Install zeroth_pg as the release at ``revision`` did: its migration files up to it, one
    transaction each, then the alembic stamp."""
    files = [(name, text) for name, text in released_files().items() if name[:4] <= revision]
    if not files or files[-1][0][:4] != revision:
        raise ValueError(f"no released revision {revision}")
    with psycopg.connect(dsn) as conn:
        for _name, text in files:
            conn.execute(text.encode())
            conn.commit()
        schema, table = migrate.VERSION_SCHEMA, migrate.VERSION_TABLE
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}".encode())
        conn.execute(f"CREATE TABLE {schema}.{table} (version_num VARCHAR(32) NOT NULL, "
                     f"CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num))".encode())
        conn.execute(f"INSERT INTO {schema}.{table} VALUES ('{revision}')".encode())
        conn.commit()
