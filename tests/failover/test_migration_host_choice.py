"""``migrate.upgrade`` (``zeroth-pg migrate``) on a real streaming pair: the host choice of
zeroth_pg/_migrate_alembic.py (``writable_libpq_dsn``) with a standby in the DSN."""

from __future__ import annotations

import psycopg
import pytest
from failover_support import DATABASE
from psycopg.conninfo import conninfo_to_dict
from replication import ReplicatedPair

import zeroth_pg
from zeroth_pg import migrate

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]


def _libpq(pair: ReplicatedPair, first: int, second: int, attrs: str | None) -> str:
    dsn = f"host=127.0.0.1,127.0.0.1 port={first},{second} dbname={DATABASE} user=postgres"
    return dsn + (f" target_session_attrs={attrs}" if attrs else "")


def test_the_standby_first_without_target_session_attrs_runs_on_the_primary(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _ = sync_pair
    dsn = _libpq(pair, pair.standby.port, pair.primary.port, None)
    assert conninfo_to_dict(migrate.writable_libpq_dsn(dsn))["port"] == str(pair.primary.port)
    migrate.upgrade(dsn)


def test_the_standby_alone_asked_for_a_writable_server_is_refused_naming_it(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _ = sync_pair
    dsn = (f"host=127.0.0.1 port={pair.standby.port} dbname={DATABASE} user=postgres "
           "password=hunter2-secret target_session_attrs=read-write")
    with pytest.raises(zeroth_pg.NoWritableServerError) as raised:
        migrate.upgrade(dsn)
    assert f"127.0.0.1:{pair.standby.port}: in recovery: a standby" in str(raised.value)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("attrs", ["prefer-standby", "standby", "read-only"])
def test_a_dsn_asking_for_a_standby_is_refused_before_the_migration_touches_anything(
        sync_pair: tuple[ReplicatedPair, str], attrs: str) -> None:
    # A migration writes: a DSN that asks libpq for a standby (or a read-only session) is the
    # operator's mistake, refused as such up front, not a read-only error from deep inside
    # alembic on whichever host libpq picked.
    pair, _ = sync_pair
    dsn = _libpq(pair, pair.primary.port, pair.standby.port, attrs)
    with pytest.raises(ValueError, match="target_session_attrs"):
        migrate.upgrade(dsn)


def test_after_a_failover_the_migration_runs_on_the_promoted_standby(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, dsn = sync_pair
    pair.failover()
    migrate.upgrade(dsn)  # the killed primary first: unreachable, the promoted one next
    with psycopg.connect(migrate.writable_libpq_dsn(dsn)) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
