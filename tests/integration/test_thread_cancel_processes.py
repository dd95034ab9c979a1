"""Cross-process thread cancel: real ``python -m zeroth_pg.worker`` owners, a non-owner canceller.

* The owner is alive: a cancel from this process (not the owner) is a durable request the owner
  hears by NOTIFY; its handler stops long before any lease renewal could have carried the
  request, the run ends cancelled, and the run queued behind it on the thread then runs on the
  same worker. (deer-flow answers 409 here.)
* The owner is SIGKILLed: a cancel before its lease + grace ran out is a request with a
  retry_after_s; after it, the cancel returns taken_over and the killed owner's late writes
  (its saved generation) are refused.

The harness (worker subprocesses, the events table, polling helpers) is the one of
test_worker_processes.py; handlers are in worker_apps.py.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import asyncpg
from test_worker_processes import (  # noqa: F401 - workers and events are fixtures used here
    deployment_name,
    events,
    eventually,
    run_row,
    wait_event,
    wait_status,
    workers,
)

from zeroth_pg import CancelOutcome, RunStatus
from zeroth_pg.threads import AdmitOutcome, Strategy, ThreadRuns

#: --lease 600: renewals (which also carry cancels) every 200 s, far beyond any wait's bound
#: (test_worker_processes.DEADLINE), so a handler that stopped at all heard the cancel by NOTIFY.
OWNER_LEASE = "600"


class TestCancelReachesALiveOwner:
    async def test_non_owner_cancel_stops_the_owners_handler_and_hands_the_thread_on(
            self, workers: Any, events: asyncpg.Pool) -> None:  # noqa: F811 - fixtures
        pool = events
        dep = deployment_name("thread-cancel")
        threads = ThreadRuns(pool)
        first = await threads.admit(dep, "t-1", {"ticks": 1, "step_seconds": 0.05, "gate": True})
        follower = await threads.admit(dep, "t-1", {"ticks": 0}, strategy=Strategy.ENQUEUE)
        assert (first.outcome, follower.outcome) == (AdmitOutcome.ADMITTED, AdmitOutcome.QUEUED)
        owner = await workers(dep, "worker_apps:scripted", "--lease", OWNER_LEASE)
        await wait_event(pool, first.run_id, "gated", generation=1, worker=owner)

        sent = time.monotonic()
        result = await threads.cancel(first.run_id, action="interrupt")
        assert (result.outcome, result.lease_worker_id) == (
            CancelOutcome.CANCEL_REQUESTED, owner.worker_id)
        stop = await wait_event(pool, first.run_id, "stopped", generation=1, worker=owner)
        stopped_after = time.monotonic() - sent
        ended = await threads.join(first.run_id, timeout=15)
        joined_after = time.monotonic() - sent

        assert json.loads(stop["data_text"])["cancel_requested"] is True
        assert ended is not None
        assert (ended.status, ended.cancel_action) == (RunStatus.CANCELLED, "interrupt")
        # Stopped at all, before the first renewal (200 s): the request came by NOTIFY.
        await owner.wait_for_line(f"run {first.run_id} cancelled on request")
        print(f"\n[thread cancel] non-owner cancel -> owner's handler stopped: "
              f"{stopped_after:.3f} s; run cancelled (join returned): {joined_after:.3f} s")

        # The queued run was promoted when the first ended, and the worker ran it.
        done = await threads.join(follower.run_id, timeout=15)
        assert done is not None
        assert done.status is RunStatus.COMPLETED
        assert done.output["worker_id"] == owner.worker_id


class TestCancelAfterTheOwnerWasKilled:
    async def test_cancel_after_lease_and_grace_takes_over_and_the_dead_owner_is_fenced(
            self, workers: Any, events: asyncpg.Pool) -> None:  # noqa: F811 - fixtures
        pool = events
        dep = deployment_name("thread-kill")
        threads = ThreadRuns(pool, grace_seconds=1)
        admitted = await threads.admit(dep, "t-1", {"ticks": None, "step_seconds": 0.1})
        owner = await workers(dep, "worker_apps:scripted")  # --lease 2
        await wait_event(pool, admitted.run_id, "started", generation=1, worker=owner)
        await eventually(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM zeroth.checkpoints k WHERE k.run_id = $1",
            admitted.run_id), "a checkpoint of generation 1")

        owner.send(signal.SIGKILL)
        await owner.wait_exit()
        killed_at = time.monotonic()

        early = await threads.cancel(admitted.run_id)
        assert early.outcome is CancelOutcome.CANCEL_REQUESTED  # lease + grace not yet run out
        assert early.retry_after_s is not None
        assert early.retry_after_s >= 1

        async def taken_over() -> Any:
            result = await threads.cancel(admitted.run_id)
            return result if result.outcome is CancelOutcome.TAKEN_OVER else None

        result = await eventually(taken_over, "a takeover after lease + grace", interval=0.1)
        taken_after = time.monotonic() - killed_at
        assert (result.status, result.lease_worker_id, result.lease_generation) == (
            RunStatus.CANCELLED, owner.worker_id, 1)
        row = await run_row(pool, admitted.run_id)
        assert json.loads(row["error"])["stop_reason"] == "taken_over"
        print(f"\n[thread takeover] SIGKILL -> cancel took over: {taken_after:.3f} s "
              f"(lease 2 s + grace 1 s; first hint retry_after_s={early.retry_after_s})")

        # The killed owner's saved generation can write nothing any more.
        stale = {"generation": 1}
        assert await threads.complete_run(admitted.run_id, owner.worker_id,
                                          output={"late": True}, **stale) is False
        assert await threads.save_checkpoint(admitted.run_id, owner.worker_id,
                                             {"late": True}, **stale) is None
        assert await threads.update_run_progress(admitted.run_id, owner.worker_id,
                                                 progress={"late": True}, **stale) is False
        assert await threads.renew_lease(admitted.run_id, owner.worker_id, **stale) is False
        after = await wait_status(pool, admitted.run_id, "cancelled")
        assert dict(after) == dict(row)
        # Nobody runs it again: the thread is free for the next admission.
        assert (await threads.admit(dep, "t-1")).outcome is AdmitOutcome.ADMITTED
