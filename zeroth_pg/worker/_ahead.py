"""Claiming ahead (``RunWorker(claim_ahead=N)``): the handler slots the runs claimed ahead wait
for, and when the worker may claim ahead at all.

A run claimed ahead is claimed and started like any other (its attempt counted) and waits in the
worker for one of ``max_concurrency`` handler slots, so the next handler starts the moment one
returns. That only pays, and only stays harmless, while handlers are short: a run that waits
long was started for nothing, and handing it back (``hand_back_to_pending``) spends one of the
hand-backs the database gives back an attempt for. So the worker claims ahead only while its
last handlers (``max_concurrency`` of them, at least :data:`AHEAD_EVIDENCE`) each returned within
:data:`AHEAD_HANDLER_LIMIT` (none yet: not at all) and no handler running now has run longer; a
run that waited :data:`AHEAD_WAIT` anyway (every handler turned long at once, or one ignores its
cancellation; not during a drain) is handed back and makes it gather that evidence again — not
on its last attempt, where a hand-back could dead-letter a run that never ran: it waits on. A
completion claims along only into room the worker may still fill (the slot it frees goes to a
waiting run first).
"""

from __future__ import annotations

import asyncio
import collections
import time

from zeroth_pg.worker._run import ActiveRun

__all__ = ["AHEAD_EVIDENCE", "AHEAD_HANDLER_LIMIT", "AHEAD_WAIT", "MAX_CLAIM_BATCH",
           "ClaimAhead", "check_claim_ahead"]

#: How long a run claimed ahead waits for a handler slot before it is handed back to pending.
AHEAD_WAIT = 1.0

#: The longest a handler may take for the worker to go on claiming ahead.
AHEAD_HANDLER_LIMIT = 0.25

#: The fewest short handlers that let a worker claim ahead (a worker of one slot would otherwise
#: take one short run for evidence).
AHEAD_EVIDENCE = 8

#: The most runs one claim may ask for (zeroth._claim_pending refuses a larger batch_size).
MAX_CLAIM_BATCH = 1000


def check_claim_ahead(claim_ahead: int, max_concurrency: int,
                      fleet_max_concurrency: int | None) -> int:
    """A RunWorker's ``claim_ahead``, checked before anything is built: an int from 0 to
    max_concurrency, no more than MAX_CLAIM_BATCH runs held in all (one claim may ask for
    every one of them), and 0 under a fleet limit (a run waiting for a handler here would hold
    an admission slot a handler elsewhere could use)."""
    if isinstance(claim_ahead, bool) or not isinstance(claim_ahead, int) \
            or not 0 <= claim_ahead <= max_concurrency:
        raise ValueError(f"claim_ahead must be an int from 0 to max_concurrency "
                         f"({max_concurrency})")
    if claim_ahead and max_concurrency + claim_ahead > MAX_CLAIM_BATCH:
        raise ValueError(f"claim_ahead: max_concurrency + claim_ahead must be at most "
                         f"{MAX_CLAIM_BATCH} (the runs one claim may ask for)")
    if claim_ahead and fleet_max_concurrency is not None:
        raise ValueError("claim_ahead cannot be combined with fleet_max_concurrency: a run "
                         "waiting for a handler would hold an admission slot of the fleet")
    return claim_ahead


class ClaimAhead:
    """The handler slots of a worker that claims ahead, and the evidence that its handlers are
    short enough for it."""

    def __init__(self, claim_ahead: int, max_concurrency: int) -> None:
        self.claim_ahead = claim_ahead
        #: One per handler that may run: every run of the worker takes one before its handler
        #: starts and gives it back when the handler returns.
        self.slots = asyncio.Semaphore(max_concurrency)
        self._evidence = max(max_concurrency, AHEAD_EVIDENCE)
        self._recent: collections.deque[float] = collections.deque(maxlen=self._evidence)
        self._long = 0  # how many of _recent reached AHEAD_HANDLER_LIMIT
        # When each slot holder's handler started, oldest first (slots are taken in time order).
        self._started: dict[int, float] = {}

    def runs_ahead(self) -> int:
        """How many runs may be claimed ahead now: ``claim_ahead`` while the last handlers were
        all short and none running has run long, else none."""
        recent = self._recent
        if len(recent) < self._evidence or self._long:
            return 0
        oldest = next(iter(self._started.values()), None)
        if oldest is not None and time.monotonic() - oldest >= AHEAD_HANDLER_LIMIT:
            return 0
        return self.claim_ahead

    def took(self, entry: ActiveRun) -> None:
        """``entry`` acquired one of :attr:`slots`; its handler starts now."""
        entry.holds_handler_slot = True
        self._started[id(entry)] = time.monotonic()

    def returned(self, entry: ActiveRun, seconds: float | None) -> None:
        """``entry``'s handler returned after ``seconds`` (None: it never started, or this is
        its task ending): its slot goes to the next run waiting, once."""
        if seconds is not None:
            recent = self._recent
            if len(recent) == self._evidence:
                self._long -= recent[0] >= AHEAD_HANDLER_LIMIT
            recent.append(seconds)
            self._long += seconds >= AHEAD_HANDLER_LIMIT
        if entry.holds_handler_slot:
            entry.holds_handler_slot = False
            self._started.pop(id(entry), None)
            self.slots.release()

    def no_slot(self) -> None:
        """A run claimed ahead found no slot in time: the handlers are not short (any more).
        Nothing more is claimed ahead until max(max_concurrency, AHEAD_EVIDENCE) short handlers
        say they are."""
        self._recent.clear()
        self._long = 0
