"""What importing zeroth_pg costs, and how its modules depend on each other.

A service that only runs workers installs neither the ``cli`` extra (typer, rich) nor needs the
migration tooling at import time; the modules of the package import each other without a cycle,
and no runtime module imports the pytest plugin.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zeroth_pg"
CLI_AND_TOOLING = ("typer", "rich", "click", "alembic")


def _loaded_after(statement: str, *, prelude: str = "") -> set[str]:
    """The top-level packages in sys.modules after ``statement``, in a fresh interpreter."""
    code = (f"import json, sys\n{prelude}\n{statement}\n"
            "print(json.dumps(sorted({m.partition('.')[0] for m in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    return set(json.loads(result.stdout))


class TestImportCost:
    @pytest.mark.parametrize("module", ["zeroth_pg", "zeroth_pg.client", "zeroth_pg.worker"])
    def test_the_library_imports_no_command_line_framework_nor_alembic(self, module):
        assert _loaded_after(f"import {module}") & set(CLI_AND_TOOLING) == set()

    def test_a_worker_from_the_top_level_package_imports_none_either(self):
        loaded = _loaded_after("from zeroth_pg import LeaseManager, RunWorker")
        assert loaded & set(CLI_AND_TOOLING) == set()

    def test_without_the_cli_extra_the_command_says_what_to_install(self):
        # None in sys.modules makes `import typer` fail as if it were not installed.
        code = ("import sys; sys.modules['typer'] = None; sys.argv = ['zeroth-pg', '--help']\n"
                "from zeroth_pg._console import main; main()")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 1
        assert "pip install 'zeroth-pg[cli]'" in result.stderr
        assert "Traceback" not in result.stderr


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_guard(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` (no import at run time) or ``if __name__ == "__main__":`` (the
    module run as a program, not imported)."""
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return True
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


def _imports(path: Path, modules: set[str], *, typing_too: bool = False) -> set[str]:
    """The zeroth_pg modules ``path`` imports at run time, wherever the import statement is (in
    a function too); with ``typing_too``, also those imported only for the type checker."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_guard(node.test) and not typing_too:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name in modules}


def _graph(*, typing_too: bool = False) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules, typing_too=typing_too) - {name}
            for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []

    def walk(name: str, trail: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in trail:
                cycles.append(" -> ".join([*trail[trail.index(target):], target]))
            elif target not in done:
                walk(target, [*trail, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            walk(name, [name])
    return cycles


class TestModuleGraph:
    def test_no_module_imports_in_a_circle(self):
        assert _cycles(_graph()) == []

    def test_the_worker_s_modules_do_not_even_name_each_other_in_a_circle(self):
        # A circle through imports made only for the type checker is a circle of concerns all
        # the same (RunContext once named RunWorker, which imported it): the worker's parts
        # depend one way, on narrow interfaces (RunHost, Leased).
        graph = {name: {t for t in targets if t.startswith("zeroth_pg.worker.")}
                 for name, targets in _graph(typing_too=True).items()
                 if name.startswith("zeroth_pg.worker.")}
        assert _cycles(graph) == []

    def test_no_runtime_module_imports_the_pytest_plugin(self):
        importers = sorted(name for name, targets in _graph().items()
                           if "zeroth_pg.testing" in targets)
        assert importers == []

    def test_only_the_command_line_imports_its_framework(self):
        offenders = []
        for path in PACKAGE.rglob("*.py"):
            name = _module_name(path)
            if name.startswith("zeroth_pg.cli") or name == "zeroth_pg.demo":
                continue  # the command line, and the demo it runs (a cli-extra feature)
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.partition(".")[0] in ("typer", "rich", "click") for n in names):
                    offenders.append(name)
        assert offenders == []


def test_run_worker_stays_a_module_one_can_hold_in_ones_head():
    """RunWorker (construction, start, drain, supervision) is under 400 lines: claim pacing,
    the outcome decision, execution and settling live in modules of their own (issue 33)."""
    lines = len((PACKAGE / "worker" / "_worker.py").read_text().splitlines())
    assert lines < 400, f"zeroth_pg/worker/_worker.py has {lines} lines"
