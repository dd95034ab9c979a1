"""The function files (``sql/functions``, one file per function, view or trigger): their order,
the script they make, its digest, and their re-application at the end of an upgrade to head
(:func:`apply_functions`), skipped when exactly these files are applied already.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

from zeroth_pg._paths import sql_functions_dir

__all__ = [
    "CATALOG_DIGEST_SQL",
    "PINNED_OPTIONS",
    "PIN_SEARCH_PATH",
    "PIN_SESSION",
    "apply_functions",
    "function_files",
    "functions_digest",
    "functions_sql",
    "package_version",
    "record_functions_sql",
    "refuse_older_package_sql",
]

log = logging.getLogger("zeroth_pg.migrate")


def function_files() -> list[Path]:
    """The function and view files, in the order ``sql/functions/order.txt`` declares.

    Every ``.sql`` file under ``sql/functions`` must be listed exactly once, and every listed file
    must exist: a file that was added but not ordered would silently never be applied.
    """
    root = sql_functions_dir()
    listed = [
        line.strip()
        for line in (root / "order.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    present = {p.relative_to(root).as_posix() for p in root.rglob("*.sql")}
    repeated = sorted({name for name in listed if listed.count(name) > 1})
    missing = sorted(set(listed) - present)
    unlisted = sorted(present - set(listed))
    if repeated or missing or unlisted:
        raise ValueError(
            f"sql/functions/order.txt disagrees with the files: repeated {repeated}, "
            f"listed but missing {missing}, present but not listed {unlisted}"
        )
    return [root / name for name in listed]


#: The first statements of every upgrade transaction. LANGUAGE sql bodies, views and the
#: operators in them are bound when they are created, with the creating session's search_path
#: (a function's own ``SET search_path`` only applies when it runs): with a schema on the path
#: that others can write to (``public`` before PostgreSQL 15), a stranger's operator such as
#: ``public.<(float8, numeric)`` would be bound into a SECURITY DEFINER body.
#: The other settings fix how the catalog digest deparses definitions, so it does not depend on
#: the session that runs the upgrade.
PIN_SESSION = (
    "SET LOCAL search_path = pg_catalog, pg_temp; SET LOCAL IntervalStyle = postgres; "
    "SET LOCAL quote_all_identifiers = off; SET LOCAL DateStyle = 'ISO, MDY'; "
    "SET LOCAL extra_float_digits = 1;"
)

#: libpq startup options that pin the search_path (kept for callers of zeroth_pg.migrate; the
#: upgrade itself no longer sends them: PgBouncer refuses a startup ``options`` unless its
#: ``ignore_startup_parameters`` lists it, and then drops it).
PINNED_OPTIONS = "-c search_path=pg_catalog,pg_temp"

#: The first statement on every connection the upgrade opens, before any other query (alembic's
#: and SQLAlchemy's own queries use operators too): a SET, which any pooler in session mode
#: passes to the server, where the startup option above was refused by PgBouncer 1.18 with its
#: default configuration ("unsupported startup parameter: options").
PIN_SEARCH_PATH = "SET search_path = pg_catalog, pg_temp"

#: A digest of what the catalog holds for the code: every function, view and trigger of the
#: schema with its definition, owner, privileges, options and comment. Run under
#: PIN_SESSION, so the deparsed definitions do not depend on the session.
CATALOG_DIGEST_SQL = """SELECT md5(coalesce(string_agg(d.line, E'\\n' ORDER BY d.line), ''))
  FROM (SELECT concat_ws(' ', 'function', p.oid::pg_catalog.regprocedure::text,
                         pg_catalog.pg_get_functiondef(p.oid),
                         pg_catalog.pg_get_userbyid(p.proowner), p.proacl::text,
                         pg_catalog.obj_description(p.oid, 'pg_proc')) AS line
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'zeroth'::pg_catalog.regnamespace AND p.prokind IN ('f', 'p', 'w')
        UNION ALL
        SELECT concat_ws(' ', 'view', c.relname, pg_catalog.pg_get_viewdef(c.oid),
                         pg_catalog.pg_get_userbyid(c.relowner), c.relacl::text, c.reloptions::text,
                         pg_catalog.obj_description(c.oid, 'pg_class'))
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'zeroth'::pg_catalog.regnamespace AND c.relkind = 'v'
        UNION ALL
        SELECT concat_ws(' ', 'trigger', t.tgname, pg_catalog.pg_get_triggerdef(t.oid),
                         t.tgenabled::text)
          FROM pg_catalog.pg_trigger t
          JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'zeroth'::pg_catalog.regnamespace AND NOT t.tgisinternal) d"""


def functions_sql() -> str:
    """Every function file in order, as one script (no transaction control of its own), after
    :data:`PIN_SESSION`."""
    root = sql_functions_dir()
    parts: list[str] = [PIN_SESSION, ""]
    for path in function_files():
        parts += [f"-- ==== sql/functions/{path.relative_to(root).as_posix()} ====", ""]
        parts.append(path.read_text(encoding="utf-8").rstrip("\n"))
        parts.append("")
    return "\n".join(parts)


def functions_digest() -> str:
    """sha256 of :func:`functions_sql`: what zeroth.code_version records as applied."""
    return hashlib.sha256(functions_sql().encode("utf-8")).hexdigest()


def package_version() -> str:
    """This package's version, which zeroth.code_version records with the code it applied."""
    from zeroth_pg import __version__

    return __version__


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.10.2rc1" → (0, 10, 2)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def record_functions_sql(files_sha256: str) -> str:
    """The statement that records in zeroth.code_version what was just applied."""
    return (
        "INSERT INTO zeroth.code_version AS v (id, files_sha256, catalog_md5, package_version,"
        " applied_at)\n"
        f"SELECT true, '{files_sha256}', ({CATALOG_DIGEST_SQL}), '{package_version()}',"
        " pg_catalog.clock_timestamp()\n"
        "ON CONFLICT ON CONSTRAINT code_version_pkey DO UPDATE\n"
        "   SET files_sha256 = excluded.files_sha256, catalog_md5 = excluded.catalog_md5,\n"
        "       package_version = excluded.package_version, applied_at = excluded.applied_at;"
    )


