"""``python -m zeroth_pg.cli``: the ``zeroth-pg`` command."""

from zeroth_pg._console import run_command

run_command("zeroth_pg.cli", prog_name="zeroth-pg")
