"""Failover soak: a worker fleet while the primary is SIGKILLed and the standby promoted.

The chaos soak's six ``python -m zeroth_pg.worker`` processes and handler (tests/chaos: two
workers per tenant, t3 under a fleet-wide ``max_concurrency``, 3 s leases, runs of 2-4 steps
that checkpoint each and commit their progress) work through a backlog over the multi-host DSN
of a replicated pair (replication.py). When a third of the runs are complete, the primary's
postmaster is SIGKILLed and the standby promoted; the killed primary's data directory is then
re-cloned from the new primary and started as its standby, and at two thirds the new primary is
killed in turn and the old one promoted back. Nothing else is touched: the same worker processes
carry on against whichever server is the primary. The chaos history checker then replays what
the last primary holds, and the harness compares it with what was acknowledged outside the
database: every enqueue the harness was answered, and every completion a worker was answered
(the worker logs it at DEBUG; chaos_fleet.WorkerProcess.completed). The runs after the last
failover's share are enqueued once the old primary is back as a standby, so that the last kill
always finds runs left to claim.

* ``sync`` (synchronous_standby_names names the standby, synchronous_commit = on): asserted —
  0 runs lost, 0 stuck, 0 accepted stale writes, exactly one accepted outcome per run, every run
  terminal, every acknowledged completion on the new primary.
* ``async`` (no synchronous standby): the standby's WAL receiver is frozen for ASYNC_LAG_S
  before the kill, so it is behind as a loaded standby or a slow network would leave it; then
  measured and reported, not asserted — acknowledged enqueues and completions the new primary
  lacks, runs executed again after an acknowledged completion, how far the standby was behind.

Both report, per failover, the time from the kill to the promotion and to the first claim on the
new primary. Sizes: CI runs 600 runs per mode (about 30-40 s each on a loaded 2-core machine);
``ZEROTH_PG_FAILOVER_RUNS=N`` runs N. Figures are printed and saved to
tests/failover/results/<mode>.json; docs/reliability.md has the latest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from chaos_fleet import Fleet, harness_pool, retrying
from chaos_history import AUDIT_DDL, check_history
from failover_support import zeroth_pair
from replication import ReplicatedPair
from soak_support import (
    FLEET,
    acknowledged_losses,
    counts,
    enqueue_all,
    first_claim_after,
    read_audit,
    sample_slots,
    until,
)
from soak_support import all_terminal as _all_terminal
from soak_support import completed as _completed

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]

RUNS_ENV = "ZEROTH_PG_FAILOVER_RUNS"
CI_RUNS = 600
#: How long the asynchronous standby's WAL receiver is frozen before the kill. On loopback an
#: idle-enough standby is 0 bytes behind and an asynchronous failover loses next to nothing
#: (docs/reliability.md); this is what one second of lag, from a loaded standby or a slow
#: network, costs.
ASYNC_LAG_S = 1.0
#: Shares of the runs completed at which the primary is killed: there, and back again.
FAILOVER_AT = (1 / 3, 2 / 3)
RESULTS = Path(__file__).resolve().parent / "results"
DRAIN_TIMEOUT = 600.0  # far above what the plan needs; runs still open then fail the test
















async def fail_over(pair: ReplicatedPair, harness: asyncpg.Pool) -> dict[str, Any]:
    """SIGKILL the primary, promote the standby (in async mode after making it lag); the
    figures of the failover, its instants as datetimes."""
    frozen = None
    if pair.mode == "async":
        # Fault injection, not a wait for a condition: the standby falls this far behind.
        frozen = await asyncio.to_thread(pair.freeze_wal_receiver)
        await asyncio.sleep(ASYNC_LAG_S)
    lag = await retrying(lambda: harness.fetchrow(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.flush_lsn)::bigint AS bytes"
        " FROM pg_stat_replication s"))
    killed_at = datetime.now(UTC)
    kill_began = time.monotonic()
    await asyncio.to_thread(pair.kill_primary)
    # From here no new statement reaches the old primary (its backends exit when they next
    # wait, and it refuses connections): a later claim is on the new primary.
    refused_at = datetime.now(UTC)
    promoting = asyncio.ensure_future(asyncio.to_thread(pair.promote))
    if frozen is not None:
        # Thawed once the promotion has told it to stop: it exits without reading what the dead
        # primary had sent, as that WAL would die in a dead machine's buffers.
        await asyncio.sleep(0.3)
        pair.thaw(frozen)
    await promoting
    figures = {"kill_to_promoted_s": round(time.monotonic() - kill_began, 3),
               "injected_lag_s": ASYNC_LAG_S if frozen is not None else 0,
               "standby_flush_behind_bytes_at_kill": lag["bytes"] if lag else None}
    await retrying(lambda: harness.execute(
        "INSERT INTO public.chaos_events (event_id, source, kind, data)"
        " VALUES (gen_random_uuid(), 'harness', 'failover', $1::text::jsonb)",
        json.dumps(figures)))
    return {**figures, "killed_at": killed_at, "refused_at": refused_at}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_failover_soak(mode: str) -> None:
    total = int(os.environ.get(RUNS_ENV) or CI_RUNS)
    began = time.monotonic()
    with zeroth_pair(mode) as (pair, dsn):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(AUDIT_DDL)
        harness = await harness_pool(dsn)
        fleet = Fleet(dsn, FLEET, log_level="DEBUG")
        failovers: list[dict[str, Any]] = []
        slot_samples: list[dict[str, Any]] = []
        sampling: asyncio.Task[None] | None = None
        try:
            # The runs after the last failover's share are enqueued only once the pair is
            # ready for it (after the reclone), so that the last kill finds runs still to
            # claim: enqueued at once, a loaded machine's fleet finished them during a 20-35 s
            # reclone, and that kill had nothing left to test.
            held_back = total - int(total * FAILOVER_AT[-1])
            enqueued = await enqueue_all(harness, 0, total - held_back)
            await fleet.start()
            sampling = asyncio.create_task(sample_slots(harness, slot_samples))
            for index, share in enumerate(FAILOVER_AT):
                if index == len(FAILOVER_AT) - 1:
                    enqueued |= await enqueue_all(harness, total - held_back, total)
                reached = await until(lambda share=share: _completed(harness, int(total * share)),
                                      DRAIN_TIMEOUT)
                assert reached, f"{share:.0%} of the runs did not complete: {await counts(harness)}"
                failovers.append(await fail_over(pair, harness))
                if index + 1 < len(FAILOVER_AT):
                    # And back: the killed primary returns as the new primary's standby at once,
                    # while the fleet works on, so that the next kill comes at its share.
                    recloned = time.monotonic()
                    pair = await asyncio.to_thread(pair.reclone_old_primary)
                    failovers[-1]["reclone_old_primary_s"] = round(time.monotonic() - recloned, 1)
            drained = await until(lambda: _all_terminal(harness), DRAIN_TIMEOUT)
        finally:
            if sampling is not None:
                sampling.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampling
            await fleet.finish()
            await harness.close()
        history, events, runs = await read_audit(dsn)
    wall = time.monotonic() - began

    report = check_history(history, events, runs, lease_seconds=FLEET.lease,
                           fleet_limits=FLEET.fleet_limits, slot_samples=slot_samples,
                           min_stale_refused=0)
    losses = acknowledged_losses(enqueued, fleet, runs, history, report)
    first_claims = [first_claim_after(history, failover["refused_at"]) for failover in failovers]
    for failover, first_claim in zip(failovers, first_claims, strict=True):
        failover["kill_to_first_claim_on_new_primary_s"] = None if first_claim is None else round(
            (first_claim - failover["killed_at"]).total_seconds(), 3)
        failover["killed_at"] = failover["killed_at"].isoformat()
        del failover["refused_at"]
    results = {
        "mode": mode, "runs_planned": total, "fleet": FLEET.workers,
        "machine": {"cpus": os.cpu_count()}, "wall_s": round(wall, 1), "drained": drained,
        "failovers": failovers,
        "acknowledged_vs_new_primary": losses,
        **{key: report.figures[key] for key in (
            "runs", "final_status", "runs_per_s", "executions_per_run", "claims_per_run",
            "stale_writes")},
        "worker_log": fleet.log_markers(),
        "unexpected_worker_exits": len(fleet.unexpected_exits),
        "violations": report.summary(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{mode}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nfailover soak ({mode}):\n" + json.dumps(results, indent=1, default=str))

    problems = [f"worker died: {exit_}" for exit_ in fleet.unexpected_exits]
    if not drained:
        problems.append(f"runs still open after {DRAIN_TIMEOUT:g}s")
    if None in first_claims:
        problems.append(f"no claim on the new primary after failover(s) {failovers}")
    if mode == "sync":
        problems += [f"{check}: {found['count']} violation(s), e.g. {found['first'][:5]}"
                     for check, found in report.summary().items()]
        for figure in ("enqueued_lost", "acknowledged_completions_lost", "runs_completed_twice"):
            if losses[figure]:
                problems.append(f"{figure}: {losses[figure]}")
        if len(runs) != len(enqueued):
            problems.append(f"{len(enqueued)} runs enqueued, {len(runs)} on the new primary")
    # Both modes: no generation number is handed out twice, lossy failover or not (a promoted
    # server claims in its timeline's band above every generation the old primary granted).
    if losses["runs_completed_twice_under_one_generation_number"]:
        problems.append("runs completed twice under one generation number: "
                        f"{losses['runs_completed_twice_under_one_generation_number']}")
    assert not problems, "\n".join(problems)
