"""The root ``zeroth-pg`` command: every command module and group put together.

Built only by a process that runs the root command (:func:`zeroth_pg.cli.main`) or reads
:data:`zeroth_pg.cli.app`: ``python -m zeroth_pg.worker`` imports :mod:`zeroth_pg.cli.worker` alone,
not the twelve other command modules and the root app typer builds from them.
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

__all__ = ["EXIT_CODES", "SchemaState", "SchemaStatus", "app", "main", "parse_duration",
           "schema_status"]

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
