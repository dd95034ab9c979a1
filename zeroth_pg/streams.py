"""Following a run's event stream (issue 34, item 1): ``LeaseManager.stream`` and the dashboard's
server-sent events read through :func:`follow`.

The database is the truth: events are numbered 1, 2, 3… per run and committed in that order
(zeroth.append_run_event), and every read asks for the events after the last id yielded. NOTIFY
``zeroth_run_events`` with the run's opaque key is only a hint to read again sooner; a slow poll
reads anyway. A dropped connection is replaced (with backoff) and the read resumes from the last
id yielded, so nothing is yielded twice or skipped. The stream ends after END, which every path
that ends a run produces (docs/python-guide.md, "Run event streams").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any
from uuid import UUID

import asyncpg

from zeroth_pg import _calls
from zeroth_pg.errors import RetryableError, translate
from zeroth_pg.notify import RUN_EVENTS_CHANNEL
from zeroth_pg.types import RunEvent, RunEventKind

__all__ = ["follow", "reader_events", "run_event"]

log = logging.getLogger("zeroth_pg.streams")

#: Reads: (connection, after) → the events after that id (END last once the run ended).
Read = Callable[[asyncpg.Connection, int], Awaitable[Sequence[RunEvent]]]
#: The run's NOTIFY key on this connection, or None: any notification of the channel wakes.
Key = Callable[[asyncpg.Connection], Awaitable[str | None]]


def run_event(row: asyncpg.Record | dict[str, Any]) -> RunEvent:
    """A row of zeroth.read_run_events (data as JSON text) as a :class:`RunEvent`."""
    return RunEvent(event_id=int(row["event_id"]), kind=RunEventKind(row["kind"]),
                    name=row["name"], data=None if row["data"] is None else json.loads(row["data"]),
                    lease_generation=row["lease_generation"], created_at=row["created_at"])


async def follow(acquire: Callable[[], AbstractAsyncContextManager[asyncpg.Connection]],
                 read: Read, key: Key, *, after: int = 0, poll_interval: float = 1.0,
                 batch: int = 100, max_reconnects: int | None = None,
                 reconnect_delay: float = 0.2) -> AsyncIterator[RunEvent]:
    """The events after ``after``, in order, each once, up to and including END.

    ``acquire`` gives a connection for LISTEN and the reads (held while the stream runs; a pooled
    connection runs ``UNLISTEN *`` when released); ``read`` reads one batch (at most ``batch``
    events); ``key`` names the notifications that concern this run. A connection lost or a
    retryable error (the server restarting, 57P01) is retried on a new connection after a
    backoff, ``max_reconnects`` times in a row at most (None: for ever)."""
    last = after
    failures = 0
    woken = asyncio.Event()
    wanted: list[str | None] = [None]  # the key of the current connection (None: any wakes)

    def on_notify(_c: object, _pid: int, _channel: str, payload: str) -> None:
        if wanted[0] is None or payload == wanted[0]:
            woken.set()

    while True:
        try:
            async with acquire() as conn:
                wanted[0] = None
                # LISTEN before the first read: a notification sent after that read is heard.
                await conn.add_listener(RUN_EVENTS_CHANNEL, on_notify)
                try:
                    wanted[0] = await key(conn)
                    while True:
                        woken.clear()
                        events = await read(conn, last)
                        failures = 0
                        for event in events:
                            if event.is_end:
                                yield event
                                return
                            if event.event_id <= last:
                                continue
                            yield event
                            last = event.event_id
                        if len(events) >= batch:
                            continue  # more to read now
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(poll_interval):
                                await woken.wait()
                finally:
                    with contextlib.suppress(Exception):
                        await conn.remove_listener(RUN_EVENTS_CHANNEL, on_notify)
        except Exception as exc:
            mapped = translate(exc)
            if not isinstance(mapped, RetryableError):
                if mapped is exc:
                    raise
                raise mapped from exc
            failures += 1
            if max_reconnects is not None and failures > max_reconnects:
                raise mapped from exc
            delay = min(reconnect_delay * 2 ** (failures - 1), 5.0) * (0.5 + random.random() / 2)
            log.warning("run event stream: %s; reading again from event %s in %.2fs",
                        mapped, last, delay)
            await asyncio.sleep(delay)


async def reader_events(conn: asyncpg.Connection, tenant_id: str, workspace_key: str,
                        run_id: UUID, after: int, max_events: int) -> list[RunEvent]:
    """The read of :func:`zeroth_pg.client.LeaseManager.read_run_events` for a role that may
    read ``zeroth.runs`` and ``zeroth.run_events`` but execute no function (zeroth_reader: its
    tenant only, by row-level security), with the same END: the stored one, or one made from
    the run's terminal status, or ``not_found`` for a run it cannot see."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        run = await conn.fetchrow(_calls.READER_RUN_TAIL, tenant_id, workspace_key, run_id)
        if run is None:
            return [RunEvent(after + 1, RunEventKind.END, "end",
                             {"status": None, "outcome": "not_found"}, None, None)]
        last = int(run["last_id"] or 0)
        rows = await conn.fetch(_calls.READER_RUN_EVENTS, tenant_id, workspace_key, run_id,
                                after, last, max_events)
        events = [run_event(r) for r in rows]
        if (run["status"] not in ("completed", "failed", "cancelled")
                or after + len(events) < last or len(events) >= max_events):
            return events
        if run["last_kind"] == "end":
            if after >= last:  # past the END: the END again
                rows = await conn.fetch(_calls.READER_RUN_EVENTS, tenant_id, workspace_key,
                                        run_id, last - 1, last, 1)
                events = [run_event(r) for r in rows]
            return events
        outcome = "dead_lettered" if run["dead"] else run["status"]
        return [*events, RunEvent(last + 1, RunEventKind.END, "end",
                                  {"status": run["status"], "outcome": outcome},
                                  run["lease_generation"], run["finished_at"])]
