"""Screenshots of every dashboard page into the docs: ``python -m tests.web.screenshots [DIR]``.

Runs the browser tests that walk the app's route table (every GET page, its path parameters
filled from seeded runs: tests/web/test_web_browser.py, PATH_SAMPLES) and the operator's flows
(the bulk confirmation and its result), against a throwaway test database, writing
``dashboard-<page>.png`` into DIR (default docs/img). Re-run it after adding a page: a page whose
path parameter has no sample fails the run and names it. Needs Debian's chromium and
chromium-driver, and the dev extra (selenium, uvicorn).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "img"
    os.environ["ZEROTH_PG_SCREENSHOTS"] = str(out.resolve())
    os.chdir(ROOT)
    code = pytest.main(["-n", "0", "-p", "no:cacheprovider", "-q", "-rs",
                        "tests/web/test_web_browser.py",
                        "-k", "every_page or operator_flows"])
    shots = sorted(out.glob("dashboard-*.png"))
    print(f"{len(shots)} screenshots in {out}: " + ", ".join(p.name for p in shots))
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
