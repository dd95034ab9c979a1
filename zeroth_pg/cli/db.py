"""``zeroth-pg db start | stop | url | psql``: the embedded PostgreSQL."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import typer

from zeroth_pg.cli._common import (
    EXIT_CODES,
    DataDir,
    JsonOutput,
    NotFoundError,
    err,
    print_json,
)

if TYPE_CHECKING:
    pass

__all__ = ["db_app"]

db_app = typer.Typer(help="The embedded PostgreSQL (used when no DSN is configured).",
                     no_args_is_help=True, epilog=EXIT_CODES)




def _use_data_dir(data_dir: str | None) -> None:
    if data_dir:
        os.environ["ZEROTH_PG_DATA_DIR"] = data_dir


def _show_server(dsn: str, as_json: bool, **extra: Any) -> None:
    """The DSN alone on stdout (``export ZEROTH_PG_DSN=$(zeroth-pg db url)``), or JSON."""
    from zeroth_pg import embedded

    info = embedded.server_info()
    facts = {"dsn": dsn, "pid": info.pid if info else None, "data_dir": str(embedded.data_dir()),
             **extra}
    if as_json:
        print_json(facts)
    else:
        sys.stdout.write(dsn + "\n")


@db_app.command("start")
def db_start(data_dir: DataDir = None, as_json: JsonOutput = False) -> None:
    """Start the embedded server (or reuse it), migrate it, print its DSN; it keeps running."""
    from zeroth_pg import embedded

    _use_data_dir(data_dir)
    already = embedded.server_info() is not None
    dsn = embedded.start_server(migrate=True)
    if not as_json:
        err.print(f"embedded PostgreSQL {'already running' if already else 'started'} "
                   f"(data in {embedded.data_dir()}); stop it with `zeroth-pg db stop`")
    _show_server(dsn, as_json, started=not already)


@db_app.command("stop")
def db_stop(data_dir: DataDir = None, as_json: JsonOutput = False) -> None:
    """Stop the embedded server (fast shutdown); its data stays.

    Exit 0 whether it was running or not: stopping is idempotent (it says "was not running";
    --json has "stopped": false). Unlike `db url`, which exits 4 with no server."""
    from zeroth_pg import embedded

    _use_data_dir(data_dir)
    stopped = embedded.stop_server()
    if as_json:
        print_json({"stopped": stopped, "data_dir": str(embedded.data_dir())})
    else:
        err.print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not "
                   "running")


@db_app.command("url")
def db_url(data_dir: DataDir = None, as_json: JsonOutput = False) -> None:
    """Print the running embedded server's DSN (nothing else on stdout).

    Exit 0 with the DSN; 4 when no embedded server is running (stdout empty, the reason on
    stderr), so `export ZEROTH_PG_DSN=$(zeroth-pg db url)` fails in a `set -e` script instead of
    exporting an empty DSN. Unlike `db stop`, which exits 0 either way."""
    from zeroth_pg import embedded

    _use_data_dir(data_dir)
    info = embedded.server_info()
    if info is None:
        raise NotFoundError(f"the embedded PostgreSQL is not running (data dir "
                            f"{embedded.data_dir()}); start it with `zeroth-pg db start`")
    _show_server(info.dsn, as_json)


@db_app.command("psql", context_settings={"allow_extra_args": True,
                                          "ignore_unknown_options": True})
def db_psql(ctx: typer.Context, data_dir: DataDir = None) -> None:
    """psql on the embedded server (started and migrated if needed); extra arguments go to
    psql."""
    from zeroth_pg import embedded

    _use_data_dir(data_dir)
    info = embedded.server_info()
    dsn = info.dsn if info is not None else embedded.start_server(migrate=True)
    psql = embedded.psql_executable()
    sys.stdout.flush()
    os.execv(psql, [psql, dsn, *ctx.args])