def refuse_older_package_sql() -> str:
    """A psql guard: refuse when a newer package applied the functions (see apply_functions)."""
    release = ",".join(str(n) for n in _release(package_version())) or "0"
    return (
        "DO $zeroth_code$\n"
        "BEGIN\n"
        "    IF pg_catalog.to_regclass('zeroth.code_version') IS NULL THEN\n"
        "        RETURN;  -- before 0009: no package recorded its code yet\n"
        "    END IF;\n"
        "    IF EXISTS (SELECT FROM zeroth.code_version v\n"
        "                WHERE pg_catalog.string_to_array(pg_catalog.substring(v.package_version,\n"
        "                          '^[0-9]+(?:[.][0-9]+)*'), '.')::int[]\n"
        f"                    > ARRAY[{release}]) THEN\n"
        "        RAISE EXCEPTION 'a newer zeroth-pg applied this database''s functions; this "
        f"script (zeroth-pg {package_version()}) would put older code back'\n"
        "            USING HINT = 'Upgrade with the newer package.';\n"
        "    END IF;\n"
        "END\n"
        "$zeroth_code$;"
    )


def apply_functions(dbapi_conn: Any) -> bool:
    """Re-apply the function files in the caller's open transaction, when they changed.

    ``migrations/env.py`` calls it after the pending migrations, in their transaction, when the
    upgrade reaches head. It applies the files (idempotent ``CREATE OR REPLACE`` with owner,
    grants and comment) unless zeroth.code_version shows that exactly these files were applied
    and the catalog still holds what they made: then it changes nothing and takes no lock, so an
    upgrade with nothing to do never waits for a session idle in a transaction. A function
    someone changed by hand differs from the recorded catalog digest and is put back. When a
    newer package applied them it leaves them alone and logs a warning: a lagging host of a
    rolling deploy that upgrades at startup must neither put older code back nor fail (old and
    new workers overlap, DESIGN rule 10). Returns whether it applied them. Does not commit.
    """
    files_sha256 = functions_digest()
    cur = dbapi_conn.cursor()
    try:
        cur.execute(PIN_SESSION)
        cur.execute(
            "SELECT v.files_sha256, v.catalog_md5, v.package_version FROM zeroth.code_version v")
        recorded = cur.fetchone()
        if recorded is not None and _release(recorded[2]) > _release(package_version()):
            log.warning("zeroth-pg %s applied this database's functions; this package (%s) is "
                        "older and leaves them as they are", recorded[2], package_version())
            return False
        cur.execute(CATALOG_DIGEST_SQL)
        current = cur.fetchone()
        if recorded is not None and current is not None and (recorded[0], recorded[1]) == (
            files_sha256, current[0]
        ):
            return False
        cur.execute(functions_sql())
        cur.execute(record_functions_sql(files_sha256))
        return True
    finally:
        cur.close()
