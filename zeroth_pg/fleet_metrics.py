"""The database's gauges, once per fleet: what every run's state looks like from the database.

A worker counts what it does (:mod:`zeroth_pg.metrics`); what the queue holds — runs per state,
how long the oldest due run has waited, dead letters, expired leases, waiting runs — is the same
number whoever reads it, so one process serves it for the whole fleet: ``zeroth-pg web`` at
``/metrics`` (:func:`metrics_response`) or the standalone ``zeroth-pg metrics`` exporter
(:func:`serve`). Every scrape is one read of ``zeroth.scope_overview`` (O(unfinished runs +
failures), through partial indexes), summed per deployment.

Labels: ``deployment`` and a fixed ``state`` vocabulary, never a tenant: a fleet of thousands of
tenants would make a series per tenant (``zeroth-pg status`` shows every scope). So the series
are at most ``7 x deployments`` (``zeroth_fleet_runs``) plus ``3 x deployments`` (the others),
one family each. A deployment with nothing pending, running, waiting or failed and no limits
row has no series; an alert on ``absent()`` is the caller's choice.

The rows are those the role may read: a ``zeroth_reader`` member sees only the tenant its
``zeroth.tenant_id`` setting names (row-level security), so a fleet-wide exporter connects as a
role that reads every scope (the table owner ``zeroth_owner``, as the dashboard does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import asyncpg
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from zeroth_pg._connect import create_pool
from zeroth_pg._hosts import LOOPBACK_HOSTS, host_allowed, host_name

__all__ = ["CONTENT_TYPE", "QUERY", "STATES", "render", "serve"]

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: zeroth_fleet_runs's ``state`` label: the columns of zeroth.scope_overview it sums.
STATES = ("pending", "due", "scheduled", "running", "waiting", "failed", "dead_lettered")

#: One statement: the scope overview summed per deployment, with the age of the oldest due run
#: measured on the database's clock (as zeroth-pg status does).
QUERY = """
SELECT o.deployment_ref,
       sum(o.pending)::bigint AS pending, sum(o.due)::bigint AS due,
       sum(o.scheduled)::bigint AS scheduled, sum(o.running)::bigint AS running,
       sum(o.waiting)::bigint AS waiting, sum(o.failed)::bigint AS failed,
       sum(o.dead_letters)::bigint AS dead_lettered,
       sum(o.live_leases)::bigint AS live_leases, sum(o.expired_leases)::bigint AS expired_leases,
       count(*) FILTER (WHERE o.paused)::bigint AS paused_scopes,
       coalesce(extract(epoch FROM clock_timestamp() - min(o.oldest_due_at)), 0)::float8
           AS oldest_due_age
  FROM zeroth.scope_overview o
 GROUP BY o.deployment_ref
 ORDER BY o.deployment_ref
"""


class _Rows(Collector):
    """The families of one scrape's rows (a registry of its own per scrape: nothing is kept
    between scrapes, so a deployment that left the overview leaves the output)."""

    def __init__(self, rows: Sequence[asyncpg.Record | dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "zeroth_fleet_runs", "Runs per deployment and state, from zeroth.scope_overview "
            "(pending = due + scheduled; failed: ended failed without a dead letter; "
            "dead_lettered: failed after max_attempts).", labels=["deployment", "state"])
        live = GaugeMetricFamily("zeroth_fleet_live_leases", "Runs holding a live lease.",
                                 labels=["deployment"])
        expired = GaugeMetricFamily(
            "zeroth_fleet_expired_leases", "Pending or running runs whose lease expired and that "
            "nobody took yet: orphans of a crashed worker awaiting an orphan sweep, and lapsed "
            "claims.", labels=["deployment"])
        oldest = GaugeMetricFamily(
            "zeroth_fleet_oldest_due_age_seconds", "How long the oldest due run nobody holds "
            "has waited (0: none due).", labels=["deployment"])
        paused = GaugeMetricFamily("zeroth_fleet_paused_scopes",
                                   "Scopes of the deployment paused in zeroth.scope_limits.",
                                   labels=["deployment"])
        for row in self.rows:
            deployment = str(row["deployment_ref"])
            for state in STATES:
                runs.add_metric([deployment, state], float(row[state] or 0))
            live.add_metric([deployment], float(row["live_leases"] or 0))
            expired.add_metric([deployment], float(row["expired_leases"] or 0))
            oldest.add_metric([deployment], max(0.0, float(row["oldest_due_age"] or 0)))
            paused.add_metric([deployment], float(row["paused_scopes"] or 0))
        yield from (runs, live, expired, oldest, paused)


def render(rows: Sequence[asyncpg.Record | dict[str, Any]]) -> bytes:
    """The Prometheus text exposition of :data:`QUERY`'s ``rows``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Rows(rows))
    return generate_latest(registry)


