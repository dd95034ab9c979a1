"""Worker processes: crash recovery, zombies, graceful shutdown, cancel, fleet concurrency.

Each test starts real ``python -m zeroth_pg.worker`` subprocesses against a fresh database and
signals them (SIGKILL, SIGSTOP/SIGCONT, SIGTERM). The handlers live in worker_apps.py and talk
to the test only through the database (``public.events`` rows and checkpoints); the test polls
the database with deadlines and never sleeps to coordinate. Leases are 2 s and orphan sweeps
0.5 s so a takeover happens within a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from tcp_proxy import TcpProxy, server_target
from worker_apps import EVENTS_DDL
from worker_apps import app as worker_app

from zeroth_pg.client import LeaseManager
from zeroth_pg.testing import run_psql

REPO = Path(__file__).resolve().parents[2]
LEASE = 2.0
#: A bound for a hang, not a timed assertion: every wait polls and returns as soon as its
#: condition holds. 15 s was exceeded on a loaded 2-core machine (a whole parallel run beside two
#: others' suites, load average 15-19: a worker process took longer than that to start, claim and
#: report). It stays under the 200 s after which TestCancelFromAnotherProcess's 600 s lease would
#: renew (that test proves the cancel arrived by NOTIFY, before any renewal).
DEADLINE = 120.0
#: The longest log line read from a worker (a longer one ends the reading of its log).
LOG_LINE_LIMIT = 2**20

LIVE_LEASES = """
    SELECT count(*) FROM zeroth.runs r
     WHERE r.deployment_ref = $1 AND r.lease_worker_id IS NOT NULL
       AND r.lease_expires_at >= clock_timestamp()"""


# -- worker subprocesses ----------------------------------------------------------------------


class WorkerProcess:
    """One ``python -m zeroth_pg.worker`` subprocess; its stderr (the log) is collected."""

    def __init__(self, proc: asyncio.subprocess.Process, worker_id: str) -> None:
        self.proc = proc
        self.worker_id = worker_id
        self.lines: list[str] = []
        self._new_line = asyncio.Event()
        self._pump = asyncio.create_task(self._read_stderr())

    @classmethod
    async def spawn(cls, dsn: str, deployment: str | None, app: str, *extra: str,
                    worker_id: str | None = None) -> WorkerProcess:
        """``deployment`` None: a fleet worker of every deployment of the App ``app`` names."""
        worker_id = worker_id or f"w-{uuid.uuid4().hex[:8]}"
        paths = [str(REPO / "tests" / "integration"), str(REPO / "tests")]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "WORKER_APPS_DSN": dsn}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "zeroth_pg.worker", "--dsn", dsn,
            *(["--deployment", deployment] if deployment is not None else []),
            "--app", app, "--worker-id", worker_id, "--lease", str(LEASE),
            "--orphan-sweep-interval", "0.5", "--poll-interval", "0.5", "--log-level", "INFO",
            *extra, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            limit=LOG_LINE_LIMIT)
        return cls(proc, worker_id)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self._new_line.set()

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    async def wait_for_line(self, needle: str, within: float = DEADLINE) -> str:
        """The first log line containing ``needle`` (fails after ``within`` seconds)."""
        deadline = time.monotonic() + within
        while True:
            for line in self.lines:
                if needle in line:
                    return line
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.returncode is not None and self._pump.done()):
                pytest.fail(f"worker {self.worker_id}: no log line with {needle!r}:\n{self.log}")
            self._new_line.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new_line.wait(), timeout=min(left, 0.2))

    async def started(self) -> None:
        await self.wait_for_line(f"worker {self.worker_id} started")

    def send(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    async def wait_exit(self, within: float = DEADLINE) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout=within)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pump, timeout=5)
        return code

    async def stop(self) -> None:
        """Clean up whatever state the test left the process in."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


@pytest.fixture
async def workers(database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[WorkerProcess]]]:
    """``await workers(deployment, app, *extra_args)`` starts a worker process; all are stopped
    (SIGCONT + SIGTERM, then SIGKILL) at teardown."""
    started: list[WorkerProcess] = []

    async def spawn(deployment: str, app: str, *extra: str,
                    worker_id: str | None = None) -> WorkerProcess:
        proc = await WorkerProcess.spawn(database_dsn, deployment, app, *extra,
                                         worker_id=worker_id)
        started.append(proc)
        return proc

    try:
        yield spawn
    finally:
        await asyncio.gather(*(proc.stop() for proc in started))


@pytest.fixture
async def events(pool: asyncpg.Pool) -> asyncpg.Pool:
    await pool.execute(EVENTS_DDL)
    return pool


# -- polling the database -----------------------------------------------------------------------


