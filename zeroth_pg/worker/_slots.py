"""The runs a worker holds, and the slots they leave free.

:class:`HeldRuns` is the table of the worker's :class:`~._run.ActiveRun` entries, keyed by
(run_id, generation), and the local slot accounting derived from it: how many runs may be claimed
now (``max_concurrency``, ``fleet_max_concurrency``) and how many handlers each deployment runs
(its local limit), counting the handlers that linger after their run left the worker; and, for a
worker that claims ahead (``claim_ahead``), the handler slots its runs wait for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

from zeroth_pg.worker._run import ActiveRun, RunState

__all__ = ["AHEAD_PAUSE", "AHEAD_WAIT", "HeldRuns", "check_claim_ahead"]

#: How long a run claimed ahead waits for a handler slot before it is handed back to pending.
#: Claiming ahead pays when handlers are short (the next run starts as a handler returns, not a
#: round trip later); a wait this long means they are not.
AHEAD_WAIT = 1.0

#: After such a hand-back the worker claims nothing ahead for this long: a run is never handed
#: back over and over by one worker whose handlers turned long.
AHEAD_PAUSE = 60.0


def check_claim_ahead(claim_ahead: int, max_concurrency: int,
                      fleet_max_concurrency: int | None) -> int:
    """A RunWorker's ``claim_ahead``, checked before anything is built: an int from 0 to
    max_concurrency, and 0 under a fleet limit (a run waiting for a handler here would hold an
    admission slot a handler elsewhere could use)."""
    if isinstance(claim_ahead, bool) or not isinstance(claim_ahead, int) \
            or not 0 <= claim_ahead <= max_concurrency:
        raise ValueError(f"claim_ahead must be an int from 0 to max_concurrency "
                         f"({max_concurrency})")
    if claim_ahead and fleet_max_concurrency is not None:
        raise ValueError("claim_ahead cannot be combined with fleet_max_concurrency: a run "
                         "waiting for a handler would hold an admission slot of the fleet")
    return claim_ahead


class HeldRuns:
    """The worker's active runs and its slot accounting."""

    def __init__(self, max_concurrency: int, fleet_max_concurrency: int | None,
                 on_linger_end: Callable[[], None], claim_ahead: int = 0) -> None:
        self.max_concurrency = max_concurrency
        self.fleet_max_concurrency = fleet_max_concurrency
        #: Runs claimed beyond the handlers that may run (0: none). They are started by their
        #: claim and wait for one of ``handler_slots``, so no more than max_concurrency handlers
        #: run however many runs are held.
        self.claim_ahead = claim_ahead
        self.handler_slots = asyncio.Semaphore(max_concurrency) if claim_ahead else None
        self._ahead_paused_until = 0.0
        # Runs asked for by claims still out (counted while claiming ahead): the claim loop and a
        # completion that tops up the runs ahead must not both fill the same room.
        self._claiming = 0
        # Keyed by (run_id, generation): after a stall longer than its lease, this process may
        # re-claim its own orphan and hold both generations until the old task has stopped.
        self.active: dict[tuple[UUID, int], ActiveRun] = {}
        # The generations of each run in active: a claim looks up older ones of the same run
        # without walking every active run (that walk was O(active) per spawn: 6% of a 100-slot
        # worker's CPU in a profile).
        self._generations: dict[UUID, set[int]] = {}
        # Handlers still running after their runs left the worker (linger), per deployment.
        self._lingering: collections.defaultdict[str, set[asyncio.Future[Any]]] = (
            collections.defaultdict(set))
        self._on_linger_end = on_linger_end

    def older(self, run_id: UUID) -> list[ActiveRun]:
        """The entries of ``run_id`` this worker holds already (older generations)."""
        generations = self._generations.get(run_id)
        if not generations:  # the common case: a run this worker does not hold yet
            return []
        return [self.active[(run_id, g)] for g in generations]

    def add(self, entry: ActiveRun) -> None:
        self.active[entry.key] = entry
        self._generations.setdefault(entry.run.run_id, set()).add(entry.run.lease_generation)

    def remove(self, entry: ActiveRun) -> None:
        """``entry`` leaves the worker (unless a newer entry took its key meanwhile)."""
        if self.active.get(entry.key) is not entry:
            return
        del self.active[entry.key]
        generations = self._generations.get(entry.run.run_id)
        if generations is not None:
            generations.discard(entry.run.lease_generation)
            if not generations:
                del self._generations[entry.run.run_id]

    def held(self) -> list[ActiveRun]:
        """The entries that still hold a lease (and a slot).

        A run whose lease is gone was cancelled and can write nothing, and a stopped run is no
        longer renewed, so its lease is gone once its last confirmed deadline passed: a handler
        that ignores its cancellation must not keep the slot for ever, nor count against the
        fleet limit (its admission slot went with it)."""
        now = time.monotonic()
        return [e for e in self.active.values()
                if not e.lease_gone and not (e.stop_reason is not None and now >= e.deadline)]

    def ahead(self) -> int:
        """How many runs may be claimed ahead now: ``claim_ahead``, unless paused."""
        if self.claim_ahead and time.monotonic() >= self._ahead_paused_until:
            return self.claim_ahead
        return 0

    def pause_ahead(self) -> None:
        """A run claimed ahead found no slot in time: claim nothing ahead for AHEAD_PAUSE."""
        self._ahead_paused_until = time.monotonic() + AHEAD_PAUSE

    @contextlib.contextmanager
    def claiming(self, runs: int) -> Iterator[None]:
        """A claim for ``runs`` runs is out: :meth:`free` counts them as held until it ends
        (only while claiming ahead, where two claims may fill the same room)."""
        counted = runs if self.claim_ahead else 0
        self._claiming += counted
        try:
            yield
        finally:
            self._claiming -= counted

    def take_handler_slot(self, entry: ActiveRun) -> None:
        """``entry`` took one of the handler slots (:attr:`handler_slots`)."""
        entry.holds_handler_slot = True

    def return_handler_slot(self, entry: ActiveRun) -> None:
        """``entry``'s handler returned: its slot goes to the next run waiting (once)."""
        if entry.holds_handler_slot and self.handler_slots is not None:
            entry.holds_handler_slot = False
            self.handler_slots.release()

    def free(self) -> int:
        """How many runs may be claimed now.

        A run whose handler has returned no longer occupies a local slot while its completion
        is in flight (its lease is still renewed until the answer): the next claim overlaps the
        completion call instead of waiting for it. At most max_concurrency runs wait like that,
        so this worker never holds more than twice max_concurrency leases. Its admission slot
        (fleet_max_concurrency) is only freed by the completion itself, so under a fleet limit
        every lease of this worker counts: a claim only they would saturate is a wasted round
        trip. A completion that carries a claim keeps its slot until that call answers: the
        claim in it fills the slot (complete_and_claim). A worker that claims ahead holds up to
        ``claim_ahead`` more, waiting for a handler slot."""
        held = self.held()
        completing = sum(1 for e in held
                         if e.state is RunState.COMPLETING and not e.claims_next)
        executing = len(held) - completing
        ahead = self.ahead()
        free = min(self.max_concurrency + ahead - executing,
                   2 * self.max_concurrency + ahead - len(held)) - self._claiming
        if self.fleet_max_concurrency is not None:
            free = min(free, self.fleet_max_concurrency - len(held))
        return free

    def executing_by_deployment(self) -> collections.Counter[str]:
        """Handlers running per deployment, for the local deployment limits. Unlike the total
        (:meth:`held`), a handler that ignores its stop counts until it returns, lease gone or
        not, and so does one still running after its run was settled (:meth:`linger`): the
        resource such a limit guards is still in use."""
        running = collections.Counter(
            e.scope.deployment_ref for e in self.active.values()
            if e.state in (RunState.QUEUED, RunState.WAITING, RunState.EXECUTING))
        for deployment, handlers in self._lingering.items():
            running[deployment] += len(handlers)
        return running

    def linger(self, deployment_ref: str, done: asyncio.Future[Any]) -> None:
        """A handler of ``deployment_ref`` goes on running after its run left the worker (a sync
        handler's thread, which Python cannot stop): it counts against the deployment's local
        limit until ``done``."""
        handlers = self._lingering[deployment_ref]
        handlers.add(done)

        def returned(future: asyncio.Future[Any]) -> None:
            handlers.discard(future)
            self._on_linger_end()  # rare: a claim pass costs less than a run waiting for a poll

        done.add_done_callback(returned)
