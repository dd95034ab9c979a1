"""A pg_auto_failover formation on 127.0.0.1 from Debian's packages: a monitor and two data nodes
(or three: ``data_nodes=3``, below).

``pg_autoctl`` (``pg-auto-failover-cli``, 2.0) runs the monitor and a keeper per node over
Debian's PostgreSQL 15 (``postgresql-15-auto-failover`` provides the monitor's extension).
Each data directory is initialised here first (``initdb --auth=trust``) and its settings put in
``postgresql.auto.conf``, read after pg_autoctl's own include file, so that every server listens
on 127.0.0.1 only, keeps its socket in its own directory and has room for a worker fleet; then
``pg_autoctl create monitor|postgres --run`` registers the directory as it is (every other node
is cloned from the first by its keeper, one after the other). Clients use :meth:`Formation.dsn`,
every node with ``target_session_attrs=read-write``.

Settings the guarantees need (docs/dba-guide.md "High availability"): every node with
``replication-quorum true`` (the default): the primary's ``synchronous_standby_names`` is
``ANY 1 (<the standbys>)`` while a standby is healthy, and the monitor promotes only a standby
that reported the primary's last LSN. With two nodes ``number_sync_standbys`` is 0: when the
standby itself fails the monitor sets the primary ``wait_primary`` and synchronous replication
is switched off until it is back (availability over a second copy); a switchover during which
the monitor judged the standby being promoted unhealthy did the same, and lost acknowledged writes
(docs/dba-guide.md "pg_auto_failover").

``data_nodes=3`` (test_ha_soak.py, ``ZEROTH_PG_HA_AF_NODES=3``): three data nodes and, once the
third has joined, ``pg_autoctl set formation number-sync-standbys 1``: the primary's
``synchronous_standby_names`` is ``ANY 1 (<the two standbys>)``, so that with one standby gone
(or judged unhealthy mid-switchover) the primary still has a synchronous standby left, and the
monitor has no reason to switch synchronous replication off (test_ha_soak.py records the new
primary's ``synchronous_standby_names`` at its first commit). The monitor's health checks
are shortened (``pgautofailover.health_check_period`` 2 s, ``node_considered_unhealthy_timeout``
10 s) so that a test waits less for a failover; the defaults are 5 s and 20 s.

``auto_failover_formation(synchronous=False)`` (test_ha_soak.py,
``ZEROTH_PG_HA_REPLICATION=async``): every node created with ``--replication-quorum false``, so
the primary's ``synchronous_standby_names`` stays empty and commits never wait for the standby;
the monitor still promotes it (``candidate-priority`` is left at its default, and it is within
``pgautofailover.promote_wal_log_threshold``, 16 MB, of the primary's last reported LSN): a
lossy failover, bounded by the lag.

Failures: :meth:`Formation.switchover` (``pg_autoctl perform switchover``),
:meth:`Formation.kill_node` (SIGKILL of the primary's keeper *and* postmaster: a SIGKILL of the
postmaster alone is repaired by its keeper, which restarts PostgreSQL on the same node), and
:meth:`Formation.stop_node` (SIGSTOP of the keeper, the postmaster and its backends, until
:meth:`Formation.resume_node`).
"""

from __future__ import annotations

import contextlib
import getpass
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from ha_processes import (
    PG15_BIN,
    Daemons,
    ManagedCluster,
    free_port,
    os_user,
    until,
    wait_or_tail,
)

__all__ = ["PROGRAMS", "Formation", "auto_failover_formation"]

PROGRAMS = ("/usr/bin/pg_autoctl", str(PG15_BIN / "initdb"),
            "/usr/lib/postgresql/15/lib/pgautofailover.so")
