"""``python -m zeroth_pg.worker``: the same command as ``zeroth-pg worker``."""

from zeroth_pg._console import run_command

run_command("zeroth_pg.cli.worker", prog_name="python -m zeroth_pg.worker")