async def scrape(pool: asyncpg.Pool) -> bytes:
    """Read the overview once and render it (a database error propagates: the scrape fails,
    and Prometheus's ``up`` says so)."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(QUERY)
    return render(rows)


# -- the standalone exporter (zeroth-pg metrics) ---------------------------------------------

_MAX_REQUEST_BYTES = 8192  # the request line and headers of a scrape; anything longer is refused
_READ_TIMEOUT = 10.0


def _host_header(head: bytes) -> str:
    """The Host header of a request head ('' without one)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"host":
            return value.strip().decode("latin-1")
    return ""


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  pool: asyncpg.Pool, allowed: frozenset[str]) -> None:
    status, body, ctype = "500 Internal Server Error", b"", "text/plain; charset=utf-8"
    try:
        with contextlib.suppress(asyncio.TimeoutError, asyncio.IncompleteReadError,
                                 asyncio.LimitOverrunError, ConnectionError):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].split()
            method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
            path = target.split(b"?", 1)[0]
            if not host_allowed(_host_header(head), allowed):
                # DNS rebinding: a page whose name points at this address reads it as its own
                # origin unless the Host it sends is refused (as the dashboard does).
                status, body = "421 Misdirected Request", b"this exporter does not answer to " \
                    b"that Host; start it with --allowed-host NAME\n"
            elif method not in (b"GET", b"HEAD"):
                status, body = "405 Method Not Allowed", b"GET /metrics\n"
            elif path == b"/metrics":
                try:
                    body, ctype, status = await scrape(pool), CONTENT_TYPE, "200 OK"
                except Exception as exc:  # the database's error, a lost connection, ...
                    log.warning("zeroth-pg metrics: the scrape failed: %s: %s",
                                type(exc).__name__, exc)
                    body = f"the database read failed: {type(exc).__name__}\n".encode()
            elif path == b"/":
                status, body = "200 OK", b"zeroth-pg metrics: GET /metrics\n"
            else:
                status, body = "404 Not Found", b"not found: GET /metrics\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + (b"" if method == b"HEAD" else body))
            await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def serve(dsn: str, *, host: str = "127.0.0.1", port: int = 9641,
                allowed_hosts: Sequence[str] = (),
                on_ready: Callable[[int], Awaitable[None] | None] | None = None) -> None:
    """Serve ``GET /metrics`` (the fleet's gauges, read at each scrape) on ``host:port`` until
    cancelled; ``on_ready`` gets the bound port (``port`` 0: any free one). Answers only a Host
    that is a loopback name, the bound address or one of ``allowed_hosts`` (421 otherwise)."""
    allowed = frozenset(host_name(h) for h in (*LOOPBACK_HOSTS, *allowed_hosts, host)
                        if h.strip() and h not in ("0.0.0.0", "::"))
    # It only reads: a hot standby serves it (docs/scaling.md).
    pool = await create_pool(dsn, min_size=1, max_size=2, reads_only=True,
                             server_settings={"application_name": "zeroth-pg metrics"})
    try:
        server = await asyncio.start_server(
            lambda r, w: _answer(r, w, pool, allowed), host, port, limit=_MAX_REQUEST_BYTES)
        async with server:
            bound = server.sockets[0].getsockname()[1]
            if on_ready is not None:
                ready = on_ready(bound)
                if ready is not None:
                    await ready
            await server.serve_forever()
    finally:
        await pool.close()
