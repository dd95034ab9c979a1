"""The asyncpg client: ``LeaseManager`` mirrors the zeroth.* SQL functions one to one.

Each method sends exactly one statement (a call of one SQL function, which is one transaction
unless the caller passes ``conn=`` inside its own transaction) and maps the result to a frozen
dataclass. Validation lives in SQL: a bad argument comes back as ZP008 and is raised here as
:class:`~zeroth_pg.errors.InvalidArgumentError`. The method names and keyword arguments follow the
upstream Zeroth ``LeaseManager``; the lifecycle methods follow the SQL names.

Scope: ``tenant_id=None`` with ``workspace_id=None`` is the ``'default'`` tenant's null
workspace; a ``workspace_id`` without a ``tenant_id`` matches nothing (seed-spec §4).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypeVar, cast
from uuid import UUID

import asyncpg

from zeroth_pg import _calls, streams, tracing
from zeroth_pg._bounded import pooled_call
from zeroth_pg._jsonb import encode as _json
from zeroth_pg._jsonb import encode_bounded
from zeroth_pg._jsonb import unstorable as unstorable  # where it used to live
from zeroth_pg.errors import InvalidArgumentError, StepResultError, translate
from zeroth_pg.types import (
    CancelOutcome,
    ChildOutcome,
    ChildStart,
    ChildWait,
    ChildWaitOutcome,
    ClaimedRun,
    CompleteAndClaimResult,
    DeploymentDefaults,
    DeploymentRegistration,
    EmitResult,
    EnqueuedRun,
    EventWait,
    EventWaitOutcome,
    FailOutcome,
    LeaseClaimResult,
    LeaseRenewal,
    OrphanClaimResult,
    PinnedRuns,
    RateLimited,
    RetiredVersion,
    RunCompletion,
    RunEvent,
    RunSettled,
    RunStatus,
    Schedule,
    ScheduleFire,
    ScheduleFiring,
    ScheduleRegistration,
    Scope,
    ScopedRun,
    ScopeLimits,
    ScopesClaimResult,
    SettleKind,
    Settlement,
    SettleOutcome,
    SleepOutcome,
    SleepResult,
    StepResult,
    VersionPolicy,
)

__all__ = ["Executor", "LeaseManager"]

#: A pool, or a connection (possibly inside the caller's transaction).
Executor: TypeAlias = "asyncpg.Pool | asyncpg.Connection"

RunId: TypeAlias = UUID | str

#: The largest event data append_run_event takes (its JSON text; zeroth.append_run_event).
MAX_RUN_EVENT_DATA = 65536


# Arguments the client must convert before SQL sees them raise InvalidArgumentError (ZP008's
# class) instead of a bare ValueError/TypeError, so callers catch one exception tree.


def _uuid(value: RunId | None) -> UUID | None:
    if value is None or isinstance(value, UUID):
        return value
    try:
        return UUID(value)
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidArgumentError(f"not a UUID: {value!r:.100}") from exc


def _dumps(value: Any) -> str | None:
    """JSON text, or SQL NULL for None."""
    return None if value is None else _json(value)


def _object(value: Mapping[str, Any] | None, name: str) -> str | None:
    """A JSON object argument (payload, metadata): None means {}."""
    if value is not None and not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{name} must be a mapping, not {type(value).__name__}")
    return _dumps(dict(value or {}))


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def _step_value(value: str | None, what: str) -> Any:
    """A recorded step result or event payload, decoded. JSON PostgreSQL holds but Python cannot
    decode (an integer of more than 4,300 digits, nesting deeper than the decoder goes), written
    by psql or another language's client, is a StepResultError (no retry can decode it), never
    a ValueError or RecursionError that fails the run as retryable, again on every replay."""
    try:
        return _loads(value)
    except (RecursionError, ValueError) as exc:
        raise StepResultError(f"{what} cannot be decoded in Python: {type(exc).__name__}: "
                              f"{str(exc)[:200]}") from None


#: RunStatus by value: the enum's own lookup (``RunStatus(value)``) costs 1-3 µs on Python 3.11,
#: and every claimed and every enqueued run takes one.
_RUN_STATUSES = {status.value: status for status in RunStatus}


def _run_status(value: str) -> RunStatus:
    """``RunStatus(value)`` (ValueError for a value that is none), without the enum's lookup."""
    found = _RUN_STATUSES.get(value)
    return RunStatus(value) if found is None else found


def _claimed(row: asyncpg.Record) -> ClaimedRun:
    # The claim has committed: a value this process cannot decode must fail its own run, never
    # make the whole batch raise here and strand every run of it until its lease expires.
    problems: list[str] = []

    def decoded(column: str, empty: Any) -> Any:
        try:
            return _loads(row[column])
        except (RecursionError, ValueError) as exc:
            problems.append(f"{column}: {type(exc).__name__}: {str(exc)[:200]}")
            return empty

    payload, metadata = decoded("payload", {}), decoded("metadata", {})
    checkpoint = decoded("checkpoint_data", None)
    return ClaimedRun(
        run_id=row["run_id"],
        lease_generation=row["lease_generation"],
        lease_expires_at=row["lease_expires_at"],
        status=_run_status(row["status"]),
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        priority=row["priority"],
        thread_id=row["thread_id"],
        idempotency_key=row["idempotency_key"],
        payload=payload,
        metadata=metadata,
        recovery_checkpoint_id=row["recovery_checkpoint_id"],
        checkpoint_data=checkpoint,
        cancel_requested=row["cancel_requested"],
        undecodable="; ".join(problems) or None,
        deadline_at=row["deadline_at"],
        deadline_in=row["deadline_in"],
    )


T = TypeVar("T")


def _called(query: str) -> str:
    """The SQL function a statement of :mod:`._calls` calls, for a message: zeroth.claim_pending."""
    found = re.search(r"(zeroth\.[a-z_]+)\(", query)
    return found.group(1) if found else "a call"


def _enqueued(row: asyncpg.Record) -> EnqueuedRun:
    return EnqueuedRun(
        run_id=row["run_id"], created=row["created"], status=_run_status(row["status"]))


