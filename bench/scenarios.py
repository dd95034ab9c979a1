"""The scenarios of issue 6. Each returns a :class:`ScenarioReport` (results, tables, targets).

Throughput numbers are runs per second, medians over ``repeat`` interleaved measurements; every
measurement starts from an emptied queue and drains a freshly enqueued one (enqueueing is not
timed). Ratios compare medians measured in the same run on the same server.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench import peers, report
from bench.cold_start import cold_start, dirty_table
from bench.commits import commits
from bench.fleet import fleet
from bench.harness import (
    Config,
    Result,
    ScenarioReport,
    Server,
    ServerUnavailable,
    Target,
    debian_server,
    interleave,
    percentile,
    pool,
)
from bench.pressure import pressure_scenario
from bench.streams import streams
from bench.systems import (
    DEPLOYMENT,
    REPO_ROOT,
    PgQueuer,
    Procrastinate,
    Raw,
    Seed,
    Zeroth,
)
from bench.writers import writers
from zeroth_pg import LeaseManager
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.worker import RunWorker

#: The slow baselines drain fewer runs per measurement (their rate is steady long before): at
#: ~100-300 runs/s, 20,000 runs × 3 repeats × 3 concurrencies would take most of an hour.
SLOW_RUNS = {"seed": 5_000, "procrastinate": 2_000, "absurd": 5_000, "dbos": 2_000}

#: The optional durable-execution peers (bench/peers.py), measured when their library is
#: importable.
PEERS = {"absurd": peers.Absurd, "dbos": peers.Dbos, "chancy": peers.Chancy}
PEER_NAMES = {"absurd": "Absurd", "dbos": "DBOS", "chancy": "chancy"}


@dataclass
class Systems:
    """One database per system, created once per run of the suite."""

    zeroth: Zeroth
    raw: Raw
    seed: Seed
    pgqueuer: PgQueuer
    procrastinate: Procrastinate
    #: The durable-execution peers whose library is installed, by label.
    peers: dict[str, Any]
    #: Servers started on demand (the stock PostgreSQL 15 of the cold-start scenarios).
    _servers: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _stock: tuple[Server | None, str | None] | None = None

    @classmethod
    async def create(cls, server: Server) -> Systems:
        found: dict[str, Any] = {}
        for label, kind in PEERS.items():
            if absent := peers.missing(label):
                print(f"[bench] {label} skipped: {', '.join(absent)} not importable "
                      "(pip install -e '.[bench]')", flush=True)
            else:
                found[label] = kind(server)
        systems = cls(Zeroth(server), Raw(server), Seed(server), PgQueuer(server),
                      Procrastinate(server), found)
        for system in systems.all():
            await system.setup()
        # Creating schemas churns the catalogs; autovacuum would then pick each database up in
        # the middle of the first round of measurements (first samples 3–5× slower in earlier
        # runs). Vacuum everything now, before anything is timed.
        for system in systems.all():
            await system.conn.execute("VACUUM ANALYZE")
        return systems

    def all(self) -> tuple[Any, ...]:
        return (self.zeroth, self.raw, self.seed, self.pgqueuer, self.procrastinate,
                *self.peers.values())

    async def close(self) -> None:
        for system in self.all():
            await system.close()
        await asyncio.to_thread(self._servers.close)

    async def versions(self, stock: bool = True) -> list[tuple[str, Server | None, str | None]]:
        """The servers of the cold-start scenarios, as (major version, server or None, why
        not): Debian's stock PostgreSQL 15 (started here the first time, kept for the run;
        left out with ``stock`` False) and the suite's own server (the embedded 18, or
        ZEROTH_PG_BENCH_DSN)."""
        own = self.zeroth.server
        major = await self.zeroth.conn.fetchval(
            "SELECT current_setting('server_version_num')::int / 10000")
        if not stock:
            return [(str(major), own, None)]
        if self._stock is None:
            try:
                started: Server = await asyncio.to_thread(self._servers.enter_context,
                                                          debian_server())
                self._stock = (started, None)
            except ServerUnavailable as exc:
                self._stock = (None, str(exc))
        found, why = self._stock
        return [("15", found, why), (str(major), own, None)]

    async def reconnect(self) -> None:
        """New setup connections for every system (after a server restart killed them)."""
        for system in self.all():
            await system.reconnect()


Measure = Callable[[], Awaitable[float]]


def case(key: str, n: int, drain: Callable[..., Awaitable[float]],
         **options: Any) -> tuple[str, Measure]:
    """A measurement keyed ``key``: empty the queue of the system ``drain`` is a method of,
    enqueue n runs (untimed), time ``drain(n, **options)``; returns runs per second."""
    system: Any = drain.__self__  # type: ignore[attr-defined]

    async def measure() -> float:
        await system.reset()
        await system.enqueue(n)
        return n / await drain(n, **options)

    return key, measure


def runs_for(system: str, cfg: Config) -> int:
    return min(cfg.runs, SLOW_RUNS.get(system, cfg.runs))


def pgqueuer_batches(concurrency: int) -> list[int]:
    """pgqueuer configurations tried at one concurrency: its default batch (10), 1, and the
    largest its rule max_concurrent_tasks >= 2 × batch_size allows."""
    largest = max(1, concurrency // 2)
    return sorted({b for b in (1, 10, largest) if b <= largest})


def rate_result(scenario: str, system: str, values: list[float], **params: Any) -> Result:
    return Result(scenario, system, "throughput", "runs/s", tuple(values), params)


def split_keys(scenario: str, values: dict[str, list[float]], param: str,
               convert: Callable[[str], Any] = str) -> list[Result]:
    """Results of cases keyed ``system|value`` (the value of ``param``)."""
    found = []
    for key, v in values.items():
        system, _, value = key.partition("|")
        found.append(rate_result(scenario, system, v, **{param: convert(value)}))
    return found


def best(results: list[Result], prefix: str, **params: Any) -> Result | None:
    """The result of ``prefix…`` systems with the highest median among those with ``params``."""
    found = [r for r in results if r.system.startswith(prefix)
             and all(r.params.get(k) == v for k, v in params.items())]
    return max(found, key=lambda r: r.median, default=None)


def ratio_target(goal: str, ours: Result | None, theirs: Result | None, need: float) -> Target:
    if ours is None or theirs is None:
        return Target(goal, "not measured", None)
    ratio = ours.median / theirs.median
    return Target(goal, f"{ratio:.2f}× ({ours.system} {ours.median:.0f} vs {theirs.system} "
                  f"{theirs.median:.0f} runs/s)", ratio >= need)


# ---------------------------------------------------------------------------------------------


async def throughput(cfg: Config, s: Systems) -> ScenarioReport:
    rep = ScenarioReport("throughput", "Throughput: no-op runs drained at concurrency "
                         + "/".join(map(str, cfg.concurrencies)))
    for c in cfg.concurrencies:
        cases = [
            case("zeroth-worker", runs_for("zeroth-worker", cfg), s.zeroth.drain_worker,
                 concurrency=c),
            # Its other configuration: one batch of runs claimed ahead (RunWorker claim_ahead).
            case("zeroth-worker claim_ahead", runs_for("zeroth-worker", cfg),
                 s.zeroth.drain_worker, concurrency=c, claim_ahead=c),
            case("zeroth-lease", runs_for("zeroth-lease", cfg), s.zeroth.drain_lease,
                 concurrency=c),
            case("procrastinate", runs_for("procrastinate", cfg), s.procrastinate.drain,
                 concurrency=c),
            case("raw", runs_for("raw", cfg), s.raw.drain, concurrency=c),
            case("seed", runs_for("seed", cfg), s.seed.drain, concurrency=c),
        ]
        cases += [case(f"pgqueuer batch={b}", runs_for("pgqueuer", cfg), s.pgqueuer.drain,
                       concurrency=c, batch=b) for b in pgqueuer_batches(c)]
        cases += [case(label, runs_for(label, cfg), peer.drain, concurrency=c)
                  for label, peer in s.peers.items()]
        values = await interleave(cases, cfg.repeat)
        rep.results += [rate_result(rep.name, key, v, concurrency=c) for key, v in values.items()]
    rep.tables.append(report.grid(rep.results, column="concurrency"))
    rep.tables.append(report.ratio_grid(rep.results, "zeroth-worker", column="concurrency",
                                        pick_best=("pgqueuer",)))
    for c in cfg.concurrencies:
        ours = best(rep.results, "zeroth-worker", concurrency=c)
        rep.targets.append(ratio_target(f"worker ≥ 2× pgqueuer's best configuration (c={c})",
                                        ours, best(rep.results, "pgqueuer", concurrency=c), 2.0))
        rep.targets.append(ratio_target(f"worker ≥ 10× procrastinate (c={c})", ours,
                                        best(rep.results, "procrastinate", concurrency=c), 10.0))
        for label, name in PEER_NAMES.items():
            rep.targets.append(ratio_target(f"worker ahead of {name} (c={c})", ours,
                                            best(rep.results, label, concurrency=c), 1.0))
    rep.plots.append(report.scaling_plot(rep, "concurrency", "runs/s", log_x=True))
    rep.notes.append(
        "Each measurement drains a freshly enqueued queue: zeroth-worker, pgqueuer and raw "
        f"{cfg.runs} runs; the slower baselines fewer "
        f"({', '.join(f'{k} {runs_for(k, cfg)}' for k in SLOW_RUNS)}) because their rate is "
        "steady long before. pgqueuer is run at each batch_size its "
        "max_concurrent_tasks ≥ 2 × batch_size rule allows (at concurrency 1 that means "
        "max_concurrent_tasks = 2); its best is the one compared. zeroth-worker runs as "
        "configured by default and with claim_ahead = C (C runs more claimed, each waiting for "
        "a handler slot: docs/python-guide.md, \"Claiming ahead\"); the targets compare the "
        "better of the two. The durable-execution peers "
        "(bench/peers.py, bench/dbos_peer.py): absurd-sdk's async worker "
        "(start_worker(concurrency=C), batch = C); DBOS in a process of its own, "
        "worker_concurrency = C, polling_interval_sec 10 ms (default 1 s), its time including "
        "DBOS.launch() and destroy(); chancy's worker with the asyncio executor, concurrency C, "
        "eager_polling. chancy's worker holds finished jobs' results in memory and writes them "
        "in batches (every second, and on stop: the drain ends after that write), so unlike "
        "the others a finished job is not durable when its handler returns. A peer whose "
        "library is not installed is not measured (its targets say 'not measured').")
    return rep


async def batch_sizes(cfg: Config, s: Systems) -> ScenarioReport:
    rep = ScenarioReport("batch", "Batch sizes: runs claimed per statement")
    loops = 8
    n = cfg.runs // 2
    cases: list[tuple[str, Measure]] = []
    for b in cfg.batch_sizes:
        cases += [
            case(f"zeroth-worker|{b}", n, s.zeroth.drain_worker, concurrency=max(loops, b)),
            case(f"zeroth-worker claim_ahead|{b}", n, s.zeroth.drain_worker,
                 concurrency=max(loops, b), claim_ahead=max(loops, b)),
            case(f"zeroth-lease|{b}", n, s.zeroth.drain_lease, concurrency=loops, batch=b),
            case(f"pgqueuer|{b}", n, s.pgqueuer.drain, concurrency=loops, batch=b),
            case(f"raw|{b}", n, s.raw.drain, concurrency=loops, batch=b),
        ]
    rep.results += split_keys(rep.name, await interleave(cases, cfg.repeat), "batch", int)
    rep.tables.append(report.grid(rep.results, column="batch"))
    rep.tables.append(report.ratio_grid(rep.results, "zeroth-worker", column="batch"))
    top = max(cfg.batch_sizes)
    rep.targets.append(ratio_target(
        f"worker with batching ≥ 50% of the raw batch floor (raw at {top} rows per statement)",
        best(rep.results, "zeroth-worker"), best(rep.results, "raw", batch=top), 0.5))
    rep.plots.append(report.scaling_plot(rep, "batch", "runs/s", log_x=True))
    rep.notes.append(
        f"{n} runs per measurement, {loops} loops (zeroth-lease, raw) or local slots (pgqueuer's "
        "max_concurrent_tasks, at least 2 × batch). zeroth-worker claims as many runs per "
        "statement as it has free slots, so its batch is set through max_concurrency = "
        f"max({loops}, batch) (and, claiming ahead, claim_ahead the same); it claims and "
        "starts a batch with one claim_and_start and acknowledges the runs that finished "
        "together with one complete_runs, while "
        "zeroth-lease's loops send one complete_runs per claimed batch. raw marks a whole batch "
        "done with one UPDATE; pgqueuer buffers its completions.")
    return rep


async def latency(cfg: Config, s: Systems) -> ScenarioReport:
    rep = ScenarioReport("latency", f"Wakeup latency: idle consumer, {cfg.latency_runs} runs "
                         f"{cfg.latency_gap * 1000:.0f} ms apart, enqueue commit → handler start")
    systems = [("zeroth-worker", s.zeroth), ("pgqueuer", s.pgqueuer),
               ("procrastinate", s.procrastinate), ("raw", s.raw), ("seed", s.seed),
               *s.peers.items()]
    samples: dict[str, list[list[float]]] = {name: [] for name, _ in systems}
    for round_no in range(cfg.repeat):
        shift = round_no % len(systems)
        for name, system in [*systems[shift:], *systems[:shift]]:
            await system.reset()
            samples[name].append(await system.latency(cfg.latency_runs, cfg.latency_gap))
    for name, rounds in samples.items():
        for q in (50, 95, 99):
            rep.results.append(Result(rep.name, name, f"p{q}", "ms",
                                      tuple(percentile(r, q) for r in rounds),
                                      {"percentile": f"p{q}"}, higher_is_better=False))
    rep.tables.append(report.grid(rep.results, column="percentile", digits=2))
    p50 = best(rep.results, "zeroth-worker", percentile="p50")
    p99 = best(rep.results, "zeroth-worker", percentile="p99")
    for goal, found, limit in (("wakeup p50 ≤ 1.0 ms", p50, 1.0), ("wakeup p99 ≤ 3 ms", p99, 3.0)):
        rep.targets.append(Target(goal, "not measured" if found is None else
                                  f"{found.median:.2f} ms", None if found is None
                                  else found.median <= limit))
    rep.notes.append(
        "The producer is a separate process (bench/producer.py) that enqueues through each "
        "system's own path and notes the instant its enqueue came back committed; the handler "
        "notes when it starts; both read CLOCK_MONOTONIC. Percentiles are per repeat; the table "
        "shows their median [min–max] over repeats. seed has no NOTIFY: upstream's default is a "
        "0.5 s poll (ARQ wakeups are off by default), so it shows what polling costs. Neither "
        "Absurd (a 0.25 s poll, its SDK's default) nor DBOS (its queue poll, 10 ms here) is "
        "woken by a NOTIFY; chancy is. Under load "
        "the producer can be descheduled between its answer and reading the clock, which shows "
        "as a small negative sample.")
    return rep


async def max_concurrency(cfg: Config, s: Systems) -> ScenarioReport:
    c = max(cfg.concurrencies)
    rep = ScenarioReport("max_concurrency", f"max_concurrency on vs off (concurrency {c}, "
                         f"fleet limit {c}; the worker also at {2 * c})")
    n = cfg.runs // 2
    lease_runs, seed_runs = runs_for("zeroth-lease", cfg), runs_for("seed", cfg)
    cases = [
        case("zeroth-worker|off", n, s.zeroth.drain_worker, concurrency=c),
        case("zeroth-worker|on", n, s.zeroth.drain_worker, concurrency=c,
             fleet_max_concurrency=c),
        case(f"zeroth-worker|on, limit {2 * c}", n, s.zeroth.drain_worker, concurrency=c,
             fleet_max_concurrency=2 * c),
        case("zeroth-lease|off", lease_runs, s.zeroth.drain_lease, concurrency=c),
        case("zeroth-lease|on", lease_runs, s.zeroth.drain_lease, concurrency=c,
             max_concurrency=c),
        case("seed|off", seed_runs, s.seed.drain, concurrency=c, admission=False),
        case("seed|on", seed_runs, s.seed.drain, concurrency=c, admission=True),
    ]
    rep.results += split_keys(rep.name, await interleave(cases, cfg.repeat), "max_concurrency")
    rep.tables.append(report.grid(rep.results, column="max_concurrency"))
    lines = ["| system | on / off |", "|---|---|"]
    compared = [("zeroth-worker", "on", f"limit {c}"),
                ("zeroth-worker", f"on, limit {2 * c}", f"limit {2 * c}"),
                ("zeroth-lease", "on", f"limit {c}"), ("seed", "on", f"limit {c}")]
    for system, setting, limit in compared:
        on, off = best(rep.results, system, max_concurrency=setting), best(
            rep.results, system, max_concurrency="off")
        if on and off:
            lines.append(f"| {system}, {limit} | {on.median / off.median:.2f} |")
        if system != "seed":
            rep.targets.append(Target(
                f"{system}: max_concurrency set ({limit}) ≥ 80% of unbounded",
                "not measured" if not (on and off) else f"{100 * on.median / off.median:.0f}%",
                None if not (on and off) else on.median >= 0.8 * off.median))
    rep.tables.append("\n".join(lines))
    rep.notes.append(
        f"zeroth: claims pass max_concurrency = {c} (numbered admission slots taken with SKIP "
        "LOCKED). seed: on = a guardrail policy exists, so every claim locks the deployment's "
        "admission row FOR UPDATE and counts live leases; off = no policy. A limit equal to the "
        "concurrency never binds for zeroth-lease and seed (the numbers are the cost of "
        "enforcing it), but it does for the worker: a run whose handler returned keeps its "
        "admission slot until its completion commits, while the unbounded worker already claims "
        f"the next batch (up to {2 * c} leases at once). At limit {2 * c} the fleet limit does "
        "not bind the worker either.")
    return rep


async def table_size(cfg: Config, s: Systems) -> ScenarioReport:
    loops = 8
    rep = ScenarioReport("table_size", f"Claim rate vs finished rows in the table ({loops} loops, "
                         "claim_and_start → complete_runs, one run per claim)")
    systems: list[tuple[str, Any, Callable[..., Awaitable[float]]]] = [
        ("zeroth-lease", s.zeroth, s.zeroth.drain_lease),
        ("raw", s.raw, s.raw.drain),
        ("seed", s.seed, s.seed.drain),
    ]
    for _, system, _ in systems:
        await system.reset()
    have = 0
    for finished in cfg.finished_rows:
        for _, system, _ in systems:
            await system.enqueue(finished - have, status="completed")
            await system.conn.execute("VACUUM ANALYZE")
        have = finished

        def on_top(system: Any, drain: Callable[..., Awaitable[float]]) -> Measure:
            """Like :func:`case`, but the queue is not emptied: the finished rows stay."""
            async def measure() -> float:
                await system.enqueue(cfg.claim_runs)
                return cfg.claim_runs / await drain(cfg.claim_runs, concurrency=loops)
            return measure

        values = await interleave(
            [(name, on_top(system, drain)) for name, system, drain in systems], cfg.repeat)
        rep.results += [rate_result(rep.name, key, v, finished_rows=finished)
                        for key, v in values.items()]
    rep.tables.append(report.grid(rep.results, column="finished_rows"))
    empty = best(rep.results, "zeroth-lease", finished_rows=cfg.finished_rows[0])
    full = best(rep.results, "zeroth-lease", finished_rows=cfg.finished_rows[-1])
    if empty and full:
        share = full.median / empty.median
        rep.targets.append(Target(
            f"claim rate with {cfg.finished_rows[-1]:,} finished runs ≥ 90% of the empty table",
            f"{100 * share:.0f}% ({full.median:.0f} vs {empty.median:.0f} runs/s)", share >= 0.9))
    rep.plots.append(report.scaling_plot(rep, "finished_rows", "runs/s", log_x=False))
    rep.notes.append(
        f"{cfg.claim_runs} pending runs are enqueued and drained per measurement on top of the "
        "finished rows (inserted in bulk, then VACUUM ANALYZE). pgqueuer deletes finished jobs "
        "from its queue table and procrastinate was left out to keep the run short, so neither "
        "is in this scenario.")
    return rep


async def renewal(cfg: Config, s: Systems) -> ScenarioReport:
    leases = cfg.live_leases
    rep = ScenarioReport("renewal", f"Renewing {leases:,} live leases of one worker")
    z, seed, raw = s.zeroth, s.seed, s.raw
    for system in (z, seed, raw):
        await system.reset()
    await z.enqueue(leases)
    lm = LeaseManager(z.conn)
    claim = await lm.claim_pending_result(DEPLOYMENT, "renewer", batch_size=min(leases, 1000))
    held = {run.run_id: run.lease_generation for run in claim.runs}
    async with pool(z.dsn, 8) as starters:
        starter = LeaseManager(starters)
        await asyncio.gather(*(starter.start_run(run_id, "renewer", generation=gen)
                               for run_id, gen in held.items()))
    await seed.enqueue(leases)
    await seed.set_policy(1_000_000)
    seed_held = []
    for _ in range(leases):
        claimed = await seed.claim(seed.conn, "renewer")
        assert claimed is not None
        seed_held.append(claimed)
    await raw.enqueue(leases)
    raw_ids = [row["id"] for row in await raw.conn.fetch(
        "UPDATE raw_jobs SET status = 'running', locked_at = now() RETURNING id")]

    statements: dict[str, int] = {}

    def counted(name: str, conn: asyncpg.Connection, call: Callable[[], Awaitable[int]]) -> Measure:
        async def measure() -> float:
            logged: list[Any] = []
            conn.add_query_logger(logged.append)
            try:
                started = time.perf_counter()
                renewed = await call()
                elapsed = time.perf_counter() - started
                await asyncio.sleep(0.01)  # asyncpg calls query loggers with call_soon
            finally:
                conn.remove_query_logger(logged.append)
            assert renewed == leases, f"{name} renewed {renewed} of {leases}"
            statements[name] = min(statements.get(name, len(logged)), len(logged))
            return 1000 * elapsed
        return measure

    async def batch() -> int:
        return sum(r.renewed for r in await lm.renew_leases("renewer", held))

    async def each() -> int:
        return sum([await lm.renew_lease(run_id, "renewer", generation=gen)
                    for run_id, gen in held.items()])

    async def upstream() -> int:
        return await seed.renew_each(seed.conn, "renewer", seed_held)

    async def floor() -> int:
        status = await raw.conn.execute(
            "UPDATE raw_jobs SET locked_at = now() WHERE id = ANY($1::bigint[])", raw_ids)
        return int(status.split()[-1])

    cases = [(name, counted(name, conn, call)) for name, conn, call in (
        ("zeroth renew_leases (batch)", z.conn, batch),
        ("zeroth renew_lease × N", z.conn, each),
        ("seed (one transaction per lease)", seed.conn, upstream),
        ("raw (one UPDATE)", raw.conn, floor))]
    # A first call also makes asyncpg introspect the array types: not part of a renewal.
    for _, measure in cases:
        await measure()
    values = await interleave(cases, cfg.repeat if cfg.quick else max(cfg.repeat, 5))
    for name, v in values.items():
        rep.results.append(Result(rep.name, name, "time", "ms", tuple(v),
                                  {"what": f"renew {leases}"}, higher_is_better=False,
                                  extra={"statements": statements[name]}))
    lines = ["| system | ms to renew all (median [min–max]) | statements sent |", "|---|---|---|"]
    lines += [f"| {r.system} | {report.cell(r, 1)} | {r.extra['statements']} |"
              for r in rep.results]
    rep.tables.append("\n".join(lines))
    trips = statements["zeroth renew_leases (batch)"]
    rep.targets.append(Target(f"{leases:,} live leases renewed in one round trip",
                              f"{trips} statement(s), all {leases:,} renewed", trips == 1))
    rep.notes.append(
        "Statements are counted with asyncpg's query logger on the connection that renews "
        "(seed's BEGIN/COMMIT included), after one warm-up call per system. The worker renews "
        "this way: one renew_leases call per renewal interval for all its runs.")
    return rep


async def sustained(cfg: Config, s: Systems) -> ScenarioReport:
    rep = ScenarioReport("sustained", f"Sustained load for {cfg.sustained_seconds:.0f} s: table "
                         "and index size, dead tuples, HOT updates")
    z = s.zeroth
    await z.reset()
    await z.conn.execute("SELECT pg_stat_reset_single_table_counters('zeroth.runs'::regclass)")
    rate, lease = 100, 3.0
    registry = CollectorRegistry()

    async def handler(_run: Any) -> None:
        await asyncio.sleep(random.uniform(0.0, 0.5))

    samples: list[dict[str, float]] = []
    async with pool(z.dsn, 40) as workers:
        worker = RunWorker(workers, DEPLOYMENT, handler, dsn=z.dsn, max_concurrency=64,
                           lease_duration=lease, metrics=WorkerMetrics.create(registry))
        lm = LeaseManager(z.conn)
        await worker.start()
        started = time.monotonic()
        next_sample = started
        enqueued = 0
        try:
            while (now := time.monotonic()) - started < cfg.sustained_seconds:
                await lm.enqueue_runs(DEPLOYMENT, [{} for _ in range(rate // 10)])
                enqueued += rate // 10
                if now >= next_sample:
                    samples.append(await _table_sample(z.conn, now - started, enqueued, registry))
                    next_sample += cfg.sample_every
                await asyncio.sleep(0.1)
            samples.append(await _table_sample(z.conn, time.monotonic() - started, enqueued,
                                               registry))
        finally:
            await worker.graceful_shutdown()
    rep.results.append(Result(rep.name, "zeroth-worker", "samples", "", (0.0,),
                              extra={"samples": samples, "rate": rate, "lease_seconds": lease}))
    last = samples[-1]
    lines = ["| t (s) | completed | runs table MB | indexes MB | claim index kB | dead tuples | "
             "HOT % of updates |", "|---|---|---|---|---|---|---|"]
    step = max(1, len(samples) // 10)
    for sample in [*samples[::step], last] if samples[::step][-1] is not last else samples[::step]:
        lines.append(
            f"| {sample['t']:.0f} | {sample['completed']:.0f} | {sample['table_mb']:.2f} | "
            f"{sample['indexes_mb']:.2f} | {sample['claim_index_kb']:.0f} | "
            f"{sample['dead']:.0f} | {sample['hot_pct']:.0f} |")
    rep.tables.append("\n".join(lines))
    rep.plots.append(report.sustained_plot(rep, samples))
    rep.notes.append(
        f"{rate // 10} runs enqueued every 0.1 s ({samples[-1]['enqueued']} in all), one worker "
        "with 64 local "
        f"slots, handlers sleep 0–0.5 s, lease {lease:.0f} s so every run is renewed about "
        "once (renew_leases every lease/3). Completed runs stay in the table (prune_runs is the "
        "cure), so the table grows with the completed count; what must not grow is the "
        "claim index (pending rows only) and the dead tuples between autovacuums. HOT % is "
        "cumulative n_tup_hot_upd / n_tup_upd since the start.")
    return rep


async def _table_sample(conn: asyncpg.Connection, t: float, enqueued: int,
                        registry: CollectorRegistry) -> dict[str, float]:
    row = await conn.fetchrow(
        """SELECT pg_relation_size('zeroth.runs') AS table_bytes,
                  pg_indexes_size('zeroth.runs') AS index_bytes,
                  pg_relation_size('zeroth.runs_claim_pending_idx') AS claim_bytes,
                  s.n_dead_tup, s.n_live_tup, s.n_tup_upd, s.n_tup_hot_upd, s.autovacuum_count
             FROM pg_stat_user_tables s WHERE s.relid = 'zeroth.runs'::regclass""")
    assert row is not None
    completed = registry.get_sample_value("zeroth_runs_completed_total",
                                          {"deployment": DEPLOYMENT}) or 0.0
    return {"t": t, "enqueued": enqueued, "completed": completed,
            "table_mb": row["table_bytes"] / 2**20, "indexes_mb": row["index_bytes"] / 2**20,
            "claim_index_kb": row["claim_bytes"] / 1024, "dead": row["n_dead_tup"],
            "live": row["n_live_tup"], "updates": row["n_tup_upd"],
            "hot_updates": row["n_tup_hot_upd"], "autovacuums": row["autovacuum_count"],
            "hot_pct": 100 * row["n_tup_hot_upd"] / max(1, row["n_tup_upd"])}


async def recovery(cfg: Config, s: Systems) -> ScenarioReport:
    lease = cfg.recovery_lease
    sweep = 0.25
    rep = ScenarioReport("recovery", f"Recovery after SIGKILL of a worker (lease {lease:.1f} s, "
                         f"orphan sweep every {sweep:.2f} s)")
    z = s.zeroth
    deployment = "bench-recovery"
    recoveries: list[float] = []
    remaining: list[float] = []
    lm = LeaseManager(z.conn)
    for _ in range(cfg.recovery_repeat):
        await z.reset()
        victim = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "zeroth_pg.worker", "--dsn", z.dsn, "--deployment", deployment,
            "--app", "bench.handlers:block", "--lease", str(lease), "--concurrency", "1",
            "--orphan-sweep-interval", "60", "--log-level", "WARNING", cwd=REPO_ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            run_id = (await lm.enqueue_run(deployment)).run_id
            await _wait_running(z.conn, run_id)
            recovered = asyncio.Event()
            stamp: list[float] = []

            async def handler(ctx: Any, stamp: list[float] = stamp,
                              recovered: asyncio.Event = recovered) -> None:
                if ctx.recovered:
                    stamp.append(time.perf_counter())
                    recovered.set()

            async with pool(z.dsn, 4) as workers:
                rescuer = RunWorker(workers, deployment, handler, dsn=z.dsn, max_concurrency=4,
                                    lease_duration=lease, orphan_sweep_interval=sweep,
                                    metrics=WorkerMetrics.create(CollectorRegistry()))
                await rescuer.start()
                try:
                    await asyncio.sleep(random.uniform(0, lease / 3))
                    victim.send_signal(signal.SIGKILL)
                    killed = time.perf_counter()
                    remaining.append(await z.conn.fetchval(
                        "SELECT extract(epoch FROM r.lease_expires_at - clock_timestamp()) "
                        "FROM zeroth.runs r WHERE r.run_id = $1", run_id))
                    await asyncio.wait_for(recovered.wait(), timeout=lease + 30)
                    recoveries.append(stamp[0] - killed)
                finally:
                    await rescuer.graceful_shutdown()
        finally:
            with contextlib.suppress(ProcessLookupError):
                victim.kill()
            await victim.wait()
    rep.results.append(Result(rep.name, "zeroth-worker", "kill → running again", "s",
                              tuple(recoveries), {"what": "recovery"}, higher_is_better=False,
                              extra={"lease_left_at_kill_s": remaining}))
    rep.results.append(Result(rep.name, "zeroth-worker", "lease left at kill", "s",
                              tuple(remaining), {"what": "lease left"}, higher_is_better=False))
    lines = ["| | median [min–max] (s) |", "|---|---|"]
    lines += [f"| {r.metric} | {report.cell(r, 2)} |" for r in rep.results]
    rep.tables.append("\n".join(lines))
    worst = max(recoveries)
    rep.targets.append(Target(f"recovery after SIGKILL ≤ lease + 1 s ({lease + 1:.1f} s)",
                              f"worst {worst:.2f} s of {len(recoveries)}", worst <= lease + 1))
    rep.notes.append(
        f"A worker process (python -m zeroth_pg.worker, lease {lease:.1f} s, handler never "
        "returns) starts a run; a second, idle worker sweeps for orphans every "
        f"{sweep:.2f} s; the first is killed with SIGKILL at a random point of its renewal "
        "interval. Recovery is kill → the second worker's handler starting the run (resumed from "
        "its checkpoint). It is bounded by the lease left at the kill plus one sweep interval; "
        "the default sweep interval is 5 s, so set orphan_sweep_interval to what you can wait.")
    return rep


async def _wait_running(conn: asyncpg.Connection, run_id: Any) -> None:
    deadline = time.monotonic() + 30
    while await conn.fetchval("SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1",
                              run_id) != "running":
        if time.monotonic() > deadline:
            raise TimeoutError("the victim worker never started its run")
        await asyncio.sleep(0.01)


SCENARIOS: dict[str, Callable[[Config, Systems], Awaitable[ScenarioReport]]] = {
    "throughput": throughput,
    "batch": batch_sizes,
    "latency": latency,
    "max_concurrency": max_concurrency,
    "table_size": table_size,
    "renewal": renewal,
    "sustained": sustained,
    "recovery": recovery,
    "cold_start": cold_start,
    "dirty_table": dirty_table,
    "writers": writers,
    "commits": commits,
    "pressure": pressure_scenario,
    "fleet": fleet,
    "streams": streams,
}

