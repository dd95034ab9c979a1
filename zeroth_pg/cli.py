"""The ``zeroth-pg`` command: install, run, feed, watch and prune zeroth_pg from a shell.

Settings fall back to ``ZEROTH_PG_*`` environment variables (``--help`` names each one); the
values of one call (a payload, a run id, an idempotency key) do not. With no ``--dsn`` /
``ZEROTH_PG_DSN`` a command uses the embedded PostgreSQL (:mod:`zeroth_pg.embedded`): started for
the command and stopped after it, unless ``zeroth-pg db start`` left it running, and migrated,
since it is ours. A configured database is never migrated except by ``zeroth-pg migrate up``.

Output: tables for people, ``--json`` for scripts (one JSON document; JSON lines for
``enqueue --batch`` and ``status --watch``). Progress and diagnostics go to stderr.

Exit codes:

* 0 — success.
* 1 — failure: a database or connection error, a run that cannot be cancelled, a demo whose runs
  did not all finish.
* 2 — usage: a bad option or argument, malformed JSON, an argument the database refused (ZP006,
  ZP008).
* 3 — ``verify``: the schema is not installed, behind this package, or at a revision this package
  does not know (newer).
* 4 — not found: no run with that id in the scope; ``db url`` with no embedded server running.

Ctrl-C ends ``status --watch`` with 0; elsewhere it aborts with 1.

``zeroth-pg worker`` and ``zeroth-pg demo`` hand their arguments to ``python -m zeroth_pg.worker``
and ``python -m zeroth_pg.demo`` (one definition of their options; ``--help`` lists them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from uuid import UUID

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from zeroth_pg.errors import InvalidArgumentError, InvalidScopeError, RunNotFoundError
from zeroth_pg.types import CancelOutcome, RunStatus

if TYPE_CHECKING:
    import asyncpg

__all__ = ["EXIT_CODES", "SchemaState", "SchemaStatus", "app", "parse_duration", "schema_status"]

EXIT_FAILURE, EXIT_USAGE, EXIT_SCHEMA, EXIT_NOT_FOUND = 1, 2, 3, 4

EXIT_CODES = (
    "Exit codes: 0 ok · 1 failure (database or connection error, run not cancellable, demo "
    "incomplete) · 2 usage (bad option, malformed JSON, argument refused by the database) · "
    "3 schema not installed, behind, or newer than this package (verify) · 4 not found (run id, "
    "embedded server)."
)

_out = Console(soft_wrap=True)
_err = Console(stderr=True, soft_wrap=True)


class NotFoundError(LookupError):
    """Exit code 4: the thing named does not exist."""


class UsageError(ValueError):
    """Exit code 2: the command line cannot be carried out as written."""


class _App(typer.Typer):
    """The root command: maps the exceptions a command lets out to the documented exit codes."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (RunNotFoundError, NotFoundError) as exc:
            _fail(EXIT_NOT_FOUND, exc)
        except (UsageError, InvalidArgumentError, InvalidScopeError) as exc:
            _fail(EXIT_USAGE, exc)
        except Exception as exc:
            _fail(EXIT_FAILURE, exc)


def _fail(code: int, exc: BaseException) -> NoReturn:
    message = str(exc) or type(exc).__name__
    _err.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    sys.exit(code)


app = _App(
    name="zeroth-pg",
    help="zeroth_pg: a durable run dispatcher whose queue is PostgreSQL.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals would print DSNs with passwords
)
migrate_app = typer.Typer(help="Install and upgrade the schema.", no_args_is_help=True,
                          epilog=EXIT_CODES)
runs_app = typer.Typer(help="List, show, cancel and redrive runs.", no_args_is_help=True,
                       epilog=EXIT_CODES)
db_app = typer.Typer(help="The embedded PostgreSQL (used when no DSN is configured).",
                     no_args_is_help=True, epilog=EXIT_CODES)
app.add_typer(migrate_app, name="migrate")
app.add_typer(runs_app, name="runs")
app.add_typer(db_app, name="db")

# -- options shared by the commands ---------------------------------------------------------------

def _setting(flag: str, help: str) -> Any:
    """An optional text option falling back to ``ZEROTH_PG_<FLAG>``."""
    env = "ZEROTH_PG_" + flag.removeprefix("--").replace("-", "_").upper()
    return typer.Option(flag, envvar=env, show_default=False, help=help)


