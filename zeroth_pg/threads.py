"""ThreadRuns: one active run per thread, multitask strategies, cancel with takeover, join.

:class:`ThreadRuns` is a :class:`~zeroth_pg.client.LeaseManager` (so an admit-and-own caller has
``start_run``, ``renew_leases``, ``complete_run``… on the same object) plus one method per thread
function of sql/migrations/0004_threads.sql. Every decision is made in SQL, in database time;
routine conflicts (a busy thread, a run another worker owns) are outcomes, never exceptions.
docs/threads.md explains the strategies, the outcomes and the HTTP mapping.

``join`` waits for ``NOTIFY zeroth_run_finished`` on one connection taken from the pool for the
duration of the wait (LISTEN needs a session; the pool runs ``UNLISTEN *`` when it gets the
connection back), and re-reads the run every ``poll_interval`` as a fallback, because a
notification is a hint, never the truth. A service with many concurrent joiners should size its
pool for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

import asyncpg

from zeroth_pg import _calls
from zeroth_pg.client import Executor, LeaseManager, RunId, _dumps, _loads, _uuid
from zeroth_pg.types import CancelOutcome, RunStatus

__all__ = [
    "HTTP_STATUS",
    "RUN_FINISHED_CHANNEL",
    "Admission",
    "AdmitOutcome",
    "CancelResult",
    "Displaced",
    "Strategy",
    "Takeover",
    "TakeoverOutcome",
    "ThreadRun",
    "ThreadRuns",
    "TokenUsage",
    "http_response",
]

#: Channel of ``NOTIFY`` sent whenever a run with a thread_id ends (completed, failed, cancelled).
RUN_FINISHED_CHANNEL = "zeroth_run_finished"

FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})

T = TypeVar("T")


class Strategy(StrEnum):
    """What ``admit_run`` does when the thread already has an active run."""

    REJECT = "reject"  # → busy
    INTERRUPT = "interrupt"  # cancel it (action interrupt) and admit
    ROLLBACK = "rollback"  # cancel it (action rollback: the owner restores) and admit
    ENQUEUE = "enqueue"  # wait behind it


class AdmitOutcome(StrEnum):
    """What ``zeroth.admit_run`` did."""

    ADMITTED = "admitted"  # the new run is the thread's active run
    QUEUED = "queued"  # the new run waits behind active_run_id
    BUSY = "busy"  # reject: nothing was created
    REUSED = "reused"  # the idempotency key or run_id named an existing run


class TakeoverOutcome(StrEnum):
    """What ``zeroth.claim_for_takeover`` / ``reconcile_thread_runs`` did with a run."""

    FAILED = "failed"  # not resumable: ended with a stop reason
    CANCELLED = "cancelled"  # a cancel had been requested
    REQUEUED = "requeued"  # resumable: back to pending for any worker (the attempt counted)
    DEAD_LETTERED = "dead_lettered"  # resumable but out of attempts: failed, dead-lettered


@dataclass(frozen=True, slots=True)
class Displaced:
    """A run an interrupt/rollback admission cancelled (or asked its owner to stop)."""

    run_id: UUID
    outcome: CancelOutcome
    worker_id: str | None
    lease_generation: int | None


@dataclass(frozen=True, slots=True)
class Admission:
    """Result of ``zeroth.admit_run``.

    ``lease_generation`` / ``lease_expires_at`` are set when the caller holds the run
    (admit-and-own, when the scope's limits left room for the lease); ``active_run_id`` and
    ``retry_after_s`` name what the thread waits for, or (admitted unleased, held back by the
    scope's rate key) when the key has a start again.
    """

    outcome: AdmitOutcome
    run_id: UUID | None
    status: RunStatus | None
    lease_generation: int | None
    lease_expires_at: datetime | None
    active_run_id: UUID | None
    retry_after_s: int | None
    displaced: tuple[Displaced, ...] = field(default=())

    @property
    def owned(self) -> bool:
        """True when the caller holds the new run's lease (start it with ``start_run``)."""
        return self.lease_generation is not None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """Result of ``zeroth.request_cancel_v2``."""

    outcome: CancelOutcome
    run_id: UUID
    status: RunStatus | None
    cancel_action: str | None
    lease_worker_id: str | None
    lease_generation: int | None
    retry_after_s: int | None


@dataclass(frozen=True, slots=True)
class Takeover:
    """A run taken over by ``claim_for_takeover`` / ``reconcile_thread_runs``."""

    run_id: UUID
    thread_id: str | None
    outcome: TakeoverOutcome
    status: RunStatus
    previous_worker_id: str
    previous_generation: int


@dataclass(frozen=True, slots=True)
class ThreadRun:
    """A run as ``zeroth.list_thread_runs`` / ``zeroth.get_thread_run`` report it."""

    run_id: UUID
    thread_id: str | None
    deployment_ref: str
    status: RunStatus
    queued: bool
    wait_reason: str | None
    attempts: int
    max_attempts: int
    resumable: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    lease_worker_id: str | None
    lease_generation: int
    lease_expires_at: datetime | None
    cancel_action: str | None
    cancel_requested_at: datetime | None
    idempotency_key: str | None
    payload: dict[str, Any]
    metadata: dict[str, Any]
    output: Any
    error: Any
    progress: Any
    accounting: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        """completed, failed or cancelled."""
        return self.status in FINISHED

    def accounting_as(self, cls: type[T]) -> T | None:
        """The accounting document as the caller's type (``cls(**accounting)``)."""
        return None if self.accounting is None else cls(**self.accounting)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """deer-flow's accounting columns as a typed accounting document (an example: any dataclass
    or mapping works). ``last_message`` is cut to ``LAST_MESSAGE_LIMIT`` characters."""

    LAST_MESSAGE_LIMIT = 2000

    message_count: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    llm_call_count: int = 0
    last_message: str | None = None

    def __post_init__(self) -> None:
        if self.last_message is not None and len(self.last_message) > self.LAST_MESSAGE_LIMIT:
            object.__setattr__(self, "last_message", self.last_message[:self.LAST_MESSAGE_LIMIT])


#: The HTTP status for each outcome, for services that expose runs over HTTP (docs/threads.md).
HTTP_STATUS: Mapping[AdmitOutcome | CancelOutcome, int] = {
    AdmitOutcome.ADMITTED: 202,
    AdmitOutcome.QUEUED: 202,
    AdmitOutcome.REUSED: 200,
    AdmitOutcome.BUSY: 409,
    CancelOutcome.CANCELLED: 202,
    CancelOutcome.CANCEL_REQUESTED: 202,
    CancelOutcome.TAKEN_OVER: 202,
    CancelOutcome.NOT_CANCELLABLE: 409,
    CancelOutcome.UNKNOWN: 404,
}


def http_response(result: Admission | CancelResult) -> tuple[int, dict[str, str]]:
    """(status, headers) for an admission or cancel result: ``Retry-After`` (seconds, a floor
    computed in database time) accompanies 202 and 409 whenever the result carries one."""
    status = HTTP_STATUS[result.outcome]
    headers: dict[str, str] = {}
    if result.retry_after_s is not None and status in (202, 409):
        headers["Retry-After"] = str(result.retry_after_s)
    return status, headers


def _json_object(value: Any) -> str | None:
    """A mapping or dataclass instance as a JSON object (None stays None)."""
    if value is None:
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json.dumps(dataclasses.asdict(value))
    return json.dumps(dict(value))


def _thread_run(row: asyncpg.Record) -> ThreadRun:
    data = dict(row)
    data["status"] = RunStatus(data["status"])
    for key in ("payload", "metadata", "output", "error", "progress", "accounting"):
        data[key] = _loads(data[key])
    return ThreadRun(**data)


def _takeover(row: asyncpg.Record) -> Takeover:
    return Takeover(run_id=row["run_id"], thread_id=row["thread_id"],
                    outcome=TakeoverOutcome(row["outcome"]), status=RunStatus(row["status"]),
                    previous_worker_id=row["previous_worker_id"],
                    previous_generation=row["previous_generation"])


@dataclass
class ThreadRuns(LeaseManager):
    """The thread API over an asyncpg pool. ``lease_duration_seconds`` is the lease an
    admit-and-own admission takes; ``grace_seconds`` is the takeover margin past a lease's
    expiry (admission retry hints, cancel, takeover, reconcile)."""

    grace_seconds: float = 10.0

    async def admit(
        self,
        deployment_ref: str,
        thread_id: str,
        payload: Mapping[str, Any] | None = None,
        *,
        strategy: Strategy | str = Strategy.REJECT,
        worker_id: str | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        run_id: RunId | None = None,
        priority: int = 0,
        max_attempts: int = 3,
        resumable: bool | None = None,
        owner_generation: int | None = None,
        conn: Executor | None = None,
    ) -> Admission:
        """Create a run for a thread (``zeroth.admit_run``); with ``worker_id`` it is leased to
        the caller at generation 1 in the same statement (admit-and-own) when the scope's
        ``zeroth.scope_limits`` row leaves room, as for a claim (not paused, a free slot, a start
        of its rate key). Otherwise it is admitted unleased (``Admission.owned`` is false): queue
        work for the deployment's workers, which the caller must not run; ``retry_after_s`` says
        when the rate key has a start again. To interrupt its own
        running run at once, the caller proves it holds that run's lease with
        ``owner_generation``; with ``worker_id`` alone a live run is only asked to stop. An owned
        admission records this client's ``code_version`` on the run, as a claim does."""
        rows = await self._fetch(
            _calls.ADMIT_RUN, deployment_ref, thread_id, str(strategy), worker_id,
            _dumps(dict(payload or {})), tenant_id, workspace_id, self.lease_duration_seconds,
            self.grace_seconds, idempotency_key, _dumps(dict(metadata or {})), _uuid(run_id),
            priority, max_attempts, resumable, owner_generation, self.code_version, conn=conn)
        row = rows[0]
        return Admission(
            outcome=AdmitOutcome(row["outcome"]), run_id=row["run_id"],
            status=None if row["status"] is None else RunStatus(row["status"]),
            lease_generation=row["lease_generation"], lease_expires_at=row["lease_expires_at"],
            active_run_id=row["active_run_id"], retry_after_s=row["retry_after_s"],
            displaced=tuple(
                Displaced(run_id=UUID(item["run_id"]), outcome=CancelOutcome(item["outcome"]),
                          worker_id=item["worker_id"], lease_generation=item["lease_generation"])
                for item in json.loads(row["displaced"])))

    async def cancel(
        self, run_id: RunId, *, action: str = "cancel", tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> CancelResult:
        """Cancel now, ask the live owner, or take over a dead owner's run
        (``zeroth.request_cancel_v2``)."""
        row = (await self._fetch(_calls.REQUEST_CANCEL_V2, _uuid(run_id), tenant_id, workspace_id,
                                 action, self.grace_seconds, conn=conn))[0]
        return CancelResult(
            outcome=CancelOutcome(row["outcome"]), run_id=row["run_id"],
            status=None if row["status"] is None else RunStatus(row["status"]),
            cancel_action=row["cancel_action"], lease_worker_id=row["lease_worker_id"],
            lease_generation=row["lease_generation"], retry_after_s=row["retry_after_s"])

    async def claim_for_takeover(
        self, run_id: RunId, *, stop_reason: str = "orphan_recovered", message: str | None = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> Takeover | None:
        """Take over one run whose owner's lease expired past the grace
        (``zeroth.claim_for_takeover``); None when it is not (or no longer) an orphan."""
        rows = await self._fetch(_calls.CLAIM_FOR_TAKEOVER, _uuid(run_id), tenant_id, workspace_id,
                                 self.grace_seconds, stop_reason, message, conn=conn)
        return _takeover(rows[0]) if rows else None

    async def reconcile(
        self, deployment_ref: str | None = None, *, claim_limit: int = 100,
        stop_reason: str = "orphan_recovered", message: str | None = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[Takeover]:
        """Take over the thread runs of a scope whose owners died
        (``zeroth.reconcile_thread_runs``); call it periodically."""
        rows = await self._fetch(_calls.RECONCILE_THREAD_RUNS, deployment_ref, tenant_id,
                                 workspace_id, self.grace_seconds, claim_limit, stop_reason,
                                 message, conn=conn)
        return [_takeover(row) for row in rows]

    async def update_run_progress(
        self, run_id: RunId, worker_id: str, *, generation: int,
        progress: Mapping[str, Any] | None = None, accounting: Mapping[str, Any] | Any = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """Merge progress and/or accounting (a mapping or a dataclass such as
        :class:`TokenUsage`) while running, fenced (``zeroth.update_run_progress``); False when
        fenced out."""
        return bool(await self._fetchval(
            _calls.UPDATE_RUN_PROGRESS, _uuid(run_id), worker_id, generation,
            _json_object(progress), _json_object(accounting), tenant_id, workspace_id,
            conn=conn))

    async def list_by_thread(
        self, thread_id: str, *, limit: int = 20, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> list[ThreadRun]:
        """The thread's runs, newest first (``zeroth.list_thread_runs``)."""
        rows = await self._fetch(_calls.LIST_THREAD_RUNS, thread_id, tenant_id, workspace_id,
                                 limit, conn=conn)
        return [_thread_run(row) for row in rows]

    async def get(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> ThreadRun | None:
        """One run, or None when no run has this id in this scope (``zeroth.get_thread_run``)."""
        rows = await self._fetch(_calls.GET_THREAD_RUN, _uuid(run_id), tenant_id, workspace_id,
                                 conn=conn)
        return _thread_run(rows[0]) if rows else None

    async def join(
        # On timeout join returns the last state it read; asyncio.timeout would raise instead.
        self, run_id: RunId, *, timeout: float, poll_interval: float = 1.0,  # noqa: ASYNC109
        tenant_id: str | None = None, workspace_id: str | None = None,
    ) -> ThreadRun | None:
        """Wait until the run is completed, failed or cancelled, at most ``timeout`` seconds.

        Returns the last state read (check :attr:`ThreadRun.finished`), or None when no run has
        this id in this scope. Woken by ``NOTIFY zeroth_run_finished`` (thread runs) carrying
        the run's opaque key; re-reads every ``poll_interval`` regardless (a notification is a
        hint, and anyone can send one).
        """
        wanted: str | None = None
        woken = asyncio.Event()

        def on_finished(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            if wanted is None or payload == wanted:
                woken.set()

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._listening(on_finished) as conn:
            wanted = await self.run_finished_key(run_id, tenant_id=tenant_id,
                                                 workspace_id=workspace_id, conn=conn)
            while True:
                woken.clear()
                run = await self.get(run_id, tenant_id=tenant_id, workspace_id=workspace_id,
                                     conn=conn)
                left = deadline - loop.time()
                if run is None or run.finished or left <= 0:
                    return run
                # asyncio.timeout: wait_for can drop a cancellation on 3.11 (gh-86296).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, poll_interval)):
                        await woken.wait()

    @contextlib.asynccontextmanager
    async def _listening(self, callback: Any) -> AsyncIterator[Any]:
        """A connection that LISTENs on zeroth_run_finished while the block runs."""
        async with contextlib.AsyncExitStack() as stack:
            conn = self.pool
            if isinstance(conn, asyncpg.Pool):
                conn = await stack.enter_async_context(conn.acquire())
            await conn.add_listener(RUN_FINISHED_CHANNEL, callback)
            try:
                yield conn
            finally:
                await conn.remove_listener(RUN_FINISHED_CHANNEL, callback)
