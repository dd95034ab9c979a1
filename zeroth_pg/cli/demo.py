"""``zeroth-pg demo`` (also ``python -m zeroth_pg.demo``): watch worker processes run, lose one
to SIGKILL, and recover its runs. The options only; the demo is :mod:`zeroth_pg.demo`."""

from __future__ import annotations

from typing import Annotated

import typer

from zeroth_pg.cli._common import App, Dsn, JsonOutput

__all__ = ["app", "demo", "main"]


def demo(
    dsn: Dsn = None,
    runs: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_DEMO_RUNS", min=1, help="Runs to enqueue.")] = 2000,
    workers: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_DEMO_WORKERS", min=1, help="Worker processes.")] = 3,
    concurrency: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_DEMO_CONCURRENCY", help="Slots per worker.")] = 16,
    lease: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_DEMO_LEASE", help="Lease seconds, short for the demo.")] = 3.0,
    kill: Annotated[bool, typer.Option(
        "--kill/--no-kill", envvar="ZEROTH_PG_DEMO_KILL",
        help="SIGKILL a worker mid-way.")] = True,
    seed: Annotated[int, typer.Option(envvar="ZEROTH_PG_DEMO_SEED", help="Seed of the run mix.")
                    ] = 7,
    timeout: Annotated[float, typer.Option(
        envvar="ZEROTH_PG_DEMO_TIMEOUT", help="Give up after this many seconds.")] = 600.0,
    as_json: JsonOutput = False,
    web: Annotated[bool, typer.Option(
        "--web", envvar="ZEROTH_PG_DEMO_WEB",
        help="Serve the read-only dashboard on 127.0.0.1 while the demo runs.")] = False,
    web_port: Annotated[int, typer.Option(
        "--web-port", envvar="ZEROTH_PG_WEB_PORT", help="Port of the dashboard.")] = 8787,
) -> None:
    """Watch worker processes run, lose one to SIGKILL, and recover its runs.

    Enqueues runs (some fail once or twice, a few always), starts worker processes, SIGKILLs one
    of them mid-way so its leases expire and the others resume its runs from their last
    checkpoints, and prints a summary read back from the database. Exit 1 unless every run
    finished.
    """
    from zeroth_pg.demo import DemoOptions, run

    raise typer.Exit(run(DemoOptions(
        dsn=dsn, runs=runs, workers=workers, concurrency=concurrency, lease=lease, kill=kill,
        seed=seed, timeout=timeout, json=as_json, web=web, web_port=web_port)))


#: The command alone, for ``python -m zeroth_pg.demo``.
app = App(name="demo")
app.command()(demo)


def main(prog_name: str = "python -m zeroth_pg.demo") -> None:
    app(prog_name=prog_name)
