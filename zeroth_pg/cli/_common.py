"""What the commands of ``zeroth-pg`` share: exit codes, the root command class, the options
that fall back to ``ZEROTH_PG_*`` variables, the database a command runs on, and output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from uuid import UUID

import typer

from zeroth_pg.errors import (
    InvalidArgumentError,
    InvalidScopeError,
    RunNotFoundError,
    ScheduleNotFoundError,
)

if TYPE_CHECKING:
    import asyncpg
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILURE",
    "EXIT_NOT_FOUND",
    "EXIT_SCHEMA",
    "EXIT_USAGE",
    "App",
    "DataDir",
    "DeploymentFilter",
    "Dsn",
    "JsonOutput",
    "NotFoundError",
    "Tenant",
    "TenantFilter",
    "UsageError",
    "Workspace",
    "WorkspaceFilter",
    "cell",
    "database",
    "err",
    "json_object",
    "out",
    "parse_duration",
    "plain",
    "print_json",
    "record",
    "rows_table",
    "run_async",
    "setting",
]

EXIT_FAILURE, EXIT_USAGE, EXIT_SCHEMA, EXIT_NOT_FOUND = 1, 2, 3, 4

EXIT_CODES = (
    "Exit codes: 0 ok · 1 failure (database or connection error, run not cancellable, demo "
    "incomplete) · 2 usage (bad option, malformed JSON, argument refused by the database) · "
    "3 schema not installed, behind, or newer than this package (verify) · 4 not found (run id, "
    "schedule name, deployment, embedded server)."
)

#: Piped or redirected, a table is printed whole, one complete line per row, whatever COLUMNS
#: says (`zeroth-pg runs list | grep failed` must find every failed run); on a terminal its
#: free-text columns fold to the width and the others are never shortened.
_PIPED_WIDTH = 100_000


class LazyConsole:
    """A rich Console made on first use: rich and the Console cost every process that imports
    the command line about 40 ms of CPU, the worker processes (``python -m zeroth_pg.worker``)
    included, which never print with it."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def print(self, *objects: Any, **options: Any) -> None:
        self.console.print(*objects, **options)


out = LazyConsole(soft_wrap=True, width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err = LazyConsole(stderr=True, soft_wrap=True)


class NotFoundError(LookupError):
    """Exit code 4: the thing named does not exist."""


class UsageError(ValueError):
    """Exit code 2: the command line cannot be carried out as written."""


class App(typer.Typer):
    """A command line (the root, or an alias such as ``python -m zeroth_pg.worker``): maps the
    exceptions a command lets out to the documented exit codes."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("add_completion", False)
        kwargs.setdefault("pretty_exceptions_show_locals", False)  # locals would print DSNs
        super().__init__(**kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (RunNotFoundError, ScheduleNotFoundError, NotFoundError) as exc:
            _fail(EXIT_NOT_FOUND, exc)
        except (UsageError, InvalidArgumentError, InvalidScopeError) as exc:
            _fail(EXIT_USAGE, exc)
        except Exception as exc:
            _fail(EXIT_FAILURE, exc)


def _fail(code: int, exc: BaseException) -> NoReturn:
    message = str(exc) or type(exc).__name__
    err.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    sys.exit(code)


# -- options shared by the commands ---------------------------------------------------------------

def setting(flag: str, help: str) -> Any:
    """An optional text option falling back to ``ZEROTH_PG_<FLAG>``."""
    env = "ZEROTH_PG_" + flag.removeprefix("--").replace("-", "_").upper()
    return typer.Option(flag, envvar=env, show_default=False, help=help)


Dsn = Annotated[str | None, setting("--dsn", "Database URL. None: the embedded PostgreSQL.")]
Tenant = Annotated[str | None, setting("--tenant", "Tenant of the runs (default: 'default').")]
Workspace = Annotated[str | None, setting(
    "--workspace", "Workspace of the runs (none: the null workspace; needs --tenant).")]
TenantFilter = Annotated[str | None, setting(
    "--tenant", "Only this tenant (default: every tenant).")]
WorkspaceFilter = Annotated[str | None, setting(
    "--workspace", "Only this workspace (default: every workspace).")]
DeploymentFilter = Annotated[str | None, setting("--deployment", "Only this deployment.")]
DataDir = Annotated[str | None, setting(
    "--data-dir",
    "Data directory of the embedded server (default: per user; /var/lib/zeroth_pg as root).")]
JsonOutput = Annotated[bool, typer.Option(
    "--json", envvar="ZEROTH_PG_JSON", help="Print JSON instead of tables.")]

# -- plumbing -------------------------------------------------------------------------------------


@contextlib.contextmanager
def database(dsn: str | None, *, migrate: bool = True) -> Iterator[str]:
    """``dsn`` as given, or the embedded server's for the length of the block (migrated)."""
    if dsn:
        yield dsn
        return
    from zeroth_pg import embedded

    with embedded.running_server(migrate=migrate) as url:
        yield url


def run_async(dsn: str | None, work: Callable[[asyncpg.Connection], Any], *,
              reads_only: bool = False) -> Any:
    """Run ``await work(conn)`` on one connection to the configured (or embedded) database.
    ``reads_only``: ``work`` never writes, so a hot standby serves it and several hosts without
    ``target_session_attrs`` mean the first that answers (zeroth_pg.connect)."""

    from zeroth_pg._connect import connect

    async def main(url: str) -> Any:
        conn = await connect(url, reads_only=reads_only)
        try:
            return await work(conn)
        finally:
            await conn.close()

    with database(dsn) as url:
        return asyncio.run(main(url))


def plain(value: Any) -> Any:
    """A JSON-ready version of a value read from the database."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Enum):
        return value.value
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=plain) + "\n")
    sys.stdout.flush()


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(plain(value))


#: Columns that may wrap; the others (ids, statuses, counts, times) are kept whole on one line.
_FREE_TEXT = {"value", "data", "error"}


def rows_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
           title: str | None = None, *, keep: Sequence[str] = ()) -> Table:
    """A table of ``rows``; a column empty in every row is left out unless named in ``keep``."""
    shown = [(key, header) for key, header in columns
             if key in keep or any(row.get(key) is not None for row in rows)]
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cells = [[cell(row.get(key)) for key, _ in shown] for row in rows]
    for index, (key, header) in enumerate(shown):
        if key in _FREE_TEXT:
            table.add_column(header, overflow="fold")
        else:  # as wide as its widest value: a narrow terminal shrinks the free text instead
            whole = max([len(header), *(len(line[index]) for line in cells)])
            table.add_column(header, no_wrap=True, overflow="fold", min_width=whole)
    for line in cells:
        table.add_row(*line)
    return table


def record(row: asyncpg.Record) -> dict[str, Any]:
    """A record as a dict, its ``::text`` JSON columns decoded."""
    out = dict(row)
    for key in ("payload", "output", "error", "metadata", "progress", "data"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


def json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what} must be a JSON object")
    return value


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s)", re.IGNORECASE)
_DURATION_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``90m``, ``30s``, ``2w`` or a sum such as ``1d12h`` → a timedelta."""
    compact = text.strip().replace(" ", "")
    parts = _DURATION_PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts).lower() != compact.lower():
        raise typer.BadParameter(f"{text!r} is not a duration like 7d, 12h, 90m, 30s or 1d12h")
    return sum((timedelta(**{_DURATION_UNITS[unit.lower()]: float(number)})
                for number, unit in parts), timedelta())


