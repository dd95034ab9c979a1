"""The parallel run's two lanes (tests/xdist_lanes.py): slow tests go to the even workers, the
others to the odd ones, which run at a lower CPU priority; nothing is left unrun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent

_MODULE = """
import json, os, time, pytest

def _record(name):
    with open(os.environ["LANES_OUT"], "a") as out:
        out.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"],
                              "nice": os.nice(0)}) + "\\n")

@pytest.mark.slow
@pytest.mark.parametrize("n", range(2))
def test_slow(n):
    _record(f"slow{n}")
    time.sleep(1.0)

@pytest.mark.parametrize("n", range(30))
def test_quick(n):
    _record(f"quick{n}")
"""


def test_slow_tests_run_on_the_even_workers_and_the_busy_lane_is_niced(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_lanes=_MODULE)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    out = tmp_path / "lanes.jsonl"
    monkeypatch.setenv("LANES_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(_TESTS), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "xdist_lanes", "-p", "no:cacheprovider",
                                           "-n", "4", "--dist", "loadgroup")
    result.assert_outcomes(passed=32)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 32
    slow = {row["worker"] for row in rows if row["test"].startswith("slow")}
    assert slow <= {"gw0", "gw2"}
    base = os.nice(0)
    for row in rows:
        odd = int(row["worker"].removeprefix("gw")) % 2 == 1
        assert row["nice"] == min(base + (5 if odd else 0), 19), row
    # The busy lane ran the quick tests while the slow lane waited.
    assert {row["worker"] for row in rows if row["test"].startswith("quick")} & {"gw1", "gw3"}
