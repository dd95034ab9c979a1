"""Two lanes for a parallel run: the slow tests on half the workers, the rest on the other half.

The slow tests (marker ``slow``: soaks, failovers, HA clusters, real-clock schedules and rate
windows) mostly wait — on a clock, on a manager's loop, on a promotion. When every worker took
them first, as a plain queue with the slow tests at its head does, the first two minutes of a
whole run used under one of the two cores (a timeline of the run: 0.7 to 1.1 cores in every 20 s
until 140 s, 1.8 to 2.0 later). Here the even-numbered workers (gw0, gw2, …) take the slow tests
first and the odd-numbered ones the others, so the waiting overlaps with work; each lane takes
the other's tests once its own are gone, so no worker idles while tests are left.

The odd (busy) lane runs at a lower CPU priority (:data:`BUSY_LANE_NICENESS`, its test server
inherits it): the slow lane's tests have deadlines of their own (a Patroni loop, a lease
renewal, a failover's timing) and were proven on a machine where the CPU was not saturated;
with the busy lane niced they still get the cores when they need them, and the busy lane gets
what they leave.

The controller learns which test ids are slow from the workers (it collects nothing itself):
each worker writes them, after xdist's group tagging, to a file the controller named in the
worker's input (:func:`write_slow_ids`), and the scheduler reads it once every worker's
collection is in (xdist checks that all collected the same tests).

A pytest plugin (tests/conftest.py loads it; ``-p xdist_lanes`` elsewhere): it acts only under
``--dist loadgroup``, which a parallel run of this suite uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

#: workerinput key: the file the workers write the slow test ids to.
SLOW_IDS_KEY = "zeroth_pg_slow_ids"
#: Controller: that file's name.
_SLOW_IDS = pytest.StashKey[str]()

#: The busy lane's niceness (its processes and its test server's): CFS gives a nice-0 process
#: about three times the CPU of a nice-5 one when both want it.
BUSY_LANE_NICENESS = 5


def is_slow_lane(worker_id: str) -> bool:
    """``gw0``, ``gw2``, … take the slow tests first; the others the rest."""
    digits = worker_id.removeprefix("gw")
    return not digits.isdigit() or int(digits) % 2 == 0


def slow_ids_file() -> str:
    """A new file name for one run's slow test ids (made by the controller)."""
    directory = tempfile.mkdtemp(prefix="zeroth-pg-lanes-")
    return os.path.join(directory, "slow-ids.json")


def write_slow_ids(path: str, items: Iterable[pytest.Item]) -> None:
    """Worker: the ids of its slow tests, as the controller will see them; atomic (every worker
    writes the same list)."""
    ids = [item.nodeid for item in items if item.get_closest_marker("slow") is not None]
    directory = os.path.dirname(path)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp") as out:
        json.dump(ids, out)
    os.replace(out.name, path)


def remove_slow_ids_file(path: str) -> None:
    with contextlib.suppress(OSError):
        for leftover in Path(path).parent.iterdir():
            leftover.unlink()
        Path(path).parent.rmdir()


def enter_lane(worker_id: str) -> None:
    """Worker, before its test server starts: the busy lane lowers its CPU priority."""
    if not is_slow_lane(worker_id):
        with contextlib.suppress(OSError):
            os.nice(BUSY_LANE_NICENESS)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get(SLOW_IDS_KEY):
            enter_lane(str(workerinput.get("workerid", "")))
    elif getattr(config.option, "dist", "no") == "loadgroup":
        config.stash[_SLOW_IDS] = slow_ids_file()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller, for each worker it starts: where to write its slow test ids."""
    if _SLOW_IDS in node.config.stash:
        node.workerinput[SLOW_IDS_KEY] = node.config.stash[_SLOW_IDS]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Worker: the slow ids, written before xdist reports the collection (after which the
    controller may schedule) and after every modifyitems hook (xdist's group tags)."""
    path = getattr(session.config, "workerinput", {}).get(SLOW_IDS_KEY)
    if path:
        write_slow_ids(path, session.items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Controller: loadgroup, in two lanes."""
    if _SLOW_IDS not in config.stash:
        return None
    return make_scheduler(config, log, config.stash[_SLOW_IDS])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SLOW_IDS in config.stash:
        remove_slow_ids_file(config.stash[_SLOW_IDS])


def make_scheduler(config: pytest.Config, log: Any, path: str) -> Any:
    """The laned variant of xdist's loadgroup scheduling (groups stay on one worker)."""
    from xdist.scheduler import LoadGroupScheduling

    class LanedScheduling(LoadGroupScheduling):  # type: ignore[misc]
        """LoadGroupScheduling whose next unit for a node is the first of the node's lane."""

        _slow: set[str] | None = None  # the slow units not yet handed out

        def _slow_scopes(self) -> set[str]:
            if self._slow is None:
                try:
                    ids = json.loads(Path(path).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    ids = []  # no lanes: xdist's own order
                self._slow = {self._split_scope(nodeid) for nodeid in ids} & set(self.workqueue)
            return self._slow

        def _assign_work_unit(self, node: Any) -> None:
            slow = self._slow_scopes()
            first = next(iter(self.workqueue))
            if not slow:
                scope = first
            elif is_slow_lane(str(node.gateway.id)):
                scope = next(s for s in self.workqueue if s in slow)
            else:  # the slow units are few and near the head: a short walk
                scope = next((s for s in self.workqueue if s not in slow), first)
            slow.discard(scope)
            # What LoadScopeScheduling._assign_work_unit does with the first unit, for this one.
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid)
                                    for nodeid, completed in work_unit.items() if not completed])

    return LanedScheduling(config, log)
