"""Completion batching: the completions of runs that finished together, as one call.

A run task hands its output to :meth:`CompletionBatcher.complete` and waits for its row. The
batcher's loop sends what has queued up as one ``complete_runs`` call (each row fenced on its
own). It never waits to fill a batch: it sends what has queued up by the time the previous call
came back, so a lone run is acknowledged as fast as with ``complete_run`` and a burst takes one
round trip instead of one per run. Transient failures are retried while a run's lease is known
to be live; an output PostgreSQL cannot store fails that run and never its batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from zeroth_pg.errors import RetryableError
from zeroth_pg.types import ClaimedRun, Scope

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["ClaimAlong", "CompletionBatcher", "Leased"]

log = logging.getLogger("zeroth_pg.worker")

#: Runs per complete_runs call at most.
MAX_BATCH = 1000


class Leased(Protocol):
    """A run under a lease: :class:`zeroth_pg.worker._run.ActiveRun` is one."""

    @property
    def run(self) -> ClaimedRun: ...

    @property
    def deadline(self) -> float:
        """Monotonic instant before which the lease is known to be live."""
        ...

    @property
    def scope(self) -> Scope:
        """Where the run lives (complete_runs is called per tenant and workspace)."""
        ...

    #: Its completion carries a claim into the slot it frees (see :data:`ClaimAlong`).
    claims_next: bool


#: Sends a batch's completions together with a claim into the slots of those entries whose
#: ``claims_next`` is set (``complete_and_claim``), hands the claimed runs over, and clears
#: those flags whatever happens: one completed-or-not per entry, in order, or None when no
#: claim can go out now (then, as on an error, the batch is completed the plain way).
ClaimAlong = Callable[[list[tuple[Leased, Any]]], Awaitable[list[bool] | None]]


@dataclass
class _Completion:
    entry: Leased
    output: Any
    # True completed, False refused by the fence, None no answer before the lease deadline; an
    # exception when the database refused this run's completion itself (a value it cannot store).
    result: asyncio.Future[bool | None]
    # Retries stop here: the lease deadline known when the completion was submitted. Not the
    # entry's own deadline, which its renewals keep moving: a completion that can never land
    # was retried for ever while the lease stayed alive (red-team pass 7).
    give_up_at: float


class CompletionBatcher:
    """Queues completions and sends them in batches from :meth:`run`."""

    def __init__(
        self,
        lease_manager: LeaseManager,
        worker_id: str,
        *,
        others_may_join: Callable[[], bool] = lambda: False,
        on_batch_refused: Callable[[], None] = lambda: None,
        claim_along: ClaimAlong | None = None,
    ) -> None:
        """``others_may_join``: True when a handler could finish in this same turn of the event
        loop (one more turn is worth waiting); ``on_batch_refused``: counts a batch the database
        refused as a whole (then completed run by run); ``claim_along``: sends a batch that
        carries claims (one commit for both), tried once before the plain path."""
        self._claim_along = claim_along
        self.lease_manager = lease_manager
        self.worker_id = worker_id
        self._others_may_join = others_may_join
        self._on_batch_refused = on_batch_refused
        self._queue: list[_Completion] = []
        self._queued = asyncio.Event()
        # Single completions split off a batch that met a held row: they retry on their own,
        # so the loop goes on with the next batch instead of waiting behind one busy row.
        self._retrying: dict[asyncio.Task[None], _Completion] = {}

    def submit(self, entry: Leased, output: Any) -> asyncio.Future[bool | None]:
        """Queue ``entry``'s completion; the future answers True completed, False refused by
        the fence, None no answer before the lease deadline (or raises what refused it)."""
        completion = _Completion(entry, output, asyncio.get_running_loop().create_future(),
                                 entry.deadline)
        self._queue.append(completion)
        self._queued.set()
        return completion.result

    async def complete(self, entry: Leased, output: Any) -> bool | None:
        """:meth:`submit`, and wait for the answer."""
        return await self.submit(entry, output)

    async def run(self) -> None:
        """Send the queued completions until cancelled."""
        try:
            while True:
                await self._queued.wait()
                if self._others_may_join():
                    # Handlers that finish in this same turn of the event loop join the batch.
                    await asyncio.sleep(0)
                self._queued.clear()
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                if self._queue:
                    self._queued.set()
                try:
                    # complete_runs is scoped: one call per (tenant, workspace) of the batch.
                    for group in _by_scope(batch):
                        await self._send(group)
                finally:
                    # Whatever happened, no run task is left waiting for an answer that never
                    # comes (the ones retrying on their own are answered there, or at exit).
                    retrying = {id(c) for c in self._retrying.values()}
                    for completion in batch:
                        if not completion.result.done() and id(completion) not in retrying:
                            completion.result.set_exception(
                                RuntimeError("the completion loop stopped before answering"))
        finally:
            self._stop_retrying()

    def _stop_retrying(self) -> None:
        for task, completion in list(self._retrying.items()):
            task.cancel()
            _settle(completion.result, None)  # no answer: the lease expires, the run is re-run
        self._retrying.clear()

    async def _send(self, batch: list[_Completion], *, on_its_own: bool = False) -> None:
        """One complete_runs call for the batch, retried on transient failures while some
        run's lease is still known to be live; a run past its deadline gets None. When the
        database refuses the batch itself, each run is completed on its own, so one bad value
        fails its run and never the others."""
        if (self._claim_along is not None and not on_its_own
                and any(c.entry.claims_next for c in batch)
                and await self._send_with_claims(batch)):
            return
        delay = 0.05
        scope = batch[0].entry.scope if batch else None
        while batch:
            assert scope is not None
            try:
                rows = await self.lease_manager.complete_runs(
                    self.worker_id,
                    [(c.entry.run.run_id, c.entry.run.lease_generation, c.output) for c in batch],
                    tenant_id=scope.tenant_id, workspace_id=scope.workspace_id)
            except RetryableError as exc:
                if not on_its_own and getattr(exc, "code", None) == "55P03":
                    # A run's row is held by another session (complete_runs waits 2 s for a
                    # row): each run of the batch retries on its own, so only that run waits,
                    # and the loop goes on with later completions (red-team passes 9 and 10).
                    log.warning("complete_runs waited for a row another session holds; "
                                "the batch of %d retries run by run", len(batch))
                    for completion in batch:
                        task = asyncio.create_task(self._send([completion], on_its_own=True))
                        self._retrying[task] = completion
                        task.add_done_callback(lambda done: self._retrying.pop(done, None))
                    return
                now = time.monotonic()
                for completion in [c for c in batch if now + delay >= c.give_up_at]:
                    log.error("run %s: giving up its completion after %s; the lease will expire",
                              completion.entry.run.run_id, exc)
                    _settle(completion.result, None)
                batch = [c for c in batch if not c.result.done()]
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            except Exception as exc:
                if len(batch) == 1:
                    if not batch[0].result.done():  # its waiter may have been cancelled
                        batch[0].result.set_exception(exc)
                    return
                log.warning("complete_runs refused a batch of %d (%s: %s); completing them one "
                            "by one", len(batch), type(exc).__name__, exc)
                self._on_batch_refused()
                for completion in batch:
                    await self._send([completion])
                return
            for completion, row in zip(batch, rows, strict=True):
                _settle(completion.result, row.completed)
            return


    async def _send_with_claims(self, batch: list[_Completion]) -> bool:
        """One try of the batch with its claims: True when it was answered. Any failure leaves
        it to the plain path (complete_runs, with its retries and its run-by-run fallback),
        and the claim to the claim loop: the call was one transaction, so nothing of it stands.
        """
        assert self._claim_along is not None
        try:
            completed = await self._claim_along([(c.entry, c.output) for c in batch])
        except Exception as exc:
            log.info("complete_and_claim failed (%s: %s); completing the batch of %d without "
                     "a claim", type(exc).__name__, exc, len(batch))
            return False
        if completed is None:
            return False
        for completion, done in zip(batch, completed, strict=True):
            _settle(completion.result, done)
        return True


def _by_scope(batch: list[_Completion]) -> list[list[_Completion]]:
    """The batch split by (tenant, workspace), in order of first appearance."""
    groups: dict[tuple[str, str | None], list[_Completion]] = {}
    for completion in batch:
        scope = completion.entry.scope
        groups.setdefault((scope.tenant_id, scope.workspace_id), []).append(completion)
    return list(groups.values())


def _settle(result: asyncio.Future[bool | None], value: bool | None) -> None:
    """Answer a waiting run task, unless it is gone (its task was cancelled with the loop)."""
    if not result.done():
        result.set_result(value)
