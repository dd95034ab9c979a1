"""Fixtures of the failover tests: a migrated zeroth database on a replicated pair."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from failover_support import zeroth_pair
from replication import ReplicatedPair, discard_initdb

# The failover soak reuses the chaos soak's fleet, handler and history checker (tests/chaos).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))


def pytest_sessionfinish() -> None:
    # An xdist worker may end with os._exit, before atexit would delete it (40 MB in memory).
    discard_initdb()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "sync_pair" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.dedicated_server)  # a replicated pair of its own
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def sync_pair() -> Iterator[tuple[ReplicatedPair, str]]:
    with zeroth_pair("sync") as found:
        yield found
