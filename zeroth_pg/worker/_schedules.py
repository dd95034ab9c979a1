"""The schedule firer of a worker: registers the application's schedules when the worker starts
(``zeroth.register_schedule``) and turns due fire times of the deployments it serves into runs
(``zeroth.fire_due_schedules``), then sleeps until the next fire time the database reported,
at most ``max_sleep``.

Any number of workers may fire at once: the database locks each due schedule row FOR UPDATE SKIP
LOCKED and records each (schedule, fire time) under a primary key, so a fire time becomes one run
whoever fires it, and no leader is needed. Firing is a hint-free poll: it needs no NOTIFY. The
next fire time is the database's; this process's clock only decides how long to sleep, and a
sleep is capped so that a clock that disagrees costs at most ``max_sleep`` of delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from zeroth_pg.client import LeaseManager
from zeroth_pg.types import ScheduleFiring
from zeroth_pg.worker._sources import ClaimSource, ManyScopes
from zeroth_pg.worker._startup import retry_starting

__all__ = ["PeriodicSchedule", "ScheduleFirer"]

log = logging.getLogger("zeroth_pg.worker")

#: The shortest sleep between two calls (a next fire time that is already due, because another
#: worker holds that schedule right now or the clocks disagree, must not spin).
MIN_SLEEP = 0.02


@dataclass(frozen=True, slots=True)
class PeriodicSchedule:
    """An application's schedule, registered when its worker starts (``register_schedule``):
    exactly one of ``cron`` (5 fields, on the wall clock of ``time_zone``) and
    ``interval_seconds``."""

    name: str
    deployment_ref: str
    cron: str | None = None
    interval_seconds: int | None = None
    time_zone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    tenant_id: str | None = None
    workspace_id: str | None = None
    priority: int = 0
    max_attempts: int = 3
    missed_fire_policy: str = "skip"
    catch_up_limit: int | None = None
    misfire_grace_seconds: int = 60


class ScheduleFirer:
    """Registers ``schedules`` once (:meth:`register`), then fires the deployments' schedules in
    ``scopes`` (None: every scope) until ``stopping()`` (:meth:`run`)."""

    def __init__(self, lease_manager: LeaseManager, deployments: Sequence[str],
                 scopes: Sequence[tuple[str | None, str | None]] | None,
                 schedules: Sequence[PeriodicSchedule], *, max_sleep: float = 1.0) -> None:
        if max_sleep <= 0:
            raise ValueError("schedule max_sleep must be > 0")
        self._lm = lease_manager
        self.deployments = list(deployments)
        self.scopes = None if scopes is None else list(scopes)
        self.schedules = list(schedules)
        self.max_sleep = max_sleep
        self.fired = 0  # runs this worker enqueued for a fire time

    async def register(self, worker_id: str) -> None:
        """Declare every schedule of the application; a DBA's pause or edit is kept. A database
        that is away is waited for (:func:`~._startup.retry_starting`: up to 30 s, "could not
        register its schedules yet"); a schedule it refuses raises at once."""
        await retry_starting(self._register, what="register its schedules", worker_id=worker_id)

    async def _register(self) -> None:
        for s in self.schedules:
            result = await self._lm.register_schedule(
                s.name, s.deployment_ref, cron=s.cron, interval_seconds=s.interval_seconds,
                tenant_id=s.tenant_id, workspace_id=s.workspace_id, time_zone=s.time_zone,
                payload=s.payload, metadata=s.metadata, priority=s.priority,
                max_attempts=s.max_attempts, missed_fire_policy=s.missed_fire_policy,
                catch_up_limit=s.catch_up_limit, misfire_grace_seconds=s.misfire_grace_seconds)
            log.info("schedule %s of %s: %s%s", s.name, s.deployment_ref, result.outcome,
                     " (paused)" if result.paused else "")

    async def fire_once(self) -> ScheduleFiring:
        result = await self._lm.fire_due_schedules(self.deployments, scopes=self.scopes)
        self.fired += sum(1 for fire in result.fires if fire.created)
        return result

    def delay(self, next_due_at: datetime | None) -> float:
        """How long to sleep before the next call."""
        if next_due_at is None:
            return self.max_sleep
        wait = (next_due_at - datetime.now(UTC)).total_seconds()
        return min(self.max_sleep, max(MIN_SLEEP, wait))

    async def run(self, stopping: Callable[[], bool]) -> None:
        while not stopping():
            result = await self.fire_once()
            await asyncio.sleep(self.delay(result.next_due_at))


def firer_for(lm: LeaseManager, source: ClaimSource, scope: tuple[str | None, str | None],
              schedules: Sequence[PeriodicSchedule], fire: bool | None,
              max_sleep: float) -> ScheduleFirer | None:
    """A RunWorker's schedule firer: none unless the worker has schedules of its own or is
    asked to fire (``fire=True``: a DBA's schedules of its deployments). ``scope``: the
    (tenant, workspace) of a worker of one scope, as its caller spelled them."""
    if fire or (fire is None and schedules):
        scopes = source.scopes if isinstance(source, ManyScopes) else [scope]
        return ScheduleFirer(lm, source.deployments, scopes, schedules, max_sleep=max_sleep)
    if schedules:
        raise ValueError("schedules given with fire_schedules=False")
    return None
