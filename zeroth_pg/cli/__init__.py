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
* 4 — not found: no run with that id in the scope, no registered deployment of that name;
  ``db url`` with no embedded server running (``db stop`` exits 0 then: stopping is
  idempotent).

Ctrl-C ends ``status --watch`` with 0; elsewhere it aborts with 1.

One module per command group, each holding only options and output: :mod:`.schema`
(``migrate``, ``verify``), :mod:`.runs`, :mod:`.enqueue`, :mod:`.status`, :mod:`.limits`,
:mod:`.schedules`, :mod:`.deployments`, :mod:`.prune`, :mod:`.db`, :mod:`.worker`,
:mod:`.metrics` and :mod:`.demo`; what they share is in :mod:`._common`, the SQL they send in
:mod:`zeroth_pg._calls`. ``python -m zeroth_pg.worker`` and ``python -m zeroth_pg.demo`` are the
same commands as ``zeroth-pg worker`` and ``zeroth-pg demo``. The command line needs the ``cli``
extra (typer, rich); nothing outside this package imports them.
"""


from __future__ import annotations

from zeroth_pg.cli import (
    db,
    demo,
    deployments,
    enqueue,
    limits,
    metrics,
    prune,
    runs,
    schedules,
    schema,
    status,
    web,
    worker,
)
from zeroth_pg.cli._common import EXIT_CODES, App, parse_duration
from zeroth_pg.cli.schema import SchemaState, SchemaStatus, schema_status

__all__ = [
    "EXIT_CODES",
    "SchemaState",
    "SchemaStatus",
    "app",
    "main",
    "parse_duration",
    "schema_status",
]

app = App(
    name="zeroth-pg",
    help="zeroth_pg: a durable run dispatcher whose queue is PostgreSQL.",
    no_args_is_help=True,
)
app.add_typer(schema.migrate_app, name="migrate")
app.add_typer(runs.runs_app, name="runs")
app.add_typer(db.db_app, name="db")
app.add_typer(schedules.schedules_app, name="schedules")
app.add_typer(limits.limits_app, name="limits")
app.add_typer(deployments.deployments_app, name="deployments")
app.command("verify")(schema.verify)
app.command("worker")(worker.worker)
app.command("demo")(demo.demo)
app.command("enqueue")(enqueue.enqueue)
app.command("status")(status.status)
app.command("prune")(prune.prune)
app.command("web")(web.web)
app.command("metrics")(metrics.metrics)


def main(prog_name: str = "zeroth-pg") -> None:
    """Entry point for ``zeroth-pg`` and ``python -m zeroth_pg.cli``."""
    app(prog_name=prog_name)
