"""Connections that land on a writable server, whatever a pooler in front of it reports
(issue 35): the one home of every asyncpg connection and pool zeroth_pg opens.

asyncpg (like libpq) picks a host of a multi-host DSN with ``target_session_attrs=read-write``
from the ``in_hot_standby`` and ``default_transaction_read_only`` values the server reports at
connection start. PgBouncer (1.18, Debian 12) reports those of the *first* server connection of
its pool, cached: after a switchover the PgBouncer of the demoted primary still says
"read-write", and the PgBouncer of the promoted standby still says "standby". Trusting them
kept a whole worker fleet on a standby, every write refused with SQLSTATE 25006, until the
PgBouncer was restarted (docs/dba-guide.md, "PgBouncer in front").

So when a DSN asks for a writable server (``target_session_attrs`` ``read-write`` or
``primary``, from the DSN, the keyword, the DSN's connection service (``?service=``, a
``pg_service.conf`` section: its hosts count too) or ``PGTARGETSESSIONATTRS``; or several hosts
and no ``target_session_attrs`` at all), :func:`connect` and the pools of :func:`create_pool` do
not trust the reported values: they connect to each host in turn (the last one found writable
first; the next one 0.25 s after the one before, or as soon as it answered that it cannot write,
so that a host that holds the check — a PgBouncer queueing it while its server restarts — does
not hold up the others), ask the server itself (``pg_is_in_recovery()``,
``transaction_read_only``: a query, which PgBouncer passes to the real server) and keep the
first that can write; a host that cannot is logged. A check that is no longer needed, or that
got no answer within the connection's ``timeout``, is never cancelled in flight (asyncpg's
cancel request, dropped half-way, crashed PgBouncer 1.18; asyncpg's own query timeout sends one
too): its connection is terminated. An attempt still connecting is cancelled, but never in the
turn or two where asyncpg would leave a future nobody awaits (:func:`_connect_to_the_end`). When
no host can, they wait and try again a few times with a
growing pause (0.25 s doubling to 5 s) shared by every caller of the pool (no busy loop while
every host is a standby), then raise :class:`NoWritableServerError`, an asyncpg
``TargetServerAttributeNotMatched`` (what asyncpg raises when no host matches), which zeroth_pg
takes as a lost connection: retryable. During the pause the connections of the last pass that
answered but could not write are asked again every 0.1 s (one caller asks, the others wait for
it): as soon as one can write (a standby was promoted) or is lost (its server restarted or was
demoted), the pause ends (no sooner than 0.25 s after it began) and the next pass comes at
once, so a promotion is not left unused until a pause grown during the outage is over; they
are closed by the next pass, or soon after the pause. (Through a PgBouncer per node, a
pg_auto_failover switchover's first claim on the new primary came 1.9 and 2.4 s after the
promotion while the fleet waited out such pauses, or for the old primary's PgBouncer to answer:
issue 35, docs/dba-guide.md.)

A pooled connection that was writable when it opened may stop being so (a promoted standby
that a manager keeps read-only, a server demoted behind a transaction-pooling PgBouncer that
keeps the client's connection). A connection on which a statement fails with 25006
(``read_only_sql_transaction``) is therefore checked again when it goes back to the pool and
closed when its server (or session) cannot write, so the next acquire opens a new one, through
the check above; a refusal by a read-only transaction of the caller's own keeps it.

Any other DSN (one host without ``target_session_attrs``, or ``any``, ``standby``,
``read-only``, ``prefer-standby``) passes to asyncpg unchanged.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import contextvars
import logging
import os
import random
import socket
import time
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import asyncpg.exceptions

from zeroth_pg._libpq import asyncpg_dsn

__all__ = ["NoWritableServerError", "connect", "create_pool", "wanted_role"]

log = logging.getLogger("zeroth_pg.connect")

#: ``target_session_attrs`` values that need a server that takes writes, and what each checks:
#: ``read-write`` also refuses a primary kept ``default_transaction_read_only`` (pg_auto_failover
#: does so until its monitor has made the promoted node a primary).
_WRITABLE = {"read-write": "read-write", "primary": "primary"}
#: Passes over every host one call makes before it gives up, and the pauses between them.
_PASSES = 3
#: asyncpg.connect's default ``timeout``: also the longest wait for a server's answer to the check.
_CONNECT_TIMEOUT_S = 60.0
_FIRST_PAUSE_S = 0.25
_MAX_PAUSE_S = 5.0
#: During a pause, how often the connections of the last pass that answered but could not write
#: are asked again (:meth:`_Hosts.wait`): a promotion ends the pause within about this long.
_WATCH_S = 0.1
#: How long a pass waits for a host's answer before it tries the next one as well.
_STAGGER_S = 0.25
#: The connection errors after which the next host is tried (as asyncpg and libpq do); any other
#: error (authentication, a database that does not exist, bad options) is raised at once.
_NEXT_HOST_ERRORS: tuple[type[BaseException], ...] = (
    OSError, TimeoutError, asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.ConnectionDoesNotExistError, asyncpg.exceptions.AdminShutdownError,
)
#: SQLSTATE read_only_sql_transaction: a write on a server that is not (or no longer) writable.
_READ_ONLY = "25006"

_CHECK = ("SELECT pg_catalog.pg_is_in_recovery() AS in_recovery,"
          " pg_catalog.current_setting('transaction_read_only') AS read_only")

#: What :func:`connect` calls learnt of each DSN's hosts (:class:`_Hosts`), by DSN and role.
_CONNECT_STATES: dict[tuple[str, str, str, str], _Hosts] = {}

#: Connections on which a statement was refused with 25006: closed when released to their pool.
_REFUSED_WRITES: weakref.WeakSet[asyncpg.Connection] = weakref.WeakSet()


class NoWritableServerError(asyncpg.exceptions.TargetServerAttributeNotMatched):  # type: ignore[misc]
    """No host of the DSN could take writes after every try (each was unreachable, in
    recovery or read-only). The message names each host and why, never the DSN's password."""


