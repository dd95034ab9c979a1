"""DBOS for the benchmark, in a process of its own (bench/peers.py starts it).

    python -m bench.dbos_peer setup   DSN           # migrate the system database, declare the queue
    python -m bench.dbos_peer enqueue DSN N         # N no-op workflows on the queue (untimed)
    python -m bench.dbos_peer drain   DSN N C       # prints the seconds a worker with C slots takes
    python -m bench.dbos_peer consume DSN           # idle worker; prints "<workflow id> <instant>"

DBOS is a process-wide singleton with its own threads (a queue thread per queue polling the
system database, a thread pool running the workflows, a notification listener), so it never
runs inside the suite's process: it could not be torn down and set up again there, and its
threads would compete with the other systems' event loop.

Configured as its docs describe for a Postgres queue: ``system_database_url`` set to the scratch
database (without it DBOS silently uses SQLite); one ``application_version`` pinned in every
process and on every enqueue (a worker dequeues only workflows of its own version, version-less
ones only while it runs the latest registered version; unpinned, each process derives its version
from a hash of its workflow source); a unique ``executor_id`` per process (``worker_concurrency``
counts per executor); ``worker_concurrency`` = the scenario's concurrency; and
``polling_interval_sec`` lowered from the default 1 s to 10 ms: DBOS queues are polled, not
notified, so at the default a worker with C slots starts at most C workflows a second.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

import psycopg

NAME = "bench"
QUEUE = "bench"
APP_VERSION = "bench-1"
WORKFLOW = "noop"
POLLING_INTERVAL = 0.01
_started: list[Any] = []  # what the workflow calls with its id (set per command)


def url(dsn: str) -> str:
    """SQLAlchemy URL with the psycopg 3 driver (DBOS's default driver is psycopg 3 too)."""
    scheme, _, rest = dsn.partition("://")
    return dsn if "+" in scheme else f"postgresql+psycopg://{rest}"


def _config(dsn: str) -> Any:
    from dbos import DBOSConfig

    config: DBOSConfig = {
        "name": NAME,
        "system_database_url": url(dsn),
        "application_version": APP_VERSION,
        "executor_id": f"bench-{os.getpid()}",
        "log_level": "WARNING",
    }
    return config


def client_for(dsn: str) -> Any:
    from dbos import DBOSClient

    return DBOSClient(system_database_url=url(dsn), application_name=NAME)


def _declare(dsn: str, concurrency: int) -> None:
    client = client_for(dsn)
    try:
        client.register_queue(QUEUE, worker_concurrency=concurrency,
                              polling_interval_sec=POLLING_INTERVAL,
                              on_conflict="always_update")
    finally:
        client.destroy()


def _dbos(dsn: str) -> Any:
    from dbos import DBOS

    DBOS(config=_config(dsn))

    @DBOS.workflow(name=WORKFLOW)
    def noop() -> None:
        for hook in _started:
            hook(DBOS.workflow_id)

    return DBOS


def setup(dsn: str) -> None:
    dbos = _dbos(dsn)
    dbos.launch()  # creates and migrates the system database's dbos schema
    dbos.destroy()
    _declare(dsn, 1)


def enqueue(dsn: str, n: int) -> None:
    """n workflows, 1,000 per transaction (DBOSClient.enqueue_in_transaction)."""
    import sqlalchemy as sa
    from dbos import DBOSClient

    engine = sa.create_engine(url(dsn))
    client = DBOSClient(system_database_engine=engine, application_name=NAME)
    try:
        for start in range(0, n, 1000):
            with engine.begin() as conn:
                for _ in range(min(1000, n - start)):
                    client.enqueue_in_transaction(
                        conn, {"queue_name": QUEUE, "workflow_name": WORKFLOW,
                               "app_version": APP_VERSION})
    finally:
        client.destroy()
        engine.dispose()


def _unfinished(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM dbos.workflow_status "
                       "WHERE status NOT IN ('SUCCESS', 'ERROR')").fetchone()
    return int(row[0])


def drain(dsn: str, n: int, concurrency: int) -> None:
    _declare(dsn, concurrency)
    handled = 0
    lock = threading.Lock()
    all_started = threading.Event()

    def count(_workflow_id: str) -> None:
        nonlocal handled
        with lock:
            handled += 1
            if handled >= n:
                all_started.set()

    _started.append(count)
    dbos = _dbos(dsn)
    check = psycopg.connect(dsn, autocommit=True)
    started = time.perf_counter()
    dbos.launch()
    if not all_started.wait(timeout=900):
        raise SystemExit(f"dbos: {handled} of {n} workflows ran in 900 s")
    # Every workflow body ran; the last ones' SUCCESS rows may not be committed yet.
    while _unfinished(check):
        time.sleep(0.002)
    dbos.destroy()
    elapsed = time.perf_counter() - started
    check.close()
    print(f"elapsed {elapsed}", flush=True)


def consume(dsn: str) -> None:
    _declare(dsn, 8)
    lock = threading.Lock()

    def note(workflow_id: str) -> None:
        instant = time.perf_counter()
        with lock:
            print(workflow_id, instant, flush=True)

    _started.append(note)
    dbos = _dbos(dsn)
    dbos.launch()
    time.sleep(0.3)  # the queue thread lists the queues and starts its worker thread
    print("ready", flush=True)
    sys.stdin.read()  # until the suite closes our stdin
    dbos.destroy()


def main(argv: list[str]) -> None:
    logging.getLogger("dbos").setLevel(logging.WARNING)
    command, dsn, *rest = argv
    if command == "setup":
        setup(dsn)
    elif command == "enqueue":
        enqueue(dsn, int(rest[0]))
    elif command == "drain":
        drain(dsn, int(rest[0]), int(rest[1]))
    elif command == "consume":
        consume(dsn)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
