"""Claim pacing: when the claim loop claims, sweeps, sleeps and lets a wakeup through.

Everything the loop remembers between passes lives in one :class:`ClaimPacer`: whether the last
claim filled every free slot (a backlog), whether the fleet limit or a deployment's local limit
was reached, when a rate limit lets a claim through again, and when the next orphan sweep is
due. Its decisions take the monotonic time as an argument and touch no database, so each one is
a unit test (tests/worker/test_pacing.py); :mod:`._claims` feeds it what each claim answered.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["FAILED_RETRY_FIRST", "FAILED_RETRY_MAX", "ClaimGroup", "ClaimPacer", "GateMode"]

#: After a failed claim pass (a connection lost to a failover, a server that cannot write yet)
#: the next pass comes this soon, the wait doubling with every failure in a row up to
#: FAILED_RETRY_MAX (or the poll interval when shorter): a worker back on its feet claims on a
#: promoted server at once instead of a poll interval later, and one whose server stays down
#: tries about once a second, not in a loop. Each pass's connect has its own pauses too
#: (zeroth_pg._connect: 0.25 s doubling while no host can write).
FAILED_RETRY_FIRST = 0.05
FAILED_RETRY_MAX = 1.0

#: One claim of a pass: the deployments it claims for (None: every one served) and its limit.
ClaimGroup = tuple[tuple[str, ...] | None, int]


class GateMode(enum.Enum):
    """What the wakeup gate should know after a claim pass (worker/_gate.py)."""

    BUSY = "busy"  # no free slot, a full batch, or all work held back: no NOTIFY needed
    FLOWING = "flowing"  # some work and room for more: the loop looks again shortly
    IDLE = "idle"  # nothing to claim: the worker waits for work and wants a NOTIFY


@dataclass
class ClaimPacer:
    """The claim loop's memory between passes, and the decisions made from it."""

    #: Local limits of single deployments (handlers at once in this process).
    deployment_limits: Mapping[str, int] = field(default_factory=dict)
    #: The last claim filled every free slot: more work is likely, claim again as soon as a slot
    #: frees.
    backlog: bool = False
    #: The last claim left no fleet slot (fleet_max_concurrency) free: claim again as soon as one
    #: of this worker's runs gives its slot back, not when that run's NOTIFY comes round.
    fleet_full: bool = False
    #: A rate limit (zeroth.rate_limits) held back or cut short the last claim: claim again at
    #: this monotonic instant (the claim's retry_after), not at once and not at the poll interval.
    rate_retry_at: float | None = None
    #: With rate_retry_at: all the work the claim saw is held back, so a NOTIFY before then is
    #: ignored (one scope: nothing it could announce is claimable before then).
    rate_all_held: bool = False
    #: Orphans are looked for on start, and again at once when a sweep found more or had no room.
    sweep_due: bool = True
    next_sweep: float = 0.0
    #: The end-only sweep of a worker with no free slot (at most once per sweep interval).
    next_end_only: float = 0.0
    #: Deployments whose last claim of their own filled their local room: they likely have more
    #: work, so a slot they free is claimed into at once (like a full batch).
    deployments_full: set[str] = field(default_factory=set)
    #: Rotates the order of a pass's claims, so a limited deployment is not always served last.
    claim_round: int = 0
    #: After a failed pass: when the next one comes (monotonic), and the wait after the next
    #: failure in a row (FAILED_RETRY_FIRST doubling). None / the first wait after a pass that
    #: answered.
    failed_retry_at: float | None = None
    failed_retry_delay: float = FAILED_RETRY_FIRST
    #: The wait after the next failed sweep in a row (FAILED_RETRY_FIRST doubling up to
    #: FAILED_RETRY_MAX); back to the first after a sweep that answered.
    sweep_retry_delay: float = FAILED_RETRY_FIRST

    # -- the orphan sweep ------------------------------------------------------------------------

    def sweep_wanted(self, now: float) -> bool:
        return self.sweep_due or now >= self.next_sweep

    def sweep_failed(self, now: float, interval: float) -> float:
        """A broken sweep must not stop claiming, nor wait a whole interval: after a failover
        the sweep is what re-leases the runs whose worker died with the old primary, so it is
        tried again on the failed pass's backoff (FAILED_RETRY_FIRST doubling with each failure
        in a row, never longer than FAILED_RETRY_MAX or ``interval``). The wait is returned."""
        delay = min(self.sweep_retry_delay, FAILED_RETRY_MAX, interval)
        self.sweep_due = False
        self.next_sweep = now + delay
        self.sweep_retry_delay = min(FAILED_RETRY_MAX, delay * 2)
        return delay

    def sweep_without_room(self, now: float, interval: float) -> bool:
        """No slot to re-lease orphans into: the sweep is retried as soon as a slot frees. True
        when the end-only sweep (orphans nobody may resume need no slot) is due now."""
        self.sweep_due = True
        if now >= self.next_end_only:
            self.next_end_only = now + interval
            return True
        return False

    def swept(self, now: float, interval: float, *, more: bool, held_until: float | None) -> None:
        """After a sweep: ``more`` orphans are likely (look again at once); ``held_until``: a rate
        limit held some back until then (sweep again then, not a whole interval later)."""
        self.sweep_due = more
        self.sweep_retry_delay = FAILED_RETRY_FIRST
        self.next_sweep = min(now + interval, held_until if held_until is not None
                              else float("inf"))

    # -- claims ----------------------------------------------------------------------------------

    def groups(self, free: int, deployments: Sequence[str],
               executing: Mapping[str, int]) -> list[ClaimGroup]:
        """The claims of one pass into ``free`` slots, given the handlers ``executing`` per
        deployment.

        Without deployment limits that is one claim of ``free``. A deployment whose local limit
        leaves it less room than ``free`` gets a claim of its own, limited to its room (one claim
        over every deployment could otherwise hand it more than its limit); a deployment at its
        limit is left out. The order of the claims rotates every pass.
        """
        if not self.deployment_limits:
            return [(None, free)]
        rooms = {d: limit - executing.get(d, 0) for d, limit in self.deployment_limits.items()}
        shared = tuple(d for d in deployments if rooms.get(d, free) >= free)
        groups: list[ClaimGroup] = [((d,), room) for d, room in rooms.items() if 0 < room < free]
        if shared:
            whole = len(shared) == len(deployments)
            groups.append((None if whole else shared, free))
        self.claim_round += 1
        turn = self.claim_round % len(groups) if groups else 0
        return groups[turn:] + groups[:turn]

    def pass_begins(self) -> None:
        self.fleet_full = False
        self.rate_retry_at, self.rate_all_held = None, True

    def nothing_to_claim_for(self) -> None:
        """Every deployment is at its local limit: wait until one frees a slot, not claim again
        at once (a stale backlog flag here once spun the loop without ever yielding)."""
        self.backlog = False

    def claimed(self, now: float, deployments: tuple[str, ...] | None, limit: int, got: int, *,
                fleet_full: bool, retry_after: float | None, all_held_back: bool) -> None:
        """What one claim of the pass answered."""
        self.fleet_full = self.fleet_full or fleet_full
        # A limited deployment that filled a claim of its own likely has more work; one claimed
        # for in a shared claim (whose fill is the backlog's business) or that came back short
        # has not (a stale entry once kept an idle worker claiming).
        if deployments is not None and len(deployments) == 1 and got == limit and (
                deployments[0] in self.deployment_limits):
            self.deployments_full.add(deployments[0])
        else:
            self.deployments_full.difference_update(
                self.deployment_limits if deployments is None else deployments)
        # Counted from the answer's arrival, after the database time retry_after is counted
        # from: never early (an early claim would only be held back again).
        if retry_after is None:
            self.rate_all_held = False
            return
        at = now + retry_after
        self.rate_retry_at = at if self.rate_retry_at is None else min(self.rate_retry_at, at)
        self.rate_all_held = self.rate_all_held and all_held_back

    def pass_ends(self, claimed: int, asked: int) -> None:
        self.backlog = claimed == asked and self.rate_retry_at is None
        self.answered()

    def answered(self) -> None:
        """A pass got through (it claimed, or had nothing to claim for): the failure backoff
        starts over."""
        self.failed_retry_at, self.failed_retry_delay = None, FAILED_RETRY_FIRST

    def pass_failed(self, now: float, poll: float) -> float:
        """The pass raised (its claim or its connection): try again after a short wait that
        doubles with each failure in a row, never longer than FAILED_RETRY_MAX or ``poll``."""
        self.backlog = False
        delay = min(self.failed_retry_delay, FAILED_RETRY_MAX, poll)
        self.failed_retry_at = now + delay
        self.failed_retry_delay = min(FAILED_RETRY_MAX, delay * 2)
        return delay

    def rate_held(self, now: float) -> bool:
        """All the work this worker can see is held back by its rate limit right now."""
        return (self.rate_all_held and self.rate_retry_at is not None
                and now < self.rate_retry_at)

    # -- between passes --------------------------------------------------------------------------

    def gate_mode(self, claimed: int | None, now: float) -> GateMode:
        """After a pass that claimed ``claimed`` runs (None: no claim was made)."""
        if claimed is None or self.backlog or self.rate_held(now):
            return GateMode.BUSY
        return GateMode.FLOWING if claimed else GateMode.IDLE

    def has_room(self, executing: Mapping[str, int]) -> bool:
        """A deployment whose last own claim was full has room again under its local limit."""
        return any(executing.get(d, 0) < self.deployment_limits[d]
                   for d in self.deployments_full)

    def claim_at_once(self, free: int, executing: Callable[[], Mapping[str, int]]) -> bool:
        """Skip the sleep: a slot is free and the last claim was full (the whole batch, or a
        limited deployment's own that has room again)."""
        return free > 0 and (self.backlog or (bool(self.deployments_full)
                                              and self.has_room(executing())))

    def sleep_for(self, now: float, poll: float) -> float:
        """How long the loop may sleep when nothing wakes it (``poll``: the poll interval, or the
        gate's shorter look while work flows)."""
        timeout = poll
        if self.rate_retry_at is not None:
            # Held back by a rate limit: look again right then. With all its work held back the
            # worker does not poll meanwhile (a poll could only be held back again).
            wait = max(0.0, self.rate_retry_at - now)
            timeout = wait if self.rate_all_held else min(timeout, wait)
        if not self.sweep_due:
            timeout = min(timeout, max(0.0, self.next_sweep - now))
        if self.failed_retry_at is not None:
            # The last pass failed: retry on the failure backoff, not a poll interval later.
            timeout = min(timeout, max(0.0, self.failed_retry_at - now))
        return timeout

    def slot_freed_wakes(self, *, fleet: bool) -> bool:
        """A freed slot (``fleet``: its admission slot too) is worth a claim pass now."""
        return (self.backlog or self.sweep_due or (fleet and self.fleet_full)
                or bool(self.deployments_full))

    def may_claim_along(self, now: float) -> bool:
        """A completion may carry the next claim (complete_and_claim) as far as pacing goes: no
        sweep due (a claim pass sweeps first) and no rate limit holding claims back."""
        return not self.sweep_due and now < self.next_sweep and self.rate_retry_at is None