async def eventually(probe: Callable[[], Awaitable[Any]], what: str,
                     within: float = DEADLINE, interval: float = 0.02) -> Any:
    """Poll ``probe`` until it returns something truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_event(pool: asyncpg.Pool, run_id: UUID, kind: str, *,
                     generation: int | None = None, worker: WorkerProcess | None = None,
                     within: float = DEADLINE) -> asyncpg.Record:
    async def probe() -> asyncpg.Record | None:
        row = await pool.fetchrow(
            """SELECT e.*, e.data::text AS data_text FROM public.events e
                WHERE e.run_id = $1 AND e.kind = $2
                  AND ($3::bigint IS NULL OR e.generation = $3)
                ORDER BY e.id LIMIT 1""", run_id, kind, generation)
        if row is None and worker is not None and worker.proc.returncode not in (None, -9):
            pytest.fail(f"worker {worker.worker_id} exited {worker.proc.returncode}:\n"
                        f"{worker.log}")
        return row

    try:
        return await eventually(probe, f"event {kind!r} (generation {generation}) of run "
                                f"{run_id}", within=within)
    except pytest.fail.Exception as missed:
        if worker is None:
            raise
        # What the worker said meanwhile (a cancel heard or not, where a handler waited).
        pytest.fail(f"{missed}\nworker {worker.worker_id}'s log (the end):\n{worker.log[-6000:]}")


async def takeover(pool: asyncpg.Pool, run_id: UUID, old_generation: int,
                   within: float = DEADLINE) -> tuple[Any, asyncpg.Record]:
    """Poll until the run has a newer lease generation. Returns the last lease expiry seen for
    ``old_generation`` (a renewal already in flight when its worker froze or died still counts)
    and the row as taken over."""
    last_expiry: Any = None

    async def probe() -> asyncpg.Record | None:
        nonlocal last_expiry
        row = await run_row(pool, run_id)
        if row["lease_generation"] == old_generation:
            last_expiry = row["lease_expires_at"]
            return None
        return row

    row = await eventually(probe, f"a takeover of run {run_id}", within=within)
    assert last_expiry is not None, "the old lease was never observed"
    return last_expiry, row


def event_data(row: asyncpg.Record) -> dict[str, Any]:
    return json.loads(row["data_text"])  # type: ignore[no-any-return]


async def release(pool: asyncpg.Pool, run_id: UUID, generation: int = 0) -> None:
    """Let the handler of ``run_id`` (that generation, or 0: any) return."""
    await pool.execute(
        """INSERT INTO public.events (run_id, worker_id, generation, kind)
           VALUES ($1, 'test', $2, 'release')""", run_id, generation)


async def run_row(pool: asyncpg.Pool, run_id: UUID) -> asyncpg.Record:
    row = await pool.fetchrow(
        """SELECT r.*, r.output::text AS output_text FROM zeroth.runs r WHERE r.run_id = $1""",
        run_id)
    assert row is not None
    return row


async def wait_status(pool: asyncpg.Pool, run_id: UUID, status: str,
                      within: float = DEADLINE) -> asyncpg.Record:
    async def probe() -> asyncpg.Record | None:
        row = await run_row(pool, run_id)
        return row if row["status"] == status else None

    return await eventually(probe, f"run {run_id} {status}", within=within)


async def checkpoints(pool: asyncpg.Pool, run_id: UUID) -> list[asyncpg.Record]:
    return list(await pool.fetch(
        """SELECT k.checkpoint_id, k.checkpoint_order, k.lease_generation,
                  k.data::text AS data_text
             FROM zeroth.checkpoints k WHERE k.run_id = $1 ORDER BY k.checkpoint_order""",
        run_id))


async def enqueue(pool: asyncpg.Pool, deployment: str, payload: dict[str, Any]) -> UUID:
    return (await LeaseManager(pool).enqueue_run(deployment, payload)).run_id


def output(row: asyncpg.Record) -> dict[str, Any]:
    return json.loads(row["output_text"])  # type: ignore[no-any-return]


def deployment_name(tag: str) -> str:
    return f"proc-{tag}-{uuid.uuid4().hex[:6]}"


# -- tests ----------------------------------------------------------------------------------------


class TestCrashRecovery:
    async def test_sigkill_mid_run_resumes_from_last_checkpoint_and_fences_the_dead(
            self, workers: Any, events: asyncpg.Pool) -> None:
        pool = events
        dep = deployment_name("crash")
        run_id = await enqueue(pool, dep, {"ticks": None, "step_seconds": 0.2})

        a = await workers(dep, "worker_apps:scripted")
        # A claims it and checkpoints at least twice before it dies.
        await wait_event(pool, run_id, "started", generation=1, worker=a)
        await eventually(lambda: pool.fetchval(
            "SELECT count(*) >= 2 FROM zeroth.checkpoints k WHERE k.run_id = $1", run_id),
            "two checkpoints of generation 1")
        b = await workers(dep, "worker_apps:scripted")
        await b.started()  # B is idle and sweeping for orphans before A dies

        a.send(signal.SIGKILL)
        killed_at = await pool.fetchval("SELECT clock_timestamp()")
        assert await a.wait_exit() == -signal.SIGKILL
        dead = await run_row(pool, run_id)
        assert (dead["status"], dead["lease_worker_id"], dead["lease_generation"]) == (
            "running", a.worker_id, 1)
        old_expiry, taken = await takeover(pool, run_id, 1)
        last = (await checkpoints(pool, run_id))[-1]
        assert json.loads(last["data_text"])["generation"] == 1

        resumed = await wait_event(pool, run_id, "started", generation=2, worker=b)
        assert resumed["worker_id"] == b.worker_id
        data = event_data(resumed)
        assert data["recovered"] is True
        assert data["recovery_checkpoint_id"] == str(last["checkpoint_id"])
        assert data["resumed_from"] == json.loads(last["data_text"])["step"]
        assert taken["lease_worker_id"] == b.worker_id
        assert taken["lease_generation"] == 2
        assert taken["recovery_checkpoint_id"] == last["checkpoint_id"]
        # B took over only after A's lease had expired.
        assert taken["lease_acquired_at"] > old_expiry
        print(f"\n[crash] kill -> resumed by second worker: "
              f"{(resumed['at'] - killed_at).total_seconds():.3f} s "
              f"(lease {LEASE:g} s, sweep 0.5 s); lease expiry -> takeover: "
              f"{(taken['lease_acquired_at'] - old_expiry).total_seconds():.3f} s; "
              f"resumed from step {data['resumed_from']}")

        # B's checkpoints continue A's sequence.
        await eventually(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM zeroth.checkpoints k "
            "WHERE k.run_id = $1 AND k.lease_generation = 2", run_id),
            "a checkpoint of generation 2")
        after = [k for k in await checkpoints(pool, run_id) if k["lease_generation"] == 2]
        assert json.loads(after[0]["data_text"])["step"] == data["resumed_from"] + 1

        # The killed generation's late writes are refused while B holds the run ...
        lm = LeaseManager(pool, lease_duration_seconds=LEASE)
        stale = {"generation": 1}
        assert await lm.complete_run(run_id, a.worker_id, output={"late": True}, **stale) is False
        assert await lm.save_checkpoint(run_id, a.worker_id, {"late": True}, **stale) is None
        assert await lm.commit_fenced(run_id, a.worker_id, output={"late": True},
                                      **stale) is False
        assert await lm.renew_lease(run_id, a.worker_id, **stale) is False
        row = await run_row(pool, run_id)
        assert (row["status"], row["output"], row["lease_worker_id"]) == (
            "running", None, b.worker_id)
        assert all(json.loads(k["data_text"]).get("late") is None
                   for k in await checkpoints(pool, run_id))

        await release(pool, run_id)
        done = await wait_status(pool, run_id, "completed")
        result = output(done)
        assert result["worker_id"] == b.worker_id
        assert result["generation"] == 2
        assert result["resumed_from"] == data["resumed_from"]
        assert result["recovery_checkpoint_id"] == str(last["checkpoint_id"])

        # ... and after the run completed.
        assert await lm.complete_run(run_id, a.worker_id, output={"late": True}, **stale) is False
        assert await lm.save_checkpoint(run_id, a.worker_id, {"late": True}, **stale) is None
        assert await lm.commit_fenced(run_id, a.worker_id, output={"late": True},
                                      **stale) is False
        assert output(await run_row(pool, run_id)) == result


class TestZombie:
    async def test_sigstopped_worker_past_its_lease_cannot_write_and_stops_its_handler(
            self, workers: Any, events: asyncpg.Pool) -> None:
        pool = events
        dep = deployment_name("zombie")
        run_id = await enqueue(pool, dep, {"ticks": None, "step_seconds": 0.2})

        a = await workers(dep, "worker_apps:scripted")
        await wait_event(pool, run_id, "started", generation=1, worker=a)
        await eventually(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM zeroth.checkpoints k WHERE k.run_id = $1", run_id),
            "a checkpoint of generation 1")
        b = await workers(dep, "worker_apps:scripted")
        await b.started()

        a.send(signal.SIGSTOP)
        stopped_at = time.monotonic()
        old_expiry, taken = await takeover(pool, run_id, 1)
        taken_after = time.monotonic() - stopped_at
        assert taken["lease_worker_id"] == b.worker_id
        assert taken["lease_generation"] == 2
        assert taken["lease_acquired_at"] > old_expiry  # only once the frozen lease expired
        resumed = await wait_event(pool, run_id, "started", generation=2, worker=b)
        assert resumed["worker_id"] == b.worker_id
        # B is running and checkpointing; from now on a generation-1 write cannot land.
        await eventually(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM zeroth.checkpoints k "
            "WHERE k.run_id = $1 AND k.lease_generation = 2", run_id),
            "a checkpoint of generation 2")
        gen1_before = await pool.fetchval(
            "SELECT count(*) FROM zeroth.checkpoints k "
            "WHERE k.run_id = $1 AND k.lease_generation = 1", run_id)

        a.send(signal.SIGCONT)
        continued_at = time.monotonic()
        stop = await wait_event(pool, run_id, "stopped", generation=1)
        stop_latency = time.monotonic() - continued_at
        assert stop["worker_id"] == a.worker_id
        await a.wait_for_line("lease generation 1 lost")
        print(f"\n[zombie] SIGSTOP -> takeover by second worker: {taken_after:.3f} s; "
              f"SIGCONT -> zombie handler stopped: {stop_latency:.3f} s "
              f"({event_data(stop)['why']})")

        # B keeps going; A wrote nothing more.
        mark = await pool.fetchval(
            "SELECT max(k.checkpoint_order) FROM zeroth.checkpoints k WHERE k.run_id = $1",
            run_id)
        await eventually(lambda: pool.fetchval(
            "SELECT max(k.checkpoint_order) > $2 FROM zeroth.checkpoints k WHERE k.run_id = $1",
            run_id, mark), "another checkpoint of generation 2")
        assert a.proc.returncode is None  # the zombie process lives on, only its run stopped
        await release(pool, run_id, generation=2)
        done = await wait_status(pool, run_id, "completed")
        assert output(done)["worker_id"] == b.worker_id
        assert output(done)["generation"] == 2

        saved = await checkpoints(pool, run_id)
        gen1 = [k for k in saved if k["lease_generation"] == 1]
        gen2 = [k for k in saved if k["lease_generation"] == 2]
        assert len(gen1) == gen1_before
        assert max(k["checkpoint_order"] for k in gen1) < min(k["checkpoint_order"] for k in gen2)
        assert all(json.loads(k["data_text"])["worker_id"] == b.worker_id for k in gen2)
        kinds = {(r["generation"], r["kind"]) for r in await pool.fetch(
            "SELECT e.generation, e.kind FROM public.events e WHERE e.run_id = $1", run_id)}
        assert (1, "completing") not in kinds
        assert (2, "completing") in kinds

    async def test_released_zombie_cannot_complete_the_run_another_worker_holds(
            self, workers: Any, events: asyncpg.Pool) -> None:
        pool = events
        dep = deployment_name("zombie-complete")
        run_id = await enqueue(pool, dep, {"ticks": 1, "step_seconds": 0.05, "gate": True})

        a = await workers(dep, "worker_apps:scripted")
        await wait_event(pool, run_id, "gated", generation=1, worker=a)
        b = await workers(dep, "worker_apps:scripted")
        await b.started()

        a.send(signal.SIGSTOP)
        old_expiry, taken = await takeover(pool, run_id, 1)
        assert taken["lease_worker_id"] == b.worker_id
        assert taken["lease_acquired_at"] > old_expiry
        held = await wait_event(pool, run_id, "gated", generation=2, worker=b)
        assert event_data(held)["step"] == 1  # B resumed after A's checkpoint and now holds
        # While A is frozen its handler is allowed to finish: on SIGCONT it returns at once,
        # unless A's refused renewal stops it first. Either way nothing of A's may land.
        await release(pool, run_id, generation=1)

        a.send(signal.SIGCONT)
        continued_at = time.monotonic()
        await a.wait_for_line("lease generation 1 lost")

        async def zombie_outcome() -> asyncpg.Record | None:
            row: asyncpg.Record | None = await pool.fetchrow(
                """SELECT e.kind, e.data::text AS data_text FROM public.events e
                    WHERE e.run_id = $1 AND e.generation = 1
                      AND e.kind IN ('stopped', 'completing')""", run_id)
            return row

        outcome = await eventually(zombie_outcome, "the zombie handler to end")
        print(f"\n[zombie-complete] SIGCONT -> generation 1 refused: "
              f"{time.monotonic() - continued_at:.3f} s (zombie handler {outcome['kind']})")
        row = await run_row(pool, run_id)
        assert row["status"] == "running"
        assert row["output"] is None
        assert row["lease_worker_id"] == b.worker_id
        assert row["lease_generation"] == 2
        assert a.proc.returncode is None

        await release(pool, run_id, generation=2)
        done = await wait_status(pool, run_id, "completed")
        result = output(done)
        assert result["worker_id"] == b.worker_id
        assert result["generation"] == 2
        assert result["resumed_from"] == 1
        assert [k["lease_generation"] for k in await checkpoints(pool, run_id)] == [1]


class TestGracefulShutdown:
    async def test_sigterm_as_soon_as_the_worker_says_it_started_drains_it(
            self, workers: Any) -> None:
        # The process signals itself from the log record "worker … started": the signal
        # handlers must already be installed then, or SIGTERM kills the process undrained.
        worker = await workers(deployment_name("early"), "sigterm_at_start_app:handler")
        code = await worker.wait_exit()
        assert code == 0, worker.log
        await worker.wait_for_line(f"worker {worker.worker_id} stopped")

    async def test_sigterm_completes_the_quick_run_and_hands_back_the_slow_one(
            self, workers: Any, events: asyncpg.Pool) -> None:
        pool = events
        dep = deployment_name("drain")
        quick = await enqueue(pool, dep, {"ticks": 0, "gate": True})
        slow = await enqueue(pool, dep, {"ticks": 2, "step_seconds": 0.1, "gate": True})

        a = await workers(dep, "worker_apps:scripted", "--shutdown-timeout", "3")
        await wait_event(pool, quick, "gated", generation=1, worker=a)
        await wait_event(pool, slow, "gated", generation=1, worker=a)
        assert len(await checkpoints(pool, slow)) == 2

        a.send(signal.SIGTERM)
        await a.wait_for_line(f"worker {a.worker_id} draining 2 run(s)")
        await release(pool, quick)  # finishes within the shutdown timeout; slow never does
        code = await a.wait_exit()
        assert code == 0, a.log
        await a.wait_for_line(f"worker {a.worker_id} stopped")
        await a.wait_for_line(f"run {slow} handed back to pending: True")

        done = await run_row(pool, quick)
        assert done["status"] == "completed"
        assert output(done)["worker_id"] == a.worker_id
        back = await run_row(pool, slow)
        assert back["status"] == "pending"
        assert back["lease_worker_id"] is None
        assert back["lease_expires_at"] is None
        assert back["attempts"] == 0  # the interrupted attempt was given back
        saved = await checkpoints(pool, slow)
        assert [json.loads(k["data_text"])["step"] for k in saved] == [1, 2]
        stopped = await wait_event(pool, slow, "stopped", generation=1)
        assert event_data(stopped)["why"] == "cancelled"

        b = await workers(dep, "worker_apps:scripted")
        resumed = await wait_event(pool, slow, "started", generation=2, worker=b)
        assert resumed["worker_id"] == b.worker_id
        assert event_data(resumed)["resumed_from"] == 2
        assert event_data(resumed)["recovery_checkpoint_id"] == str(saved[-1]["checkpoint_id"])
        await release(pool, slow, generation=2)
        finished = await wait_status(pool, slow, "completed")
        result = output(finished)
        assert result["worker_id"] == b.worker_id
        assert result["resumed_from"] == 2
        assert result["steps"] == 2
        assert result["attempt"] == 1
        assert len(await checkpoints(pool, slow)) == 2  # no step was redone
        b.send(signal.SIGTERM)
        assert await b.wait_exit() == 0, b.log
        await b.wait_for_line(f"worker {b.worker_id} draining 0 run(s)")


    async def test_a_second_sigterm_hands_the_running_run_back_at_once_and_exits_0(
            self, workers: Any, events: asyncpg.Pool) -> None:
        # The first SIGTERM drains (the handler would get an hour); the second hurries the
        # drain: the run is handed back now, its checkpoints kept, and the process exits 0. It
        # used to find the default action again and kill the process with the run in hand.
        pool = events
        dep = deployment_name("hurry")
        slow = await enqueue(pool, dep, {"ticks": 2, "step_seconds": 0.1, "gate": True})
        # A 30 s lease: hurried, the worker waits for the hand-back at most a lease (then the
        # lease lapses anyway). The handler's cancellation path (recording "stopped" through
        # its own pool) and the hand-back once took more than the file's 2 s lease on a loaded
        # machine, and the handler was abandoned with its run.
        a = await workers(dep, "worker_apps:scripted", "--shutdown-timeout", "3600",
                          "--lease", "30")
        await wait_event(pool, slow, "gated", generation=1, worker=a)

        a.send(signal.SIGTERM)
        await a.wait_for_line(f"worker {a.worker_id} draining 1 run(s)")
        a.send(signal.SIGTERM)
        code = await a.wait_exit()
        assert code == 0, a.log
        await a.wait_for_line("SIGTERM again while draining; handing every run back now")
        await a.wait_for_line(f"run {slow} handed back to pending: True")
        await a.wait_for_line(f"worker {a.worker_id} stopped")

        back = await run_row(pool, slow)
        assert back["status"] == "pending"
        assert (back["lease_worker_id"], back["lease_expires_at"]) == (None, None)
        assert back["attempts"] == 0  # the interrupted attempt was given back
        assert [json.loads(k["data_text"])["step"] for k in await checkpoints(pool, slow)] == [
            1, 2]
        stopped = await wait_event(pool, slow, "stopped", generation=1)
        assert event_data(stopped)["why"] == "cancelled"


class TestCancelFromAnotherProcess:
    async def test_psql_request_cancel_reaches_the_worker_handler(
            self, workers: Any, events: asyncpg.Pool, database_dsn: str) -> None:
        pool = events
        dep = deployment_name("cancel")
        run_id = await enqueue(pool, dep, {"ticks": 1, "step_seconds": 0.05, "gate": True})
        # A 600 s lease renews every 200 s: a handler stopped before that (wait_event fails
        # after DEADLINE) heard the cancel by NOTIFY, not by a renewal.
        a = await workers(dep, "worker_apps:scripted", "--lease", "600")
        await wait_event(pool, run_id, "gated", generation=1, worker=a)

        sent = time.monotonic()
        # psql: a third process, neither the test nor the worker, asks for the cancel.
        answer = await asyncio.to_thread(
            run_psql, database_dsn,
            f"SELECT zeroth.request_cancel(run_id => '{run_id}'::uuid)", "-t", "-A")
        assert answer.stdout.strip() == "cancel_requested", answer.stderr
        stop = await wait_event(pool, run_id, "stopped", generation=1)
        reached = time.monotonic() - sent
        assert event_data(stop)["cancel_requested"] is True
        row = await wait_status(pool, run_id, "cancelled")
        assert row["lease_worker_id"] is None
        assert (1, "completing") not in {(r["generation"], r["kind"]) for r in await pool.fetch(
            "SELECT e.generation, e.kind FROM public.events e WHERE e.run_id = $1", run_id)}
        await a.wait_for_line(f"run {run_id} cancelled on request")
        print(f"\n[cancel] psql request_cancel -> handler stopped: {reached:.3f} s")


class TestFleetConcurrency:
    async def test_three_processes_never_exceed_the_fleet_max(
            self, workers: Any, events: asyncpg.Pool, connect: Any) -> None:
        pool = events
        dep = deployment_name("fleet")
        runs, limit = 60, 3
        await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"seconds": 0.1}}] * runs)

        monitor = await connect()
        samples: list[int] = []
        done = asyncio.Event()

        async def watch() -> None:
            while not done.is_set():
                samples.append(await monitor.fetchval(LIVE_LEASES, dep))
                await asyncio.sleep(0.003)

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        try:
            procs = [await workers(dep, "worker_apps:sleeper", "--concurrency", "4",
                                   "--fleet-concurrency", str(limit)) for _ in range(3)]

            async def all_done() -> bool:
                for proc in procs:
                    if proc.proc.returncode is not None:
                        pytest.fail(f"worker exited {proc.proc.returncode}:\n{proc.log}")
                return bool(await pool.fetchval(
                    "SELECT count(*) = $2 FROM zeroth.runs r "
                    "WHERE r.deployment_ref = $1 AND r.status = 'completed'", dep, runs))

            await eventually(all_done, f"{runs} runs completed", within=30, interval=0.05)
        finally:
            done.set()
            await watcher
        elapsed = time.monotonic() - started

        assert max(samples) <= limit
        assert max(samples) == limit  # the bound was reached, so it was really tested
        # Handler executions (database clock) never overlapped more than the limit either.
        rows = await pool.fetch(
            "SELECT e.at, e.kind, e.worker_id FROM public.events e WHERE e.kind IN "
            "('started', 'finished') ORDER BY e.at, e.kind = 'started'")
        assert sum(r["kind"] == "started" for r in rows) == runs
        running = overlap = 0
        for r in rows:
            running += 1 if r["kind"] == "started" else -1
            overlap = max(overlap, running)
        assert overlap <= limit
        per_worker = {p.worker_id: sum(1 for r in rows if r["kind"] == "started"
                                       and r["worker_id"] == p.worker_id) for p in procs}
        assert await pool.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1 "
            "AND r.lease_worker_id IS NOT NULL", dep) == 0
        print(f"\n[fleet] {runs} runs x 0.1 s on 3 processes (fleet max {limit}, local 4): "
              f"{len(samples)} lease samples, max live leases {max(samples)}, max handler "
              f"overlap {overlap}, {elapsed:.2f} s; runs per worker {sorted(per_worker.values())}")


async def test_a_worker_given_zeroth_pg_dsn_serves_without_migrating_it(database_dsn):
    """``serve()`` with no dsn serves ZEROTH_PG_DSN as it is, without migrating it (which needs
    the migrating role's privileges): a least-privileged worker (a zeroth_worker login, no
    CREATE on the database) starts and serves."""
    from roles import dsn_as, login_role

    with login_role(database_dsn, "zeroth_worker") as (name, password):
        worker_dsn = dsn_as(database_dsn, name, password)
        paths = [str(REPO / "tests" / "integration"), str(REPO / "tests")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "ZEROTH_PG_DSN": worker_dsn,
               "WORKER_APPS_DSN": database_dsn}
        code = ("import asyncio, logging\n"
                "logging.basicConfig(level=logging.INFO)\n"
                "from zeroth_pg.worker._process import serve\n"
                "asyncio.run(serve(deployment='env-dsn', app='worker_apps:sleeper',"
                " worker_id='w-env-dsn', poll_interval=0.5))\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        worker = WorkerProcess(proc, "w-env-dsn")
        try:
            await worker.started()
            lm_pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2)
            try:
                await lm_pool.execute(EVENTS_DDL)  # what the handler records into
                run = await LeaseManager(lm_pool).enqueue_run("env-dsn", payload={"seconds": 0})
                deadline = time.monotonic() + 30
                while await lm_pool.fetchval(
                        "SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                        run.run_id) != "completed":
                    assert time.monotonic() < deadline, worker.log
                    await asyncio.sleep(0.1)
            finally:
                await lm_pool.close()
            worker.send(signal.SIGTERM)
            assert await worker.wait_exit() == 0, worker.log
        finally:
            await worker.stop()


async def test_a_handler_that_exits_interrupts_or_raises_huge_fails_its_run_not_the_process(
        workers, events):
    """Through a real ``zeroth-pg worker`` process: beside a run
    that is running, three runs whose async handler calls ``sys.exit(3)``, raises
    KeyboardInterrupt, or raises a ValueError with a 50 MB message. Each fails with its error
    (SystemExit and its code named; the huge message cut to the bound), the running run then
    completes, the process serves on and drains on SIGTERM with exit status 0, and no line of
    its log is longer than the bound (a SystemExit must not end the process with its other runs
    left running, nor a huge message be logged whole)."""
    from zeroth_pg.errors import MAX_ERROR_TEXT_BYTES

    pool = events
    dep = deployment_name("raises")
    # A lease that load cannot lapse: with the module's 2 s one, a loaded machine (load average
    # 15+) can let the lease of a run in hand expire while the 50 MB message is built and cut,
    # and the orphan sweep then fails that run (orphan_recovered, an error without "type")
    # before its handler's error lands: right for the product, not what this test is about.
    worker = await workers(dep, "worker_apps:raises_on_request", "--concurrency", "4",
                           "--lease", "60")
    await worker.started()
    innocent = await enqueue(pool, dep, {})
    await wait_event(pool, innocent, "started", worker=worker)
    lm = LeaseManager(pool)
    hostile = {how: (await lm.enqueue_run(dep, {"raise": how}, max_attempts=1)).run_id
               for how in ("exit", "interrupt", "huge")}
    errors = {}
    for how, run_id in hostile.items():
        await wait_status(pool, run_id, "failed")
        errors[how] = json.loads(await pool.fetchval(
            "SELECT r.error::text FROM zeroth.runs r WHERE r.run_id = $1", run_id))
    assert errors["exit"].get("type") == "RuntimeError", errors["exit"]
    assert "SystemExit (exit code 3)" in errors["exit"]["message"]
    assert "KeyboardInterrupt" in errors["interrupt"]["message"]
    assert errors["huge"].get("type") == "ValueError", errors["huge"]["message"][:200]
    assert len(errors["huge"]["message"].encode()) <= MAX_ERROR_TEXT_BYTES
    assert "[truncated " in errors["huge"]["message"]

    await release(pool, innocent)
    await wait_status(pool, innocent, "completed")
    later = await enqueue(pool, dep, {})  # the process still claims
    await wait_event(pool, later, "started", worker=worker)
    await release(pool, later)
    await wait_status(pool, later, "completed")
    assert worker.proc.returncode is None
    worker.send(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log
    assert worker._pump.exception() is None  # every line of the log was read
    assert max(len(line.encode()) for line in worker.lines) <= MAX_ERROR_TEXT_BYTES + 1024
    assert any("ValueError: bad response: xxx" in line for line in worker.lines)


async def test_one_process_serves_a_mapping_of_deployments_in_every_scope(workers, pool):
    """``--app worker_apps:fleet`` (a mapping) with ``--deployment`` twice: a fleet worker of
    those two deployments, in every tenant and workspace; the mapping's third is not served."""
    lm = LeaseManager(pool)
    served: list[tuple[str, str, str | None]] = []
    for deployment in ("fleet-mail", "fleet-resize"):
        for tenant, workspace in (("acme", None), ("globex", "w1")):
            await lm.enqueue_run(deployment, {}, tenant_id=tenant, workspace_id=workspace)
            served.append((deployment, tenant, workspace))
    left = await lm.enqueue_run("fleet-unserved", {}, tenant_id="acme")
    worker = await workers("fleet-mail", "worker_apps:fleet", "--deployment", "fleet-resize")
    await worker.started()
    deadline = time.monotonic() + DEADLINE
    while await pool.fetchval("SELECT count(*) FROM zeroth.runs WHERE status = 'completed'") < 4:
        assert time.monotonic() < deadline, worker.log
        await asyncio.sleep(0.1)
    rows = await pool.fetch(
        "SELECT deployment_ref, tenant_id, workspace_id, output FROM zeroth.runs "
        "WHERE status = 'completed'")
    assert sorted((r["deployment_ref"], r["tenant_id"], r["workspace_id"]) for r in rows) == \
        sorted(served)
    for row in rows:
        assert json.loads(row["output"]) == {"deployment": row["deployment_ref"],
                                             "tenant": row["tenant_id"],
                                             "workspace": row["workspace_id"]}
    assert await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                               left.run_id) == "pending"
    worker.send(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log


async def test_one_process_serves_the_deployments_of_an_app(workers, pool):
    """``--app worker_apps:app`` (a zeroth_pg.App) with ``--deployment`` twice: its async and
    its sync deployment are served, in every tenant, the sync one in a thread of its own; the
    App's third deployment is not served."""
    lm, deployments = LeaseManager(pool), worker_app.deployments
    await lm.enqueue_run("app-greet", deployments["app-greet"].payload(name="ada"),
                         tenant_id="acme")
    await lm.enqueue_run("app-shout", deployments["app-shout"].payload("hi"), tenant_id="globex")
    left = await lm.enqueue_run("app-unserved", {})
    worker = await workers("app-greet", "worker_apps:app", "--deployment", "app-shout")
    await worker.started()
    deadline = time.monotonic() + DEADLINE
    while await pool.fetchval("SELECT count(*) FROM zeroth.runs WHERE status = 'completed'") < 2:
        assert time.monotonic() < deadline, worker.log
        await asyncio.sleep(0.1)
    outputs = {r["deployment_ref"]: json.loads(r["output"]) for r in await pool.fetch(
        "SELECT deployment_ref, output FROM zeroth.runs WHERE status = 'completed'")}
    assert outputs == {"app-greet": {"hello": "ada", "tenant": "acme"},
                       "app-shout": {"shout": "HI", "thread": "run"}}
    assert await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                               left.run_id) == "pending"
    worker.send(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log


async def _fired_and_completed(pool: asyncpg.Pool, deployment: str,
                               worker: WorkerProcess) -> list[asyncpg.Record]:
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = await pool.fetch(
            """SELECT output, metadata FROM zeroth.runs
                WHERE deployment_ref = $1 AND status = 'completed'
                  AND metadata ? 'zeroth_schedule'""", deployment)
        if len(rows) >= 2:
            return rows
        assert time.monotonic() < deadline, worker.log
        await asyncio.sleep(0.1)


async def test_an_app_process_registers_and_fires_its_periodic_schedules(workers, pool):
    """``--app worker_apps:periodic_app``: the process registers the App's @app.periodic
    schedule when it starts and fires it (it used to start without its schedules: the CLI took
    the App's handlers, not its schedules)."""
    worker = await workers("app-tick", "worker_apps:periodic_app")
    await worker.started()
    rows = await _fired_and_completed(pool, "app-tick", worker)
    assert {json.loads(r["output"])["source"] for r in rows} == {"schedule"}
    assert await pool.fetchval(
        "SELECT managed_by FROM zeroth.schedules WHERE name = 'app-tick'") == "app"
    worker.send(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log


async def test_fire_schedules_makes_a_process_fire_a_dba_schedule(workers, pool):
    """A schedule a DBA created in SQL fires when a worker of its deployment is started with
    --fire-schedules; each fire time is one run."""
    await LeaseManager(pool).create_schedule("mail-every-second", "fleet-mail",
                                             interval_seconds=1)
    worker = await workers("fleet-mail", "worker_apps:fleet", "--fire-schedules")
    await worker.started()
    rows = await _fired_and_completed(pool, "fleet-mail", worker)
    fires = [json.loads(r["metadata"])["zeroth_schedule"]["fire_at"] for r in rows]
    assert len(fires) == len(set(fires))
    worker.send(signal.SIGTERM)
    assert await worker.wait_exit() == 0, worker.log


# -- starting before the database -----------------------------------------------------------------


def _nothing_listens(target: dict[str, Any]) -> tuple[str, int]:
    """A DSN of ``target``'s database on a 127.0.0.1 port nothing listens on (for now), and
    the port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    user = target.get("user") or "postgres"
    return f"postgresql://{user}@127.0.0.1:{port}/{target['dbname']}", port


class TestStartingBeforeItsDatabase:
    async def test_a_worker_started_before_its_database_listens_waits_and_starts(
            self, database_dsn: str) -> None:
        # The worker's DSN names a port where nothing listens yet (a database not up yet, or
        # restarting while a supervisor respawns the worker): it says it could not connect yet
        # and keeps trying; once a proxy to the real server listens there, it starts and drains.
        target = server_target(database_dsn)
        late, port = _nothing_listens(target)
        worker = await WorkerProcess.spawn(late, deployment_name("late-db"), "worker_apps:sleeper")
        proxy = TcpProxy(target)
        try:
            await worker.wait_for_line("could not connect yet")
            assert worker.proc.returncode is None, worker.log
            await proxy.start(port)
            await worker.started()
            worker.send(signal.SIGTERM)
            assert await worker.wait_exit() == 0, worker.log
        finally:
            await worker.stop()
            await proxy.close()

    async def test_a_sigterm_while_it_waits_for_its_database_exits_0(
            self, database_dsn: str) -> None:
        # A supervisor stops a worker whose database never came up: it held nothing, so it
        # ends at once with 0 (it used to die by the signal: -15).
        never, _ = _nothing_listens(server_target(database_dsn))
        worker = await WorkerProcess.spawn(never, deployment_name("never-db"),
                                           "worker_apps:sleeper")
        try:
            await worker.wait_for_line("could not connect yet")
            worker.send(signal.SIGTERM)
            assert await worker.wait_exit() == 0, worker.log
            assert "stopped before it could connect" in worker.log
        finally:
            await worker.stop()

    async def test_settings_no_retry_can_fix_fail_at_once(self, database_dsn: str) -> None:
        # A DSN the client refuses outright (an sslmode that does not exist) is not retried.
        target = server_target(database_dsn)
        user = target.get("user") or "postgres"
        bad = f"postgresql://{user}@127.0.0.1:1/{target['dbname']}?sslmode=nonsense"
        worker = await WorkerProcess.spawn(bad, deployment_name("bad-dsn"), "worker_apps:sleeper")
        try:
            assert await worker.wait_exit() == 1, worker.log
            assert "could not connect yet" not in worker.log
            assert "sslmode" in worker.log
        finally:
            await worker.stop()
