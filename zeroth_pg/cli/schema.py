"""``zeroth-pg migrate up | status | sql`` and ``zeroth-pg verify``: the schema against the
migrations this package ships."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from zeroth_pg.cli._common import (
    EXIT_CODES,
    EXIT_SCHEMA,
    Dsn,
    JsonOutput,
    database,
    err,
    out,
    print_json,
    rows_table,
)

if TYPE_CHECKING:
    pass

__all__ = ["SchemaState", "SchemaStatus", "connect_warnings", "migrate_app", "schema_status",
           "verify"]

migrate_app = typer.Typer(help="Install and upgrade the schema.", no_args_is_help=True,
                          epilog=EXIT_CODES)




class SchemaState(StrEnum):
    """Where a database's schema stands against the migrations this package ships."""

    CURRENT = "current"
    BEHIND = "behind"  # migrations of this package are not applied yet
    NOT_INSTALLED = "not_installed"
    UNKNOWN = "unknown"  # a revision this package does not ship: a newer package migrated it


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """The database's revision (``zeroth.alembic_version``) against the package's head."""

    state: SchemaState
    current: str | None
    head: str
    pending: tuple[str, ...]


def schema_status(dsn: str) -> SchemaStatus:
    """Compare ``migrate.current_revision`` with ``migrate.head_revision``.

    A revision id is the number of its ``sql/migrations`` file (tests/migrations/test_stubs.py).
    """
    from zeroth_pg import migrate

    names = [path.stem for path in migrate.sql_files()]
    revisions = [name[:4] for name in names]
    head = migrate.head_revision()
    current = migrate.current_revision(dsn)
    if current is None:
        return SchemaStatus(SchemaState.NOT_INSTALLED, None, head, tuple(names))
    if current not in revisions:
        return SchemaStatus(SchemaState.UNKNOWN, current, head, ())
    pending = tuple(names[revisions.index(current) + 1:])
    return SchemaStatus(SchemaState.BEHIND if pending else SchemaState.CURRENT, current, head,
                        pending)


def _show_schema(status: SchemaStatus, as_json: bool, warnings: list[str] | None = None) -> None:
    if as_json:
        print_json({**asdict(status), **({} if warnings is None else {"warnings": warnings})})
        return
    rows = [{"what": "database", "value": status.current or "(not installed)"},
            {"what": "package head", "value": status.head},
            {"what": "state", "value": status.state.value},
            {"what": "pending", "value": ", ".join(status.pending) or "none"}]
    out.print(rows_table(rows, [("what", "schema"), ("value", "")]))


@migrate_app.command("up")
def migrate_up(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Apply every pending migration (alembic upgrade head, serialised by an advisory lock)."""
    from zeroth_pg import migrate

    with database(dsn, migrate=False) as url:
        before = migrate.current_revision(url)
        migrate.upgrade(url)
        status = schema_status(url)
    if as_json:
        print_json({"from": before, **asdict(status)})
    else:
        err.print(f"migrated from {before or '(not installed)'} to {status.current}")
        _show_schema(status, as_json=False)


@migrate_app.command("status")
def migrate_status(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Show the database's revision, the package's head and the pending migrations."""
    with database(dsn, migrate=False) as url:
        _show_schema(schema_status(url), as_json)


@migrate_app.command("sql")
def migrate_sql(
    from_revision: Annotated[str | None, typer.Option(
        "--from", help="print the upgrade script from this revision, not the install")] = None,
    from_database: Annotated[str | None, typer.Option(
        "--dsn", help="print the upgrade script from this database's revision (no environment "
                      "fallback: a plain `migrate sql` always prints the install)")] = None,
) -> None:
    """Print the psql script: the whole install, or the upgrade from a revision (one
    transaction; psql -v ON_ERROR_STOP=1 -f script.sql)."""
    from zeroth_pg import migrate

    if from_revision is not None and from_database is not None:
        raise typer.BadParameter("give --from or --dsn, not both")
    if from_database is not None:
        from_revision = migrate.current_revision(from_database)
        if from_revision is None:
            err.print("zeroth_pg is not installed in that database: printing the install script")
    try:
        sys.stdout.write(migrate.upgrade_sql(from_revision))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--from") from exc


def connect_warnings(dsn: str) -> list[str]:
    """What verify warns about without failing: PUBLIC holding CONNECT on the database, which
    lets every LOGIN member of the (cluster-wide) zeroth group roles made for another database of
    the cluster use this one too."""
    from zeroth_pg import migrate

    database_name = migrate.public_connect_database(dsn)
    if database_name is None:
        return []
    return [f"PUBLIC may connect to database {database_name}: the zeroth_worker, zeroth_reader "
            f"and zeroth_owner roles span the cluster, so a LOGIN member made for another "
            f"database of this cluster can use zeroth_pg here too. Confine the login roles: "
            f"REVOKE CONNECT ON DATABASE {database_name} FROM PUBLIC; GRANT CONNECT ON DATABASE "
            f"{database_name} TO <each role that uses it>; (docs/security.md, \"Three group "
            f"roles\")"]


def verify(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Exit 3 unless the schema is exactly at this package's head revision. Warns (exit 0 all
    the same) while PUBLIC may connect to the database: the zeroth roles span the cluster."""
    with database(dsn, migrate=False) as url:
        status = schema_status(url)
        warnings = [] if status.current is None else connect_warnings(url)
    _show_schema(status, as_json, warnings)
    for warning in warnings:
        err.print(f"warning: {warning}", markup=False, highlight=False)
    if status.state is SchemaState.UNKNOWN:
        err.print(f"schema unknown: revision {status.current} is newer than this package "
                   f"(head {status.head}); upgrade zeroth_pg")
    elif status.state is not SchemaState.CURRENT:
        err.print(f"schema {status.state.value}: run `zeroth-pg migrate up`")
    if status.state is not SchemaState.CURRENT:
        raise typer.Exit(EXIT_SCHEMA)