def wanted_role(dsn: str, *, reads_only: bool = False, **kwargs: Any) -> str | None:
    """``read-write`` or ``primary`` when connections to ``dsn`` (an asyncpg URI) must be able
    to write, as asyncpg reads ``target_session_attrs`` (the keyword, then the DSN's, then
    ``PGTARGETSESSIONATTRS``); ``read-write`` too for several hosts with none set (zeroth_pg
    writes: the first host that answers is not enough) unless the caller ``reads_only`` (a
    dashboard without actions, the fleet metrics: a hot standby serves them, docs/scaling.md,
    and libpq's ``any``, the first host that answers, applies); None otherwise."""
    query = _query(dsn)
    attrs = kwargs.get("target_session_attrs") or query.get("target_session_attrs") or \
        _service(dsn, kwargs).get("target_session_attrs") or \
        os.environ.get("PGTARGETSESSIONATTRS")
    if attrs:
        return _WRITABLE.get(str(attrs).strip().lower())
    return "read-write" if not reads_only and len(_hosts(dsn, kwargs)) > 1 else None


def _query(dsn: str) -> dict[str, str]:
    parts = urllib.parse.urlsplit(dsn)
    return {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query).items()}


def _service(dsn: str, kwargs: dict[str, Any]) -> dict[str, str]:
    """The parameters of the connection service ``dsn`` or ``kwargs`` name (``service``), read
    from the file asyncpg reads (``servicefile``, ``PGSERVICEFILE``, ``~/.pg_service.conf``);
    empty when none is named or found."""
    name = kwargs.get("service") or _query(dsn).get("service")
    if not name:
        return {}
    path = kwargs.get("servicefile") or os.environ.get("PGSERVICEFILE") or \
        os.path.join(os.path.expanduser("~"), ".pg_service.conf")
    parser = configparser.ConfigParser()
    parser.read(str(path))
    return dict(parser[name]) if parser.has_section(name) else {}


def _hosts(dsn: str, kwargs: dict[str, Any]) -> list[tuple[str, int]]:
    """The (host, port) list asyncpg would try for ``dsn`` and ``kwargs``, in order (the
    keywords, else the URI's host list, else its ``host=`` query, else the service file's,
    else ``PGHOST``); empty when nothing names a host (asyncpg's defaults then apply)."""
    port_arg = kwargs.get("port")
    ports: list[int] = ([int(p) for p in port_arg] if isinstance(port_arg, list | tuple)
                        else [int(port_arg)] if port_arg else [])
    host_arg = kwargs.get("host")
    if host_arg:
        return _pair(list(host_arg) if isinstance(host_arg, list | tuple)
                     else str(host_arg).split(","), ports)
    spec = urllib.parse.urlsplit(dsn).netloc.rpartition("@")[2]
    if spec:
        return _pair([urllib.parse.unquote(e) for e in spec.split(",")], ports)
    query = _query(dsn)
    if not ports and query.get("port"):
        ports = [int(p) for p in query["port"].split(",") if p]
    if query.get("host"):
        return _pair(query["host"].split(","), ports)
    service = _service(dsn, kwargs)
    if not ports and service.get("port"):
        ports = [int(p) for p in service["port"].split(",") if p]
    if service.get("host"):
        return _pair(service["host"].split(","), ports)
    if os.environ.get("PGHOST"):
        return _pair(os.environ["PGHOST"].split(","), ports)
    return []


def _entry(spec: str) -> tuple[str, int | None]:
    """One host of a list as asyncpg reads it: ``/socket/dir``, ``[v6]:port``, ``name:port``,
    each port optional."""
    spec = spec.strip()
    if spec.startswith("/"):
        return spec, None
    if spec.startswith("["):
        name, _, rest = spec[1:].partition("]")
        return name, int(rest[1:]) if rest.startswith(":") and rest[1:] else None
    name, _, port = spec.partition(":")
    return name, int(port) if port else None


def _default_ports(count: int) -> list[int]:
    spec = os.environ.get("PGPORT")
    if not spec:
        return [5432] * count
    found = [int(p) for p in spec.split(",")]
    return found * count if len(found) == 1 else found