Dsn = Annotated[str | None, _setting("--dsn", "Database URL. None: the embedded PostgreSQL.")]
Tenant = Annotated[str | None, _setting("--tenant", "Tenant of the runs (default: 'default').")]
Workspace = Annotated[str | None, _setting(
    "--workspace", "Workspace of the runs (none: the null workspace; needs --tenant).")]
TenantFilter = Annotated[str | None, _setting(
    "--tenant", "Only this tenant (default: every tenant).")]
WorkspaceFilter = Annotated[str | None, _setting(
    "--workspace", "Only this workspace (default: every workspace).")]
DeploymentFilter = Annotated[str | None, _setting("--deployment", "Only this deployment.")]
DataDir = Annotated[str | None, _setting(
    "--data-dir",
    "Data directory of the embedded server (default: per user; /var/lib/zeroth_pg as root).")]
JsonOutput = Annotated[bool, typer.Option(
    "--json", envvar="ZEROTH_PG_JSON", help="Print JSON instead of tables.")]

# Commands whose arguments go, unparsed, to another module's command line (help included).
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True,
                 "help_option_names": []}

# -- SQL the command line sends itself: reads of views and tables (writes go through LeaseManager)

_RUN_COLUMNS = """r.run_id, r.tenant_id, r.workspace_id, r.deployment_ref, r.thread_id,
    r.status::text AS status, r.wait_reason, r.priority, r.run_after, r.attempts, r.max_attempts,
    r.created_at, r.updated_at, r.started_at, r.finished_at, r.dead_lettered_at,
    r.idempotency_key, r.lease_worker_id, r.lease_generation, r.lease_expires_at,
    r.recovery_checkpoint_id, r.cancel_action, r.cancel_requested_at, r.checkpoint_seq,
    r.payload::text AS payload, r.output::text AS output, r.error::text AS error,
    r.metadata::text AS metadata, r.progress::text AS progress"""

LIST_RUNS = f"""SELECT {_RUN_COLUMNS}
      FROM zeroth.runs r
     WHERE ($1::text IS NULL OR r.deployment_ref = $1)
       AND ($2::text[] IS NULL OR r.status::text = ANY ($2::text[]))
       AND ($3::text IS NULL OR r.tenant_id = $3)
       AND ($4::text IS NULL OR r.workspace_id = $4)
     ORDER BY r.created_at DESC, r.run_id
     LIMIT $5"""

FIND_RUN = f"""SELECT {_RUN_COLUMNS}, r.workspace_key
      FROM zeroth.runs r
     WHERE r.run_id = $1
       AND ($2::text IS NULL OR r.tenant_id = $2)
       AND ($3::text IS NULL OR r.workspace_id = $3)"""

RUN_CHECKPOINTS = """SELECT c.checkpoint_order, c.checkpoint_id, c.lease_generation, c.created_at,
           c.data::text AS data
      FROM zeroth.checkpoints c
     WHERE c.tenant_id = $1 AND c.workspace_key = $2 AND c.run_id = $3
     ORDER BY c.checkpoint_order"""

# One row per (tenant, workspace, deployment) out of the operator views.
STATUS = """SELECT s.tenant_id, s.workspace_id, s.deployment_ref,
           sum(s.pending)::bigint AS pending, sum(s.claimable)::bigint AS claimable,
           sum(s.scheduled)::bigint AS scheduled, sum(s.live)::bigint AS live_leases,
           sum(s.expired)::bigint AS expired_leases, sum(s.dead)::bigint AS dead_letters
      FROM (SELECT q.tenant_id, q.workspace_id, q.deployment_ref, q.pending, q.claimable,
                   q.scheduled, 0 AS live, 0 AS expired, 0 AS dead
              FROM zeroth.queue_depth q
            UNION ALL
            SELECT l.tenant_id, l.workspace_id, l.deployment_ref, 0, 0, 0, count(*), 0, 0
              FROM zeroth.live_leases l GROUP BY l.tenant_id, l.workspace_id, l.deployment_ref
            UNION ALL
            SELECT e.tenant_id, e.workspace_id, e.deployment_ref, 0, 0, 0, 0, count(*), 0
              FROM zeroth.expired_leases e GROUP BY e.tenant_id, e.workspace_id, e.deployment_ref
            UNION ALL
            SELECT d.tenant_id, d.workspace_id, d.deployment_ref, 0, 0, 0, 0, 0, count(*)
              FROM zeroth.dead_letters d GROUP BY d.tenant_id, d.workspace_id, d.deployment_ref
           ) s
     WHERE ($1::text IS NULL OR s.deployment_ref = $1)
       AND ($2::text IS NULL OR s.tenant_id = $2)
       AND ($3::text IS NULL OR s.workspace_id = $3)
     GROUP BY s.tenant_id, s.workspace_id, s.deployment_ref
     ORDER BY s.tenant_id, s.workspace_id NULLS FIRST, s.deployment_ref"""

