"""The bench as users run it (issue 30): cold starts on a stock PostgreSQL 15 and on the
embedded 18, with a monitoring loop beside the load, and a dirty table.

**cold_start** — on each server version (:meth:`Systems.versions`: Debian's PostgreSQL 15 from
``/usr/lib/postgresql/15/bin`` with initdb's stock settings, and the bench's own server, the
embedded 18 or ``ZEROTH_PG_BENCH_DSN``), every cell starts from a **fresh database** (zeroth_pg:
migrated; each peer: its schema installed, as its docs say), the load begins at once, the bench
runs **no VACUUM and no ANALYZE**, and autovacuum is the server's own. Beside the load runs
:class:`bench.monitor.Monitor` (pgstattuple, pgstatindex, pg_stat_activity every 5 s). Cells:

* continuous — a producer at a fixed offered rate while the consumer (W slots, 1 ms handler)
  runs: 600/s at W = 32, 200/s at W = 4 (bench/continuous.py);
* chaos — the 600/s cell with ``pg_ctl restart -m fast`` half-way (servers the bench started);
* depth — the queue held 4,000 deep, W = 4 / 16 / 64, long enough to see the first
  autovacuum of the jobs table.

Every system (zeroth-worker, pgqueuer, procrastinate, pg-boss) runs every cell, and the depth
cells also run the worker's other configuration, ``zeroth-worker claim_ahead`` (claim_ahead = W,
as in the throughput scenario; the pg-boss ratio takes the better of the two, named); reported
per 5 s window: runs started per second and the pickup p99 of the runs enqueued in it, and when
autovacuum first vacuumed / analyzed the jobs table. The targets are issue 30's, as ratios.

**dirty_table** — zeroth_pg's claim latency and throughput on a clean table against one with
200,000 dead tuples in ``zeroth.runs`` and autovacuum held off: another session holds a
transaction with an xid (``BEGIN; SELECT txid_current()``) for the whole phase, so nothing dead
can be vacuumed or have its index entries killed; the dead tuples are runs enqueued and then
deleted while it is held. Both phases on each server version, each on a fresh database.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import pgboss
from bench.continuous import (
    DRAIN_LIMIT,
    RECOVERY_GRACE,
    WARMUP,
    WINDOW,
    Load,
    Trace,
    pgboss_cell,
    pgqueuer_cell,
    procrastinate_cell,
    restart_cell_seconds,
    window_starts,
    zeroth_cell,
)
from bench.harness import Config, Result, ScenarioReport, Server, Target, percentile, pool
from bench.monitor import Monitor
from bench.systems import PgQueuer, Procrastinate, Zeroth
from zeroth_pg import LeaseManager

SYSTEMS = ("zeroth-worker", "pgqueuer", "procrastinate", "pg-boss")
#: The worker's other configuration, in the depth cells only (as in the throughput scenario):
#: claim_ahead = W, W runs more claimed than its handler slots, each waiting for one.
AHEAD = "zeroth-worker claim_ahead"
DEPTH_SYSTEMS = ("zeroth-worker", AHEAD, "pgqueuer", "procrastinate", "pg-boss")
#: What each system's monitor samples: its jobs table and (zeroth_pg) the claim's index.
TABLES = {"zeroth-worker": ("zeroth.runs", "zeroth.runs_claim_pending_idx"),
          AHEAD: ("zeroth.runs", "zeroth.runs_claim_pending_idx"),
          "pgqueuer": ("pgqueuer", None), "procrastinate": ("procrastinate_jobs", None),
          "pg-boss": ("pgboss.job", None)}
DEPTH = 4000
QUICK_DEPTH = 500
QUICK_DRAIN_LIMIT = 5.0
FIRST_MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class Cell:
    kind: str  # continuous | chaos | depth
    concurrency: int
    seconds: float
    rate: float = 0.0
    systems: tuple[str, ...] = SYSTEMS
    depth: int = DEPTH

    @property
    def label(self) -> str:
        if self.kind == "depth":
            return f"depth {self.depth}, W={self.concurrency}"
        restart = ", restart" if self.kind == "chaos" else ""
        return f"{self.rate:.0f}/s, W={self.concurrency}{restart}"


def plan(cfg: Config, version: str) -> list[Cell]:
    """The cells on one server version. Quick (CI's smoke): each code path once, one 5 s
    window per cell — on PostgreSQL 15 a continuous cell of zeroth_pg; on the bench's own
    server a depth cell (500 deep) of zeroth_pg (both configurations) and pgqueuer, a
    continuous one of procrastinate and pg-boss, and zeroth_pg's restart cell (10 s, restart
    at 2 s)."""
    if cfg.quick:
        if version == "15":
            return [Cell("continuous", 4, 5.0, 50.0, ("zeroth-worker",))]
        return [Cell("depth", 4, 5.0, depth=QUICK_DEPTH,
                     systems=("zeroth-worker", AHEAD, "pgqueuer")),
                Cell("continuous", 4, 5.0, 50.0, ("procrastinate", "pg-boss")),
                Cell("chaos", 4, 10.0, 50.0, ("zeroth-worker",))]
    cells = [Cell("continuous", 32, 60.0, 600.0), Cell("continuous", 4, 60.0, 200.0),
             Cell("chaos", 32, restart_cell_seconds(60.0), 600.0),
             *(Cell("depth", w, 120.0, systems=DEPTH_SYSTEMS) for w in (4, 16, 64))]
    return _chosen(cells)


def _chosen(cells: list[Cell]) -> list[Cell]:
    """The cells and systems ZEROTH_PG_BENCH_COLD_CELLS (kinds: continuous, chaos, depth) and
    ZEROTH_PG_BENCH_COLD_SYSTEMS (names of DEPTH_SYSTEMS; AHEAD runs in depth cells only) keep,
    comma-separated; unset: all."""
    kinds = _listed("ZEROTH_PG_BENCH_COLD_CELLS", {"continuous", "chaos", "depth"})
    systems = _listed("ZEROTH_PG_BENCH_COLD_SYSTEMS", set(DEPTH_SYSTEMS))
    return [dataclasses.replace(cell, systems=tuple(n for n in cell.systems
                                                    if systems is None or n in systems))
            for cell in cells if kinds is None or cell.kind in kinds]


def _listed(variable: str, allowed: set[str]) -> set[str] | None:
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    names = {name.strip() for name in value.split(",") if name.strip()}
    if not names or not names <= allowed:
        raise SystemExit(f"{variable}={value!r}: expected a comma-separated list of "
                         f"{', '.join(sorted(allowed))}")
    return names


def restart_after(cell: Cell) -> float:
    """When a chaos cell restarts the server: half-way (a quick one: after 2 s)."""
    return 2.0 if cell.seconds < 2 * WARMUP else max(WARMUP, cell.seconds / 2)


def recovery_grace(cell: Cell) -> float:
    return 2.0 if cell.seconds < 2 * WARMUP else RECOVERY_GRACE


@dataclass
class Outcome:
    """One system in one cell."""

    trace: Trace
    sent: int
    monitor: Monitor
    seconds: float

    def windows(self) -> list[float]:
        return self.trace.windows(self.seconds)

    def before_maintenance(self, since: float) -> list[int]:
        """Indexes of the whole windows from ``since`` that ended before autovacuum first
        vacuumed or analyzed the jobs table."""
        first = self.monitor.first_maintenance
        return [i for i, start in enumerate(window_starts(self.seconds))
                if start >= since and (first is None or start + WINDOW <= first)]


async def _run_cell(server: Server, name: str, cell: Cell, restart: Any) -> Outcome:
    trace = Trace()
    load = Load(cell.seconds, rate=cell.rate,
                depth=cell.depth if cell.kind == "depth" else None,
                restart=restart if cell.kind == "chaos" else None,
                restart_after=restart_after(cell),
                drain_limit=QUICK_DRAIN_LIMIT if cell.seconds < 2 * WARMUP else DRAIN_LIMIT)
    system: Any = None
    # Names of the cell's own: the suite's systems keep their databases on the same server.
    label = "cold_" + re.sub(r"\W", "_", name)
    if name in (ZEROTH := ("zeroth-worker", AHEAD)):
        dsn = await asyncio.to_thread(server.zeroth_database, label)
    elif name == "pg-boss":
        dsn = await asyncio.to_thread(server.database, label)
    else:
        system = PgQueuer(server) if name == "pgqueuer" else Procrastinate(server)
        system.label = label
        await system.setup()
        dsn = system.dsn
    table, index = TABLES[name]
    monitor = Monitor(dsn, table, index, origin=lambda: trace.t0)
    await monitor.prepare()
    stop = asyncio.Event()

    async def watch() -> None:
        await trace.loading.wait()
        await monitor.run(stop)

    watching = asyncio.create_task(watch())
    try:
        if name in ZEROTH:
            sent = await zeroth_cell(dsn, trace, load, cell.concurrency,
                                     claim_ahead=cell.concurrency if name == AHEAD else 0)
        elif name == "pg-boss":
            sent = await pgboss_cell(dsn, trace, load, cell.concurrency)
        elif name == "pgqueuer":
            sent = await pgqueuer_cell(system, trace, load, cell.concurrency)
        else:
            sent = await procrastinate_cell(system, trace, load, cell.concurrency)
    finally:
        stop.set()
        if trace.loading.is_set():
            await watching
        else:  # the cell failed before its load began
            watching.cancel()
        if system is not None:
            with contextlib.suppress(Exception):  # its connection may have died in a restart
                await system.close()
        # Gone before the next cell: a database left behind would keep autovacuum's workers
        # busy (and its launcher's round longer) while the next cell waits for its first one.
        await asyncio.to_thread(server.drop, label)
    return Outcome(trace, sent, monitor, cell.seconds)


def _fmt_series(values: list[float], digits: int = 0) -> str:
    return " ".join("–" if v != v else f"{v:.{digits}f}" for v in values)


def _when(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} s"


async def cold_start(cfg: Config, s: Any) -> ScenarioReport:
    rep = ScenarioReport("cold_start", "Cold start as users run it: fresh database, no VACUUM "
                         "or ANALYZE by the bench, stock autovacuum, a monitor beside the load, "
                         "per 5 s window")
    reason = pgboss.unavailable()
    if reason is not None:
        rep.notes.append(f"pg-boss unavailable: {reason}")
        print(f"[bench] pg-boss unavailable: {reason}", flush=True)
    for version, server, why in await s.versions():
        if server is None:
            rep.notes.append(f"PostgreSQL {version} not measured: {why}")
            print(f"[bench] PostgreSQL {version} not measured: {why}", flush=True)
            continue
        await _one_version(cfg, rep, version, server, pgboss_missing=reason,
                           reconnect=s.reconnect if server is s.zeroth.server else None)
    rep.notes.append(
        "Each cell and system: a fresh database (zeroth_pg migrated with zeroth_pg.migrate; "
        "pgqueuer `install` + its `optimize_autovacuum` table settings; procrastinate "
        "apply_schema; pg-boss 10.4.2's own start()), new connections, load at once, the "
        "consumer in the producer's process (pg-boss: a Node process, bench/pgboss/driver.js, "
        "one work() loop of batchSize W whose handlers run at once — pg-boss's fastest shape "
        "of batch 1, 4, 16 and W —, pollingIntervalSeconds 0.5, woken with notifyWorker "
        "after each insert and after each batch it found). Windows: runs whose handler started "
        "in each 5 s window, per second; p99: pickup (enqueue committed → handler start) of the "
        "runs enqueued in that window. 'autovacuum / autoanalyze': when autovacuum first "
        "vacuumed / analyzed the jobs table, from pg_stat_user_tables, seconds after the load "
        "began. The monitor (bench/monitor.py) runs pgstattuple on the jobs table, pgstatindex "
        "on one of its indexes (zeroth_pg: the claim's partial index) and a pg_stat_activity "
        "query every 5 s. Depth cells hold 4,000 runs queued (a count, then at most 500 per "
        "enqueue); they also run the worker with claim_ahead = W (W runs claimed beyond its "
        "handler slots, each waiting for one), and the pg-boss ratio takes the better "
        "configuration, named.")
    return rep


async def _one_version(cfg: Config, rep: ScenarioReport, version: str, server: Server,
                       pgboss_missing: str | None,
                       reconnect: Callable[[], Awaitable[None]] | None) -> None:
    found = await server.settings()
    shown = ", ".join(f"{k} {found[k]}" for k in (
        "server_version", "fsync", "synchronous_commit", "full_page_writes", "autovacuum",
        "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
        "autovacuum_analyze_scale_factor", "shared_buffers") if k in found)
    rep.results.append(Result(rep.name, "server", "settings", "", (0.0,), {"version": version},
                              extra=found))
    lines = [f"**PostgreSQL {version}** ({server.kind}: {shown})", "",
             "| cell | system | started of sent | runs/s per 5 s window | pickup p99 ms per "
             "window | autovacuum / autoanalyze |", "|---|---|---|---|---|---|"]
    depth_rates: dict[tuple[int, str], float] = {}
    for cell in plan(cfg, version):
        if cell.kind == "chaos" and server.restart is None:
            rep.notes.append(f"PostgreSQL {version}: the restart cells need a server the bench "
                             "started itself; skipped on ZEROTH_PG_BENCH_DSN.")
            continue
        for name in cell.systems:
            if name == "pg-boss" and pgboss_missing is not None:
                lines.append(f"| {cell.label} | pg-boss | pg-boss unavailable: "
                             f"{pgboss_missing} | | | |")
                continue
            try:
                out = await _run_cell(server, name, cell, server.restart)
            except Exception as exc:
                if cell.kind == "chaos" and reconnect is not None:
                    await reconnect()
                if name in ("zeroth-worker", AHEAD):
                    raise  # the system under test: the scenario crashed
                # A peer that fails (its driver, its library) costs its row, not the scenario.
                why = f"{type(exc).__name__}: {str(exc)[:300]}"
                lines.append(f"| {cell.label} | {name} | failed: {why} | | | |")
                rep.notes.append(f"PostgreSQL {version}, {cell.label}, {name} failed: {why}")
                print(lines[-1], flush=True)
                continue
            if cell.kind == "chaos" and reconnect is not None:
                await reconnect()  # the suite's setup connections died with the server
            windows, p99s = out.windows(), out.trace.window_p99(cell.seconds)
            mon = out.monitor
            lines.append(
                f"| {cell.label} | {name} | {len(out.trace.started)} of {out.sent} | "
                f"{_fmt_series(windows)} | {_fmt_series(p99s, 1)} | "
                f"{_when(mon.first_autovacuum)} / {_when(mon.first_autoanalyze)} |")
            print(lines[-1], flush=True)
            if out.trace.peer_errors:
                rep.notes.append(f"PostgreSQL {version}, {cell.label}, {name}: "
                                 f"{out.trace.peer_errors} unhandled rejection(s) logged and "
                                 "survived (Node would end the process)")
            params = {"version": version, "cell": cell.label, "kind": cell.kind,
                      "concurrency": cell.concurrency, "offered": cell.rate}
            rep.results.append(Result(
                rep.name, name, "window_median", "runs/s",
                (statistics.median(windows) if windows else 0.0,), params,
                extra={"windows": windows, "window_p99_ms": p99s, "sent": out.sent,
                       "started": len(out.trace.started), "restart": out.trace.restart,
                       "first_autovacuum": mon.first_autovacuum,
                       "first_autoanalyze": mon.first_autoanalyze,
                       "monitor_problem": mon.problem, "monitor": mon.samples}))
            if mon.problem:
                rep.notes.append(f"PostgreSQL {version}, {name}: {mon.problem}")
            if cell.kind == "depth":
                depth_rates[(cell.concurrency, name)] = (
                    statistics.median(windows) if windows else 0.0)
            if name == "zeroth-worker":
                rep.targets.append(_target(version, cell, out))
    for w in sorted({w for w, _ in depth_rates}):
        # The better of the worker's two configurations, named (as in the throughput scenario).
        ours = [(depth_rates[(w, n)], n) for n in ("zeroth-worker", AHEAD) if (w, n) in depth_rates]
        if not ours:
            continue
        rate, name = max(ours)
        theirs = depth_rates.get((w, "pg-boss"))
        goal = (f"PG {version} cold start, queue held deep, W={w}: ≥ 2× pg-boss's rate "
                "(median 5 s window)")
        if theirs is None:
            rep.targets.append(Target(goal, "not measured (pg-boss not run)", None))
        elif theirs <= 0:
            rep.targets.append(Target(goal, f"pg-boss started nothing; {name} {rate:.0f}/s",
                                      rate > 0))
        else:
            ratio = rate / theirs
            rep.targets.append(Target(goal, f"{ratio:.2f}× ({name} {rate:.0f} vs {theirs:.0f} "
                                            "runs/s)", ratio >= 2.0))
    rep.tables.append("\n".join(lines))


def _target(version: str, cell: Cell, out: Outcome) -> Target:
    windows = out.windows()
    first = out.monitor.first_maintenance
    if cell.kind == "depth":
        goal = (f"PG {version} cold start, depth {cell.depth}, W={cell.concurrency}: no 5 s window "
                "of the first minute below 80% of the rate after the first autovacuum")
        starts = window_starts(out.seconds)
        early = [w for start, w in zip(starts, windows, strict=True) if start < FIRST_MINUTE]
        after = [w for start, w in zip(starts, windows, strict=True)
                 if first is not None and start >= first]
        if not after or not early:
            return Target(goal, f"not measured: no whole window after an autovacuum of "
                          f"zeroth.runs (first: {_when(first)}) in {out.seconds:.0f} s; "
                          f"first-minute min {min(early, default=0):.0f}/s", None)
        reference = statistics.median(after)
        ratio = min(early) / reference if reference else 0.0
        return Target(goal, f"{ratio:.2f} (min {min(early):.0f} vs {reference:.0f} runs/s "
                      f"after the autovacuum at {first:.0f} s)", ratio >= 0.8)
    if cell.kind == "chaos":
        goal = (f"PG {version} cold start {cell.rate:.0f}/s W={cell.concurrency}, restarted "
                "half-way: every 5 s window from the grace on ≥ 95% of offered, p99 ≤ 100 ms")
        if out.trace.restart is None:
            return Target(goal, "not measured: no restart happened", None)
        since = out.trace.restart[1] + recovery_grace(cell)
        after = [w for start, w in zip(window_starts(out.seconds), windows, strict=True)
                 if start >= since]
        p99 = percentile(out.trace.pickups_ms(since), 99)
        if not after:
            return Target(goal, f"not measured: no whole window {recovery_grace(cell):.0f} s "
                          "after the restart", None)
        ratio = min(after) / cell.rate
        took = out.trace.restart[1] - out.trace.restart[0]
        recovered = out.trace.recovered_after(cell.rate)
        return Target(goal, f"{ratio:.2f} of offered (min {min(after):.0f}/s), p99 "
                      f"{p99:.1f} ms, restart took {took:.1f} s, ≥ 95% again after "
                      f"{'never' if recovered is None else f'{recovered:.0f} s'}",
                      ratio >= 0.95 and p99 <= 100)
    goal = (f"PG {version} cold start {cell.rate:.0f}/s W={cell.concurrency}: every 5 s window "
            "from 10 s on, before any autovacuum, ≥ 95% of offered and pickup p99 ≤ 100 ms")
    since = min(WARMUP, out.seconds - WINDOW)  # quick cells are shorter than the warm-up
    chosen = out.before_maintenance(since)
    if not chosen:
        # An autovacuum before the first window counted (a server holding many databases is
        # visited often): the target cannot be judged, but what every window did is still data.
        every = [i for i, start in enumerate(window_starts(out.seconds)) if start >= since]
        low, p99 = _low_and_p99(out, cell, since, every)
        return Target(goal, f"not measured: autovacuum of zeroth.runs at {_when(first)}; every "
                      f"window from {since:.0f} s on (after it): {low / cell.rate:.2f} of offered "
                      f"(min {low:.0f}/s), p99 {p99:.1f} ms", None)
    low, p99 = _low_and_p99(out, cell, since, chosen)
    ratio = low / cell.rate
    return Target(goal, f"{ratio:.2f} of offered (min {low:.0f}/s in {len(chosen)} windows), "
                  f"p99 {p99:.1f} ms", ratio >= 0.95 and p99 <= 100)


def _low_and_p99(out: Outcome, cell: Cell, since: float, chosen: list[int]) -> tuple[float, float]:
    """The lowest rate of the chosen windows and the pickup p99 of the runs acked in them."""
    if not chosen:
        return 0.0, 0.0
    windows = out.windows()
    low = min(windows[i] for i in chosen)
    end = window_starts(out.seconds)[chosen[-1]] + WINDOW
    p99 = percentile([ms for n, acked in out.trace.acked.items() if n in out.trace.started
                      and since <= acked - out.trace.t0 < end
                      for ms in (1000 * (out.trace.started[n] - acked),)], 99)
    return low, p99


# -- dirty table ----------------------------------------------------------------------------------

DIRTY_LOOPS = 8


async def _drain_timed(dsn: str, n: int) -> tuple[float, list[float]]:
    """n queued runs drained by DIRTY_LOOPS LeaseManager loops, claim_and_start (batch 1) →
    complete_runs: runs/s and every claim's latency (ms)."""
    claims: list[float] = []
    async with pool(dsn, DIRTY_LOOPS) as loops:
        lm = LeaseManager(loops)

        async def loop(worker_id: str) -> int:
            done = 0
            while True:
                began = time.perf_counter()
                claim = await lm.claim_and_start("bench", worker_id, batch_size=1)
                claims.append(1000 * (time.perf_counter() - began))
                if not claim.runs:
                    return done
                await lm.complete_runs(worker_id, [(r.run_id, r.lease_generation)
                                                   for r in claim.runs])
                done += len(claim.runs)

        started = time.perf_counter()
        done = sum(await asyncio.gather(*(loop(f"dirty-{i}") for i in range(DIRTY_LOOPS))))
        elapsed = time.perf_counter() - started
    assert done == n, f"drained {done} of {n}"
    return n / elapsed, claims