def _pair(specs: list[str], ports: list[int]) -> list[tuple[str, int]]:
    """Each host with its port: the explicit ports (one for all, or one each), else the host's
    own, else ``PGPORT`` or 5432."""
    entries = [_entry(s) for s in specs if s.strip()]
    if len(ports) == 1:
        ports = ports * len(entries)
    if ports and len(ports) != len(entries):
        raise asyncpg.exceptions.ClientConfigurationError(
            f"the connection string names {len(entries)} hosts and {len(ports)} ports")
    default = ports or _default_ports(len(entries))
    if len(default) != len(entries):
        raise asyncpg.exceptions.ClientConfigurationError(
            f"PGPORT names {len(default)} ports for {len(entries)} hosts")
    return [(name, port if port is not None and not ports else default[i])
            for i, (name, port) in enumerate(entries)]


def _where(host: tuple[str, int] | None) -> str:
    if host is None:
        return "the default host"
    name, port = host
    if name.startswith("/"):
        return f"{name.rstrip('/')}/.s.PGSQL.{port}"
    return f"[{name}]:{port}" if ":" in name else f"{name}:{port}"


@dataclass(slots=True)
class _Hosts:
    """What one pool (or one :func:`connect` call) has learnt about its hosts: the one found
    writable last (tried first), and until when every host was found unable to write (no caller
    tries again before then)."""

    role: str
    last_good: tuple[str, int] | None = None
    quiet_until: float = 0.0
    pause: float = _FIRST_PAUSE_S
    reported: dict[str, str] = field(default_factory=dict)
    #: The outage logged last (every host and why): logged again only when it changes.
    outage: str = ""
    #: The pass over the hosts under way (its result: a writable host found), that concurrent
    #: callers wait for instead of going over the hosts themselves; and why the last one failed.
    probe: asyncio.Future[bool | None] | None = None
    last_why: list[str] = field(default_factory=list)
    #: When the pause under way began; the connections of the last pass that answered but could
    #: not write, asked again during the pause; the caller doing so, that the others wait for.
    paused_at: float = 0.0
    watched: list[asyncpg.Connection] = field(default_factory=list)
    watcher: asyncio.Future[None] | None = None

    def order(self, hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """``hosts`` with the one found writable last first."""
        return sorted(hosts, key=lambda host: host != self.last_good)

    def report(self, where: str, why: str) -> None:
        """Log a host that cannot write once per change of its state, not at every try."""
        if self.reported.get(where) != why:
            self.reported[where] = why
            log.warning("%s accepted the connection but cannot take writes (%s): trying the "
                        "other hosts. A pooler in front of it may report a stale role "
                        "(docs/dba-guide.md, \"PgBouncer in front\")", where, why)

    def found(self, host: tuple[str, int] | None, where: str) -> None:
        if self.reported.pop(where, None) is not None or self.quiet_until:
            log.info("%s takes writes: connections go there", where)
        self.last_good, self.quiet_until, self.pause = host, 0.0, _FIRST_PAUSE_S
        self.outage = ""
        self.watch([])

    def none_found(self, why: list[str]) -> float:
        """No host could write: the pause before the next pass (shared by every caller, and
        by the next call when this one gives up). Logged as a warning once per change of the
        hosts' states, at DEBUG at every other pass."""
        now = time.monotonic()
        if self.quiet_until <= now:
            wait = self.pause * random.uniform(0.8, 1.2)
            self.paused_at, self.quiet_until = now, now + wait
            self.pause = min(self.pause * 2, _MAX_PAUSE_S)
            outage = "; ".join(why)
            level = logging.WARNING if outage != self.outage else logging.DEBUG
            self.outage = outage
            log.log(level, "no writable server among %d host(s) (%s); next try in %.1f s",
                    len(why), outage, wait)
        return max(0.0, self.quiet_until - now)

    def watch(self, conns: list[asyncpg.Connection]) -> None:
        """Keep ``conns`` (each answered the check but could not write) to ask again during
        the pause (:meth:`wait`), instead of those kept before, which are closed. Each is
        closed by the next pass, or soon after the pause it was kept for when no caller came
        to wait (the pool was closed, or is idle): never kept for long."""
        for conn in self.watched:
            if conn not in conns:
                _terminate(conn)
        self.watched = conns
        if conns:
            left = max(0.0, self.quiet_until - time.monotonic())
            asyncio.get_running_loop().call_later(left + 1.0, self._expire, conns)

    def _expire(self, conns: list[asyncpg.Connection]) -> None:
        if self.watched is conns:
            self.watch([])

    async def wait(self) -> None:
        """Until the pause is over, or over early: one of the connections kept by
        :meth:`watch` can write (a standby was promoted, a read-only primary made writable)
        or was lost (its server restarted or went away: a state changed), no sooner than
        ``_FIRST_PAUSE_S`` after the pause began. A grown pause (up to ``_MAX_PAUSE_S``) thus
        spares the hosts a pass of new connections and checks while nothing changes, without
        leaving a new primary unused for up to that long. One caller asks (every ``_WATCH_S``,
        one query per kept connection); the others wait for it."""
        loop = asyncio.get_running_loop()
        while (left := self.quiet_until - time.monotonic()) > 0:
            watcher = self.watcher
            if watcher is not None and not watcher.done() and watcher.get_loop() is loop:
                await asyncio.shield(watcher)
                continue
            conns = [conn for conn in self.watched if not conn.is_closed()
                     and getattr(conn, "_loop", None) is loop]
            if not conns:
                # In steps: another caller may find a writable host meanwhile (found() ends the
                # pause for every caller, and closes the watched connections, which ends a
                # watcher's wait too); one sleep of the whole pause
                # left a promoted server unused for up to a second (a Patroni switchover, issue
                # 35: a renewal asleep here missed its lease deadline on the new primary).
                await asyncio.sleep(min(left, _WATCH_S))
                continue
            self.watcher = future = loop.create_future()
            try:
                await self._watch(conns, left)
            finally:
                if self.watcher is future:
                    self.watcher = None
                future.set_result(None)

    async def _watch(self, conns: list[asyncpg.Connection], left: float) -> None:
        async def changed(conn: asyncpg.Connection) -> None:
            while True:
                await asyncio.sleep(_WATCH_S)
                try:
                    if await _ask(conn, self.role, max(_WATCH_S, left)) is None:
                        return  # it takes writes now
                except asyncio.CancelledError:
                    raise
                except TimeoutError:
                    await asyncio.Event().wait()  # hung (its connection closed): no news
                except Exception:
                    if conn.is_closed():
                        return  # lost: its server restarted, was demoted, went away
                    # Hung (a timeout) or busy: no news from this one.
                    await asyncio.Event().wait()

        tasks = [asyncio.get_running_loop().create_task(changed(conn)) for conn in conns]
        try:
            done, _ = await asyncio.wait(tasks, timeout=left,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if done:
            now = time.monotonic()
            earliest = self.paused_at + _FIRST_PAUSE_S
            if self.quiet_until > max(now, earliest):
                log.debug("a host that could not take writes changed state: trying the hosts "
                          "again now")
                self.quiet_until = max(now, earliest)


def _terminate(conn: asyncpg.Connection) -> None:
    """``conn.terminate()`` from any event loop: a connection kept (:meth:`_Hosts.watch`) by a
    caller on another loop (a CLI command per ``asyncio.run``, a test, a restarted loop) is
    terminated on its own loop, and one whose loop is closed is only dropped (nothing can run
    there: terminating it raised "Event loop is closed" into the caller's connect)."""
    loop = getattr(conn, "_loop", None)
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or loop is running:
        conn.terminate()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(conn.terminate)


async def _writable(conn: asyncpg.Connection, role: str) -> str | None:
    """None when ``conn``'s server takes writes as ``role`` asks, else why not. No timeout of
    asyncpg's own (which sends a cancel request): :func:`_ask` bounds the wait."""
    row = await conn.fetchrow(_CHECK)
    assert row is not None
    if row["in_recovery"]:
        return "in recovery: a standby"
    if role == "read-write" and row["read_only"] != "off":
        return "transaction_read_only is on"
    return None


async def _ask(conn: asyncpg.Connection, role: str, wait_s: float) -> str | None:
    """:func:`_writable` for the tasks a pass or a pause abandons: a cancellation does not reach
    the query (asyncpg would send the server a cancel request, on a new connection that it may
    drop half-way, on which PgBouncer 1.18 crashed: "FATAL … disconnect_client(): bad client
    state: 0", every PgBouncer of a soak in turn); the query finishes by itself, or fails when
    its connection is terminated. A server that let the client in but does not answer within
    ``wait_s`` (the connection's timeout: a host hung after the login, a PgBouncer PAUSEd):
    the connection is terminated (not cancelled, nor by asyncpg's own timeout, which sends a
    cancel request too) and TimeoutError raised, so the next host is tried."""
    inner = asyncio.ensure_future(_writable(conn, role))
    inner.add_done_callback(_retrieved)
    try:
        async with asyncio.timeout(wait_s):
            return await asyncio.shield(inner)
    except TimeoutError:
        conn.terminate()
        raise


#: TCP keepalives and TCP_USER_TIMEOUT on every TCP connection zeroth_pg opens (asyncpg has no
#: option for them; libpq's ``keepalives*`` and ``tcp_user_timeout``): a server cut off by a
#: partition that drops packets is noticed by the kernel, so an idle pooled connection (or one
#: whose close waits for the server's goodbye) fails instead of waiting for hours of TCP
#: retransmissions. A frozen server on a reachable host (SIGSTOP, a hung postmaster) still
#: acknowledges both at the TCP level: the calls' own bound covers that (zeroth_pg._bounded).
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_COUNT = 10, 5, 3
_TCP_USER_TIMEOUT_MS = 30_000


def _keepalive(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Set :data:`_TCP_USER_TIMEOUT_MS` and the keepalives on ``conn``'s socket when it is a
    TCP one (not a Unix socket), where the platform has the options (Linux has all)."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return conn
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
                        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", _KEEPALIVE_COUNT),
                        ("TCP_USER_TIMEOUT", _TCP_USER_TIMEOUT_MS)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)
    return conn


async def _connect_to_the_end(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect(dsn, **kwargs)`` (with :func:`_keepalive`) whose cancellation never
    lands where asyncpg leaves a future behind: a caller cancelled meanwhile (a pass that found
    another host, a call's bound giving up a pool acquire) gets its CancelledError at once, and
    the connect is cancelled as soon as that is safe (:func:`_cancel_when_safe`: at once but
    for a turn or two of the event loop); a connection it opened meanwhile is terminated, an
    error it raised is retrieved.

    Why: asyncpg (0.32) reads the server's answer to the SSL request (``sslmode=prefer``, the
    default over TCP) through a throw-away protocol whose future nobody awaits if the connect
    is cancelled after the TCP connection was made and before ``loop.create_connection``
    returned. Closing that transport then sets the future to ``ConnectionError("unexpected
    connection_lost() call")``, and asyncio logs "Future exception was never retrieved" at
    ERROR: 0 to 5 times per worker process in every HA test (issue 35;
    tests/client/test_abandoned_connects.py). Not left to run to its end either: its
    ``timeout`` (an hour, for some callers) would keep a hung host's login open that long."""
    task = asyncio.ensure_future(asyncpg.connect(dsn, **kwargs))
    try:
        return _keepalive(await asyncio.shield(task))
    except asyncio.CancelledError:
        task.add_done_callback(_close_abandoned)
        _cancel_when_safe(task, time.monotonic() + _SAFE_CANCEL_WAIT_S)
        raise


#: How long an abandoned connect's cancellation is put off at most while it is opening a
#: transport (:func:`_cancel_when_safe`): a plain TCP transport is open within a turn of the
#: event loop; a direct-TLS one waits for its handshake, which a hung host never answers.
_SAFE_CANCEL_WAIT_S = 1.0


def _cancel_when_safe(task: asyncio.Future[Any], until: float) -> None:
    """Cancel the abandoned connect ``task``, except while it is inside asyncio's
    ``_create_connection_transport`` (the protocol made, the transport not yet handed back:
    :func:`_connect_to_the_end`): then look again 10 ms later, up to ``until``."""
    if task.done():
        return
    if _opening_transport(task) and time.monotonic() < until:
        task.get_loop().call_later(0.01, _cancel_when_safe, task, until)
        return
    task.cancel()


def _opening_transport(task: asyncio.Future[Any]) -> bool:
    """Whether ``task``'s chain of awaited coroutines is inside asyncio's
    ``_create_connection_transport`` (a loop written in C, uvloop's, shows no such frame)."""
    get_coro = getattr(task, "get_coro", None)
    awaited = get_coro() if get_coro is not None else None
    while awaited is not None:
        code = getattr(awaited, "cr_code", None)
        if code is not None and code.co_name == "_create_connection_transport":
            return True
        awaited = getattr(awaited, "cr_await", None)
    return False


def _close_abandoned(task: asyncio.Future[asyncpg.Connection]) -> None:
    """Done callback of a connect nobody waits for any more: its connection closed (no goodbye
    to wait for), its error retrieved."""
    if task.cancelled():
        return
    if task.exception() is None:
        task.result().terminate()


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned check's error is not worth a warning


def _watch_refused_writes(conn: asyncpg.Connection) -> None:
    """Mark ``conn`` once a statement on it is refused with 25006 (asyncpg calls its query
    loggers soon after each statement, before a release of the connection can run)."""
    ref = weakref.ref(conn)

    def logged(record: Any) -> None:
        exc = getattr(record, "exception", None)
        if getattr(exc, "sqlstate", None) == _READ_ONLY and (found := ref()) is not None:
            _REFUSED_WRITES.add(found)

    conn.add_query_logger(logged)


@dataclass(slots=True)
class _Pass:
    """One pass over every host: the writable connection found, else why each host failed."""

    conn: asyncpg.Connection | None = None
    why: list[str] = field(default_factory=list)
    reached: int = 0
    last_error: BaseException | None = None
    #: The connections that answered but could not write (to watch during the pause).
    refusing: list[asyncpg.Connection] = field(default_factory=list)


async def _one_pass(state: _Hosts, dsn: str, kwargs: dict[str, Any]) -> _Pass:
    found = _Pass()
    try:
        await _pass_over(state, dsn, kwargs, found)
    except BaseException:
        for conn in found.refusing:
            conn.terminate()
        if found.conn is not None:
            # Found, then the caller was cancelled while the others were being closed: the
            # connection is nobody's to close but this pass's.
            found.conn.terminate()
        raise
    if found.conn is not None:
        for conn in found.refusing:
            conn.terminate()  # no goodbye to wait for (a standby may hang soon)
        found.refusing = []
    return found


async def _pass_over(state: _Hosts, dsn: str, kwargs: dict[str, Any], found: _Pass) -> None:
    """Each host in turn (the one found writable last first), each next one ``_STAGGER_S``
    after the one before or as soon as that one answered that it cannot write: the first whose
    server takes writes wins and the others are abandoned. A host that lets the client in and
    then holds the check (a PgBouncer whose server is restarting queues the query until it is
    back; a hung host) so delays the next ones by ``_STAGGER_S``, not by its timeout. While one
    has not answered, those that cannot write are asked again every ``_WATCH_S`` (a standby
    promoted meanwhile wins); once every host has answered, the pass ends."""
    candidates: list[tuple[str, int] | None] = \
        list(state.order(_hosts(dsn, kwargs))) or [None]
    wait_s = float(kwargs.get("timeout") or _CONNECT_TIMEOUT_S)
    loop = asyncio.get_running_loop()
    unanswered = len(candidates)
    settled = asyncio.Event()  # every host answered: the pass ends
    opened: dict[int, asyncpg.Connection] = {}  # each attempt's connection, once open
    answered_one = asyncio.Event()  # some host answered: start the next one now

    def answered() -> None:
        nonlocal unanswered
        unanswered -= 1
        answered_one.set()
        if unanswered == 0:
            settled.set()

    async def attempt(index: int, host: tuple[str, int] | None) -> asyncpg.Connection | None:
        where = _where(host)
        overrides: dict[str, Any] = {"target_session_attrs": "any"}
        if host is not None:
            overrides.update(host=host[0], port=host[1])
        try:
            conn = await _connect_to_the_end(dsn, **{**kwargs, **overrides})
        except _NEXT_HOST_ERRORS as exc:
            found.last_error = exc
            found.why.append(f"{where}: unreachable ({type(exc).__name__})")
            answered()
            return None
        opened[index] = conn
        first = True
        try:
            while True:
                try:
                    refusal = await _ask(conn, state.role, wait_s)
                except (*_NEXT_HOST_ERRORS, asyncpg.exceptions.PostgresError,
                        asyncpg.exceptions.InterfaceError) as exc:
                    conn.terminate()
                    if first:
                        found.last_error = exc
                        found.why.append(f"{where}: unreachable ({type(exc).__name__})")
                        answered()
                    return None
                if refusal is None:
                    if first:
                        found.reached += 1
                    else:
                        found.refusing.remove(conn)  # it takes writes now: not to be closed
                    state.found(host, where)
                    return conn
                if first:
                    first = False
                    found.reached += 1
                    found.refusing.append(conn)  # watched during the pause, then terminated
                    state.report(where, refusal)
                    found.why.append(f"{where}: {refusal}")
                    answered()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_WATCH_S):
                        await settled.wait()
                if settled.is_set():
                    return None
        except BaseException:
            if first:
                conn.terminate()
            raise

    tasks: list[asyncio.Task[asyncpg.Connection | None]] = []
    ended = loop.create_task(settled.wait())

    def winner(done: set[Any]) -> asyncpg.Connection | None:
        for task in done:
            if task is not ended and (conn := task.result()) is not None:
                return conn
        return None

    try:
        for index, host in enumerate(candidates):
            answered_one.clear()
            tasks.append(loop.create_task(attempt(index, host)))
            if index == len(candidates) - 1:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STAGGER_S):
                    await answered_one.wait()
            if (conn := winner({task for task in tasks if task.done()})) is not None:
                found.conn = conn
                break
        pending: set[Any] = {*tasks, ended}
        while found.conn is None and not ended.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            found.conn = winner(done)
        if found.conn is not None:
            _watch_refused_writes(found.conn)
    finally:
        ended.cancel()
        if found.conn is None and settled.is_set():
            # Every host answered: those asking again stop after their current question.
            await asyncio.wait(tasks, timeout=1.0)
        for index, task in enumerate(tasks):
            if not task.done():
                if (conn := opened.get(index)) is not None and (
                        found.conn is not None or conn not in found.refusing):
                    conn.terminate()  # no cancel request: its query fails
                task.cancel()
        def close_spares(gathered: asyncio.Future[list[Any]]) -> None:
            if not gathered.cancelled():
                for result in gathered.result():
                    if isinstance(result, asyncpg.Connection) and result is not found.conn:
                        result.terminate()  # a second host that takes writes: not needed

        # Shielded: a caller cancelled meanwhile still has every task's connection closed.
        spares = asyncio.gather(*tasks, return_exceptions=True)
        spares.add_done_callback(close_spares)
        await asyncio.shield(spares)


async def _open(state: _Hosts, dsn: str, kwargs: dict[str, Any]) -> asyncpg.Connection:
    why: list[str] = []
    for number in range(_PASSES):
        await state.wait()
        loop = asyncio.get_running_loop()
        probe = state.probe
        # Another caller going over the hosts: its pass counts as this caller's too (concurrent
        # acquires during an outage probe each host once per pass, not once per caller). When
        # it found a writable host, this caller connects there (it is tried first). When its
        # pass did not end (that caller was cancelled, or failed), the first waiter to go on
        # starts the next pass and the others wait for that one, not one pass each.
        shared: bool | None = None
        while probe is not None and not probe.done() and probe.get_loop() is loop:
            shared = await asyncio.shield(probe)
            if shared is not None:
                break
            probe = state.probe
        if shared is False:
            why = state.last_why
            state.none_found(why)
            if number < _PASSES - 1:
                await state.wait()
            continue
        state.probe = probe = loop.create_future()
        writable: bool | None = None  # None: the pass did not end (cancelled, an error)
        try:
            found = await _one_pass(state, dsn, kwargs)
            writable = found.conn is not None
            if not writable:
                state.last_why = found.why
        finally:
            if state.probe is probe:
                state.probe = None
            # Those waiting go on: to the host found (tried first), to the pause, or (the pass
            # did not end) to a pass of their own.
            probe.set_result(writable)
        if found.conn is not None:
            return found.conn
        why = found.why
        if found.reached == 0 and found.last_error is not None:
            raise found.last_error  # every host down: asyncpg's own answer, at once
        state.none_found(why)
        state.watch(found.refusing)
        if number < _PASSES - 1:
            await state.wait()
    raise NoWritableServerError(
        f"no server that takes writes among the {len(why)} host(s) of the connection string "
        f"after {_PASSES} tries ({'; '.join(why)})")


async def connect(dsn: str, *, reads_only: bool = False, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect(dsn, **kwargs)`` for zeroth_pg: ``dsn`` in any form (a URI or libpq
    ``key=value``: :func:`~zeroth_pg.asyncpg_dsn`); when it asks for a writable server, the
    connection is to a server that takes writes by its own answer, whatever a pooler in front
    reports (module docstring). ``reads_only``: the caller never writes, so several hosts
    without ``target_session_attrs`` mean the first that answers, as in libpq
    (:func:`wanted_role`)."""
    url = asyncpg_dsn(dsn)
    role = wanted_role(url, reads_only=reads_only, **kwargs)
    if role is None:
        return await _connect_to_the_end(url, **kwargs)
    # What earlier calls learnt of these hosts (the writable one, the pause, what was logged):
    # a caller that reconnects again and again (a listener) shares it as a pool's connects do.
    key = (url, role, repr(kwargs.get("host")), repr(kwargs.get("port")))
    state = _CONNECT_STATES.get(key)
    if state is None:
        if len(_CONNECT_STATES) >= 64:  # bounded: a process connects to a few DSNs
            _CONNECT_STATES.clear()
        state = _CONNECT_STATES[key] = _Hosts(role)
    return await _open(state, url, kwargs)


class _Connector:
    """The ``connect=`` of a pool: :func:`_open` with what this pool has learnt of its hosts."""

    def __init__(self, role: str) -> None:
        self.state = _Hosts(role)

    async def __call__(self, dsn: str, **kwargs: Any) -> asyncpg.Connection:
        return await _open(self.state, dsn, kwargs)


def _discarding_reset(
    reset: Callable[[asyncpg.Connection], Awaitable[None]] | None, role: str,
) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """The pool's ``reset=``: a connection that was refused a write as read-only and whose
    server (or session) no longer takes writes as ``role`` asks is closed instead of kept (the
    pool opens a new one, checked, at the next acquire); any other goes through ``reset``
    (asyncpg's default reset query when None). The check keeps a connection refused by a
    read-only transaction of its caller's own (``SET TRANSACTION READ ONLY``) on a server that
    takes writes."""

    async def release(conn: asyncpg.Connection) -> None:
        if conn in _REFUSED_WRITES:
            _REFUSED_WRITES.discard(conn)
            if (why := await _ask(conn, role, _CONNECT_TIMEOUT_S)) is not None:
                log.info("a connection was refused a write as read-only (SQLSTATE 25006; %s): "
                         "closed, the next one will look for a server that takes writes", why)
                conn.terminate()
                return
        await (reset or _reset_checking_client)(conn)

    return release


#: Every pooled connection's session asks its server to notice a client that is gone while a
#: statement runs (PostgreSQL 14+; otherwise a backend notices only when it next writes to the
#: client): a call abandoned at its bound (:mod:`zeroth_pg._bounded`: its connection
#: terminated) then ends within this interval, rolled back, instead of waiting out a lock or a
#: slow plan and committing what its caller no longer knows of — a claim's leases, for one —
#: while each retry adds another backend to the pile. A SET, not a startup parameter:
#: PgBouncer refuses unknown startup parameters.
CHECK_CLIENT = "SET client_connection_check_interval = '1s'"


#: Set while zeroth_pg gives back a connection that one of its own calls left as it found it
#: (:func:`released_as_found`).
_AS_FOUND: contextvars.ContextVar[bool] = contextvars.ContextVar("zeroth_pg_as_found",
                                                                 default=False)


@contextlib.contextmanager
def released_as_found() -> Iterator[None]:
    """Around ``pool.release(conn)`` of a connection whose only use since its acquire was one
    statement of zeroth_pg's SQL API, answered (or refused by the server, so rolled back): the
    pool's default reset then sends nothing. That reset (asyncpg's RESET ALL, UNLISTEN *,
    CLOSE ALL, pg_advisory_unlock_all) is a round trip and five statements before every call's
    caller gets its answer, and its RESET ALL dropped the session's claim floors, which are
    session settings (sql/functions/internal/claim_floor.sql), after every call. Nothing such a
    statement leaves needs it: the functions' own SET clauses end with them, and the claim
    floors are meant to stay (announce_idle's session advisory locks are the exception: those
    calls are released with the full reset, :func:`zeroth_pg._bounded.pooled_call`). asyncpg
    runs the reset in a task made by the release (its shield), which copies this context; any
    other release, a caller's own ``pool.acquire()`` among them, is reset in full. A caller's
    own ``reset=`` always runs."""
    token = _AS_FOUND.set(True)
    try:
        yield
    finally:
        _AS_FOUND.reset(token)


async def skip_reset(_conn: asyncpg.Connection) -> None:
    """``reset=`` for a pool that runs nothing but zeroth_pg's calls and SQL of your own that
    leaves no session state: no reset on any release (not even a SET of :data:`CHECK_CLIENT`,
    which nothing then undoes; asyncpg still rolls back a transaction left open).

    Not needed for zeroth_pg's own calls: a pool of :func:`create_pool` gives back a connection
    that only served one of them without the reset already (:func:`released_as_found`), and
    resets in full a connection that served anything else, so code that changes session state
    (a handler's ``SET ROLE``, a ``LISTEN``, a session advisory lock) cannot leave it to the
    calls that follow. With this reset it can: do not use it for a pool shared with such code.
    """


async def _reset_checking_client(conn: asyncpg.Connection) -> None:
    """asyncpg's reset (its RESET ALL included), ``SET SESSION AUTHORIZATION DEFAULT``,
    ``RESET ROLE``, ``DISCARD TEMP`` and :data:`CHECK_CLIENT` again, in one round trip. RESET
    ALL leaves the session user and the role alone (PostgreSQL's ``session_authorization`` and
    ``role`` settings are not reset by it): without these, code that ran ``SET ROLE`` on a
    pooled connection (or, logged in as a superuser — the embedded server's DSN —, ``SET
    SESSION AUTHORIZATION``) left every later call on it to run as that role. Going back to the
    authenticated user is allowed to any role. The session's temporary schema is searched
    first for type names: a temporary table named like a type (``text``) broke the ``$n::text``
    casts of every later call on the connection."""
    await conn.execute(f"{conn.get_reset_query()}\nSET SESSION AUTHORIZATION DEFAULT;\n"
                       f"RESET ROLE;\nDISCARD TEMP;\n{CHECK_CLIENT};")


def _checking_client(
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None,
    reset: Callable[[asyncpg.Connection], Awaitable[None]] | None,
) -> dict[str, Any]:
    """A pool's ``init=`` and ``reset=`` that set :data:`CHECK_CLIENT` on each new connection
    and again after each reset, around the caller's own."""

    async def first(conn: asyncpg.Connection) -> None:
        await conn.execute(CHECK_CLIENT)
        if init is not None:
            await init(conn)

    async def again(conn: asyncpg.Connection) -> None:
        if reset is skip_reset:
            return  # nothing reset: CHECK_CLIENT stands
        if reset is None:
            if not _AS_FOUND.get():
                await _reset_checking_client(conn)
        else:
            await reset(conn)
            await conn.execute(CHECK_CLIENT)

    return {"init": first, "reset": again}


async def _plain_connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    """The ``connect=`` of a pool that needs no writable-server check: asyncpg's, with
    :func:`_keepalive`."""
    return await _connect_to_the_end(dsn, **kwargs)


def create_pool(dsn: str, *, reads_only: bool = False, **kwargs: Any) -> asyncpg.Pool:
    """``asyncpg.create_pool(dsn, **kwargs)`` for zeroth_pg (await it, or ``async with`` it, as
    asyncpg's): ``dsn`` in any form; when it asks for a writable server, every connection the
    pool opens is to a server that takes writes by its own answer, and a connection refused a
    write as read-only (25006) is closed on release instead of kept (module docstring). A
    ``connect=`` of the caller's replaces that check. ``reads_only``: as for :func:`connect`.
    Every connection's session sets :data:`CHECK_CLIENT` (at its start and after each reset,
    around an ``init=`` or ``reset=`` of the caller's), so a call abandoned at a worker's call
    bound ends on the server too."""
    url = asyncpg_dsn(dsn)
    role = wanted_role(url, reads_only=reads_only, **kwargs)
    own_connect = kwargs.pop("connect", None)
    kwargs.update(_checking_client(kwargs.pop("init", None), kwargs.pop("reset", None)))
    if own_connect is not None:
        return asyncpg.create_pool(url, connect=own_connect, **kwargs)
    if role is None:
        return asyncpg.create_pool(url, connect=_plain_connect, **kwargs)
    kwargs["connect"] = _Connector(role)
    kwargs["reset"] = _discarding_reset(kwargs["reset"], role)
    return asyncpg.create_pool(url, **kwargs)
