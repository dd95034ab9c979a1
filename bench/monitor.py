"""A monitoring loop beside the load, as real monitoring runs one (issue 30).

Every :data:`INTERVAL` seconds, on a connection of its own, each statement in its own
transaction (as pgwatch, check_pgactivity or an outside harness's sampler do):
``pgstattuple`` of the system's jobs table (of each leaf partition of a partitioned one, as
pg-boss's), ``pgstatindex`` of one of its B-tree indexes, and ``pg_stat_activity`` of the
database (sessions, oldest transaction, oldest xmin). Each of them holds a snapshot for as long
as it reads: moments with the xmin horizon pinned, which is what the issue's harness did to a
fresh zeroth_pg database. Besides, from ``pg_stat_user_tables``: dead tuples and when
autovacuum first vacuumed or analyzed the table (seconds after the load began), which splits a
cell into "before any autovacuum" and "after".

pgstattuple is a contrib extension (``CREATE EXTENSION pgstattuple``: superuser, the admin DSN
the bench uses); where it cannot be created the loop samples pg_stat_activity alone and says so
in :attr:`Monitor.problem`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

INTERVAL = 5.0


@dataclass
class Monitor:
    """Samples ``table`` (and ``index``, else the table's first B-tree index) of ``dsn``; times
    are seconds after ``origin()`` (perf_counter of the load's start)."""

    dsn: str
    table: str
    index: str | None = None
    origin: Callable[[], float] = time.perf_counter
    samples: list[dict[str, Any]] = field(default_factory=list)
    first_autovacuum: float | None = None
    first_autoanalyze: float | None = None
    problem: str | None = None

    @property
    def first_maintenance(self) -> float | None:
        """When autovacuum first vacuumed or analyzed the table (either ends the cold start)."""
        found = [t for t in (self.first_autovacuum, self.first_autoanalyze) if t is not None]
        return min(found, default=None)

    async def prepare(self) -> None:
        """Create the extension before the load starts (a monitoring setup step)."""
        conn = await asyncpg.connect(self.dsn)
        try:
            if self.index and await conn.fetchval("SELECT to_regclass($1)", self.index) is None:
                self.index = None  # renamed or dropped (a schema change): the table's first
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        except asyncpg.PostgresError as exc:
            self.problem = f"pgstattuple unavailable: {exc}"
        finally:
            await conn.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every INTERVAL until ``stop``; a lost connection (a restart) is replaced at
        the next sample."""
        conn: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                began = time.perf_counter()
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(self.dsn, timeout=5)
                    self.samples.append(await self._sample(conn))
                except Exception as exc:
                    # Any failure of a sample is data, not the end of the cell: a restart can
                    # leave asyncpg mid-operation (InternalClientError, no InterfaceError).
                    self.samples.append({"t": self._now(), "error": str(exc)[:200]})
                    if conn is not None:
                        conn.terminate()
                    conn = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        stop.wait(), max(0.0, INTERVAL - (time.perf_counter() - began)))
        finally:
            if conn is not None:
                conn.terminate()

    def _now(self) -> float:
        return time.perf_counter() - self.origin()

    async def _sample(self, conn: asyncpg.Connection) -> dict[str, Any]:
        sample: dict[str, Any] = {"t": self._now()}
        # pg_partition_tree returns no row for a table that is not partitioned.
        leaves = [row[0] for row in await conn.fetch(
            "SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) "
            "WHERE isleaf ORDER BY 1", self.table)] or [self.table]
        if self.problem is None:
            tuples = dead = 0
            for leaf in leaves:
                row = await conn.fetchrow(
                    "SELECT tuple_count, dead_tuple_count FROM pgstattuple($1::regclass)", leaf)
                tuples += row["tuple_count"]
                dead += row["dead_tuple_count"]
            indexes = [self.index] if self.index else [row[0] for row in await conn.fetch(
                """SELECT DISTINCT ON (i.indrelid) i.indexrelid::regclass::text
                     FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                     JOIN pg_am a ON a.oid = c.relam
                    WHERE i.indrelid = ANY($1::regclass[]) AND a.amname = 'btree'
                    ORDER BY i.indrelid, c.relname""", leaves)]
            leaf_pages = 0
            for index in indexes:
                row = await conn.fetchrow(
                    "SELECT leaf_pages FROM pgstatindex($1::regclass)", index)
                leaf_pages += row["leaf_pages"]
            sample.update(tuples=tuples, dead_tuples=dead, index_leaf_pages=leaf_pages)
        activity = await conn.fetchrow(
            """SELECT count(*) AS sessions,
                      coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)
                        AS oldest_xact_s,
                      coalesce(max(age(backend_xmin)), 0) AS oldest_xmin_age
                 FROM pg_stat_activity WHERE datname = current_database()""")
        stats = await conn.fetchrow(
            """SELECT coalesce(sum(n_dead_tup), 0) AS n_dead_tup,
                      coalesce(sum(autovacuum_count), 0) AS autovacuums,
                      coalesce(sum(autoanalyze_count), 0) AS autoanalyzes,
                      min(extract(epoch FROM clock_timestamp() - last_autovacuum)) AS vacuum_ago,
                      min(extract(epoch FROM clock_timestamp() - last_autoanalyze))
                        AS analyze_ago
                 FROM pg_stat_user_tables WHERE relid = ANY($1::regclass[])""", leaves)
        sample.update(sessions=activity["sessions"],
                      oldest_xact_s=float(activity["oldest_xact_s"]),
                      oldest_xmin_age=activity["oldest_xmin_age"],
                      n_dead_tup=int(stats["n_dead_tup"]), autovacuums=int(stats["autovacuums"]),
                      autoanalyzes=int(stats["autoanalyzes"]))
        # The first one seen: its time from the table's last_auto* (exact when it is the first).
        if self.first_autovacuum is None and stats["vacuum_ago"] is not None:
            self.first_autovacuum = sample["t"] - float(stats["vacuum_ago"])
        if self.first_autoanalyze is None and stats["analyze_ago"] is not None:
            self.first_autoanalyze = sample["t"] - float(stats["analyze_ago"])
        return sample
