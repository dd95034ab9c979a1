"""The order in which xdist workers take the suite's tests (tests/conftest.py): each module's
tests spread over the run, a module that shares a wider-scoped fixture kept together, the same
order in every worker; and the share of the test modules each worker rewrites before it
collects."""

from __future__ import annotations

from itertools import pairwise
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture
def suite_conftest(request: pytest.FixtureRequest) -> ModuleType:
    """tests/conftest.py as pytest loaded it (several modules are named ``conftest``)."""
    for plugin in request.config.pluginmanager.get_plugins():
        if str(getattr(plugin, "__file__", "")).endswith("tests/conftest.py"):
            return plugin  # type: ignore[no-any-return]
    raise AssertionError("tests/conftest.py is not loaded")


def item(nodeid: str, *scopes: str) -> Any:
    """A collected test as _spread reads it: its id and the scopes of its fixtures."""
    definitions = {f"fixture{n}": [SimpleNamespace(scope=scope)] for n, scope in enumerate(scopes)}
    fixtures = SimpleNamespace(name2fixturedefs=definitions)
    return SimpleNamespace(nodeid=nodeid, _fixtureinfo=fixtures)


def ordered(conftest: ModuleType, items: list[Any]) -> list[str]:
    keys = conftest._spread(items)
    return [test.nodeid for test in sorted(items, key=lambda test: keys[test.nodeid])]


def suite() -> list[Any]:
    waiting = [item(f"tests/client/test_waiting.py::test_{n}", "function") for n in range(6)]
    busy = [item(f"tests/sql/test_busy.py::test_{n}") for n in range(6)]
    served = [item(f"tests/web/test_served.py::test_{n}", "function", "module")
              for n in range(4)]
    other = [item(f"tests/sql/test_other.py::test_{n}") for n in range(6)]
    return waiting + busy + served + other


def test_a_modules_tests_are_spread_over_the_run_not_run_back_to_back(
        suite_conftest: ModuleType) -> None:
    order = ordered(suite_conftest, suite())
    for module in ("test_waiting", "test_busy", "test_other"):
        places = [index for index, nodeid in enumerate(order) if f"/{module}.py::" in nodeid]
        assert len(places) == 6
        # Never two of the module's tests in a row: a worker that finishes one takes another
        # module's next, so the four workers are never all in the same module.
        assert all(later - earlier > 1 for earlier, later in pairwise(places)), order


def test_a_module_sharing_a_module_scoped_fixture_stays_together_in_its_order(
        suite_conftest: ModuleType) -> None:
    order = ordered(suite_conftest, suite())
    places = [index for index, nodeid in enumerate(order) if "/test_served.py::" in nodeid]
    assert places == list(range(places[0], places[0] + 4)), order
    assert [order[index] for index in places] == [
        f"tests/web/test_served.py::test_{n}" for n in range(4)]


def test_every_worker_computes_the_same_order_whatever_the_collection_order(
        suite_conftest: ModuleType) -> None:
    items = suite()
    # Each module's tests in the same relative order (as every worker collects them), the
    # modules in another: the order of the run is the same.
    regrouped = items[16:] + items[6:12] + items[:6] + items[12:16]
    assert sorted(test.nodeid for test in regrouped) == sorted(test.nodeid for test in items)
    assert ordered(suite_conftest, regrouped) == ordered(suite_conftest, items)


@pytest.mark.parametrize(("workerinput", "share"), [
    ({"workerid": "gw1", "workercount": 4}, (1, 4)),
    ({"workerid": "gw0", "workercount": 1}, (0, 1)),
    # A worker started again after a crash (xdist names it gw4 of 4).
    ({"workerid": "gw4", "workercount": 4}, (0, 4)),
    # Workers named otherwise (--tx id=name//popen) or without a count rewrite everything.
    ({"workerid": "name", "workercount": 2}, (0, 1)),
    ({"workerid": "gw1"}, (0, 1)),
    ({}, (0, 1)),
])
def test_each_worker_rewrites_its_own_share_of_the_modules(
        suite_conftest: ModuleType, workerinput: dict[str, Any], share: tuple[int, int]) -> None:
    assert suite_conftest._share(workerinput) == share


def _options(**given: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"usepdb": False, "trace": False, "collectonly": False,
                              "capture": "fd", **given})


def test_a_run_on_a_server_of_the_callers_runs_in_one_process(
        suite_conftest: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROTH_PG_TEST_DSN", raising=False)
    assert not suite_conftest._one_process(_options(), ["tests/plans"])
    # Its own servers, one per worker, otherwise; a named server is shared by every worker.
    monkeypatch.setenv("ZEROTH_PG_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    assert suite_conftest._one_process(_options(), ["tests/plans"])


def test_chosen_tests_a_debugger_or_watched_output_run_in_one_process(
        suite_conftest: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROTH_PG_TEST_DSN", raising=False)
    assert suite_conftest._one_process(_options(), ["tests/sql/test_x.py::test_y"])
    assert suite_conftest._one_process(_options(usepdb=True), [])
    assert suite_conftest._one_process(_options(capture="no"), [])
    assert not suite_conftest._one_process(_options(), ["tests/sql/test_x.py"])