@dataclass
class LeaseManager:
    """Async client of the zeroth SQL API over an asyncpg pool.

    ``lease_duration_seconds`` is the lease every claim and renewal asks for (seed default 60).
    ``code_version`` is the version of the calling code every claim declares (issue 34; None:
    unversioned): a run it starts records it, and under the deployment's version policy
    (:meth:`set_version_policy`) a claim resumes only the started runs this version may serve.
    ``call_timeout`` (seconds; None, the default: unbounded) bounds every call made through
    ``pool`` when it is a pool, the wait for a connection included: a call with no answer by
    then has its connection terminated (never returned to the pool), the pool's other
    connections replaced, and raises :class:`~zeroth_pg.errors.CallTimeoutError` (retryable;
    whether it committed is unknown). A worker sets it (``RunWorker(call_timeout=…)``) so that
    a hung or partitioned primary does not hold its loops (:mod:`zeroth_pg._bounded`). Calls
    given ``conn=`` are the caller's to bound.
    """

    pool: Executor
    lease_duration_seconds: float = 60.0
    code_version: str | None = None
    call_timeout: float | None = None

    # -- plumbing --------------------------------------------------------------------------

    async def _call(self, conn: Executor | None, query: str,
                    call: Callable[[Executor], Awaitable[T]], *,
                    leaves_session_state: bool = False) -> T:
        """``call`` on ``conn``, else on a connection of the pool (:func:`pooled_call`: bounded
        by ``call_timeout``, given back without a reset unless ``leaves_session_state``), else
        on whatever ``self.pool`` is; errors mapped once (:func:`translate`)."""
        try:
            if conn is None and isinstance(self.pool, asyncpg.Pool):
                return await pooled_call(self.pool, self.call_timeout, call,
                                         lambda: _called(query),
                                         leaves_session_state=leaves_session_state)
            return await call(conn or self.pool)
        except Exception as exc:
            mapped = translate(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    async def _fetch(self, query: str, *args: Any, conn: Executor | None) -> list[asyncpg.Record]:
        return list(await self._call(conn, query, lambda c: c.fetch(query, *args)))

    async def _fetchval(self, query: str, *args: Any, conn: Executor | None,
                        leaves_session_state: bool = False) -> Any:
        return await self._call(conn, query, lambda c: c.fetchval(query, *args),
                                leaves_session_state=leaves_session_state)

    # -- enqueue ---------------------------------------------------------------------------

    async def enqueue_run(
        self,
        deployment_ref: str,
        payload: Mapping[str, Any] | None = None,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        priority: int | None = None,
        run_after: datetime | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        run_id: RunId | None = None,
        thread_id: str | None = None,
        attempt_timeout_seconds: int | None = None,
        run_timeout_seconds: int | None = None,
        conn: Executor | None = None,
    ) -> EnqueuedRun:
        """Create a pending run (``zeroth.enqueue_run``); ``priority`` / ``max_attempts`` None:
        the deployment's registered defaults (:meth:`register_deployment`), else 0 / 3;
        ``attempt_timeout_seconds`` / ``run_timeout_seconds``: this run's bound on an attempt's
        wall time and on its total time from its first claim, whole seconds (None: the
        deployment's); a
        repeated idempotency key returns the existing run with ``created=False``; a key
        starting ``zeroth-schedule:`` (the schedules' own) raises ReservedKeyError. With
        OpenTelemetry, a ``send`` span whose trace context goes into ``metadata``
        (:mod:`zeroth_pg.tracing`)."""
        for name, value in (("attempt_timeout_seconds", attempt_timeout_seconds),
                            ("run_timeout_seconds", run_timeout_seconds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidArgumentError(f"{name} must be whole seconds (an int) or None")
        with tracing.send(deployment_ref, tenant_id, workspace_id) as span:
            rows = await self._fetch(
                _calls.ENQUEUE_RUN, deployment_ref, _object(payload, "payload"), tenant_id,
                workspace_id, priority, run_after, max_attempts, idempotency_key,
                _object(tracing.inject(metadata), "metadata"), _uuid(run_id), thread_id,
                attempt_timeout_seconds, run_timeout_seconds, conn=conn)
            tracing.sent(span, rows[0]["run_id"])
        return _enqueued(rows[0])

    async def enqueue_runs(
        self,
        deployment_ref: str,
        runs: Iterable[Mapping[str, Any]],
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[EnqueuedRun]:
        """Create many runs in one call (``zeroth.enqueue_runs``), results in input order.

        Each item may carry payload, priority, run_after, max_attempts, idempotency_key,
        metadata, run_id and thread_id; an item without priority / max_attempts gets the
        deployment's registered defaults (:meth:`register_deployment`), else 0 / 3. A key
        starting ``zeroth-schedule:`` raises ReservedKeyError (nothing is created).
        """
        if not isinstance(runs, Iterable) or isinstance(runs, str | bytes | Mapping):
            raise InvalidArgumentError("runs must be an iterable of mappings")
        items = [_json_item(item) for item in runs]
        with tracing.send(deployment_ref, tenant_id, workspace_id, len(items)):
            if tracing.enabled():
                for item in items:
                    if isinstance(item.get("metadata", {}), Mapping):
                        traced = tracing.inject(item.get("metadata"))
                        if traced is not None:
                            item["metadata"] = traced
            rows = await self._fetch(_calls.ENQUEUE_RUNS, deployment_ref, _json(items),
                                     tenant_id, workspace_id, conn=conn)
        return [_enqueued(row) for row in rows]

    # -- claims ----------------------------------------------------------------------------

    async def claim_pending(
        self,
        deployment_ref: str,
        worker_id: str,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int | None = None,
        conn: Executor | None = None,
    ) -> UUID | None:
        """Claim one pending run (``zeroth.claim_pending``); its status stays pending."""
        result = await self.claim_pending_result(
            deployment_ref, worker_id, tenant_id=tenant_id, workspace_id=workspace_id,
            max_concurrency=max_concurrency, conn=conn)
        return result.run_id

    async def claim_pending_result(
        self,
        deployment_ref: str,
        worker_id: str,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int | None = None,
        batch_size: int = 1,
        conn: Executor | None = None,
    ) -> LeaseClaimResult:
        """Claim up to ``batch_size`` pending runs and report the saturation this call saw
        (``zeroth.claim_pending``)."""
        return _claim_result(await self._fetch(
            _calls.CLAIM_PENDING, deployment_ref, worker_id, tenant_id, workspace_id,
            max_concurrency, batch_size, self.lease_duration_seconds, self.code_version,
            conn=conn))

    async def claim_and_start(
        self,
        deployment_ref: str,
        worker_id: str,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int | None = None,
        batch_size: int = 1,
        conn: Executor | None = None,
    ) -> LeaseClaimResult:
        """Claim up to ``batch_size`` pending runs and start them in the same statement
        (``zeroth.claim_and_start``): every returned run is running, its attempt counted."""
        return _claim_result(await self._fetch(
            _calls.CLAIM_AND_START, deployment_ref, worker_id, tenant_id, workspace_id,
            max_concurrency, batch_size, self.lease_duration_seconds, self.code_version,
            conn=conn))

    async def claim_and_start_scopes(
        self,
        deployment_refs: Sequence[str],
        worker_id: str,
        *,
        scopes: Sequence[tuple[str | None, str | None]] | None = None,
        max_concurrency: int | None = None,
        batch_size: int = 1,
        conn: Executor | None = None,
    ) -> ScopesClaimResult:
        """Claim and start up to ``batch_size`` runs across many deployments and scopes, fairly
        (``zeroth.claim_and_start_scopes``). ``scopes``: (tenant_id, workspace_id) pairs, or
        None for every scope of ``deployment_refs`` that has pending runs. Each scope keeps
        its own limits (``zeroth.scope_limits``, else ``max_concurrency``)."""
        deployments, tenants, workspaces = _scope_arguments(deployment_refs, scopes)
        return _scopes_result(await self._fetch(
            _calls.CLAIM_AND_START_SCOPES, deployments, worker_id, tenants, workspaces,
            max_concurrency, batch_size, self.lease_duration_seconds, self.code_version,
            conn=conn))

    async def claim_orphaned_scopes(
        self,
        deployment_refs: Sequence[str],
        worker_id: str,
        *,
        scopes: Sequence[tuple[str | None, str | None]] | None = None,
        max_concurrency: int | None = None,
        claim_limit: int | None = None,
        grace_seconds: float = 10.0,
        conn: Executor | None = None,
    ) -> ScopesClaimResult:
        """:meth:`claim_orphaned_result` in every scope of ``deployment_refs`` with an expired
        running run, or in the listed ``scopes`` (``zeroth.claim_orphaned_scopes``);
        ``claim_limit`` is shared by all (0: end only). ``saturated``: the scopes where a
        resumable orphan waits for a free slot."""
        deployments, tenants, workspaces = _scope_arguments(deployment_refs, scopes)
        return _scopes_result(await self._fetch(
            _calls.CLAIM_ORPHANED_SCOPES, deployments, worker_id, tenants, workspaces,
            max_concurrency, claim_limit, self.lease_duration_seconds, grace_seconds,
            self.code_version, conn=conn))

    async def claim_orphaned(
        self,
        deployment_ref: str,
        worker_id: str,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int | None = None,
        claim_limit: int | None = None,
        grace_seconds: float = 10.0,
        conn: Executor | None = None,
    ) -> list[UUID]:
        """Take over running runs whose lease expired (``zeroth.claim_orphaned``)."""
        result = await self.claim_orphaned_result(
            deployment_ref, worker_id, tenant_id=tenant_id, workspace_id=workspace_id,
            max_concurrency=max_concurrency, claim_limit=claim_limit,
            grace_seconds=grace_seconds, conn=conn)
        return list(result.run_ids)

    async def claim_orphaned_result(
        self,
        deployment_ref: str,
        worker_id: str,
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        max_concurrency: int | None = None,
        claim_limit: int | None = None,
        grace_seconds: float = 10.0,
        conn: Executor | None = None,
    ) -> OrphanClaimResult:
        """Claim orphans and tell saturation (an orphan waits for a slot) from a definitive
        empty scan (``zeroth.claim_orphaned``). The same call ends the orphans nobody may
        resume: out of attempts (dead-lettered), or not resumable and expired more than
        ``grace_seconds`` ago (failed); those are not returned."""
        rows = await self._fetch(
            _calls.CLAIM_ORPHANED, deployment_ref, worker_id, tenant_id, workspace_id,
            max_concurrency, claim_limit, self.lease_duration_seconds, grace_seconds,
            self.code_version, conn=conn)
        runs = tuple(_claimed(row) for row in rows if row["run_id"] is not None)
        first = rows[0]
        return OrphanClaimResult(
            run_ids=tuple(run.run_id for run in runs),
            concurrency_saturated=first["concurrency_saturated"],
            generations={run.run_id: run.lease_generation for run in runs},
            active_count=first["active_count"],
            max_concurrency=first["concurrency_limit"],
            runs=runs,
            retry_at=first["retry_at"],
            retry_after=first["retry_after"],
        )

    # -- lease upkeep ----------------------------------------------------------------------

    async def renew_lease(
        self,
        run_id: RunId,
        worker_id: str,
        *,
        generation: int | None = None,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """Extend a live lease (``zeroth.renew_lease``), never past the attempt's or run's
        deadline; False when taken over or expired, :class:`DeadlinePassedError` (ZP013) when
        refused because the holder's deadline passed."""
        return bool(await self._fetchval(
            _calls.RENEW_LEASE, _uuid(run_id), worker_id, generation, tenant_id, workspace_id,
            self.lease_duration_seconds, conn=conn))

    async def renew_leases(
        self,
        worker_id: str,
        leases: Mapping[UUID, int] | Sequence[tuple[RunId, int]],
        *,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[LeaseRenewal]:
        """Renew all of one worker's leases in one call (``zeroth.renew_leases``), given as
        run id → generation; one result per lease, in order."""
        try:
            pairs = [(run_id, generation) for run_id, generation in (
                leases.items() if isinstance(leases, Mapping) else leases)]
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError("leases must map run ids to generations") from exc
        rows = await self._fetch(
            _calls.RENEW_LEASES, worker_id, [_uuid(run_id) for run_id, _ in pairs],
            [generation for _, generation in pairs], tenant_id, workspace_id,
            self.lease_duration_seconds, conn=conn)
        return [LeaseRenewal(run_id=row["run_id"], renewed=row["renewed"],
                             lease_expires_at=row["lease_expires_at"],
                             cancel_requested=row["cancel_requested"],
                             sqlstate=row["sqlstate"]) for row in rows]

    async def current_generation(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> int | None:
        """The run's lease generation, or None if unknown (``zeroth.current_generation``)."""
        value = await self._fetchval(_calls.CURRENT_GENERATION, _uuid(run_id), tenant_id,
                                     workspace_id, conn=conn)
        return None if value is None else int(value)

    async def current_holder(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> str | None:
        """The worker id named in the run's lease, or None (``zeroth.current_holder``)."""
        value = await self._fetchval(_calls.CURRENT_HOLDER, _uuid(run_id), tenant_id,
                                     workspace_id, conn=conn)
        return None if value is None else str(value)

    async def get_recovery_checkpoint_id(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> UUID | None:
        """The checkpoint the lease holder resumes from (``zeroth.get_recovery_checkpoint_id``)."""
        value: UUID | None = await self._fetchval(
            _calls.GET_RECOVERY_CHECKPOINT_ID, _uuid(run_id), tenant_id, workspace_id, conn=conn)
        return value

    async def count_pending(
        self, deployment_ref: str, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> int:
        """Pending runs of a deployment in a scope (``zeroth.count_pending``)."""
        return int(await self._fetchval(_calls.COUNT_PENDING, deployment_ref, tenant_id,
                                        workspace_id, conn=conn))

    async def count_pending_scopes(
        self, deployment_refs: Sequence[str], *,
        scopes: Sequence[tuple[str | None, str | None]] | None = None,
        conn: Executor | None = None,
    ) -> dict[str, int]:
        """Pending runs per deployment, summed over the listed ``scopes`` ((tenant_id,
        workspace_id) pairs) or, with None, over every scope of ``deployment_refs``
        (``zeroth.count_pending_scopes``): one entry per deployment, 0 when it has none."""
        deployments, tenants, workspaces = _scope_arguments(deployment_refs, scopes)
        rows = await self._fetch(_calls.COUNT_PENDING_SCOPES, deployments, tenants, workspaces,
                                 conn=conn)
        return {row["deployment_ref"]: int(row["pending"]) for row in rows}

    # -- notification keys -----------------------------------------------------------------
    # NOTIFY payloads are opaque: each channel carries a key only the database can compute (from
    # a secret no client role can read). These say which key means "for you".

    async def wakeup_key(
        self, deployment_ref: str, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> str:
        """The payload of ``zeroth_wakeup`` for this scope (``zeroth.wakeup_key``)."""
        return str(await self._fetchval(_calls.WAKEUP_KEY, deployment_ref, tenant_id,
                                        workspace_id, conn=conn))

    async def control_key(self, worker_id: str, *, conn: Executor | None = None) -> str:
        """The payload of ``zeroth_control`` for this worker id (``zeroth.control_key``): a
        cancel was requested for one of its runs. Confirm with :meth:`renew_leases`."""
        return str(await self._fetchval(_calls.CONTROL_KEY, worker_id, conn=conn))

    async def announce_idle(
        self, deployment_ref: str, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> tuple[int, ...]:
        """This session waits for work of the scope: take the scope's wakeup-gate stripes it
        does not hold (``zeroth.announce_idle``), so writers notify ``zeroth_wakeup``; returns
        every stripe the session holds. Session advisory locks: pass the listener's own
        connection (``conn``), never a pooled one, write nothing on it, and claim once more
        after a call that returned a new stripe."""
        # Through the pool (against the advice above) the connection is reset on release, so
        # its locks do not outlive the call on an idle pooled connection.
        return tuple(await self._fetchval(_calls.ANNOUNCE_IDLE, deployment_ref, tenant_id,
                                          workspace_id, conn=conn, leaves_session_state=True))

    async def announce_busy(
        self, deployment_ref: str, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> int:
        """Let go of every wakeup-gate stripe of the scope this session holds
        (``zeroth.announce_busy``): writers of the scope stop notifying. Returns how many."""
        return int(await self._fetchval(_calls.ANNOUNCE_BUSY, deployment_ref, tenant_id,
                                        workspace_id, conn=conn))

    async def deployment_wakeup_key(self, deployment_ref: str, *,
                                    conn: Executor | None = None) -> str:
        """The payload of ``zeroth_wakeup`` for work in any scope of the deployment while a
        fleet worker waits on its gate (``zeroth.deployment_wakeup_key``)."""
        return str(await self._fetchval(_calls.DEPLOYMENT_WAKEUP_KEY, deployment_ref, conn=conn))

    async def announce_idle_deployment(self, deployment_ref: str, *,
                                       conn: Executor | None = None) -> tuple[int, ...]:
        """:meth:`announce_idle` on the gate of the whole deployment
        (``zeroth.announce_idle_deployment``): writers of any of its scopes notify."""
        return tuple(await self._fetchval(_calls.ANNOUNCE_IDLE_DEPLOYMENT, deployment_ref,
                                          conn=conn, leaves_session_state=True))

    async def announce_busy_deployment(self, deployment_ref: str, *,
                                       conn: Executor | None = None) -> int:
        """:meth:`announce_busy` on the gate of the whole deployment
        (``zeroth.announce_busy_deployment``)."""
        return int(await self._fetchval(_calls.ANNOUNCE_BUSY_DEPLOYMENT, deployment_ref,
                                        conn=conn))

    async def run_finished_key(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> str:
        """The payload of ``zeroth_run_finished`` when this run ends
        (``zeroth.run_finished_key``)."""
        return str(await self._fetchval(_calls.RUN_FINISHED_KEY, _uuid(run_id), tenant_id,
                                        workspace_id, conn=conn))

    # -- fenced writes ---------------------------------------------------------------------

    async def commit_fenced(
        self,
        run_id: RunId,
        worker_id: str,
        *,
        generation: int,
        tenant_id: str | None = None,
        workspace_id: str | None = None,
        conn: Executor | None = None,
        **columns: Any,
    ) -> bool:
        """Write allowlisted columns (output, error, metadata, progress) only while holding
        the lease generation (``zeroth.commit_fenced``); False when fenced out."""
        return bool(await self._fetchval(
            _calls.COMMIT_FENCED, _uuid(run_id), worker_id, generation, _json(columns),
            tenant_id, workspace_id, conn=conn))

    async def start_run(
        self, run_id: RunId, worker_id: str, *, generation: int, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """pending → running for the lease holder (``zeroth.start_run``); a run's first start
        records this client's ``code_version`` (as a claim does)."""
        return bool(await self._fetchval(_calls.START_RUN, _uuid(run_id), worker_id, generation,
                                         tenant_id, workspace_id, self.code_version, conn=conn))

    async def save_checkpoint(
        self, run_id: RunId, worker_id: str, data: Any, *, generation: int,
        checkpoint_id: RunId | None = None, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> UUID | None:
        """Save a checkpoint, fenced (``zeroth.save_checkpoint``); None when fenced out."""
        value: UUID | None = await self._fetchval(
            _calls.SAVE_CHECKPOINT, _uuid(run_id), worker_id, generation, _json(data),
            _uuid(checkpoint_id), tenant_id, workspace_id, conn=conn)
        return value

    async def complete_run(
        self, run_id: RunId, worker_id: str, *, generation: int, output: Any = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """running → completed, fenced (``zeroth.complete_run``)."""
        return bool(await self._fetchval(
            _calls.COMPLETE_RUN, _uuid(run_id), worker_id, generation, _dumps(output), tenant_id,
            workspace_id, conn=conn))

    async def complete_runs(
        self, worker_id: str, completions: Sequence[tuple[RunId, int] | tuple[RunId, int, Any]],
        *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[RunCompletion]:
        """Complete many of one worker's runs in one call (``zeroth.complete_runs``), each
        fenced on its own. ``completions`` are (run_id, generation) or (run_id, generation,
        output) — output as in :meth:`complete_run`. One result per run, in order."""
        run_ids, generations, outputs = _completion_arrays(completions)
        rows = await self._fetch(
            _calls.COMPLETE_RUNS, worker_id, run_ids, generations, outputs, tenant_id,
            workspace_id, conn=conn)
        return [RunCompletion(run_id=row["run_id"], completed=row["completed"]) for row in rows]

    async def complete_and_claim(
        self, deployment_ref: str, worker_id: str,
        completions: Sequence[tuple[RunId, int] | tuple[RunId, int, Any]], *,
        tenant_id: str | None = None, workspace_id: str | None = None,
        max_concurrency: int | None = None, batch_size: int = 1,
        conn: Executor | None = None,
    ) -> CompleteAndClaimResult:
        """:meth:`complete_runs`, then :meth:`claim_and_start` into the slots they freed, in one
        call and one commit (``zeroth.complete_and_claim``). Any error leaves both undone."""
        run_ids, generations, outputs = _completion_arrays(completions)
        rows = await self._fetch(
            _calls.COMPLETE_AND_CLAIM, deployment_ref, worker_id, run_ids, generations, outputs,
            tenant_id, workspace_id, max_concurrency, batch_size, self.lease_duration_seconds,
            self.code_version, conn=conn)
        return CompleteAndClaimResult(
            # The database refused a NULL run id, so every one is a UUID here.
            completions=tuple(RunCompletion(run_id=cast(UUID, run_id), completed=completed)
                              for run_id, completed in zip(run_ids, rows[0]["completed"],
                                                           strict=True)),
            claim=_claim_result(rows))

    async def settle_runs(
        self, worker_id: str, settlements: Sequence[Settlement], *,
        retry_base_seconds: float | None = None, retry_max_seconds: float | None = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[RunSettled]:
        """End a mixed batch of one worker's runs in one call (``zeroth.settle_runs``):
        completions, failures (retry with backoff, or fail), cancels and hand-backs, each fenced
        on its own. One result per run, in order; a run refused (fenced out, or no such edge
        from its status) has outcome None and the SQLSTATE that says why. A retry's backoff:
        ``retry_base_seconds`` / ``retry_max_seconds`` when both are given, else each run's
        deployment's registered policy (``zeroth.deployments``), else 1 / 300 s."""
        if isinstance(settlements, str) or not isinstance(settlements, Sequence):
            raise InvalidArgumentError("settlements must be a list of Settlement values")
        items = list(settlements)
        if not all(isinstance(item, Settlement) for item in items):
            raise InvalidArgumentError("settlements must be Settlement values")
        try:
            kinds = [SettleKind(item.kind).value for item in items]
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from exc
        outputs = [_dumps(item.output) for item in items]
        errors = [_dumps(item.error) for item in items]
        rows = await self._fetch(
            _calls.SETTLE_RUNS, worker_id, [_uuid(item.run_id) for item in items],
            [item.generation for item in items], kinds,
            outputs if any(o is not None for o in outputs) else None,
            errors if any(e is not None for e in errors) else None,
            retry_base_seconds, retry_max_seconds, tenant_id, workspace_id, conn=conn)
        return [RunSettled(
            run_id=row["run_id"],
            outcome=None if row["outcome"] is None else SettleOutcome(row["outcome"]),
            sqlstate=row["sqlstate"]) for row in rows]

    async def fail_run(
        self, run_id: RunId, worker_id: str, *, generation: int, error: Any = None,
        retryable: bool = True, retry_base_seconds: float | None = None,
        retry_max_seconds: float | None = None,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> FailOutcome | None:
        """Fail an attempt, fenced (``zeroth.fail_run``): retry with backoff, fail, or
        dead-letter; None when fenced out. A retry policy left None is the deployment's
        registered one (read at this failure), else 1 / 300 s."""
        value = await self._fetchval(
            _calls.FAIL_RUN, _uuid(run_id), worker_id, generation, _dumps(error), retryable,
            retry_base_seconds, retry_max_seconds, tenant_id, workspace_id, conn=conn)
        return None if value is None else FailOutcome(value)

    async def cancel_run(
        self, run_id: RunId, worker_id: str, *, generation: int, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """The lease holder ends its run as cancelled (``zeroth.cancel_run``)."""
        return bool(await self._fetchval(_calls.CANCEL_RUN, _uuid(run_id), worker_id, generation,
                                         tenant_id, workspace_id, conn=conn))

    async def pause_run(
        self, run_id: RunId, worker_id: str, *, generation: int, reason: str,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """running → waiting, fenced, releasing the lease and giving the attempt back
        (``zeroth.pause_run``)."""
        return bool(await self._fetchval(_calls.PAUSE_RUN, _uuid(run_id), worker_id, generation,
                                         reason, tenant_id, workspace_id, conn=conn))

    async def sleep_run(
        self, run_id: RunId, worker_id: str, *, generation: int,
        resume_at: datetime | None = None, delay_seconds: float | None = None,
        checkpoint: Any = None, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> SleepResult | None:
        """Durable sleep, fenced (``zeroth.sleep_run``): running → pending until ``resume_at``
        (a past instant: now) or the database clock + ``delay_seconds`` (exactly one), the
        attempt given back, the lease and slot released; ``checkpoint`` (any JSON value but
        None) is saved in the same call, the recovery checkpoint of the resumed attempt. A
        pending cancel request cancels the run instead. None when fenced out."""
        if resume_at is not None and (not isinstance(resume_at, datetime)
                                      or resume_at.utcoffset() is None):
            raise InvalidArgumentError("resume_at must be a timezone-aware datetime")
        row = (await self._fetch(
            _calls.SLEEP_RUN, _uuid(run_id), worker_id, generation, resume_at, delay_seconds,
            _dumps(checkpoint), tenant_id, workspace_id, conn=conn))[0]
        if row["outcome"] is None:
            return None
        return SleepResult(outcome=SleepOutcome(row["outcome"]), run_after=row["run_after"],
                           checkpoint_id=row["checkpoint_id"])

    # -- run event stream (issue 34, item 1) ------------------------------------------------

    async def append_run_event(
        self, run_id: RunId, worker_id: str, name: str, data: Any = None, *, generation: int,
        tenant_id: str | None = None, workspace_id: str | None = None, notify: bool = True,
        conn: Executor | None = None,
    ) -> int | None:
        """Append an event to the run's stream as its live holder (``zeroth.append_run_event``):
        its id (1, 2, 3… per run); None when fenced out. ``data`` is JSON (None: JSON null) of at
        most 64 KiB, refused before it is encoded whole (InvalidArgumentError). A run holds at
        most its deployment's ``max_run_events`` events (10,000 unless a DBA set it): past it
        :class:`~zeroth_pg.errors.RunEventLimitError` (ZP014), nothing stored."""
        text = encode_bounded(data, MAX_RUN_EVENT_DATA, "event data")
        value = await self._fetchval(_calls.APPEND_RUN_EVENT, _uuid(run_id), worker_id,
                                     generation, name, text, tenant_id, workspace_id, notify,
                                     conn=conn)
        return None if value is None else int(value)

    async def read_run_events(
        self, run_id: RunId, *, after: int = 0, max_events: int = 100,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> list[RunEvent]:
        """The run's events after ``after``, in order, then END once it ended
        (``zeroth.read_run_events``); END ``not_found`` for a run this scope cannot see."""
        rows = await self._fetch(_calls.READ_RUN_EVENTS, _uuid(run_id), after, max_events,
                                 tenant_id, workspace_id, conn=conn)
        return [streams.run_event(r) for r in rows]

    async def run_events_key(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> str:
        """The payload of ``zeroth_run_events`` when this run's stream moves
        (``zeroth.run_events_key``)."""
        return str(await self._fetchval(_calls.RUN_EVENTS_KEY, _uuid(run_id), tenant_id,
                                        workspace_id, conn=conn))

    def stream(
        self, run_id: RunId, *, after: int = 0, tenant_id: str | None = None,
        workspace_id: str | None = None, poll_interval: float = 1.0, batch: int = 100,
        max_reconnects: int | None = None,
    ) -> AsyncIterator[RunEvent]:
        """``async for event in client.stream(run_id, after=last_id)``: the run's events after
        ``after``, each once and in order, ending after END (``zeroth.read_run_events``). One
        connection of the pool LISTENs on ``zeroth_run_events`` and reads again on the run's
        key (``zeroth.run_events_key``) and every ``poll_interval`` seconds; a connection lost
        is replaced and the read resumes from the last id yielded (``max_reconnects`` in a row
        at most; None: for ever; over a single connection: never)."""
        run = _uuid(run_id)
        if run is None:
            raise InvalidArgumentError("run_id must not be None")
        executor = self.pool

        def acquire() -> AbstractAsyncContextManager[asyncpg.Connection]:
            if isinstance(executor, asyncpg.Pool):
                return cast("AbstractAsyncContextManager[asyncpg.Connection]", executor.acquire())
            return _borrowed(executor)

        async def read(conn: asyncpg.Connection, last: int) -> list[RunEvent]:
            return await self.read_run_events(run, after=last, max_events=batch,
                                              tenant_id=tenant_id, workspace_id=workspace_id,
                                              conn=conn)

        async def key(conn: asyncpg.Connection) -> str | None:
            return await self.run_events_key(run, tenant_id=tenant_id,
                                             workspace_id=workspace_id, conn=conn)

        return streams.follow(
            acquire, read, key, after=after, poll_interval=poll_interval, batch=batch,
            max_reconnects=max_reconnects if isinstance(executor, asyncpg.Pool) else 0)

    # -- steps and events ------------------------------------------------------------------

    async def get_step(
        self, run_id: RunId, worker_id: str, step_key: str, *, generation: int,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> StepResult | None:
        """A step's recorded result, read by the live holder only (``zeroth.get_step``):
        ``recorded`` False when none is recorded yet; None when fenced out."""
        row = (await self._fetch(_calls.GET_STEP, _uuid(run_id), worker_id, generation, step_key,
                                 tenant_id, workspace_id, conn=conn))[0]
        if row["step_found"] is None:
            return None
        return StepResult(recorded=bool(row["step_found"]),
                          result=_step_value(row["result"], f"the result of step {step_key!r}"))

    async def record_step(
        self, run_id: RunId, worker_id: str, step_key: str, result: Any, *, generation: int,
        tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> StepResult | None:
        """Record a step's result once, fenced (``zeroth.record_step``): the first recorded
        result wins and is returned (``recorded`` False: an earlier one won); None when fenced
        out. ``result`` must be JSON (None is JSON null)."""
        row = (await self._fetch(_calls.RECORD_STEP, _uuid(run_id), worker_id, generation,
                                 step_key, _json(result), tenant_id, workspace_id, conn=conn))[0]
        if row["recorded"] is None:
            return None
        return StepResult(recorded=bool(row["recorded"]), result=_step_value(
            row["recorded_result"], f"the result of step {step_key!r}"))

    async def wait_for_event(
        self, run_id: RunId, worker_id: str, step_key: str, name: str, *, generation: int,
        timeout_seconds: float | None = None, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> EventWait | None:
        """Wait for the event ``name`` of the run's scope as step ``step_key``, fenced
        (``zeroth.wait_for_event``): received / timed_out (recorded), or the run left its
        worker (waiting; cancelled when a cancel request was pending). None when fenced out."""
        row = (await self._fetch(_calls.WAIT_FOR_EVENT, _uuid(run_id), worker_id, generation,
                                 step_key, name, timeout_seconds, tenant_id, workspace_id,
                                 conn=conn))[0]
        if row["outcome"] is None:
            return None
        return EventWait(outcome=EventWaitOutcome(row["outcome"]),
                         payload=_step_value(row["payload"], f"the payload of event {name!r}"),
                         timeout_at=row["timeout_at"])

    async def emit_event(
        self, name: str, payload: Any = None, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> EmitResult:
        """Emit the event ``name`` of a scope (``zeroth.emit_event``): idempotent, first write
        wins; every run of the scope waiting on it becomes pending."""
        row = (await self._fetch(_calls.EMIT_EVENT, name, _json(payload), tenant_id,
                                 workspace_id, conn=conn))[0]
        return EmitResult(emitted=bool(row["emitted"]), woken=int(row["woken"]))

    async def wake_due_waits(
        self, deployment_refs: Sequence[str] | None = None, *, batch_size: int = 100,
        conn: Executor | None = None,
    ) -> int:
        """The sweep of runs nobody holds (``zeroth.wake_due_waits``): pending and waiting runs
        past their run deadline → failed (stop_reason run_timeout), then runs waiting on an event
        past their wait's deadline → pending; returns how many it ended and woke (call again
        while it returns ``batch_size``)."""
        refs, _, _ = _scope_arguments(deployment_refs, None)
        return int(await self._fetchval(_calls.WAKE_DUE_WAITS, refs, batch_size, conn=conn))

    # -- child runs ------------------------------------------------------------------------

    async def start_child_run(
        self, run_id: RunId, worker_id: str, step_key: str, deployment_ref: str,
        payload: Mapping[str, Any] | None = None, *, generation: int,
        priority: int | None = None, max_attempts: int | None = None,
        metadata: Mapping[str, Any] | None = None,
        detached: bool = False, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> ChildStart | None:
        """Start a child run of the holder's running run as step ``step_key``, fenced
        (``zeroth.start_child_run``): pending in the parent's scope (``priority`` /
        ``max_attempts`` None: the child deployment's registered defaults, else 0 / 3); a replay
        of the step gets
        the same child (``created`` False), another deployment / payload / detached under the
        key raises ChildRunConflictError. ``detached``: not cancelled with the parent. None when
        fenced out."""
        row = (await self._fetch(
            _calls.START_CHILD_RUN, _uuid(run_id), worker_id, generation, step_key,
            deployment_ref, _object(payload, "payload"), priority, max_attempts,
            _object(tracing.inject(metadata), "metadata"), detached, tenant_id, workspace_id,
            conn=conn))[0]
        if row["child_run_id"] is None:
            return None
        return ChildStart(child_run_id=row["child_run_id"], created=bool(row["created"]))

    async def wait_for_children(
        self, run_id: RunId, worker_id: str, step_key: str, child_run_ids: Sequence[RunId], *,
        generation: int, mode: str = "all", tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> ChildWait | None:
        """Wait for all (``mode="all"``) or any (``"any"``) of the holder's children as step
        ``step_key``, fenced (``zeroth.wait_for_children``): ready with their outcomes
        (recorded), or the run left its worker (waiting; cancelled when a cancel request was
        pending). None when fenced out."""
        if isinstance(child_run_ids, str | bytes) or not isinstance(child_run_ids, Sequence):
            raise InvalidArgumentError("child_run_ids must be a sequence of run ids")
        ids = [_uuid(child) for child in child_run_ids]
        row = (await self._fetch(_calls.WAIT_FOR_CHILDREN, _uuid(run_id), worker_id, generation,
                                 step_key, ids, mode, tenant_id, workspace_id, conn=conn))[0]
        if row["outcome"] is None:
            return None
        children = _loads(row["children"])
        return ChildWait(outcome=ChildWaitOutcome(row["outcome"]),
                         children=None if children is None else tuple(
                             _child_outcome(child) for child in children))

    # -- giving a lease back ---------------------------------------------------------------

    async def release_lease(
        self, run_id: RunId, worker_id: str, *, generation: int, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """Give up exactly this lease generation (``zeroth.release_lease``)."""
        return bool(await self._fetchval(_calls.RELEASE_LEASE, _uuid(run_id), worker_id,
                                         generation, tenant_id, workspace_id, conn=conn))

    async def hand_back_to_pending(
        self, run_id: RunId, worker_id: str, *, generation: int, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """running → pending for exactly this generation (``zeroth.hand_back_to_pending``).

        The first ``max_attempts`` hand-backs of a run give its attempt back; later ones keep it
        counted, and one that finds no attempt left dead-letters the run instead (still True:
        the lease was given back)."""
        return bool(await self._fetchval(_calls.HAND_BACK_TO_PENDING, _uuid(run_id), worker_id,
                                         generation, tenant_id, workspace_id, conn=conn))

    async def expire_recovery_lease(
        self, run_id: RunId, worker_id: str, *, generation: int, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """Make owned running work reclaimable now, keeping its checkpoint
        (``zeroth.expire_recovery_lease``)."""
        return bool(await self._fetchval(_calls.EXPIRE_RECOVERY_LEASE, _uuid(run_id), worker_id,
                                         generation, tenant_id, workspace_id, conn=conn))

    # -- admin -----------------------------------------------------------------------------

    async def clear_lease(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """Admin, unfenced: drop the lease whoever holds it (``zeroth.clear_lease``); a running
        run keeps its holder with an expired lease so it stays recoverable."""
        return bool(await self._fetchval(_calls.CLEAR_LEASE, _uuid(run_id), tenant_id,
                                         workspace_id, conn=conn))

    async def request_cancel(
        self, run_id: RunId, *, action: str = "cancel", tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> CancelOutcome:
        """Cancel now, or ask the live owner to (``zeroth.request_cancel``)."""
        value = await self._fetchval(_calls.REQUEST_CANCEL, _uuid(run_id), tenant_id, workspace_id,
                                     action, conn=conn)
        return CancelOutcome(value)

    async def resume_run(
        self, run_id: RunId, *, input: Any = None, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> bool:
        """waiting → pending (``zeroth.resume_run``)."""
        return bool(await self._fetchval(_calls.RESUME_RUN, _uuid(run_id), tenant_id, workspace_id,
                                         _dumps(input), conn=conn))

    async def redrive_run(
        self, run_id: RunId, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """failed/cancelled → pending with attempts reset (``zeroth.redrive_run``)."""
        return bool(await self._fetchval(_calls.REDRIVE_RUN, _uuid(run_id), tenant_id,
                                         workspace_id, conn=conn))

    # -- maintenance -----------------------------------------------------------------------

    async def set_rate_limit(
        self, name: str, max_starts: int, period_seconds: float, *, note: str | None = None,
        conn: Executor | None = None,
    ) -> bool:
        """Create or change rate limit ``name``: at most ``max_starts`` starts in any rolling
        window of ``period_seconds``, for every scope whose ``zeroth.scope_limits.rate_limit``
        names it (``zeroth.set_rate_limit``; admin: granted to nobody, run as a member of
        zeroth_owner). True when the key was created. Bad values: InvalidArgumentError."""
        return bool(await self._fetchval(_calls.SET_RATE_LIMIT, name, max_starts,
                                         period_seconds, note, conn=conn))

    async def set_scope_limits(
        self, deployment_ref: str, *, tenant_id: str | None = None,
        workspace_id: str | None = None, paused: bool | None = None,
        max_concurrency: int | None = None, weight: int | None = None,
        rate_limit: str | None = None, note: str | None = None, conn: Executor | None = None,
    ) -> ScopeLimits:
        """Create or change the ``zeroth.scope_limits`` row of one scope
        (``zeroth.set_scope_limits``; admin: granted to nobody, run as a member of zeroth_owner).
        None keeps a value (a new row: the defaults); ``max_concurrency=0`` removes the limit,
        ``rate_limit=""`` the key. The next claim of every worker applies it. Bad values or an
        unknown key: InvalidArgumentError. Returns the row."""
        row = (await self._fetch(_calls.SET_SCOPE_LIMITS, deployment_ref, tenant_id,
                                 workspace_id, paused, max_concurrency, weight, rate_limit, note,
                                 conn=conn))[0]
        return ScopeLimits(**dict(row))

    async def prune_runs(
        self, older_than: timedelta, *, batch_size: int = 1000, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> int:
        """Delete one batch of finished runs that finished before now - ``older_than``, of the
        events older than that which no run waits on and, with ``tenant_id=None`` (every tenant),
        of the registry's deployment changes older than that, each deployment's latest kept
        (``zeroth.prune_runs``); returns how many rows, all together. Call until it returns 0."""
        return int(await self._fetchval(_calls.PRUNE_RUNS, older_than, batch_size, tenant_id,
                                        workspace_id, conn=conn))

    # -- the registry of deployments -------------------------------------------------------
    # An application's declaration (register_deployment, at start: zeroth_worker) and a DBA's
    # (set_deployment_defaults: admin, run as zeroth_owner); every change is audited.

    async def register_deployment(
        self, deployment_ref: str, *, max_attempts: int = 3, priority: int = 0,
        retry_base_seconds: float | None = None, retry_max_seconds: float | None = None,
        lease_seconds: float | None = None, attempt_timeout_seconds: float | None = None,
        run_timeout_seconds: float | None = None, conn: Executor | None = None,
    ) -> DeploymentRegistration:
        """Declare a deployment's defaults, what enqueue_run gives a run that names none, the
        retry policy fail_run applies and the lease a claim gives when their callers pass none,
        and the bound on an attempt's wall time and on a run's total time the claims fix as
        deadlines (None: not set) (``zeroth.register_deployment``): created, updated (the last
        registration wins; the change is in ``zeroth.deployment_changes``), unchanged, or kept
        as a DBA set them."""
        rows = await self._fetch(_calls.REGISTER_DEPLOYMENT, deployment_ref, max_attempts,
                                 priority, retry_base_seconds, retry_max_seconds, lease_seconds,
                                 attempt_timeout_seconds, run_timeout_seconds, conn=conn)
        return _registration(rows[0])

    async def set_deployment_defaults(
        self, deployment_ref: str, *, max_attempts: int | None = None,
        priority: int | None = None, managed_by: str = "sql",
        retry_base_seconds: float | None = None, retry_max_seconds: float | None = None,
        lease_seconds: float | None = None, unset: Sequence[str] | None = (),
        attempt_timeout_seconds: float | None = None, run_timeout_seconds: float | None = None,
        conn: Executor | None = None,
    ) -> DeploymentRegistration:
        """Set a deployment's defaults as a DBA (``zeroth.set_deployment_defaults``, admin:
        granted to nobody, run as a member of zeroth_owner); None keeps a value, ``unset``
        names the policy values (``retry_base_seconds``, ``retry_max_seconds``,
        ``lease_seconds``, ``attempt_timeout_seconds``, ``run_timeout_seconds``) to set back
        to not set. ``managed_by="sql"`` keeps them against
        applications' registrations, ``"app"`` hands them back. Runs enqueued before keep
        their attempts and priority; a retry policy applies from the next failure, a lease
        from the next claim."""
        if unset is not None and (isinstance(unset, str) or not isinstance(unset, Sequence)):
            raise InvalidArgumentError("unset must be a list of value names")
        rows = await self._fetch(_calls.SET_DEPLOYMENT_DEFAULTS, deployment_ref, max_attempts,
                                 priority, managed_by, retry_base_seconds, retry_max_seconds,
                                 lease_seconds, list(unset or ()), attempt_timeout_seconds,
                                 run_timeout_seconds, conn=conn)
        return _registration(rows[0])

    async def list_deployments(
        self, deployment_ref: str | None = None, *, conn: Executor | None = None,
    ) -> list[DeploymentDefaults]:
        """The registered deployments and their defaults by name, or the one named
        (``zeroth.list_deployments``)."""
        rows = await self._fetch(_calls.LIST_DEPLOYMENTS, deployment_ref, conn=conn)
        return [DeploymentDefaults(
            deployment_ref=row["deployment_ref"], max_attempts=row["max_attempts"],
            priority=row["priority"], managed_by=row["managed_by"], version=int(row["version"]),
            created_at=row["created_at"], updated_at=row["updated_at"],
            updated_by=row["updated_by"], retry_base_seconds=row["retry_base_seconds"],
            retry_max_seconds=row["retry_max_seconds"],
            lease_seconds=row["lease_seconds"],
            attempt_timeout_seconds=row["attempt_timeout_seconds"],
            run_timeout_seconds=row["run_timeout_seconds"]) for row in rows]

    # -- code versions (issue 34, item 3) --------------------------------------------------

    async def set_version_policy(
        self, deployment_ref: str, version_policy: str, *,
        compatible_versions: Sequence[str] | None = None, conn: Executor | None = None,
    ) -> VersionPolicy:
        """Which code versions may resume a started run of a registered deployment
        (``zeroth.set_version_policy``, admin: granted to nobody, run as a member of
        zeroth_owner): ``any`` (the default: every version), ``same`` (only the version that
        started it) or ``compatible`` (two versions both in ``compatible_versions``, or the
        same). Audited in ``zeroth.code_version_changes``."""
        if compatible_versions is not None and (isinstance(compatible_versions, str)
                                                or not isinstance(compatible_versions, Sequence)):
            raise InvalidArgumentError("compatible_versions must be a list of code versions")
        rows = await self._fetch(
            _calls.SET_VERSION_POLICY, deployment_ref, version_policy,
            None if compatible_versions is None else list(compatible_versions), conn=conn)
        versions = rows[0]["versions"]
        return VersionPolicy(outcome=rows[0]["outcome"], version_policy=rows[0]["policy"],
                             compatible_versions=None if versions is None else tuple(versions))

    async def retire_code_version(
        self, deployment_ref: str, code_version: str, action: str, *,
        to_version: str | None = None, message: str | None = None,
        conn: Executor | None = None,
    ) -> RetiredVersion:
        """The way out for the active runs pinned to a code version no worker serves any more
        (``zeroth.retire_code_version``, admin): ``action="move"`` makes them record
        ``to_version`` (None: unversioned, resumable by every version); ``"fail"`` ends the
        ones nobody holds (failed and dead-lettered, stop_reason ``code_version_retired``).
        Audited in ``zeroth.code_version_changes``."""
        rows = await self._fetch(_calls.RETIRE_CODE_VERSION, deployment_ref, code_version,
                                 action, to_version, message, conn=conn)
        return RetiredVersion(runs_changed=rows[0]["runs_changed"],
                              runs_left=rows[0]["runs_left"])

    async def pinned_runs(
        self, deployment_ref: str | None = None, *, tenant_id: str | None = None,
        workspace_id: str | None = None, conn: Executor | None = None,
    ) -> list[PinnedRuns]:
        """The active started runs pinned to a code version (``zeroth.pinned_runs``), per scope,
        deployment and version; only deployments whose version policy is not ``any``. None
        filters nothing."""
        rows = await self._fetch(_calls.PINNED_RUNS, deployment_ref, tenant_id, workspace_id,
                                 conn=conn)
        return [PinnedRuns(**dict(row)) for row in rows]

    # -- schedules -------------------------------------------------------------------------
    # A DBA's (create/alter/pause/resume/delete: admin functions, run as zeroth_owner) and an
    # application's (register_schedule at worker start, fire_due_schedules in the worker).

    async def create_schedule(
        self, name: str, deployment_ref: str, *, cron: str | None = None,
        interval_seconds: int | None = None, tenant_id: str | None = None,
        workspace_id: str | None = None, time_zone: str = "UTC",
        payload: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
        priority: int = 0, max_attempts: int = 3, missed_fire_policy: str = "skip",
        catch_up_limit: int | None = None, misfire_grace_seconds: int = 60,
        start_at: datetime | None = None, paused: bool = False, conn: Executor | None = None,
    ) -> Schedule:
        """A new schedule of a scope (``zeroth.create_schedule``, admin): exactly one of ``cron``
        (5 fields, on the wall clock of ``time_zone``) and ``interval_seconds``."""
        rows = await self._fetch(
            _calls.CREATE_SCHEDULE, name, deployment_ref, cron, interval_seconds, tenant_id,
            workspace_id, time_zone, _object(payload, "payload"), _object(metadata, "metadata"),
            priority, max_attempts, missed_fire_policy, catch_up_limit, misfire_grace_seconds,
            start_at, paused, conn=conn)
        return _schedule(rows[0])

    async def alter_schedule(
        self, name: str, *, tenant_id: str | None = None, workspace_id: str | None = None,
        deployment_ref: str | None = None, cron: str | None = None,
        interval_seconds: int | None = None, time_zone: str | None = None,
        payload: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
        priority: int | None = None, max_attempts: int | None = None,
        missed_fire_policy: str | None = None, catch_up_limit: int | None = None,
        misfire_grace_seconds: int | None = None, start_at: datetime | None = None,
        conn: Executor | None = None,
    ) -> Schedule:
        """Change a schedule (``zeroth.alter_schedule``, admin); None keeps a value. Raises
        :class:`~zeroth_pg.errors.ScheduleNotFoundError` (ZP009)."""
        rows = await self._fetch(
            _calls.ALTER_SCHEDULE, name, tenant_id, workspace_id, deployment_ref, cron,
            interval_seconds, time_zone, None if payload is None else _object(payload, "payload"),
            None if metadata is None else _object(metadata, "metadata"), priority, max_attempts,
            missed_fire_policy, catch_up_limit, misfire_grace_seconds, start_at, conn=conn)
        return _schedule(rows[0])

    async def pause_schedule(
        self, name: str, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> Schedule:
        """Stop a schedule firing (``zeroth.pause_schedule``, admin; ZP009 when missing)."""
        rows = await self._fetch(_calls.PAUSE_SCHEDULE, name, tenant_id, workspace_id, conn=conn)
        return _schedule(rows[0])

    async def resume_schedule(
        self, name: str, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> Schedule:
        """Fire again from the next fire time after now (``zeroth.resume_schedule``, admin)."""
        rows = await self._fetch(_calls.RESUME_SCHEDULE, name, tenant_id, workspace_id, conn=conn)
        return _schedule(rows[0])

    async def delete_schedule(
        self, name: str, *, tenant_id: str | None = None, workspace_id: str | None = None,
        conn: Executor | None = None,
    ) -> UUID:
        """Delete a schedule and its fire records (``zeroth.delete_schedule``, admin); returns its
        id. Its runs stay."""
        value = await self._fetchval(_calls.DELETE_SCHEDULE, name, tenant_id, workspace_id,
                                     conn=conn)
        return UUID(str(value))

    async def list_schedules(
        self, *, tenant_id: str | None = None, workspace_id: str | None = None,
        deployment_refs: Sequence[str] | None = None, conn: Executor | None = None,
    ) -> list[Schedule]:
        """The schedules of one scope by name (``zeroth.list_schedules``)."""
        deployments, _, _ = _scope_arguments(deployment_refs, None)
        rows = await self._fetch(_calls.LIST_SCHEDULES, tenant_id, workspace_id, deployments,
                                 conn=conn)
        return [_schedule(row) for row in rows]

    async def register_schedule(
        self, name: str, deployment_ref: str, *, cron: str | None = None,
        interval_seconds: int | None = None, tenant_id: str | None = None,
        workspace_id: str | None = None, time_zone: str = "UTC",
        payload: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
        priority: int = 0, max_attempts: int = 3, missed_fire_policy: str = "skip",
        catch_up_limit: int | None = None, misfire_grace_seconds: int = 60,
        conn: Executor | None = None,
    ) -> ScheduleRegistration:
        """Declare an application's schedule (``zeroth.register_schedule``): created, updated if
        an application made it, or kept as a DBA left it (never unpaused)."""
        rows = await self._fetch(
            _calls.REGISTER_SCHEDULE, name, deployment_ref, cron, interval_seconds, tenant_id,
            workspace_id, time_zone, _object(payload, "payload"), _object(metadata, "metadata"),
            priority, max_attempts, missed_fire_policy, catch_up_limit, misfire_grace_seconds,
            conn=conn)
        row = rows[0]
        return ScheduleRegistration(schedule_id=row["schedule_id"], outcome=row["outcome"],
                                    next_fire_at=row["next_fire_at"], paused=row["paused"])

    async def fire_schedule_now(
        self, name: str, *, tenant_id: str | None = None, workspace_id: str | None = None,
        idempotency_key: str | None = None, conn: Executor | None = None,
    ) -> ScheduleFire:
        """One run of the schedule now, beside its fire times (``zeroth.fire_schedule_now``,
        admin): its cadence (next and last fire time, fire count, paused) is left as it was.
        ``idempotency_key``: this request's key (at most 200 characters); a repeat with the same
        key returns the first call's run (``created`` False) instead of firing again. Raises
        :class:`~zeroth_pg.errors.ScheduleNotFoundError` (ZP009),
        :class:`~zeroth_pg.errors.InvalidArgumentError` (ZP008: a bad key)."""
        row = (await self._fetch(_calls.FIRE_SCHEDULE_NOW, name, tenant_id, workspace_id,
                                 idempotency_key, conn=conn))[0]
        return ScheduleFire(schedule_id=row["schedule_id"], tenant_id=row["tenant_id"],
                            workspace_id=row["workspace_id"], name=row["name"],
                            deployment_ref=row["deployment_ref"], fire_at=row["fire_at"],
                            run_id=row["run_id"], created=row["created"],
                            skipped=int(row["skipped"]))

    async def fire_due_schedules(
        self, deployment_refs: Sequence[str], *,
        scopes: Sequence[tuple[str | None, str | None]] | None = None,
        max_schedules: int = 100, max_fires: int = 1000, conn: Executor | None = None,
    ) -> ScheduleFiring:
        """Turn due fire times of these deployments' schedules into runs, exactly once
        (``zeroth.fire_due_schedules``): the listed ``scopes`` or, with None, every scope; at
        most ``max_fires`` runs per call (the rest stay due for the next call)."""
        deployments, tenants, workspaces = _scope_arguments(deployment_refs, scopes)
        rows = await self._fetch(_calls.FIRE_DUE_SCHEDULES, deployments, tenants, workspaces,
                                 max_schedules, max_fires, conn=conn)
        fires = tuple(
            ScheduleFire(schedule_id=row["schedule_id"], tenant_id=row["tenant_id"],
                         workspace_id=row["workspace_id"], name=row["name"],
                         deployment_ref=row["deployment_ref"], fire_at=row["fire_at"],
                         run_id=row["run_id"], created=row["created"], skipped=int(row["skipped"]))
            for row in rows if row["schedule_id"] is not None)
        return ScheduleFiring(fires=fires, next_due_at=rows[0]["next_due_at"] if rows else None)


@asynccontextmanager
async def _borrowed(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """A connection the caller owns, lent to a stream (not closed after)."""
    yield conn


def _registration(row: asyncpg.Record) -> DeploymentRegistration:
    previous = row["previous"]
    return DeploymentRegistration(
        outcome=row["outcome"], deployment_ref=row["deployment_ref"],
        max_attempts=row["max_attempts"], priority=row["priority"],
        managed_by=row["managed_by"], version=int(row["version"]),
        previous=None if previous is None else _loads(previous),
        retry_base_seconds=row["retry_base_seconds"], retry_max_seconds=row["retry_max_seconds"],
        lease_seconds=row["lease_seconds"], attempt_timeout_seconds=row["attempt_timeout_seconds"],
        run_timeout_seconds=row["run_timeout_seconds"])


def _schedule(row: asyncpg.Record) -> Schedule:
    return Schedule(
        schedule_id=row["schedule_id"], tenant_id=row["tenant_id"],
        workspace_id=row["workspace_id"], name=row["name"], deployment_ref=row["deployment_ref"],
        cron=row["cron"], interval_seconds=row["interval_seconds"], time_zone=row["time_zone"],
        anchor_at=row["anchor_at"], payload=_loads(row["payload"]),
        metadata=_loads(row["metadata"]), priority=row["priority"],
        max_attempts=row["max_attempts"], missed_fire_policy=row["missed_fire_policy"],
        catch_up_limit=row["catch_up_limit"], misfire_grace_seconds=row["misfire_grace_seconds"],
        paused=row["paused"], managed_by=row["managed_by"], next_fire_at=row["next_fire_at"],
        last_fire_at=row["last_fire_at"], fire_count=int(row["fire_count"]),
        skipped_count=int(row["skipped_count"]), created_at=row["created_at"],
        updated_at=row["updated_at"], last_error=row["last_error"],
        last_error_at=row["last_error_at"])


def _completion_arrays(
    completions: Sequence[tuple[RunId, int] | tuple[RunId, int, Any]],
) -> tuple[list[UUID | None], list[int], list[str | None] | None]:
    """The arrays of a batch of completions: run ids, generations, and the outputs as JSON text
    (None when no completion carries one: the outputs written with commit_fenced stay)."""
    try:
        items = [(item[0], item[1], item[2] if len(item) > 2 else None) for item in completions]
    except (TypeError, IndexError) as exc:
        raise InvalidArgumentError(
            "completions must be (run_id, generation[, output]) tuples") from exc
    outputs = [_dumps(output) for _, _, output in items]
    return ([_uuid(run_id) for run_id, _, _ in items], [generation for _, generation, _ in items],
            outputs if any(o is not None for o in outputs) else None)


def _claim_result(rows: list[asyncpg.Record]) -> LeaseClaimResult:
    runs = tuple(_claimed(row) for row in rows if row["run_id"] is not None)
    first = rows[0]
    return LeaseClaimResult(
        run_id=runs[0].run_id if runs else None,
        concurrency_saturated=first["concurrency_saturated"],
        active_count=first["active_count"],
        max_concurrency=first["concurrency_limit"],
        runs=runs,
        retry_at=first["retry_at"],
        retry_after=first["retry_after"],
    )


def _scope_arguments(
    deployment_refs: Sequence[str] | None,
    scopes: Sequence[tuple[str | None, str | None]] | None,
) -> tuple[list[str] | None, list[str | None] | None, list[str | None] | None]:
    """The arrays of a multi-scope call: deployments, and tenants and workspaces (None: every
    scope). What is not a list of names (None, a string, a number) goes to the database as it
    is or is refused here, always as InvalidArgumentError, never a TypeError."""
    if isinstance(deployment_refs, str | bytes) or not (
            deployment_refs is None or isinstance(deployment_refs, Iterable)):
        raise InvalidArgumentError("deployment_refs must be a sequence of deployment names")
    deployments = None if deployment_refs is None else list(deployment_refs)
    if scopes is None:
        return deployments, None, None
    if isinstance(scopes, str | bytes) or not isinstance(scopes, Iterable):
        raise InvalidArgumentError("scopes must be a sequence of (tenant_id, workspace_id) pairs")
    pairs: list[tuple[Any, ...]] = []
    for pair in scopes:
        if isinstance(pair, str | bytes) or not isinstance(pair, Iterable):
            raise InvalidArgumentError("each scope must be a (tenant_id, workspace_id) pair")
        pairs.append(tuple(pair))
    if any(len(pair) != 2 for pair in pairs):
        raise InvalidArgumentError("each scope must be a (tenant_id, workspace_id) pair")
    return deployments, [p[0] for p in pairs], [p[1] for p in pairs]


def _scopes_result(rows: list[asyncpg.Record]) -> ScopesClaimResult:
    runs: list[ScopedRun] = []
    saturated: list[Scope] = []
    limited: dict[Scope, RateLimited] = {}
    for row in rows:
        scope = Scope(row["deployment_ref"], row["tenant_id"], row["workspace_id"])
        if row["retry_at"] is not None:
            limited.setdefault(scope, RateLimited(scope, row["retry_at"], row["retry_after"]))
        if row["run_id"] is not None:
            runs.append(ScopedRun(scope, _claimed(row)))
        elif row["retry_at"] is None:
            saturated.append(scope)
    return ScopesClaimResult(runs=tuple(runs), saturated=tuple(saturated),
                             rate_limited=tuple(limited.values()))


def _child_outcome(child: Mapping[str, Any]) -> ChildOutcome:
    """One element of wait_for_children's children array."""
    finished = child.get("finished_at")
    return ChildOutcome(
        run_id=UUID(child["run_id"]),
        status=None if child.get("status") is None else RunStatus(child["status"]),
        output=child.get("output"), error=child.get("error"),
        dead_lettered=bool(child.get("dead_lettered")),
        finished_at=None if finished is None else datetime.fromisoformat(finished))


def _json_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """One enqueue_runs item as JSON: datetimes and UUIDs become strings."""
    if not isinstance(item, Mapping):
        raise InvalidArgumentError(f"each run must be a mapping, not {type(item).__name__}")
    out: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, datetime):
            out[key] = value.isoformat()
        elif isinstance(value, UUID):
            out[key] = str(value)
        else:
            out[key] = value
    return out
