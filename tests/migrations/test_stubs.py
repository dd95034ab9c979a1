"""Every sql/migrations file has exactly one alembic stub, and the stubs form one chain."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from zeroth_pg import migrate
from zeroth_pg._paths import migrations_dir


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_zeroth_stub_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stubs() -> list[Path]:
    return sorted(p for p in (migrations_dir() / "versions").glob("*.py") if p.stem[:1].isdigit())


def test_every_sql_file_has_exactly_one_stub_and_vice_versa() -> None:
    sql_stems = [p.stem for p in migrate.sql_files()]
    assert sql_stems, "no sql/migrations/*.sql files"
    assert [p.stem for p in _stubs()] == sql_stems


def test_each_stub_runs_its_own_file_and_chains_to_the_previous_one() -> None:
    previous = None
    for stub in _stubs():
        module = _load(stub)
        number = re.match(r"^(\d{4})_", stub.name)
        assert number is not None, stub.name
        assert module.revision == number.group(1)
        assert module.down_revision == previous
        assert f"{stub.stem}.sql" == module.SQL_FILE
        previous = module.revision
    assert previous == migrate.head_revision()


def test_downgrade_is_refused() -> None:
    for stub in _stubs():
        with pytest.raises(NotImplementedError, match="forward-only"):
            _load(stub).downgrade()


def test_sql_files_do_not_manage_transactions() -> None:
    # Each revision runs in alembic's transaction and install_sql() wraps everything in one.
    pattern = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK)\s*;", re.IGNORECASE | re.MULTILINE)
    for path in migrate.sql_files():
        assert not pattern.search(path.read_text()), path.name
