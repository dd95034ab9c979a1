"""A TCP proxy on 127.0.0.1 in front of the test's server, for tests that need a connection to
go over TCP (the embedded server listens on a Unix socket) or to be cut or held half-way.

Shared by tests/client/test_abandoned_connects.py (a plain proxy) and
tests/failover/test_terminated_connection.py (one that holds back the server's end).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from zeroth_pg.testing import libpq_dsn

__all__ = ["TcpProxy", "server_target", "uri_through"]


def server_target(database_dsn: str) -> dict[str, Any]:
    """The libpq parameters of ``database_dsn`` (``host`` and ``port`` defaulted)."""
    params = conninfo_to_dict(libpq_dsn(database_dsn))
    params.setdefault("port", 5432)
    if not params.get("host"):
        params["host"] = "/var/run/postgresql"
    return params


def uri_through(target: dict[str, Any], proxies: list[TcpProxy], query: str = "") -> str:
    """A URI to ``target``'s database as its user, through ``proxies`` (a multi-host one when
    several)."""
    user, dbname = target.get("user") or "postgres", target["dbname"]
    spec = ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies)
    return f"postgresql://{user}@{spec}/{dbname}{query}"


class TcpProxy:
    """Forwards every byte between its clients and ``target`` (a Unix socket directory or a TCP
    host, as libpq's ``host``). :meth:`_ended` decides what happens when one side ends (here:
    the other side is closed)."""

    def __init__(self, target: dict[str, Any]) -> None:
        self._target = target
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1:``port`` (0: any free port, then :attr:`port`)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = str(self._target["host"]), int(self._target["port"])
        if host.startswith("/"):
            return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
        return await asyncio.open_connection(host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await self._open_upstream()
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_writer]
        for task in (asyncio.create_task(self._pump(reader, up_writer, from_server=False)),
                     asyncio.create_task(self._pump(up_reader, writer, from_server=True))):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *,
                    from_server: bool) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        await self._ended(dst, from_server=from_server)

    async def _ended(self, dst: asyncio.StreamWriter, *, from_server: bool) -> None:
        """One side ended (``from_server``: the server's): pass the end on."""
        dst.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