DATABASE_NOW = "SELECT clock_timestamp()"
DATABASE_NOW_PLUS = "SELECT clock_timestamp() + $1::interval"

# -- plumbing -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _database(dsn: str | None, *, migrate: bool = True) -> Iterator[str]:
    """``dsn`` as given, or the embedded server's for the length of the block (migrated)."""
    if dsn:
        yield dsn
        return
    from zeroth_pg import embedded

    with embedded.running_server(migrate=migrate) as url:
        yield url


def _run_async(dsn: str | None, work: Callable[[asyncpg.Connection], Any]) -> Any:
    """Run ``await work(conn)`` on one connection to the configured (or embedded) database."""

    import asyncpg

    async def main(url: str) -> Any:
        conn = await asyncpg.connect(url)
        try:
            return await work(conn)
        finally:
            await conn.close()

    with _database(dsn) as url:
        return asyncio.run(main(url))


def _plain(value: Any) -> Any:
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


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=_plain) + "\n")
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(_plain(value))


#: Columns that may wrap; the others are kept on one line (ids, statuses, counts, times).
_FREE_TEXT = {"value", "data"}
#: Columns never shortened: ids to copy into the next command.
_UUIDS = {"run_id", "checkpoint_id"}


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
           title: str | None = None, *, keep: Sequence[str] = ()) -> Table:
    """A table of ``rows``; a column empty in every row is left out unless named in ``keep``."""
    shown = [(key, header) for key, header in columns
             if key in keep or any(row.get(key) is not None for row in rows)]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for key, header in shown:
        wraps = key in _FREE_TEXT
        table.add_column(header, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis",
                         min_width=36 if key in _UUIDS else None)
    for row in rows:
        table.add_row(*(_cell(row.get(key)) for key, _ in shown))
    return table


