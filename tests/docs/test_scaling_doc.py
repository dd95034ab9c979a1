"""docs/scaling.md marks every public function and view for Citus, and names nothing else.

The Citus section goes through the SQL API one function at a time (holds / must change / what
changes). A function added later without a row would leave the page silently incomplete — child
runs did — so the rows are compared with the definitions in sql/functions (the file names of
public functions are not their only definitions: request_cancel.sql also defines
request_cancel_v2, so the CREATE statements are read).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCALING = ROOT / "docs" / "scaling.md"
FUNCTIONS = ROOT / "sql" / "functions"

CREATE_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION zeroth\.([a-z][a-z0-9_]*)\s*\(")
CREATE_VIEW = re.compile(r"CREATE OR REPLACE VIEW (zeroth\.[a-z][a-z0-9_]*)")
ROW = re.compile(r"^\| `([a-z][a-z0-9_.]*)` \|", re.MULTILINE)


def defined() -> set[str]:
    # Public = not underscore-prefixed; sql/functions/internal holds only the _helpers.
    names = {name for path in FUNCTIONS.glob("*.sql")
             for name in CREATE_FUNCTION.findall(path.read_text())}
    views = {name for path in (FUNCTIONS / "views").glob("*.sql")
             for name in CREATE_VIEW.findall(path.read_text())}
    return names | views


def documented() -> list[str]:
    text = SCALING.read_text()
    section = text[text.index("### Every public function"):]
    return ROW.findall(section)


def test_every_public_function_and_view_has_one_row() -> None:
    rows = documented()
    missing = defined() - set(rows)
    assert not missing, f"docs/scaling.md has no Citus row for {sorted(missing)}"
    twice = sorted({name for name in rows if rows.count(name) > 1})
    assert not twice, f"docs/scaling.md has more than one row for {twice}"


def test_no_row_names_something_that_does_not_exist() -> None:
    unknown = set(documented()) - defined()
    assert not unknown, f"docs/scaling.md has rows for unknown functions {sorted(unknown)}"
