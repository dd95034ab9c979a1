"""Commits, WAL flushes and WAL bytes per completed run (issue 13, item 4).

Under production durability every commit that wrote something waits for a WAL flush, so the
flushes per run are the ceiling of a system's serial rate on a given disk, and commits per run
are its round trips that end a transaction. For each system and concurrency: empty the queue,
enqueue n no-op runs (not counted), let the server's statistics settle, read the counters,
drain, let them settle again, read them again. Per run:

* commits — ``pg_stat_database.xact_commit`` of the system's own database (every committed
  transaction, read-only ones included: a lone SELECT in autocommit is one);
* WAL flushes — fsyncs of WAL: ``pg_stat_wal.wal_sync`` up to PostgreSQL 17; from 18 on that
  column is gone and the count is ``pg_stat_io`` (object ``wal``, context ``normal``, summed over
  backend types: client backends and the WAL writer alike); detected at runtime;
* WAL writes — ``wal_write`` / pg_stat_io ``writes`` of the same row (write() calls);
* WAL bytes — the difference of ``pg_current_wal_insert_lsn()``; full-page images
  (``pg_stat_wal.wal_fpi``) are kept beside them.

The WAL counters are cluster-wide, which is right because one system runs at a time; an idle
period measured first gives the background rate (WAL writer, checkpoints, standby snapshots),
subtracted per second of each measurement. "Settled" means every backend of the system's
database but its setup connection has gone (a backend flushes its statistics as it exits, before
it leaves pg_stat_activity), the setup connection's own were flushed with
``pg_stat_force_next_flush()``, and two reads 0.2 s apart agree. What remains counted besides
the runs: the consumer's start and stop (connection set-up statements, LISTEN) and at most two
bookkeeping statements of the drain on the setup connection, fixed costs spread over n runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import drains as drains_mod
from bench.harness import Config, Result, ScenarioReport, Target, interleave

FENCED = ("zeroth-worker", "zeroth-lease", "seed")

#: Issue 30: WAL bytes per completed run of the worker at c = 1, in its better configuration
#: (as the throughput scenario takes it: by default, or claiming ahead).
WAL_PER_RUN_TARGET = 900
METRICS = (("commits", "commits/run"), ("flushes", "WAL flushes/run"),
           ("writes", "WAL writes/run"), ("wal_bytes", "WAL bytes/run"),
           ("fpi", "full-page images/run"))


@dataclass(frozen=True)
class Counters:
    at: float
    commits: int
    rollbacks: int
    flushes: float | None
    writes: float | None
    wal_bytes: float
    fpi: float | None

    def minus(self, other: Counters) -> dict[str, float | None]:
        def diff(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else float(a) - float(b)

        return {"seconds": self.at - other.at, "commits": diff(self.commits, other.commits),
                "rollbacks": diff(self.rollbacks, other.rollbacks),
                "flushes": diff(self.flushes, other.flushes),
                "writes": diff(self.writes, other.writes),
                "wal_bytes": diff(self.wal_bytes, other.wal_bytes),
                "fpi": diff(self.fpi, other.fpi)}


class Stats:
    """Reads the server's counters from a connection to the admin database (its own read
    transactions count against that database, not the measured one)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.source = "none"
        self._wal = "NULL::numeric AS flushes, NULL::numeric AS writes"
        self._fpi = "NULL::numeric"

    @classmethod
    async def connect(cls, admin_dsn: str) -> Stats:
        stats = cls(await asyncpg.connect(admin_dsn))
        wal_columns = {row["attname"] for row in await stats.conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass('pg_stat_wal') "
            "AND attnum > 0 AND NOT attisdropped")}
        has_io_wal = await stats.conn.fetchval(
            "SELECT to_regclass('pg_stat_io') IS NOT NULL") and await stats.conn.fetchval(
            "SELECT EXISTS (SELECT FROM pg_stat_io WHERE object = 'wal')")
        if "wal_sync" in wal_columns:  # PostgreSQL 14–17
            stats.source = "pg_stat_wal.wal_sync / wal_write"
            stats._wal = ("(SELECT wal_sync FROM pg_stat_wal)::numeric AS flushes, "
                          "(SELECT wal_write FROM pg_stat_wal)::numeric AS writes")
        elif has_io_wal:  # PostgreSQL 18+: the counts moved to pg_stat_io
            stats.source = "pg_stat_io (object wal, context normal) fsyncs / writes"
            stats._wal = ("(SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal' "
                          "AND context = 'normal') AS flushes, "
                          "(SELECT sum(writes) FROM pg_stat_io WHERE object = 'wal' "
                          "AND context = 'normal') AS writes")
        if "wal_fpi" in wal_columns:
            stats._fpi = "(SELECT wal_fpi FROM pg_stat_wal)::numeric"
        return stats

    async def close(self) -> None:
        await self.conn.close()

    async def read(self, database: str) -> Counters:
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await self.conn.fetchrow(
            f"""SELECT d.xact_commit, d.xact_rollback, {self._wal}, {self._fpi} AS fpi,
                       pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') AS lsn
                  FROM pg_stat_database d WHERE d.datname = $1""", database)
        assert row is not None, database
        return Counters(time.monotonic(), row["xact_commit"], row["xact_rollback"],
                        row["flushes"], row["writes"], float(row["lsn"]), row["fpi"])

    async def settled(self, system: Any, database: str, limit: float = 10.0) -> Counters:
        """The counters once every other backend of ``database`` has gone and two reads agree."""
        pid = system.conn.get_server_pid()
        await flush_own(system.conn)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            others = await self.conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2",
                database, pid)
            if not others:
                break
            await asyncio.sleep(0.02)
        last = await self.read(database)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            now = await self.read(database)
            if (now.commits, now.flushes, now.wal_bytes) == (last.commits, last.flushes,
                                                              last.wal_bytes):
                return now
            last = now
        return last


