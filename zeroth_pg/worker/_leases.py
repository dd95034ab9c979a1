"""Lease upkeep: the renewals of every lease a worker holds, and fail-stop at their deadlines.

One ``renew_leases`` call per (tenant, workspace) renews every renewable lease of that scope (one
call in all for a worker of one scope), every ``renew_interval`` and at once when
:attr:`LeaseUpkeep.renew_now` is set (a ``zeroth_control`` notification for this worker). A
refused renewal stops that run (:attr:`StopReason.LEASE_LOST`): nothing more is written for it.
A renewal that reports ``cancel_requested`` stops it as :attr:`StopReason.CANCEL`. A renewal that
*fails* (connection lost) is retried until the last confirmed lease deadline, measured on the
local monotonic clock from the moment the confirmed call was sent; past it the run is stopped
(:attr:`StopReason.DEADLINE`, fail-stop). Its lease then simply expires, so it is never stranded
and claim_orphaned recovers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from zeroth_pg.worker._run import ActiveRun, RunState, StopReason

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["LeaseUpkeep"]

log = logging.getLogger("zeroth_pg.worker")


class LeaseUpkeep:
    """Keeps the leases of the runs ``runs()`` returns; stops a run through ``stop``."""

    def __init__(
        self,
        lease_manager: LeaseManager,
        worker_id: str,
        *,
        runs: Callable[[], Collection[ActiveRun]],
        stop: Callable[[ActiveRun, StopReason], None],
        lease_duration: float,
        renew_interval: float,
    ) -> None:
        self.lease_manager = lease_manager
        self.worker_id = worker_id
        self.lease_duration = lease_duration
        self.renew_interval = renew_interval
        self._runs = runs
        self._stop = stop
        #: Set to renew now (at most one renewal every 50 ms all the same).
        self.renew_now = asyncio.Event()

    async def run(self) -> None:
        """Renew until cancelled."""
        interval = self.renew_interval
        # A notification can ask for a renewal at any time: at most one every 50 ms, so a flood
        # of forged notifications costs one cheap statement per 50 ms and nothing else.
        spacing = min(0.05, self.renew_interval)
        last = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.renew_now.wait()
            if (wait := last + spacing - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            self.renew_now.clear()
            interval = self.renew_interval
            entries = [entry for entry in self._runs() if entry.renewable]
            if not entries:
                continue
            last = time.monotonic()
            soon: list[float] = []  # deadlines that need a renewal before the next interval
            for group in _by_scope(entries):
                soon.extend(await self._renew(group))
            if soon:
                self.enforce_deadlines()
                interval = min(self.renew_interval,
                               *(max(0.01, d - time.monotonic()) for d in soon))

    async def _renew(self, entries: list[ActiveRun]) -> list[float]:
        """One renew_leases call for the entries (all of one scope). Returns the deadlines that
        must be renewed again before the next interval: every one after a failed call (retry
        soon, no later than the deadline, so fail-stop is punctual), else those whose row
        another session held."""
        by_id = {entry.run.run_id: entry for entry in entries}
        scope = entries[0].scope
        sent = time.monotonic()
        nearest = min(entry.deadline for entry in entries)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation that
            # arrives as the call completes (CPython gh-86296), and the loop went on renewing
            # while shutdown waited for it for ever.
            async with asyncio.timeout(max(0.05, nearest - sent)):
                renewals = await self.lease_manager.renew_leases(
                    self.worker_id,
                    {run_id: entry.run.lease_generation for run_id, entry in by_id.items()},
                    tenant_id=scope.tenant_id, workspace_id=scope.workspace_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("lease renewal failed (%s: %s); retrying", type(exc).__name__, exc)
            return [*(e.deadline for e in entries if e.renewable), sent + 1.0]
        busy: list[float] = []
        for renewal in renewals:
            entry = by_id[renewal.run_id]
            if renewal.renewed is None:
                # Another session holds the run's row: not renewed this time, not lost. The
                # deadline stays; the next renewal comes no later than it, and the handler is
                # stopped at it if the row stays busy.
                busy.append(entry.deadline)
                continue
            if renewal.renewed:
                entry.deadline = sent + self.lease_duration
                if entry.attempt_deadline is not None:  # the database caps the lease there
                    entry.deadline = min(entry.deadline, entry.attempt_deadline)
                if renewal.cancel_requested:
                    if entry.stop_reason is None:  # said once: every renewal reports it again
                        log.info("run %s: a cancel was requested; stopping its handler",
                                 renewal.run_id)
                    self._stop(entry, StopReason.CANCEL)
            elif entry.state is RunState.COMPLETING:
                # Its completion raced this renewal and cleared the lease; the completion's own
                # answer says what happened.
                continue
            elif entry.renewable:
                log.warning("lease of run %s (generation %d) lost", renewal.run_id,
                            entry.run.lease_generation)
                self._stop(entry, StopReason.LEASE_LOST)
        return busy

    def enforce_deadlines(self) -> None:
        """Stop every renewable run whose lease is no longer known to be live."""
        now = time.monotonic()
        for entry in list(self._runs()):
            if entry.renewable and now >= entry.deadline:
                log.error("run %s: no confirmed lease since its deadline; stopping the handler",
                          entry.run.run_id)
                self._stop(entry, StopReason.DEADLINE)


def _by_scope(entries: Iterable[ActiveRun]) -> list[list[ActiveRun]]:
    """The entries split by (tenant, workspace): renew_leases is scoped."""
    groups: dict[tuple[str, str | None], list[ActiveRun]] = {}
    for entry in entries:
        groups.setdefault((entry.scope.tenant_id, entry.scope.workspace_id), []).append(entry)
    return list(groups.values())
