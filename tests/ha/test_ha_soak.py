"""The failover soak under the failover managers DBAs run: Patroni (etcd) and pg_auto_failover.

The chaos soak's worker fleet (tests/chaos/chaos_fleet.py: six ``python -m zeroth_pg.worker``
processes over three tenants, 3 s leases, runs of 2-4 checkpointed steps, t3 under a fleet-wide
``max_concurrency``) works through a backlog over the cluster's multi-host DSN
(``target_session_attrs=read-write``), with synchronous replication as each manager sets it up
(patroni_cluster.py, auto_failover.py). When half the runs are complete the harness either asks
the manager for a switchover (``patronictl switchover`` / ``pg_autoctl perform switchover``) or
kills the primary node — SIGKILL of the manager on it *and* of its postmaster, as a dead machine
(the postmaster alone is restarted in place by either manager: that is a restart, not a
failover), or stops it — SIGSTOP of the manager, the postmaster and every backend, as a node
cut off by a partition looks to its clients: connections hang rather than fail — and resumes it
once another node has committed (its manager must then demote it). Nothing else is touched:
the same worker processes carry on against whichever node is the primary. Then the chaos
history checker replays what the new primary holds, and the acknowledgements seen outside the
database are compared with it (tests/failover/soak_support.py).

Asserted, for each manager and each event: 0 acknowledged enqueues or completions lost, 0 stale
writes accepted, exactly one accepted outcome per run, every run terminal (none stuck), no
generation number handed out twice, no worker died, and a claim on the new primary. Reported:
the time from the event to the new primary accepting writes and to the first claim on it (the
first claim whose generation is in the new timeline's band, so on the new primary for certain).
These are wall-clock figures of a loaded machine, printed and saved to
tests/ha/results/<manager>-<event>.json, never asserted.

Sizes: CI runs 150 runs per test, the kill event for each manager; ``ZEROTH_PG_HA_RUNS=N`` runs
N, ``ZEROTH_PG_HA_EVENTS=all`` every event (switchover, kill, stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import psycopg
import pytest
from auto_failover import PROGRAMS as AUTO_FAILOVER_PROGRAMS
from auto_failover import auto_failover_formation
from chaos_fleet import Fleet, harness_pool
from chaos_history import AUDIT_DDL, check_history
from ha_processes import require
from ha_processes import until as ha_until
from patroni_cluster import PROGRAMS as PATRONI_PROGRAMS
from patroni_cluster import patroni_cluster
from soak_support import (
    FLEET,
    all_terminal,
    compare_acknowledged,
    completed,
    counts,
    enqueue_all,
    read_audit,
    sample_slots,
    until,
)

from zeroth_pg import migrate

#: Each test brings up a whole cluster (etcd and three Patroni nodes, or a monitor and two
#: nodes), so they run one at a time in one xdist worker: several clusters at once on a 2-core
#: machine made the managers' failure detection, and so the tests, miss their deadlines.
pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server,
              pytest.mark.xdist_group("ha_clusters")]

#: The events the whole run exercises: by default the failover by killing the primary node, for
#: each manager (the suite's time budget); ZEROTH_PG_HA_EVENTS=all (or a comma list of
#: switchover, kill, stop) runs the switchover and the SIGSTOP partition too.
EVENTS_ENV = "ZEROTH_PG_HA_EVENTS"
ALL_EVENTS = ("switchover", "kill", "stop")


def _events() -> list[str]:
    chosen = os.environ.get(EVENTS_ENV, "kill").strip()
    if chosen == "all":
        return list(ALL_EVENTS)
    events = [e.strip() for e in chosen.split(",") if e.strip()]
    unknown = sorted(set(events) - set(ALL_EVENTS))
    if unknown or not events:
        raise pytest.UsageError(f"{EVENTS_ENV}: unknown event(s) {unknown}; choose from "
                                f"{', '.join(ALL_EVENTS)} or all")
    return events

RUNS_ENV = "ZEROTH_PG_HA_RUNS"
CI_RUNS = 150
EVENT_AT = 0.5  # share of the runs completed when the switchover or the kill comes
DRAIN_TIMEOUT = 600.0  # far above what the plan needs; runs still open then fail the test
RESULTS = Path(__file__).resolve().parent / "results"
DATABASE = "zeroth"


class Node(Protocol):
    name: str

    def dsn(self, dbname: str = ...) -> str: ...


class Cluster(Protocol):
    def dsn(self, dbname: str) -> str: ...
    def primary(self) -> Any: ...
    def switchover(self) -> tuple[Any, Any]: ...
    def kill_node(self, node: Any) -> None: ...
    def stop_node(self, node: Any) -> None: ...
    def resume_node(self, node: Any) -> None: ...


MANAGERS: dict[str, tuple[Callable[[], contextlib.AbstractContextManager[Any]], tuple[str, ...],
                          str]] = {
    "patroni": (patroni_cluster, PATRONI_PROGRAMS, "patroni etcd-server postgresql-15"),
    "pg_auto_failover": (auto_failover_formation, AUTO_FAILOVER_PROGRAMS,
                         "pg-auto-failover-cli postgresql-15-auto-failover postgresql-15"),
}


@contextlib.contextmanager
def zeroth_cluster(manager: str) -> Iterator[tuple[Any, str]]:
    """The manager's cluster with database ``zeroth`` migrated through the multi-host DSN."""
    start, programs, packages = MANAGERS[manager]
    require(programs, packages)
    with start() as cluster:
        primary = cluster.primary()
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        dsn = cluster.dsn(DATABASE)
        migrate.upgrade(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(AUDIT_DDL)
        yield cluster, dsn


def inject(cluster: Cluster, event: str) -> dict[str, Any]:
    """Switch over, kill the primary node, or stop it (SIGSTOP, resumed once another node
    commits); returns when another node has committed a write."""
    began_at = datetime.now(UTC)
    began = time.monotonic()
    if event == "switchover":
        old, new = cluster.switchover()
    else:
        old = cluster.primary()
        if event == "kill":
            cluster.kill_node(old)
        else:
            cluster.stop_node(old)
        new = cluster.primary()
        deadline = time.monotonic() + 300
        while new is old:  # primary() polls; the killed node refuses at once
            assert time.monotonic() < deadline, "no node was promoted after the kill"
            time.sleep(0.2)
            new = cluster.primary()
    writable = round(time.monotonic() - began, 3)

    def first_commit() -> object:
        # The first commit there: a promoted server may accept connections as read-write and
        # still hold every commit until the manager has a synchronous standby for it again, or
        # has switched synchronous replication off. One event id for every try.
        with psycopg.connect(new.dsn(DATABASE), autocommit=True, connect_timeout=10) as conn:
            conn.execute("INSERT INTO public.chaos_events (event_id, source, kind, data)"
                         " VALUES (%s, 'harness', 'failover', '{}')"
                         " ON CONFLICT (event_id) DO NOTHING", (event_id,))
            return conn.execute("SELECT current_setting('synchronous_standby_names'),"
                                " zeroth._generation_floor()").fetchone()

    event_id = uuid.uuid4()
    # Read on the new node itself: a resumed old primary answers reads until it is demoted.
    standbys, floor = ha_until(first_commit, 300, "the new primary commits a write")  # type: ignore[misc]
    if event == "stop":
        # The hung node comes back once the new primary commits: its manager must demote it
        # (its clients' writes since the stop were never acknowledged; they must not land).
        cluster.resume_node(old)
    return {"event": event, "old_primary": old.name, "new_primary": new.name,
            "event_to_new_primary_writable_s": writable,
            "synchronous_standby_names_at_first_commit": standbys,
            "new_generation_floor": floor,
            "event_to_first_commit_on_new_primary_s": round(time.monotonic() - began, 3),
            "began_at": began_at}


@pytest.mark.parametrize("event", _events())
@pytest.mark.parametrize("manager", ["patroni", "pg_auto_failover"])
async def test_ha_soak(manager: str, event: str) -> None:
    total = int(os.environ.get(RUNS_ENV) or CI_RUNS)
    began = time.monotonic()
    with zeroth_cluster(manager) as (cluster, dsn):
        harness: asyncpg.Pool = await harness_pool(dsn)
        fleet = Fleet(dsn, FLEET, log_level="DEBUG")
        slot_samples: list[dict[str, Any]] = []
        sampling: asyncio.Task[None] | None = None
        figures: dict[str, Any] = {}
        try:
            enqueued = await enqueue_all(harness, 0, total)
            await fleet.start()
            sampling = asyncio.create_task(sample_slots(harness, slot_samples))
            reached = await until(lambda: completed(harness, int(total * EVENT_AT)),
                                  DRAIN_TIMEOUT)
            assert reached, f"half the runs did not complete: {await counts(harness)}"
            figures = await asyncio.to_thread(inject, cluster, event)
            drained = await until(lambda: all_terminal(harness), DRAIN_TIMEOUT)
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
    completions = [(run_id, generation, worker.worker_id) for worker in fleet.every
                   for run_id, generation in worker.completed]
    losses = compare_acknowledged(enqueued, completions, runs, history)
    losses["acknowledged_handler_writes_lost"] = sum(
        "answered accepted but is not in the history" in message
        for message in report.violations.get("handler_log_agrees", []))
    # The first claim on the new primary: the first in its timeline's generation band.
    claims = [row["acquired_at"] for row in history if row["kind"] == "claim"
              and row["new_generation"] > figures["new_generation_floor"]]
    first_claim = min(claims, default=None)
    figures["event_to_first_claim_on_new_primary_s"] = None if first_claim is None else round(
        (first_claim - figures["began_at"]).total_seconds(), 3)
    figures["began_at"] = figures["began_at"].isoformat()
    results = {
        "manager": manager, "event": event, "runs_planned": total, "fleet": FLEET.workers,
        "machine": {"cpus": os.cpu_count(), "note": "shared and loaded: timings are not "
                    "benchmarks"},
        "wall_s": round(wall, 1), "drained": drained, "failover": figures,
        "acknowledged_vs_new_primary": losses,
        **{key: report.figures[key] for key in (
            "runs", "final_status", "executions_per_run", "claims_per_run", "stale_writes",
            "accepted_writes", "failed_attempts_by_error")},
        "worker_log": fleet.log_markers(),
        "unexpected_worker_exits": len(fleet.unexpected_exits),
        "violations": report.summary(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{manager}-{event}.json").write_text(
        json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nHA soak ({manager}, {event}):\n" + json.dumps(results, indent=1, default=str))

    problems = [f"worker died: {exit_}" for exit_ in fleet.unexpected_exits]
    if not drained:
        problems.append(f"runs still open after {DRAIN_TIMEOUT:g}s")
    if not figures["new_generation_floor"]:
        problems.append(f"the new primary is still on timeline 1 (no promotion?): {figures}")
    if first_claim is None:
        problems.append(f"no claim on the new primary after the {event}: {figures}")
    problems += [f"{check}: {found['count']} violation(s), e.g. {found['first'][:5]}"
                 for check, found in report.summary().items()]
    for figure in ("enqueued_lost", "acknowledged_completions_lost", "runs_completed_twice",
                   "runs_completed_twice_under_one_generation_number",
                   "acknowledged_handler_writes_lost"):
        if losses[figure]:
            problems.append(f"{figure}: {losses[figure]}")
    if len(runs) != len(enqueued):
        problems.append(f"{len(enqueued)} runs enqueued, {len(runs)} on the new primary")
    assert not problems, "\n".join(problems)
