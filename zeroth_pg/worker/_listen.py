"""The worker's notifications: hints, never the truth.

:class:`Listener` owns the worker's LISTEN connection (:class:`~zeroth_pg.notify.Notifier`) and
the opaque keys that tell which NOTIFY payloads are meant for this worker. A wakeup that carries
one of its keys asks the claim loop to look now; a control notification that carries its key asks
for a renewal at once (the renewal, not the notification, reports a cancel). After every
(re)connect it looks for work (notifications sent meanwhile are gone) and fetches the keys again
(the secret they come from may have been rotated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from zeroth_pg._connect import connect
from zeroth_pg.notify import CONTROL_CHANNEL, WAKEUP_CHANNEL, Notifier
from zeroth_pg.worker._gate import WakeupGate
from zeroth_pg.worker._sources import ClaimSource

if TYPE_CHECKING:
    from zeroth_pg.client import LeaseManager

__all__ = ["Listener"]

log = logging.getLogger("zeroth_pg.worker")


class Listener:
    """Turns the NOTIFYs meant for ``worker_id`` into ``wake`` (claim now; not while
    ``rate_held()``) and ``renew`` (renew now; only while ``holding()`` runs)."""

    def __init__(self, lm: LeaseManager, source: ClaimSource, gate: WakeupGate, worker_id: str,
                 *, wake: Callable[[], None], rate_held: Callable[[], bool],
                 renew: Callable[[], None], holding: Callable[[], bool]) -> None:
        self._lm, self._source, self._gate, self.worker_id = lm, source, gate, worker_id
        self._wake, self._rate_held, self._renew, self._holding = wake, rate_held, renew, holding
        self.notifier: Notifier | None = None
        # The opaque NOTIFY payloads meant for this worker; None until fetched (then every
        # notification on the channel is taken as a hint: a wasted look, never a wrong action).
        self.wakeup_keys: frozenset[str] | None = None
        self.control_key: str | None = None
        self._key_tasks: set[asyncio.Task[None]] = set()

    def start(self, dsn: str) -> Notifier:
        # Named so operators (and the chaos soak) can tell the listener in pg_stat_activity.
        settings = {"application_name": f"zeroth-listener:{self.worker_id}"}
        self.notifier = Notifier(
            dsn, on_notification=self.on_notification, on_connect=self.on_listen,
            connect=lambda dsn: connect(dsn, server_settings=settings))
        self.notifier.start()
        return self.notifier

    async def stop(self) -> None:
        for task in list(self._key_tasks):
            task.cancel()
        for task in list(self._key_tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.notifier is not None:
            await self.notifier.stop()  # a gate call that is out ends with its connection
        await self._gate.stop()

    def on_listen(self) -> None:
        """After every LISTEN (re)connect: look for work, renew, and fetch the keys again."""
        if self.notifier is not None:
            self._gate.connected(self.notifier)
        self._wake()
        self._renew()
        task = asyncio.get_running_loop().create_task(self._fetch_keys())
        self._key_tasks.add(task)
        task.add_done_callback(self._key_tasks.discard)

    async def _fetch_keys(self) -> None:
        try:
            self.wakeup_keys = await self._source.wakeup_keys()
            self.control_key = await self._lm.control_key(self.worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # until the next connect every notification is a hint for us
            log.warning("could not fetch this worker's notification keys (%s: %s)",
                        type(exc).__name__, exc)

    def on_notification(self, channel: str, payload: str) -> None:
        if channel == WAKEUP_CHANNEL:
            if (self.wakeup_keys is None or payload in self.wakeup_keys) and (
                    not self._rate_held()):
                self._wake()
        elif channel == CONTROL_CHANNEL and self._holding() and (
                self.control_key is None or payload == self.control_key):
            # Someone asked for a cancel of a run held by this worker id, or pretends to: ask
            # the database (the renewal reports cancel_requested) before stopping anything.
            self._renew()