async def _claim_counters(conn: asyncpg.Connection) -> dict[str, int]:
    """The server's cumulative counters the drain moves: entries returned by index scans of
    runs_claim_pending_idx (only the claims read it), blocks requested from zeroth.runs (claims
    and completions) and from that index."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await conn.fetchrow(
        """SELECT (SELECT idx_tup_read FROM pg_stat_user_indexes
                     WHERE indexrelid = 'zeroth.runs_claim_pending_idx'::regclass)
                      AS claim_index_entries,
                  (SELECT heap_blks_read + heap_blks_hit FROM pg_statio_user_tables
                     WHERE relid = 'zeroth.runs'::regclass) AS heap_blocks,
                  (SELECT idx_blks_read + idx_blks_hit FROM pg_statio_user_indexes
                     WHERE indexrelid = 'zeroth.runs_claim_pending_idx'::regclass)
                      AS claim_index_blocks""")
    return {name: int(value or 0) for name, value in row.items()}


async def _dirty_phase(server: Server, dirty: bool, dead: int, n: int,
                       prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
                       ) -> dict[str, Any]:
    """zeroth_pg's phase: n runs drained on a fresh database, clean or dirty. prepare: run on
    the migrated database first (bench/dirty_phases.py: an earlier commit's functions)."""
    z = Zeroth(server)
    z.label = f"dirty{int(dirty)}"
    await z.setup()
    if prepare is not None:
        await prepare(z.conn)
    holder: asyncpg.Connection | None = None
    try:
        if dirty:
            holder = await asyncpg.connect(z.dsn)
            await holder.execute("BEGIN")
            await holder.fetchval("SELECT txid_current()")  # pins the xmin horizon
            await z.enqueue(dead)
            await z.conn.execute("DELETE FROM zeroth.runs")
        lm = LeaseManager(z.conn)
        for start in range(0, n, 5000):
            await lm.enqueue_runs("bench", [{} for _ in range(min(5000, n - start))])
        found = (await z.conn.fetchval(
            "SELECT dead_tuple_count FROM pgstattuple('zeroth.runs')")
            if await _has_pgstattuple(z.conn) else None)
        before = await _claim_counters(z.conn)
        rate, claims = await _drain_timed(z.dsn, n)
        await asyncio.sleep(1.5)  # the drain's backends have exited and flushed their counters
        after = await _claim_counters(z.conn)
        stats = await z.conn.fetchrow(
            "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
            "WHERE relid = 'zeroth.runs'::regclass")
        return {"rate": rate, "p50": percentile(claims, 50), "p99": percentile(claims, 99),
                "dead": found,
                # per claim_and_start call (the empty ones at the end included), from the
                # server's counters around the drain: machine-independent, unlike the times
                **{f"{name}_per_claim": (after[name] - before[name]) / len(claims)
                   for name in before},
                "autovacuums": stats["autovacuum_count"],
                "autoanalyzes": stats["autoanalyze_count"]}
    finally:
        if holder is not None:
            await holder.close()
        await z.close()
        await asyncio.to_thread(server.drop, z.label)


#: The peers of the dirty-table scenario: each drains the same n jobs at concurrency
#: DIRTY_LOOPS, clean and with its own queue table made dirty the same way (its throughput
#: against its own clean run is what compares; their claim latency is not observable).
DIRTY_PEERS = ("zeroth-worker", "pgqueuer", "procrastinate")


async def _dirty_peer_phase(server: Server, name: str, dirty: bool, dead: int, n: int
                            ) -> dict[str, Any]:
    """One system's drain of n jobs at DIRTY_LOOPS, on a fresh database; dirty: a session
    pins the xmin horizon, then ``dead`` jobs are enqueued through the system's own path and
    deleted (dead row versions and index entries in its queue table) before the n jobs."""
    system: Any = (Zeroth(server) if name == "zeroth-worker"
                   else PgQueuer(server) if name == "pgqueuer" else Procrastinate(server))
    system.label = f"dirty_{name.replace('-', '_')}{int(dirty)}"
    await system.setup()
    holder: asyncpg.Connection | None = None
    table = TABLES[name][0]
    try:
        if dirty:
            holder = await asyncpg.connect(system.dsn)
            await holder.execute("BEGIN")
            await holder.fetchval("SELECT txid_current()")  # pins the xmin horizon
            await system.enqueue(dead)
            await system.conn.execute(f"DELETE FROM {table}")
        await system.enqueue(n)
        found = (await system.conn.fetchval(
            "SELECT dead_tuple_count FROM pgstattuple($1::regclass)", table)
            if await _has_pgstattuple(system.conn) else None)
        if name == "zeroth-worker":
            elapsed = await system.drain_worker(n, concurrency=DIRTY_LOOPS)
        elif name == "pgqueuer":  # its best batch at c = 8 in the throughput scenario
            elapsed = await system.drain(n, concurrency=DIRTY_LOOPS, batch=4)
        else:
            elapsed = await system.drain(n, concurrency=DIRTY_LOOPS)
        return {"rate": n / elapsed, "dead": found}
    finally:
        if holder is not None:
            await holder.close()
        await system.close()
        await asyncio.to_thread(server.drop, system.label)


async def _has_pgstattuple(conn: asyncpg.Connection) -> bool:
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except asyncpg.PostgresError:
        return False
    return True


async def dirty_table(cfg: Config, s: Any) -> ScenarioReport:
    dead = 2_000 if cfg.quick else 200_000
    n = 300 if cfg.quick else 5_000
    rep = ScenarioReport("dirty_table", f"Dirty table: {dead:,} dead tuples in zeroth.runs, "
                         "the xmin horizon pinned for the whole phase, against clean "
                         f"({n:,} runs, {DIRTY_LOOPS} claim loops)")
    lines = ["| server | table | runs/s | claim p50 / p99 ms | dead tuples (pgstattuple) | "
             "autovacuums / autoanalyzes of zeroth.runs | per claim: claim-index entries / "
             "runs blocks / claim-index blocks |", "|---|---|---|---|---|---|---|"]
    peer_lines = ["| server | system | table | runs/s | dead tuples in its queue table |",
                  "|---|---|---|---|---|"]
    # The smoke (--quick): the bench's own server only (the code path is the same).
    for version, server, why in await s.versions(stock=not cfg.quick):
        if server is None:
            rep.notes.append(f"PostgreSQL {version} not measured: {why}")
            continue
        phases = {}
        for dirty in (False, True):
            phase = await _dirty_phase(server, dirty, dead, n)
            phases[dirty] = phase
            lines.append(f"| {version} | {'dirty' if dirty else 'clean'} | {phase['rate']:.0f} "
                         f"| {phase['p50']:.2f} / {phase['p99']:.2f} | {phase['dead']} | "
                         f"{phase['autovacuums']} / {phase['autoanalyzes']} | "
                         f"{phase['claim_index_entries_per_claim']:.1f} / "
                         f"{phase['heap_blocks_per_claim']:.1f} / "
                         f"{phase['claim_index_blocks_per_claim']:.1f} |")
            print(lines[-1], flush=True)
            rep.results.append(Result(rep.name, "zeroth-lease", "throughput", "runs/s",
                                      (phase["rate"],), {"version": version, "dirty": dirty},
                                      extra=phase))
        # The smoke (--quick) runs the peer phase's code path once, with one peer.
        for name in (DIRTY_PEERS[1:2] if cfg.quick else DIRTY_PEERS):
            rates = {}
            for dirty in (False, True):
                try:
                    phase = await _dirty_peer_phase(server, name, dirty, dead, n)
                except Exception as exc:  # a peer's failure costs its row, not the scenario
                    if name == "zeroth-worker":
                        raise
                    why = f"{type(exc).__name__}: {str(exc)[:200]}"
                    rep.notes.append(f"PostgreSQL {version}, dirty table, {name} failed: {why}")
                    break
                rates[dirty] = phase["rate"]
                peer_lines.append(f"| {version} | {name} | {'dirty' if dirty else 'clean'} | "
                                  f"{phase['rate']:.0f} | {phase['dead']} |")
                print(peer_lines[-1], flush=True)
                rep.results.append(Result(rep.name, name, "throughput", "runs/s",
                                          (phase["rate"],), {"version": version, "dirty": dirty},
                                          extra=phase))
            if len(rates) == 2 and rates[False]:
                peer_lines.append(f"| {version} | {name} | dirty ÷ clean | "
                                  f"{rates[True] / rates[False]:.2f} | |")
                print(peer_lines[-1], flush=True)
        clean, dirty_ = phases[False], phases[True]
        p99_ratio = dirty_["p99"] / clean["p99"] if clean["p99"] else float("inf")
        rate_ratio = dirty_["rate"] / clean["rate"] if clean["rate"] else 0.0
        rep.targets.append(Target(f"PG {version} dirty table: claim p99 within 2× of clean",
                                  f"{p99_ratio:.2f}× ({dirty_['p99']:.2f} vs "
                                  f"{clean['p99']:.2f} ms)", p99_ratio <= 2.0))
        rep.targets.append(Target(f"PG {version} dirty table: throughput ≥ 70% of clean",
                                  f"{rate_ratio:.2f} ({dirty_['rate']:.0f} vs "
                                  f"{clean['rate']:.0f} runs/s)", rate_ratio >= 0.7))
    rep.tables.append("\n".join(lines))
    rep.tables.append("\n".join(peer_lines))
    rep.notes.append(
        f"The second table: each system drains the same {n:,} jobs at concurrency "
        f"{DIRTY_LOOPS} (the zeroth_pg worker; pgqueuer with batch 4; procrastinate), clean and "
        f"with its own queue table made dirty the same way ({dead:,} jobs enqueued through its "
        "own path and deleted while a session pins the horizon): each against its own clean run.")
    rep.notes.append(
        f"Each phase on a fresh migrated database (no VACUUM or ANALYZE by the bench). Dirty: a "
        "second session runs BEGIN; SELECT txid_current() and stays idle in its transaction for "
        f"the whole phase; then {dead:,} runs are inserted and deleted (dead row versions in "
        "zeroth.runs and dead entries in every index of it, the claim's partial index among "
        f"them). Both phases then enqueue {n:,} runs with enqueue_runs and drain them with "
        f"{DIRTY_LOOPS} LeaseManager loops of claim_and_start (batch 1) → complete_runs; claim "
        "latency is each claim_and_start call's round trip, the empty ones at the end included.")
    return rep