async def flush_own(conn: asyncpg.Connection) -> None:
    """Make a connection's pending statistics shared now (PostgreSQL 15+: a backend flushes them
    at most once a second otherwise); the flush happens before the answer comes back."""
    if conn.get_server_version().major >= 15:
        await conn.execute("SELECT pg_stat_force_next_flush()")


def concurrencies(cfg: Config) -> tuple[int, ...]:
    return (1,) if cfg.quick else (1, 8, 32)


def runs_per_measurement(cfg: Config) -> int:
    return 100 if cfg.quick else 1_000


async def commits(cfg: Config, s: Any) -> ScenarioReport:
    n = runs_per_measurement(cfg)
    cs = concurrencies(cfg)
    rep = ScenarioReport("commits", f"Commits and WAL flushes per completed run ({n} no-op runs "
                         f"drained per measurement, concurrency {'/'.join(map(str, cs))})")
    found, skipped = drains_mod.drains(s)
    if any(d.name == "zeroth-worker" for d in found):
        # The worker's other configuration, as in the throughput scenario: claim_ahead = C (a
        # call then carries the completions and claims of about twice the runs).
        found.insert(1, drains_mod.Drain(
            "zeroth-worker claim_ahead", s.zeroth,
            lambda n, c: s.zeroth.drain_worker(n, concurrency=c, claim_ahead=c), "zeroth.runs",
            latency=False))
    admin_dsn = found[0].system.server.admin_dsn
    stats = await Stats.connect(admin_dsn)
    try:
        databases = {id(d.system): await d.system.conn.fetchval("SELECT current_database()")
                     for d in found}
        idle_seconds = 0.5 if cfg.quick else 3.0
        first = await stats.settled(found[0].system, databases[id(found[0].system)])
        await asyncio.sleep(idle_seconds)
        idle = (await stats.read(databases[id(found[0].system)])).minus(first)
        background = {k: (v or 0.0) / idle["seconds"] for k, v in idle.items()
                      if k in ("flushes", "writes", "wal_bytes", "fpi") and idle["seconds"]}
        per_run: dict[tuple[str, int], list[dict[str, float | None]]] = {}

        def measure(drain: drains_mod.Drain, c: int) -> Any:
            system, database = drain.system, databases[id(drain.system)]
            count = drains_mod.runs(drain, n)

            async def one() -> float:
                await system.reset()
                await system.enqueue(count)
                before = await stats.settled(system, database)
                seconds = await drain.run(count, c)
                after = await stats.settled(system, database)
                delta = after.minus(before)
                row: dict[str, float | None] = {"runs": count, "drain_seconds": seconds}
                for key, _ in METRICS:
                    value = delta[key]
                    if value is not None and key in background:
                        value = max(0.0, value - background[key] * (delta["seconds"] or 0.0))
                    row[key] = None if value is None else value / count
                row["rollbacks"] = (delta["rollbacks"] or 0.0) / count
                per_run.setdefault((drain.name, c), []).append(row)
                return count / seconds

            return one

        for c in cs:
            rates = await interleave([(d.name, measure(d, c)) for d in found], cfg.repeat)
            for name, values in rates.items():
                rows = per_run[(name, c)][-len(values):]  # not the warm-up round
                for key, unit in METRICS:
                    if any(r[key] is None for r in rows):
                        continue
                    rep.results.append(Result(
                        rep.name, name, key, unit, tuple(float(r[key] or 0.0) for r in rows),
                        {"concurrency": c}, higher_is_better=False,
                        extra={"measurements": rows}))
                rep.results.append(Result(rep.name, name, "throughput", "runs/s", tuple(values),
                                          {"concurrency": c}))
    finally:
        await stats.close()
    rep.tables.append(_table(rep.results, cs))
    rep.targets += _targets(rep.results, cs, judged=not cfg.quick)
    rep.notes.append(
        f"WAL flushes from {stats.source}; commits from pg_stat_database.xact_commit of each "
        "system's own database; WAL bytes from pg_current_wal_insert_lsn(). Idle background "
        f"over {idle_seconds:.0f} s, subtracted per second: "
        + ", ".join(f"{k} {v:.2f}/s" for k, v in background.items())
        + ". The counters include each drain's fixed costs (the consumer's connections, LISTEN, "
        "start and stop) spread over its runs"
        + (f" ({', '.join(f'{d.name} {drains_mod.runs(d, n)}' for d in found if d.runs_share < 1)}"
           " runs for the slow ones)" if any(d.runs_share < 1 for d in found) else "")
        + ". Group commit shows as fewer flushes than writing commits at higher concurrency. "
        "Throughput is that of the counted drains (one measurement each, small n). Full-page "
        "images follow checkpoints (and, with data_checksums on, hint bits): they vary with "
        "when a checkpoint fell.")
    if skipped:
        rep.notes.append(f"Not measured (no drain adapter in bench/drains.py): "
                         f"{', '.join(skipped)}.")
    return rep


