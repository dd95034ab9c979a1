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

from zeroth_pg.worker._ahead import ClaimAhead
from zeroth_pg.worker._run import ActiveRun, RunState

__all__ = ["HeldRuns"]


class HeldRuns:
    """The worker's active runs and its slot accounting."""

    def __init__(self, max_concurrency: int, fleet_max_concurrency: int | None,
                 on_linger_end: Callable[[], None], claim_ahead: int = 0) -> None:
        self.max_concurrency = max_concurrency
        self.fleet_max_concurrency = fleet_max_concurrency
        #: A worker that claims ahead (``claim_ahead`` > 0; else None): the handler slots its
        #: runs wait for, so no more than max_concurrency handlers run however many it holds.
        self.ahead_gate = ClaimAhead(claim_ahead, max_concurrency) if claim_ahead else None
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
        """How many runs may be claimed ahead now (:meth:`ClaimAhead.runs_ahead`)."""
        return self.ahead_gate.runs_ahead() if self.ahead_gate is not None else 0

    @contextlib.contextmanager
    def claiming(self, runs: int) -> Iterator[None]:
        """A claim for ``runs`` runs is out: :meth:`free` counts them as held until it ends
        (only while claiming ahead, where two claims may fill the same room)."""
        counted = runs if self.ahead_gate is not None else 0
        self._claiming += counted
        try:
            yield
        finally:
            self._claiming -= counted

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
        ahead = 0
        if self.ahead_gate is not None:
            ahead = self.ahead_gate.runs_ahead()
            # A handler slot still taken by a run no longer counted held (its lease gone, its
            # handler not returned: one that ignores its cancellation) is not free either.
            executing += (sum(e.holds_handler_slot for e in self.active.values())
                          - sum(e.holds_handler_slot for e in held))
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
