"""Where a worker's runs come from: one scope (:class:`OneScope`, today's worker of one deployment
in one tenant/workspace) or many (:class:`ManyScopes`, a fleet worker serving several
deployments in a listed set of scopes or in every scope they have).

Both answer the same questions for the claim loop, each with its SQL: claim into the free slots,
sweep for orphans, which NOTIFY payloads are meant for this worker, and which wakeup gates it
waits on. Everything after the claim (renewals, completions, fenced writes) follows the scope
each run carries, so the rest of the worker does not know which source it has.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from zeroth_pg.types import ClaimedRun, LeaseClaimResult, RetryPolicy, RunCompletion, Scope
from zeroth_pg.worker._gate import GateTarget

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["ClaimSource", "Claimed", "ManyScopes", "OneScope", "default_worker_id",
           "per_deployment", "source_for"]


def default_worker_id() -> str:
    """A worker's id when none is given: 12 random hex digits (48 bits), unique per process in
    any fleet a person can read through. The id is written into the run's row at every claim (the
    lease holder), logged whole in that claim's WAL record: a uuid4's 32 digits cost 20 bytes of
    WAL a run more for nothing (issue 30; docs/performance.md). A second worker with the same id
    (a collision, or a name given twice) is fenced by the lease generation like any other."""
    return secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class Claimed:
    """What one claim or sweep handed over, and the saturation it saw."""

    runs: tuple[tuple[Scope, ClaimedRun], ...]
    #: Some scope had work (a pending run, or a resumable orphan) but no free fleet slot.
    saturated: bool
    #: No fleet slot is left after this claim in the scope(s) it served (claim again as soon as
    #: one of this worker's runs gives its slot back).
    fleet_full: bool = False
    #: One scope only: its live leases and limit, for the utilisation gauge.
    active_count: int = 0
    limit: int | None = None
    #: A rate limit held a scope back or cut its batch short: seconds (from the claim's
    #: database time) until the first of them can start a run again. None: no rate limit hit.
    retry_after: float | None = None
    #: All the work this claim could see is held back by its rate limit until retry_after, so
    #: a NOTIFY before then cannot be for anything claimable (one scope only: a fleet's NOTIFY
    #: names a deployment, and may be for a scope that is not held back).
    all_held_back: bool = False


class ClaimSource(Protocol):
    deployments: tuple[str, ...]

    def describe(self) -> str: ...

    # ``deployments``: a subset of :attr:`deployments` to claim for this call (the others are
    # at their local limit), None for all of them.
    async def claim(self, worker_id: str, free: int, fleet_max: int | None,
                    deployments: Sequence[str] | None = None) -> Claimed: ...

    async def sweep(self, worker_id: str, claim_limit: int, fleet_max: int | None,
                    grace: float, deployments: Sequence[str] | None = None) -> Claimed: ...

    async def wakeup_keys(self) -> frozenset[str]: ...

    def gate_targets(self) -> list[GateTarget]: ...

    # Pending runs per deployment served, over the scopes served (one SQL statement).
    async def queue_depth(self) -> Mapping[str, int]: ...


class OneScope:
    """One deployment in one (tenant, workspace): claim_and_start, claim_orphaned, the scope's
    wakeup gate."""

    def __init__(self, lm: LeaseManager, deployment_ref: str, tenant_id: str | None,
                 workspace_id: str | None) -> None:
        self._lm = lm
        self.deployments: tuple[str, ...] = (deployment_ref,)
        self.scope = Scope(deployment_ref, tenant_id or "default", workspace_id)
        # The caller's spelling, passed through to every call (NULL tenant = 'default').
        self._tenant_id, self._workspace_id = tenant_id, workspace_id

    def describe(self) -> str:
        return f"deployment {self.scope.deployment_ref}"

    async def claim(self, worker_id: str, free: int, fleet_max: int | None,
                    deployments: Sequence[str] | None = None) -> Claimed:
        return self._claimed(await self._lm.claim_and_start(
            self.scope.deployment_ref, worker_id, tenant_id=self._tenant_id,
            workspace_id=self._workspace_id, max_concurrency=fleet_max, batch_size=free))

    def _claimed(self, result: LeaseClaimResult) -> Claimed:
        limit = result.max_concurrency
        return Claimed(
            runs=tuple((self.scope, run) for run in result.runs),
            saturated=result.concurrency_saturated,
            fleet_full=limit is not None and (
                result.concurrency_saturated or result.active_count + len(result.runs) >= limit),
            active_count=result.active_count, limit=limit, retry_after=result.retry_after,
            all_held_back=result.retry_after is not None)

    async def complete_and_claim(
            self, worker_id: str, completions: Sequence[tuple[UUID, int, Any]], free: int,
            fleet_max: int | None) -> tuple[tuple[RunCompletion, ...], Claimed]:
        """Complete runs of this scope and claim up to ``free`` more in the same call."""
        result = await self._lm.complete_and_claim(
            self.scope.deployment_ref, worker_id, completions, tenant_id=self._tenant_id,
            workspace_id=self._workspace_id, max_concurrency=fleet_max, batch_size=free)
        return result.completions, self._claimed(result.claim)

    async def sweep(self, worker_id: str, claim_limit: int, fleet_max: int | None,
                    grace: float, deployments: Sequence[str] | None = None) -> Claimed:
        result = await self._lm.claim_orphaned_result(
            self.scope.deployment_ref, worker_id, tenant_id=self._tenant_id,
            workspace_id=self._workspace_id, max_concurrency=fleet_max, claim_limit=claim_limit,
            grace_seconds=grace)
        return Claimed(runs=tuple((self.scope, run) for run in result.runs),
                       saturated=result.concurrency_saturated,
                       active_count=result.active_count, limit=result.max_concurrency,
                       retry_after=result.retry_after)

    async def wakeup_keys(self) -> frozenset[str]:
        return frozenset({await self._lm.wakeup_key(
            self.scope.deployment_ref, tenant_id=self._tenant_id,
            workspace_id=self._workspace_id)})

    def gate_targets(self) -> list[GateTarget]:
        return [GateTarget.scope(self._lm, self.scope.deployment_ref, self._tenant_id,
                                 self._workspace_id)]

    async def queue_depth(self) -> Mapping[str, int]:
        return {self.scope.deployment_ref: await self._lm.count_pending(
            self.scope.deployment_ref, tenant_id=self._tenant_id,
            workspace_id=self._workspace_id)}


class ManyScopes:
    """Several deployments in a listed set of (tenant, workspace) scopes, or (``scopes`` None)
    in every scope they have: claim_and_start_scopes, claim_orphaned_scopes, and the wakeup
    gate of each deployment (a NOTIFY from a scope outside the list is a wasted look)."""

    def __init__(self, lm: LeaseManager, deployments: Sequence[str],
                 scopes: Sequence[tuple[str | None, str | None]] | None) -> None:
        if isinstance(deployments, str) or not deployments:
            raise ValueError("a fleet worker needs a non-empty list of deployments")
        self._lm = lm
        self.deployments = tuple(dict.fromkeys(deployments))
        self.scopes: list[tuple[str | None, str | None]] | None = (
            None if scopes is None else [(tenant, workspace) for tenant, workspace in scopes])
        if self.scopes is not None and not self.scopes:
            raise ValueError("scopes must be None (every scope) or a non-empty list")

    def describe(self) -> str:
        where = "every scope" if self.scopes is None else f"{len(self.scopes)} scope(s)"
        return f"deployments {', '.join(self.deployments)} in {where}"

    async def claim(self, worker_id: str, free: int, fleet_max: int | None,
                    deployments: Sequence[str] | None = None) -> Claimed:
        result = await self._lm.claim_and_start_scopes(
            deployments or self.deployments, worker_id, scopes=self.scopes,
            max_concurrency=fleet_max, batch_size=free)
        return Claimed(runs=tuple((r.scope, r.run) for r in result.runs),
                       saturated=bool(result.saturated), fleet_full=bool(result.saturated),
                       retry_after=min((r.retry_after for r in result.rate_limited),
                                       default=None))

    async def sweep(self, worker_id: str, claim_limit: int, fleet_max: int | None,
                    grace: float, deployments: Sequence[str] | None = None) -> Claimed:
        result = await self._lm.claim_orphaned_scopes(
            deployments or self.deployments, worker_id, scopes=self.scopes,
            max_concurrency=fleet_max, claim_limit=claim_limit, grace_seconds=grace)
        return Claimed(runs=tuple((r.scope, r.run) for r in result.runs),
                       saturated=bool(result.saturated),
                       retry_after=min((r.retry_after for r in result.rate_limited),
                                       default=None))

    async def wakeup_keys(self) -> frozenset[str]:
        return frozenset([await self._lm.deployment_wakeup_key(d) for d in self.deployments])

    def gate_targets(self) -> list[GateTarget]:
        return [GateTarget.deployment(self._lm, d) for d in self.deployments]

    async def queue_depth(self) -> Mapping[str, int]:
        # Summed per deployment (a fleet may serve thousands of scopes; per scope, an operator
        # reads zeroth.queue_depth or `zeroth-pg status`).
        return await self._lm.count_pending_scopes(self.deployments, scopes=self.scopes)


def source_for(lm: LeaseManager, deployment_ref: str | Mapping[str, Any], handler: Any,
               scopes: Sequence[tuple[str | None, str | None]] | None, tenant_id: str | None,
               workspace_id: str | None) -> tuple[dict[str, Any], ClaimSource]:
    """A RunWorker's handlers by deployment and its source, from its arguments: one deployment
    and its handler in one scope, or (a mapping) a fleet worker's handlers and scopes."""
    if isinstance(deployment_ref, str):
        if handler is None:
            raise ValueError("a worker of one deployment needs its handler")
        if scopes is not None:
            raise ValueError("scopes needs a mapping of deployments to handlers")
        return {deployment_ref: handler}, OneScope(lm, deployment_ref, tenant_id, workspace_id)
    if handler is not None or tenant_id is not None or workspace_id is not None:
        raise ValueError("a fleet worker takes its handlers in the mapping and its "
                         "scopes in scopes=, not handler, tenant_id or workspace_id")
    handlers = dict(deployment_ref)
    return handlers, ManyScopes(lm, list(handlers), scopes)


def per_deployment(values: Mapping[str, Any] | None, deployments: Sequence[str],
                   what: str) -> dict[str, Any]:
    """A per-deployment setting, checked against the deployments a worker serves."""
    chosen = dict(values or {})
    unknown = sorted(set(chosen) - set(deployments))
    if unknown:
        raise ValueError(f"{what} names deployment(s) this worker does not serve: "
                         f"{', '.join(unknown)}")
    return chosen


def retry_policies(base_seconds: float | None, max_seconds: float | None,
                   retries: Mapping[str, RetryPolicy] | None,
                   deployments: Sequence[str]) -> dict[str, RetryPolicy | None]:
    """The retry policy of each deployment served: ``retries``' own, else the worker's
    (``base_seconds`` / ``max_seconds``, a missing side 1 / 300 s), else None when the worker
    set neither: fail_run then takes the deployment's registered policy (zeroth.deployments)."""
    default = (None if base_seconds is None and max_seconds is None
               else RetryPolicy(1.0 if base_seconds is None else base_seconds,
                                300.0 if max_seconds is None else max_seconds))
    policies: dict[str, RetryPolicy | None] = {d: default for d in deployments}
    policies.update(per_deployment(retries, deployments, "retries"))
    return policies