def _record(row: asyncpg.Record) -> dict[str, Any]:
    """A record as a dict, its ``::text`` JSON columns decoded."""
    out = dict(row)
    for key in ("payload", "output", "error", "metadata", "progress", "data"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


def _json_object(text: str, what: str) -> dict[str, Any]:
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


# -- migrate / verify -----------------------------------------------------------------------------


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


def _show_schema(status: SchemaStatus, as_json: bool) -> None:
    if as_json:
        _print_json(asdict(status))
        return
    rows = [{"what": "database", "value": status.current or "(not installed)"},
            {"what": "package head", "value": status.head},
            {"what": "state", "value": status.state.value},
            {"what": "pending", "value": ", ".join(status.pending) or "none"}]
    _out.print(_table(rows, [("what", "schema"), ("value", "")]))


@migrate_app.command("up")
def migrate_up(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Apply every pending migration (alembic upgrade head, serialised by an advisory lock)."""
    from zeroth_pg import migrate

    with _database(dsn, migrate=False) as url:
        before = migrate.current_revision(url)
        migrate.upgrade(url)
        status = schema_status(url)
    if as_json:
        _print_json({"from": before, **asdict(status)})
    else:
        _err.print(f"migrated from {before or '(not installed)'} to {status.current}")
        _show_schema(status, as_json=False)


@migrate_app.command("status")
def migrate_status(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Show the database's revision, the package's head and the pending migrations."""
    with _database(dsn, migrate=False) as url:
        _show_schema(schema_status(url), as_json)


@migrate_app.command("sql")
def migrate_sql() -> None:
    """Print the whole install script for psql (psql -v ON_ERROR_STOP=1 -f install.sql)."""
    from zeroth_pg import migrate

    sys.stdout.write(migrate.install_sql())


@app.command()
def verify(dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """Exit 3 unless the schema is exactly at this package's head revision."""
    with _database(dsn, migrate=False) as url:
        status = schema_status(url)
    _show_schema(status, as_json)
    if status.state is SchemaState.UNKNOWN:
        _err.print(f"schema unknown: revision {status.current} is newer than this package "
                   f"(head {status.head}); upgrade zeroth_pg")
    elif status.state is not SchemaState.CURRENT:
        _err.print(f"schema {status.state.value}: run `zeroth-pg migrate up`")
    if status.state is not SchemaState.CURRENT:
        raise typer.Exit(EXIT_SCHEMA)


# -- worker / demo: their own command lines -------------------------------------------------------


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def worker(ctx: typer.Context) -> None:
    """Run a worker: --app module:handler --deployment NAME [...]; SIGTERM drains.

    The options of python -m zeroth_pg.worker: zeroth-pg worker --help lists them.
    """
    from zeroth_pg.worker import main

    raise typer.Exit(main(list(ctx.args), prog="zeroth-pg worker"))


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def demo(ctx: typer.Context) -> None:
    """Watch worker processes run, lose one to SIGKILL, and recover its runs.

    The options of python -m zeroth_pg.demo: zeroth-pg demo --help lists them.
    """
    from zeroth_pg.demo import main

    raise typer.Exit(main(list(ctx.args), prog="zeroth-pg demo"))


@app.command(context_settings=_PASS_THROUGH, add_help_option=False)
def bench(ctx: typer.Context) -> None:
    """Measure zeroth_pg against pgqueuer, procrastinate and the raw-SQL floor (bench/).

    The options of python -m bench: zeroth-pg bench --help lists them. Needs a source checkout
    (bench/ is not part of the wheel) and the bench extra: pip install -e '.[dev,bench]'.
    """
    root = _checkout_root()
    if root is None:
        _err.print("zeroth-pg bench runs the suite in bench/ of a source checkout, which this "
                   "installation is not: clone the repository, pip install -e '.[dev,bench]', "
                   "and run it there")
        raise typer.Exit(EXIT_USAGE)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.__main__ import app as bench_app

    bench_app(args=list(ctx.args), prog_name="zeroth-pg bench")


def _checkout_root() -> Path | None:
    """The repository this package was installed from in editable mode, if it has bench/."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "bench" / "__main__.py").is_file() else None


# -- enqueue --------------------------------------------------------------------------------------


async def _absolute_time(conn: asyncpg.Connection, text: str | None) -> datetime | None:
    """``--run-after``: an ISO timestamp, or a duration from now on the database clock."""
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    try:
        delay = parse_duration(text)
    except typer.BadParameter:
        raise UsageError(f"--run-after {text!r} is neither an ISO timestamp nor a duration "
                         "(30s, 5m, 1h)") from None
    return await conn.fetchval(DATABASE_NOW_PLUS, delay)  # type: ignore[no-any-return]


def _batch_items(lines: Sequence[str], defaults: dict[str, Any]) -> list[dict[str, Any]]:
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"stdin line {number}: not valid JSON: {exc}") from exc
        if not isinstance(item, dict):
            raise UsageError(f"stdin line {number}: each line must be a JSON object")
        items.append({**defaults, **item})
    return items


@app.command()
def enqueue(
    deployment: Annotated[str, typer.Option(
        "--deployment", envvar="ZEROTH_PG_DEPLOYMENT", help="Deployment the runs are for.")],
    payload: Annotated[str | None, typer.Option(
        help="The run's payload, a JSON object (single run).", show_default=False)] = None,
    priority: Annotated[int | None, typer.Option(
        help="Higher runs first (default 0; with --batch: for lines without one).",
        show_default=False)] = None,
    run_after: Annotated[str | None, typer.Option(
        help="Not before: ISO timestamp, or a duration from now on the database clock (30s, "
             "5m).", show_default=False)] = None,
    max_attempts: Annotated[int | None, typer.Option(
        help="Attempts before a failing run is dead-lettered (default 3).",
        show_default=False)] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        help="A repeated key returns the existing run (created: false).",
        show_default=False)] = None,
    metadata: Annotated[str | None, typer.Option(
        help="Metadata, a JSON object.", show_default=False)] = None,
    batch: Annotated[bool, typer.Option(
        "--batch", help="Enqueue one run per JSON line on stdin, each an object with optional "
        "payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, "
        "thread_id.")] = False,
    chunk_size: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_ENQUEUE_CHUNK", min=1, max=10000,
        help="Runs per enqueue_runs call with --batch.")] = 1000,
    tenant: Tenant = None,
    workspace: Workspace = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Create one run (zeroth.enqueue_run), or many from JSON lines on stdin (--batch)."""
    from zeroth_pg.client import LeaseManager

    if batch and (payload is not None or idempotency_key is not None):
        raise typer.BadParameter("--payload and --idempotency-key name one run; with --batch "
                                 "put them on each stdin line")
    payload_obj = _json_object(payload, "--payload") if payload is not None else {}
    metadata_obj = _json_object(metadata, "--metadata") if metadata is not None else None
    lines = sys.stdin.read().splitlines() if batch else []

    async def work(conn: asyncpg.Connection) -> list[Any]:
        lm = LeaseManager(conn)
        when = await _absolute_time(conn, run_after)
        if not batch:
            return [await lm.enqueue_run(
                deployment, payload_obj, tenant_id=tenant, workspace_id=workspace,
                priority=priority or 0, run_after=when,
                max_attempts=3 if max_attempts is None else max_attempts,
                idempotency_key=idempotency_key, metadata=metadata_obj)]
        defaults = {key: value for key, value in (
            ("priority", priority), ("run_after", when), ("max_attempts", max_attempts),
            ("metadata", metadata_obj)) if value is not None}
        items = _batch_items(lines, defaults)
        results: list[Any] = []
        for start in range(0, len(items), chunk_size):
            results += await lm.enqueue_runs(deployment, items[start:start + chunk_size],
                                             tenant_id=tenant, workspace_id=workspace)
        return results

    enqueued = _run_async(dsn, work)
    rows = [{"run_id": run.run_id, "created": run.created, "status": run.status}
            for run in enqueued]
    if as_json:
        if batch:
            for row in rows:
                _print_json(row)
        else:
            _print_json(rows[0])
    elif batch:
        created = sum(1 for row in rows if row["created"])
        _out.print(f"enqueued {len(rows)} run(s) for {deployment}: {created} created, "
                   f"{len(rows) - created} already there (idempotency key or run id)")
    else:
        _out.print(_table(rows, [("run_id", "run_id"), ("created", "created"),
                                 ("status", "status")]))


# -- runs -----------------------------------------------------------------------------------------


_LIST_COLUMNS = [("run_id", "run_id"), ("deployment_ref", "deployment"), ("tenant_id", "tenant"),
                 ("workspace_id", "workspace"), ("status", "status"), ("tries", "tries"),
                 ("priority", "prio"), ("created_at", "created (UTC)"),
                 ("lease_worker_id", "lease holder")]


@runs_app.command("list")
def runs_list(
    deployment: DeploymentFilter = None,
    status: Annotated[list[RunStatus] | None, typer.Option(
        "--status", help="Only runs in this status (repeatable).", show_default=False)] = None,
    limit: Annotated[int, typer.Option(envvar="ZEROTH_PG_LIMIT", min=1,
                                       help="At most this many runs, newest first.")] = 50,
    tenant: TenantFilter = None,
    workspace: WorkspaceFilter = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Runs, newest first."""
    statuses = [s.value for s in status] if status else None

    async def work(conn: asyncpg.Connection) -> list[dict[str, Any]]:
        rows = await conn.fetch(LIST_RUNS, deployment, statuses, tenant, workspace, limit)
        return [_record(row) for row in rows]

    rows = _run_async(dsn, work)
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        row["tries"] = f"{row['attempts']}/{row['max_attempts']}"
    _out.print(_table(rows, _LIST_COLUMNS))


RunIdArg = Annotated[UUID, typer.Argument(help="The run id.", show_default=False)]


async def _locate(conn: asyncpg.Connection, run_id: UUID, tenant: str | None,
                  workspace: str | None) -> dict[str, Any]:
    """The run with this id; without --tenant, in whichever scope holds it."""
    rows = await conn.fetch(FIND_RUN, run_id, tenant, workspace)
    if not rows:
        raise NotFoundError(f"no run {run_id}"
                            + (f" in tenant {tenant!r}" if tenant is not None else ""))
    if len(rows) > 1:
        scopes = ", ".join(f"{r['tenant_id']}/{r['workspace_id'] or '-'}" for r in rows)
        raise UsageError(f"run {run_id} exists in several scopes ({scopes}): give --tenant "
                         "and --workspace")
    return _record(rows[0])


@runs_app.command("show")
def runs_show(run_id: RunIdArg, tenant: TenantFilter = None, workspace: WorkspaceFilter = None,
              dsn: Dsn = None, as_json: JsonOutput = False) -> None:
    """One run and its checkpoints."""

    async def work(conn: asyncpg.Connection) -> dict[str, Any]:
        run = await _locate(conn, run_id, tenant, workspace)
        checkpoints = await conn.fetch(RUN_CHECKPOINTS, run["tenant_id"], run.pop("workspace_key"),
                                       run_id)
        run["checkpoints"] = [_record(c) for c in checkpoints]
        return run

    run = _run_async(dsn, work)
    if as_json:
        _print_json(run)
        return
    checkpoints = run.pop("checkpoints")
    fields = [{"field": key, "value": value} for key, value in run.items() if value is not None]
    _out.print(_table(fields, [("field", "field"), ("value", "value")], title=f"run {run_id}"))
    _out.print(_table(checkpoints, [("checkpoint_order", "#"), ("checkpoint_id", "checkpoint_id"),
                                    ("lease_generation", "generation"),
                                    ("created_at", "created (UTC)"), ("data", "data")],
                      title=f"{len(checkpoints)} checkpoint(s)"))


class CancelAction(StrEnum):
    """The ``action`` argument of ``zeroth.request_cancel``."""

    CANCEL = "cancel"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


@runs_app.command("cancel")
def runs_cancel(
    run_id: RunIdArg,
    action: Annotated[CancelAction, typer.Option(
        help="What the owner is asked to do with a running run.")] = CancelAction.CANCEL,
    tenant: TenantFilter = None, workspace: WorkspaceFilter = None, dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Cancel a run now, or ask its live owner to (zeroth.request_cancel); exit 1 if finished."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> tuple[dict[str, Any], CancelOutcome]:
        run = await _locate(conn, run_id, tenant, workspace)
        outcome = await LeaseManager(conn).request_cancel(
            run_id, action=action.value, tenant_id=run["tenant_id"],
            workspace_id=run["workspace_id"])
        return run, outcome

    run, outcome = _run_async(dsn, work)
    if as_json:
        _print_json({"run_id": run_id, "outcome": outcome})
    else:
        _out.print(f"{run_id}: {outcome.value}")
    if outcome is CancelOutcome.UNKNOWN:
        raise typer.Exit(EXIT_NOT_FOUND)
    if outcome is CancelOutcome.NOT_CANCELLABLE:
        _err.print(f"run {run_id} is already {run['status']}")
        raise typer.Exit(EXIT_FAILURE)


@runs_app.command("redrive")
def runs_redrive(run_id: RunIdArg, tenant: TenantFilter = None,
                 workspace: WorkspaceFilter = None, dsn: Dsn = None,
                 as_json: JsonOutput = False) -> None:
    """Put a failed or cancelled run back to pending (zeroth.redrive_run); exit 1 otherwise."""
    from zeroth_pg.client import LeaseManager

    async def work(conn: asyncpg.Connection) -> bool:
        run = await _locate(conn, run_id, tenant, workspace)
        return await LeaseManager(conn).redrive_run(run_id, tenant_id=run["tenant_id"],
                                                    workspace_id=run["workspace_id"])

    redriven = _run_async(dsn, work)
    if as_json:
        _print_json({"run_id": run_id, "redriven": redriven})
    else:
        _out.print(f"{run_id}: back to pending")


# -- status ---------------------------------------------------------------------------------------

_STATUS_COLUMNS = [("tenant_id", "tenant"), ("workspace_id", "workspace"),
                   ("deployment_ref", "deployment"), ("pending", "pending"),
                   ("claimable", "claimable"), ("scheduled", "scheduled"),
                   ("live_leases", "leased"), ("expired_leases", "expired"),
                   ("dead_letters", "dead")]


def _status_table(rows: list[dict[str, Any]], at: datetime, footer: str = "") -> Table:
    table = _table(rows, _STATUS_COLUMNS, keep=[key for key, _ in _STATUS_COLUMNS[2:]],
                   title=f"zeroth_pg status at {_cell(at)} UTC (database clock){footer}")
    table.caption = ("leased / expired: runs with a live / an expired lease; dead: dead letters"
                     if rows else "no pending runs, leases or dead letters")
    return table


@app.command()
def status(
    deployment: DeploymentFilter = None,
    tenant: TenantFilter = None,
    workspace: WorkspaceFilter = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh like top until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_WATCH_INTERVAL", min=0.1, help="Seconds between refreshes.")] = 2.0,
    count: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_WATCH_COUNT", min=0,
        help="With --watch: stop after this many refreshes (0: never).")] = 0,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Queue depth, live and expired leases and dead letters per deployment and tenant."""
    from rich.live import Live

    async def sample(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], datetime]:
        rows = await conn.fetch(STATUS, deployment, tenant, workspace)
        return [dict(row) for row in rows], await conn.fetchval(DATABASE_NOW)

    def emit_json(rows: list[dict[str, Any]], at: datetime) -> None:
        _print_json({"at": at, "scopes": rows})

    async def work(conn: asyncpg.Connection) -> None:
        rows, at = await sample(conn)
        if not watch:
            if as_json:
                emit_json(rows, at)
            else:
                _out.print(_status_table(rows, at))
            return
        footer = f" · every {interval:g}s · Ctrl-C quits"
        shown = 0
        live = None if as_json else Live(_status_table(rows, at, footer), console=_out,
                                         auto_refresh=False)
        with live or contextlib.nullcontext():
            while True:
                if live is None:
                    emit_json(rows, at)
                else:
                    live.update(_status_table(rows, at, footer), refresh=True)
                shown += 1
                if count and shown >= count:
                    return
                await asyncio.sleep(interval)
                rows, at = await sample(conn)

    try:
        _run_async(dsn, work)
    except KeyboardInterrupt:
        if not watch:
            raise


# -- prune ----------------------------------------------------------------------------------------


@app.command()
def prune(
    older_than: Annotated[timedelta, typer.Option(
        envvar="ZEROTH_PG_PRUNE_OLDER_THAN", parser=parse_duration, metavar="DURATION",
        help="Delete finished runs (completed, failed, cancelled) that finished longer ago than "
             "this: 7d, 12h, 1d12h.", show_default=False)],
    batch_size: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_PRUNE_BATCH", min=1, max=10000,
        help="Runs deleted per transaction.")] = 1000,
    tenant: TenantFilter = None,
    workspace: Annotated[str | None, _setting(
        "--workspace", "Only this workspace of --tenant (none: the null workspace).")] = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Delete finished runs older than --older-than, in batches (zeroth.prune_runs).

    Completed, failed (dead letters too) and cancelled runs whose finished_at lies before
    now - older_than on the database clock go, with their checkpoints, one short transaction per
    batch, until none is left.
    """
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from zeroth_pg.client import LeaseManager

    started = time.monotonic()

    async def work(conn: asyncpg.Connection) -> tuple[int, int]:
        lm = LeaseManager(conn)
        deleted = batches = 0
        columns = (SpinnerColumn(), TextColumn("pruning runs finished before now - "
                                               f"{older_than}"), BarColumn(),
                   TextColumn("{task.completed:,} deleted"), TimeElapsedColumn())
        with Progress(*columns, console=_err, transient=as_json) as progress:
            task = progress.add_task("prune", total=None)
            while True:
                count = await lm.prune_runs(older_than, batch_size=batch_size, tenant_id=tenant,
                                            workspace_id=workspace)
                batches += 1
                deleted += count
                progress.advance(task, count)
                if count == 0:
                    return deleted, batches

    deleted, batches = _run_async(dsn, work)
    if as_json:
        _print_json({"deleted": deleted, "batches": batches,
                     "older_than_seconds": older_than.total_seconds(),
                     "seconds": round(time.monotonic() - started, 3)})
    else:
        _out.print(f"deleted {deleted:,} finished run(s) in {batches} batch(es)")


# -- db: the embedded server ----------------------------------------------------------------------


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
        _print_json(facts)
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
        _err.print(f"embedded PostgreSQL {'already running' if already else 'started'} "
                   f"(data in {embedded.data_dir()}); stop it with `zeroth-pg db stop`")
    _show_server(dsn, as_json, started=not already)


@db_app.command("stop")
def db_stop(data_dir: DataDir = None, as_json: JsonOutput = False) -> None:
    """Stop the embedded server (fast shutdown); its data stays."""
    from zeroth_pg import embedded

    _use_data_dir(data_dir)
    stopped = embedded.stop_server()
    if as_json:
        _print_json({"stopped": stopped, "data_dir": str(embedded.data_dir())})
    else:
        _err.print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not "
                   "running")


@db_app.command("url")
def db_url(data_dir: DataDir = None, as_json: JsonOutput = False) -> None:
    """Print the running embedded server's DSN; exit 4 when it is not running."""
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


def main() -> None:
    """Entry point for ``python -m zeroth_pg.cli``."""
    app()


if __name__ == "__main__":
    main()
