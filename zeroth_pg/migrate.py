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
import os
import sys
from pathlib import Path

# The concerns live in their own modules; this module is their one public face (the revision
# stubs import apply_sql_file and forward_only from here, migrations/env.py apply_functions).
from zeroth_pg._libpq import embedded_bin_dir, with_database
from zeroth_pg._migrate_alembic import (
    ADVISORY_LOCK_KEY,
    VERSION_SCHEMA,
    VERSION_TABLE,
    apply_sql_file,
    current_revision,
    forward_only,
    head_revision,
    public_connect_database,
    sql_files,
    to_sqlalchemy_url,
    upgrade,
    writable_libpq_dsn,
)
from zeroth_pg._migrate_alembic import alembic_config as _alembic_config  # noqa: F401
from zeroth_pg._migrate_dump import (
    SCHEMA_DUMP_COMMAND,
    dump_schema,
    find_pg_dump,
    generate_schema_sql,
    migrated_scratch_database,
    normalise_dump,
    schema_sql_path,
    server_major,
)
from zeroth_pg._migrate_functions import (
    CATALOG_DIGEST_SQL,
    PIN_SESSION,
    PINNED_OPTIONS,
    apply_functions,
    function_files,
    functions_digest,
    functions_sql,
    package_version,
)
from zeroth_pg._migrate_script import install_sql, upgrade_sql
from zeroth_pg._paths import repo_root, sql_functions_dir

__all__ = [
    # With the names importable from here before the split (tests, bench/, zeroth_pg.docs).
    "ADVISORY_LOCK_KEY",
    "CATALOG_DIGEST_SQL",
    "PINNED_OPTIONS",
    "PIN_SESSION",
    "SCHEMA_DUMP_COMMAND",
    "VERSION_SCHEMA",
    "VERSION_TABLE",
    "apply_functions",
    "apply_sql_file",
    "current_revision",
    "dump_schema",
    "embedded_bin_dir",
    "find_pg_dump",
    "forward_only",
    "function_files",
    "functions_digest",
    "functions_sql",
    "generate_schema_sql",
    "head_revision",
    "install_sql",
    "migrated_scratch_database",
    "normalise_dump",
    "package_version",
    "public_connect_database",
    "schema_sql_path",
    "server_major",
    "sql_files",
    "sql_functions_dir",
    "to_sqlalchemy_url",
    "upgrade",
    "upgrade_sql",
    "with_database",
    "writable_libpq_dsn",
]


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