PG_CTL = str(PG15_BIN / "pg_ctl")
_SETTINGS = {
    "listen_addresses": "'127.0.0.1'", "max_connections": "300", "fsync": "off",
    "full_page_writes": "on", "wal_log_hints": "on", "synchronous_commit": "on",
    "wal_receiver_status_interval": "1s", "log_min_messages": "warning",
    # When each accepted write became visible (test_ha_soak.py: first_claimable.py).
    "track_commit_timestamp": "on",
}
_MONITOR_SETTINGS = {"pgautofailover.health_check_period": "2000",
                     "pgautofailover.node_considered_unhealthy_timeout": "10000"}


@dataclass(slots=True)
class AutoNode:
    name: str
    port: int
    pgdata: Path

    superuser: str = "postgres"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.superuser}@127.0.0.1:{self.port}/{dbname}"


class Formation(ManagedCluster):
    manager = "a pg_auto_failover"

    def __init__(self, daemons: Daemons, monitor: AutoNode, nodes: list[AutoNode],
                 synchronous: bool = True) -> None:
        super().__init__(daemons, nodes)
        self.monitor = monitor
        self.synchronous = synchronous

    def dsn(self, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return (f"postgresql://{self.nodes[0].superuser}@{hosts}/{dbname}"
                "?target_session_attrs=read-write")

    def states(self) -> list[dict[str, Any]]:
        """The monitor's view: one row per node (name, reported and goal state, LSN)."""
        with psycopg.connect(self.monitor.dsn("pg_auto_failover"), connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text, reportedlsn::text,"
                " replicationquorum FROM pgautofailover.node ORDER BY nodeid").fetchall()
        return [{"name": r[0], "reported": r[1], "goal": r[2], "lsn": r[3], "quorum": r[4]}
                for r in rows]

    def synchronous_standby_names(self) -> str:
        with psycopg.connect(self.primary().dsn(), connect_timeout=5) as conn:
            return str(conn.execute("SHOW synchronous_standby_names").fetchone()[0])  # type: ignore[index]

    def wait_healthy(self, timeout: float = 300) -> None:
        """Until the monitor has one ``primary`` and a ``secondary`` for every other node, each
        at its goal, and (when synchronous) the primary's commits wait for a standby (a
        non-empty synchronous_standby_names)."""
        def healthy() -> bool:
            states = self.states()
            settled = sorted(s["reported"] for s in states if s["reported"] == s["goal"])
            return settled == ["primary"] + ["secondary"] * (len(self.nodes) - 1) and (
                not self.synchronous or bool(self.synchronous_standby_names()))
        until(healthy, timeout, "the formation has a primary and a synchronous secondary",
              interval=0.5)

    def wait_running(self, count: int, what: str, timeout: float = 300) -> None:
        """Until ``count`` nodes run as ``single``, ``primary`` or ``secondary``, each at its
        goal."""
        until(lambda: sum(s["reported"] in ("single", "primary", "secondary")
                          and s["reported"] == s["goal"] for s in self.states()) >= count,
              timeout, what)

    def autoctl(self, *args: str, timeout: float = 180) -> str:
        return self.daemons.run(["/usr/bin/pg_autoctl", *args], timeout=timeout)

    def switchover(self) -> tuple[AutoNode, AutoNode]:
        old = self.primary()
        self.autoctl("perform", "switchover", "--pgdata", str(self.monitor.pgdata), "--wait",
                     "150", timeout=200)
        new = until(lambda: (p := self.primary()) is not old and p, 180,
                    "the switchover's standby accepts writes")
        return old, new  # type: ignore[return-value]

    def restart_node(self, node: AutoNode) -> None:
        """Run a killed node's keeper again: it rejoins as a standby (pg_rewind)."""
        self.daemons.stop_postgres(node.pgdata)
        self.daemons.start(node.name, ["/usr/bin/pg_autoctl", "run", "--pgdata",
                                       str(node.pgdata)])


def _initdb(daemons: Daemons, node: AutoNode, settings: dict[str, str]) -> None:
    daemons.run([str(PG15_BIN / "initdb"), "-D", str(node.pgdata), "--auth=trust",
                 "--encoding=utf8", "-U", node.superuser])
    with (node.pgdata / "postgresql.auto.conf").open("a") as auto:
        for name, value in settings.items():
            auto.write(f"{name} = {value}\n")


@contextlib.contextmanager
def auto_failover_formation(synchronous: bool = True, data_nodes: int = 2
                            ) -> Iterator[Formation]:
    """Monitor + ``data_nodes`` nodes (2 or 3), healthy; every process stopped and the directory
    deleted on exit. ``synchronous=False``: every node outside the write quorum (asynchronous
    replication). Three synchronous nodes: ``number_sync_standbys`` 1 (module docstring)."""
    if data_nodes not in (2, 3):
        raise ValueError(f"data_nodes: 2 or 3, not {data_nodes!r}")
    daemons = Daemons("zeroth-pg-autofailover-")
    try:
        # pg_autoctl connects to its local server as the OS user it runs as, over a socket in
        # $PG_REGRESS_SOCK_DIR (the temp directory): that user is every server's superuser.
        superuser = os_user() or getpass.getuser()
        monitor = AutoNode("monitor", free_port(), daemons.tmp / "monitor", superuser)
        nodes = [AutoNode(f"node{i}", free_port(), daemons.tmp / f"node{i}", superuser)
                 for i in range(1, data_nodes + 1)]
        daemons.pgdatas += [monitor.pgdata, *(node.pgdata for node in nodes)]
        formation = Formation(daemons, monitor, nodes, synchronous)
        _initdb(daemons, monitor, {**_SETTINGS, **_MONITOR_SETTINGS})
        # Created, then set to listen on loopback only (pg_autoctl starts the monitor with
        # ``-h <listen_addresses>`` from its own config, which outranks every config file), run.
        formation.autoctl("create", "monitor", "--pgdata", str(monitor.pgdata), "--pgport",
                          str(monitor.port), "--pgctl", PG_CTL, "--hostname", "127.0.0.1",
                          "--auth", "trust", "--no-ssl")
        formation.autoctl("config", "set", "--pgdata", str(monitor.pgdata),
                          "postgresql.listen_addresses", "127.0.0.1")
        daemons.start("monitor", ["/usr/bin/pg_autoctl", "run", "--pgdata",
                                  str(monitor.pgdata)])
        until(lambda: formation.states() is not None, 180, "the monitor answers")
        uri = (f"postgres://autoctl_node@127.0.0.1:{monitor.port}/pg_auto_failover"
               "?sslmode=prefer")
        _initdb(daemons, nodes[0], _SETTINGS)
        for index, node in enumerate(nodes):
            daemons.start(node.name, [
                "/usr/bin/pg_autoctl", "create", "postgres", "--pgdata", str(node.pgdata),
                "--pgport", str(node.port), "--pgctl", PG_CTL, "--hostname", "127.0.0.1",
                "--listen", "127.0.0.1", "--pghost", str(daemons.tmp), "--name", node.name,
                "--dbname", "postgres", "--monitor", uri, "--auth", "trust", "--no-ssl",
                "--replication-quorum", "true" if synchronous else "false", "--run"])
            # One at a time: each joins once the one before runs (the first as a single
            # primary, then each standby as a secondary), as a DBA adds nodes.
            wait_or_tail(lambda node=node, index=index: formation.wait_running(
                index + 1, f"{node.name} joins the formation"), daemons, ("monitor", node.name))
        if synchronous and data_nodes == 3:
            # Once both quorum standbys have joined, as a DBA growing a formation would.
            formation.autoctl("set", "formation", "number-sync-standbys", "--pgdata",
                              str(nodes[0].pgdata), "1")
        wait_or_tail(formation.wait_healthy, daemons,
                     ("monitor", *(node.name for node in nodes)))
        yield formation
    finally:
        daemons.close()


def describe(formation: Formation) -> str:
    return json.dumps(formation.states())
