"""The ``zeroth-pg`` console script and the ``python -m`` aliases: run a command line, or say
how to install it. It needs the ``cli`` extra (typer, rich); the library does not."""

from __future__ import annotations

import importlib
import sys

__all__ = ["main", "run_command"]

_CLI_EXTRA = frozenset({"typer", "click", "rich"})


def run_command(module: str = "zeroth_pg.cli", *, prog_name: str = "zeroth-pg") -> None:
    """Import ``module`` (a :mod:`zeroth_pg.cli` module) and run its ``main``."""
    try:
        command = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in _CLI_EXTRA:
            raise
        sys.exit(f"{prog_name}: the command line needs {exc.name}, which is not installed: "
                 "pip install 'zeroth-pg[cli]'")
    command.main(prog_name=prog_name)


def main() -> None:
    """The ``zeroth-pg`` console script."""
    run_command()
