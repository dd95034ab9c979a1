"""``python -m bench [SCENARIO…] [--quick]``: zeroth_pg against its peers and the raw-SQL floor.

Starts a throwaway PostgreSQL (the tests' harness) or uses ``ZEROTH_PG_BENCH_DSN``, gives every
system its own database on it, runs the chosen scenarios (all by default; each system measured
``--repeat`` times, interleaved) and writes ``bench/results/<date>[-quick]-<scenario>.json``,
``…-summary.md`` (tables, ratios, targets) and PNG plots of the scaling scenarios. Nothing is
asserted about speed: the exit status is non-zero only when a scenario crashed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer

from bench import report
from bench.harness import PROFILES, Config, ScenarioReport, server, wal_flushes_per_second
from bench.scenarios import SCENARIOS, Systems

app = typer.Typer(add_completion=False, help=__doc__)


def _machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, load average at start "
            f"{load}")


def _versions() -> dict[str, str]:
    found = {}
    for name in ("zeroth-pg", "pgqueuer", "procrastinate", "absurd-sdk", "absurdctl", "dbos",
                 "chancy", "asyncpg", "psycopg"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    with contextlib.suppress(OSError, ValueError):  # bench/pgboss, installed with npm
        package = Path(__file__).resolve().parent / "pgboss/node_modules/pg-boss/package.json"
        found["pg-boss"] = json.loads(package.read_text())["version"]
    return found


async def _run(names: list[str], cfg: Config, meta: dict[str, Any], out: Path,
               prefix: str) -> tuple[list[ScenarioReport], list[str]]:
    reports: list[ScenarioReport] = []
    failed: list[str] = []
    with server(meta["profile"]) as srv:
        meta["server"] = await srv.settings()
        meta["wal_flushes_per_second"] = await wal_flushes_per_second(srv.admin_dsn)
        systems = await Systems.create(srv)
        try:
            for name in names:
                print(f"[bench] {name} …", flush=True)
                started = time.perf_counter()
                try:
                    rep = await SCENARIOS[name](cfg, systems)
                except Exception:
                    failed.append(name)
                    traceback.print_exc()
                    continue
                rep.seconds = time.perf_counter() - started
                reports.append(rep)
                path = report.write(rep, meta, out, prefix)
                print(f"[bench] {name}: {rep.seconds:.0f} s → {path}", flush=True)
                for table in rep.tables:
                    print(table, flush=True)
                for target in rep.targets:
                    print(f"  target: {target.goal}: {target.measured} → "
                          f"{ {True: 'met', False: 'NOT met', None: 'not measured'}[target.met] }",
                          flush=True)
        finally:
            await systems.close()
    return reports, failed


@app.command()
def main(
    scenarios: Annotated[list[str] | None, typer.Argument(
        help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="tiny sizes: a smoke run of every scenario's code path in about 2 "
                        "minutes (CI runs it); its numbers mean nothing")] = False,
    repeat: Annotated[int | None, typer.Option(
        help="measurements per system and configuration (default 3)")] = None,
    runs: Annotated[int | None, typer.Option(
        help="no-op runs per throughput measurement (default 20,000)")] = None,
    sustained: Annotated[float | None, typer.Option(
        help="seconds of the sustained-load scenario (default 300)")] = None,
    out: Annotated[Path, typer.Option(help="where results go")] = report.RESULTS_DIR,
    profile: Annotated[str, typer.Option(
        help="durability of the throwaway server: durable (fsync, synchronous_commit, "
             "full_page_writes on: production) or fast (all off: the CPU-bound view); a server "
             "given by ZEROTH_PG_BENCH_DSN is measured as it is")] = "durable",
) -> None:
    if profile not in PROFILES:
        raise typer.BadParameter(f"--profile must be one of {PROFILES}")
    names = scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise typer.BadParameter(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    cfg = Config.smoke() if quick else Config.full()
    if repeat is not None:
        cfg = replace(cfg, repeat=max(1, repeat))
    if runs is not None:
        cfg = replace(cfg, runs=max(100, runs), claim_runs=min(cfg.claim_runs, max(100, runs)))
    if sustained is not None:
        cfg = replace(cfg, sustained_seconds=max(10.0, sustained))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    started = datetime.datetime.now(datetime.UTC)
    prefix = (started.strftime("%Y-%m-%d") + ("-quick" if quick else "")
              + ("" if profile == "durable" else f"-{profile}"))
    report.configure(out, prefix)
    meta: dict[str, Any] = {"started": started.isoformat(timespec="seconds"), "quick": quick,
                            "profile": profile,
                            "config": asdict(cfg), "machine": _machine(),
                            "versions": _versions(), "argv": sys.argv}
    t0 = time.perf_counter()
    reports, failed = asyncio.run(_run(names, cfg, meta, out, prefix))
    every = not scenarios or set(names) == set(SCENARIOS)
    summary = out / f"{prefix}-summary{'' if every else '-' + '-'.join(names)}.md"
    summary.write_text(report.markdown(reports, meta))
    print(f"[bench] {len(reports)} scenario(s) in {time.perf_counter() - t0:.0f} s → {summary}")
    if failed:
        print(f"[bench] crashed: {', '.join(failed)}", file=sys.stderr)
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