def _get(results: list[Result], system: str, metric: str, c: int) -> Result | None:
    return next((r for r in results if r.system == system and r.metric == metric
                 and r.params.get("concurrency") == c), None)


def _table(results: list[Result], cs: tuple[int, ...]) -> str:
    systems = list(dict.fromkeys(r.system for r in results))
    shown = [("commits", 2), ("flushes", 2), ("wal_bytes", 0), ("throughput", 0)]
    head = "| system | c | commits/run | WAL flushes/run | WAL bytes/run | runs/s (counted drain) |"
    lines = [head, "|---|---|---|---|---|---|"]
    for system in systems:
        for c in cs:
            cells = []
            for metric, digits in shown:
                found = _get(results, system, metric, c)
                cells.append("—" if found is None else f"{found.median:,.{digits}f}")
            lines.append(f"| {system} | {c} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _targets(results: list[Result], cs: tuple[int, ...], *,
             judged: bool = True) -> list[Target]:
    targets = []
    for c in cs:
        goal = (f"zeroth_pg's WAL flushes per run lowest among the systems that fence every "
                f"write (zeroth-worker, zeroth-lease, seed), c={c}")
        found = {name: _get(results, name, "flushes", c) for name in FENCED}
        ours = [r for name, r in found.items() if name.startswith("zeroth") and r is not None]
        seed = found["seed"]
        if not ours or seed is None:
            targets.append(Target(goal, "not measured", None))
            continue
        best = min(ours, key=lambda r: r.median)
        ratio = best.median / seed.median if seed.median else float("inf")
        measured = (", ".join(f"{name} {r.median:.2f}" for name, r in found.items() if r)
                    + f" flushes/run; {best.system} ÷ seed = {ratio:.2f}")
        targets.append(Target(goal, measured, best.median < seed.median))
    if 1 in cs:
        targets.append(_wal_target(results, judged))
    return targets


def _wal_target(results: list[Result], judged: bool) -> Target:
    """``judged`` False (--quick): the drain's fixed costs, spread over 100 runs, would decide
    it; the value is shown, not judged."""
    goal = (f"WAL bytes per completed run at c=1 ≤ {WAL_PER_RUN_TARGET} (zeroth-worker, its "
            "better configuration)")
    ours = [r for r in results if r.system.startswith("zeroth-worker")
            and r.metric == "wal_bytes" and r.params.get("concurrency") == 1]
    if not ours:
        return Target(goal, "not measured", None)
    best = min(ours, key=lambda r: r.median)
    measured = ", ".join(f"{r.system} {r.median:,.0f}" for r in ours) + " bytes/run"
    if not judged:
        return Target(goal, measured + " (quick run: not judged)", None)
    return Target(goal, measured, best.median <= WAL_PER_RUN_TARGET)
