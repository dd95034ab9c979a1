"""zeroth_pg's phases of the dirty_table scenario alone (issue 30), on Debian's PostgreSQL 15 and
the embedded 18, optionally against the SQL functions of an earlier commit in the same run.

    python -m bench.dirty_phases [--dead 200000] [--runs 5000] [--rounds 1] [--before REV]

Each phase is bench/cold_start.py's ``_dirty_phase`` (a fresh migrated database; dirty: a session
pins the xmin horizon, ``--dead`` runs are inserted and deleted; then ``--runs`` runs in batches
of 5,000 through ``enqueue_runs`` drained by 8 loops of ``claim_and_start`` (batch 1) →
``complete_runs``), clean then dirty. ``--before REV``: every phase also runs on a database whose
function files that differ from REV are replaced by REV's (``git show REV:file``, applied after
the migration: functions only; a state change of the migration stays), the two variants
alternating so the machine's noise falls on both alike. Prints one line per phase: runs/s, claim
p50 / p99, and per claim the entries of runs_claim_pending_idx, the blocks of zeroth.runs and of
that index (counts: the same on a loaded machine); then the ratios dirty ÷ clean of each round.
Not part of ``python -m bench`` (its dirty_table scenario runs the same phases with the peers).
The servers run in /dev/shm when TMPDIR is unset and it exists.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from bench.cold_start import _dirty_phase
from bench.harness import debian_server, server

ROOT = Path(__file__).resolve().parent.parent


def _changed_functions(rev: str) -> list[tuple[str, str]]:
    """(path, REV's text) of every sql/functions file that differs from REV, in order.txt's
    order (a file REV lacks is left as it is)."""
    changed = subprocess.run(["git", "diff", "--name-only", rev, "--", "sql/functions"],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    order = (ROOT / "sql/functions/order.txt").read_text().split()
    found = []
    for name in order:
        path = f"sql/functions/{name}"
        if path in changed:
            old = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT,
                                 capture_output=True, text=True)
            if old.returncode == 0:
                found.append((path, old.stdout))
    return found


def _prepare(files: list[tuple[str, str]]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    async def apply(conn: asyncpg.Connection) -> None:
        for _, text in files:
            await conn.execute(text)
    return apply


def _line(version: str, variant: str, dirty: bool, p: dict[str, Any]) -> str:
    return (f"PG {version} {variant:6} {'dirty' if dirty else 'clean'}: {p['rate']:.0f} runs/s, "
            f"claim p50 {p['p50']:.2f} / p99 {p['p99']:.2f} ms; per claim "
            f"{p['claim_index_entries_per_claim']:.1f} claim-index entries, "
            f"{p['heap_blocks_per_claim']:.1f} runs blocks, "
            f"{p['claim_index_blocks_per_claim']:.1f} claim-index blocks; "
            f"autovacuums / autoanalyzes of zeroth.runs {p['autovacuums']} / "
            f"{p['autoanalyzes']}; load {os.getloadavg()[0]:.1f}")


async def main(args: argparse.Namespace,
               variants: list[tuple[str, Callable[[asyncpg.Connection], Awaitable[None]] | None]]
               ) -> None:
    with contextlib.ExitStack() as stack:
        servers = []
        for version in args.versions.split(","):
            servers.append((version, stack.enter_context(
                debian_server(int(version)) if version == "15" else server())))
        for version, found in servers:
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else variants[::-1]
                phases: dict[tuple[str, bool], dict[str, Any]] = {}
                for variant, prepare in order:
                    for dirty in (False, True):
                        phase = await _dirty_phase(found, dirty, args.dead, args.runs,
                                                   prepare=prepare)
                        phases[variant, dirty] = phase
                        print(_line(version, variant, dirty, phase), flush=True)
                for variant, _ in variants:
                    clean, dirty_ = phases[variant, False], phases[variant, True]
                    print(f"PG {version} {variant:6} round {round_ + 1}: dirty ÷ clean runs/s "
                          f"{dirty_['rate'] / clean['rate']:.2f}, claim p99 "
                          f"{dirty_['p99'] / clean['p99']:.2f}×", flush=True)


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dead", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--before", help="also run on the SQL functions of this commit")
    parser.add_argument("--versions", default="15,18")
    args = parser.parse_args()
    if "TMPDIR" not in os.environ and Path("/dev/shm").is_dir():
        os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="zeroth-pg-dirty-", dir="/dev/shm")
        os.chmod(os.environ["TMPDIR"], 0o755)  # the servers' OS user (as root) reaches its dirs
        tempfile.tempdir = None
    variants: list[tuple[str, Callable[[asyncpg.Connection], Awaitable[None]] | None]] = [
        ("after", None)]
    if args.before:
        files = _changed_functions(args.before)
        print(f"before = {args.before}: {', '.join(p for p, _ in files) or 'no function file'}")
        variants.append(("before", _prepare(files)))
    asyncio.run(main(args, variants))


if __name__ == "__main__":
    cli()
