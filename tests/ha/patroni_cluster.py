"""A three-node Patroni cluster on one etcd member, all on 127.0.0.1, from Debian's packages.

``patroni`` (3.0.x, /usr/bin/patroni and patronictl) manages Debian's PostgreSQL 15
(/usr/lib/postgresql/15/bin); ``etcd-server`` (3.4, /usr/bin/etcd) is the DCS, reached through
Patroni's etcd v2 client (below). Each node has its own PostgreSQL port and REST API port;
clients use the multi-host DSN :meth:`PatroniCluster.dsn` with ``target_session_attrs=read-write``.

Settings (the ones the guarantees need, docs/dba-guide.md "High availability"):

* ``synchronous_mode: true`` and ``synchronous_mode_strict: true`` — a commit waits for the
  synchronous standby Patroni names, and Patroni promotes only a node that was synchronous, so
  an acknowledged commit survives a failover; strict: with no standby left, commits wait rather
  than go asynchronous;
* ``maximum_lag_on_failover: 0`` — belt and braces for the same (in synchronous mode Patroni
  already picks only the synchronous standby);
* ``ttl: 20`` (Patroni's minimum), ``loop_wait: 2``, ``retry_timeout: 5`` — the leader key
  expires 20 s after the primary's Patroni last renewed it; that is the failover time after a
  whole node dies, well above the soak's 3 s worker lease (leases are decided on the database
  clock: a lease that ran out during the failover is taken over on the new primary);
* ``use_pg_rewind`` (so ``full_page_writes`` and ``wal_log_hints`` are on): a killed primary
  rejoins as a standby. fsync is off (only processes die here, never the machine);
* Patroni talks to etcd through its **v2 API** (``etcd:``; etcd started ``--enable-v2``), not
  ``etcd3:``. Patroni 3.0.2's etcd3 client (Debian 12's) renews the leader key of a primary whose
  lease expired while its Patroni was frozen with an unconditional put: resumed after another
  node had taken the key (a SIGSTOP longer than ``ttl``, as :meth:`stop_node` does it; a paused
  VM), the old primary overwrote the new leader's key and kept running as the primary, the
  promoted node demoted itself and the third was pg_rewind-ed onto the old primary's timeline —
  what the new primary had acknowledged was gone — and then its stale cache looped on
  "Synchronous replication key updated by someone else", never healthy again (seen
  2026-12-06; patroni/patroni#2689, fixed in 3.0.3, and #2783). The v2 client renews with
  ``prevValue=<its own name>``, which fails once another node holds the key, and the old
  primary demotes. ``ZEROTH_PG_HA_PATRONI_DCS=etcd3`` runs the etcd3 client instead.

``patroni_cluster(synchronous=False)`` (test_ha_soak.py, ``ZEROTH_PG_HA_REPLICATION=async``):
``synchronous_mode`` off and ``maximum_lag_on_failover`` 1 GB, so that Patroni promotes the most
advanced replica even when it lags (a lossy failover, bounded by that lag).

Failures it injects: :meth:`switchover` (``patronictl switchover --force``),
:meth:`kill_node` (SIGKILL of the primary's Patroni *and* postmaster: the node dies; a SIGKILL of
the postmaster alone is not a failover under Patroni, whose loop restarts PostgreSQL in place on
the same node within ``loop_wait`` — :meth:`kill_postmaster`), and :meth:`stop_node` (SIGSTOP of
Patroni, the postmaster and its backends: a node that hangs, as a network partition leaves it,
until :meth:`resume_node`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import urllib.request
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
    until,
    wait_or_tail,
)

__all__ = ["PROGRAMS", "PatroniCluster", "patroni_cluster"]

PROGRAMS = ("/usr/bin/patroni", "/usr/bin/patronictl", "/usr/bin/etcd", str(PG15_BIN / "initdb"))
#: ``etcd`` (the v2 API, the default) or ``etcd3``: which of its etcd clients Patroni uses.
DCS_ENV = "ZEROTH_PG_HA_PATRONI_DCS"


def dcs() -> str:
    chosen = os.environ.get(DCS_ENV, "etcd").strip()
    if chosen not in ("etcd", "etcd3"):
        raise ValueError(f"{DCS_ENV}: etcd (the v2 API) or etcd3")
    return chosen
SCOPE = "zeroth"
TTL = 20
LOOP_WAIT = 2


@dataclass(slots=True)
class PatroniNode:
    name: str
    port: int
    api_port: int
    pgdata: Path
    config: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def role(self) -> str | None:
        """What the node's REST API says it is (``master``/``primary``, ``replica``, …)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/patroni",
                                        timeout=3) as answer:
                found: dict[str, Any] = json.load(answer)
        except (OSError, ValueError):
            return None
        return str(found.get("role")) if found.get("state") == "running" else None


class PatroniCluster(ManagedCluster):
    manager = "a Patroni"

    def __init__(self, daemons: Daemons, nodes: list[PatroniNode], etcd_port: int,
                 synchronous: bool = True) -> None:
        super().__init__(daemons, nodes)
        self.etcd_port = etcd_port
        self.synchronous = synchronous

    def dsn(self, dbname: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def patronictl(self, *args: str) -> str:
        return self.daemons.run(["/usr/bin/patronictl", "-c", str(self.nodes[0].config), *args])

    def members(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.patronictl("list", "-f", "json"))
        return found

    def sync_standby(self) -> str | None:
        """The member Patroni holds synchronous (``Sync Standby``), if any."""
        for member in self.members():
            if member.get("Role") == "Sync Standby" and member.get("State") in (
                    "running", "streaming"):
                return str(member["Member"])
        return None

    def wait_healthy(self, timeout: float = 240) -> None:
        """Until one leader and two replicas run, one of them the synchronous standby (when
        synchronous)."""
        def healthy() -> bool:
            members = self.members()
            running = [m for m in members if m.get("State") in ("running", "streaming")]
            return len(running) == len(self.nodes) and (
                not self.synchronous or self.sync_standby() is not None) and (
                self._every_replica_streams())
        until(healthy, timeout, "the Patroni cluster has a leader, two replicas and a sync "
              "standby", interval=0.5)

    def _every_replica_streams(self) -> bool:
        """Whether the primary streams to every other node. Patroni's list alone is not enough:
        a demoted old primary shows "running" for a moment after it started as a replica and
        before Patroni stops it again for pg_rewind; a failover then made the restarted node
        wait for WAL from the stopped primary, and Patroni left it so for ``pg_ctl_timeout``
        (60 s), the promoted server's commits held all that time by strict synchronous mode
        (tests/ha, 2026-12-06: its first commit 40 s after it took writes)."""
        primary = self.primary()
        with psycopg.connect(primary.dsn(), connect_timeout=3) as conn:
            rows = conn.execute("SELECT application_name FROM pg_stat_replication"
                                " WHERE state = 'streaming'").fetchall()
        return {str(name) for name, in rows} >= {n.name for n in self.nodes if n is not primary}

    def switchover(self) -> tuple[PatroniNode, PatroniNode]:
        """``patronictl switchover --force`` to the synchronous standby; (old, new) primary."""
        old = self.primary()
        candidate = self.sync_standby() if self.synchronous else next(
            str(m["Member"]) for m in self.members() if m.get("Role") == "Replica"
            and m.get("State") in ("running", "streaming"))
        assert candidate is not None, self.members()
        self.patronictl("switchover", SCOPE, "--leader", old.name, "--candidate", candidate,
                        "--force")
        new = until(lambda: (p := self.primary()) is not old and p, 180,
                    "the switchover's candidate accepts writes")
        return old, new  # type: ignore[return-value]

    def kill_postmaster(self, node: PatroniNode) -> None:
        self._signal_postmaster(node, signal.SIGKILL)

    def restart_node(self, node: PatroniNode) -> None:
        """Start a killed node's Patroni again: it rejoins (pg_rewind) as a replica."""
        self.daemons.stop_postgres(node.pgdata)  # orphaned backends of a killed postmaster
        self.daemons.start(node.name, ["/usr/bin/patroni", str(node.config)])


def _config(daemons: Daemons, node: PatroniNode, etcd_port: int, synchronous: bool) -> str:
    socket_dir = daemons.mkdir(f"{node.name}-sock")
    parameters = {
        "max_connections": 300, "fsync": "off", "full_page_writes": "on", "wal_log_hints": "on",
        "synchronous_commit": "on", "wal_receiver_status_interval": "1s",
        "unix_socket_directories": str(socket_dir), "log_min_messages": "warning",
        "max_wal_senders": 10, "max_replication_slots": 10, "wal_keep_size": "256MB",
        # When each accepted write became visible (test_ha_soak.py: first_claimable.py).
        "track_commit_timestamp": "on",
    }
    config = {
        "scope": SCOPE, "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"127.0.0.1:{node.api_port}",
                    "connect_address": f"127.0.0.1:{node.api_port}"},
        dcs(): {"hosts": [f"127.0.0.1:{etcd_port}"]},
        "bootstrap": {
            "dcs": {"ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": 5,
                    "maximum_lag_on_failover": 0 if synchronous else 1 << 30,
                    "synchronous_mode": synchronous, "synchronous_mode_strict": synchronous,
                    "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                   "parameters": parameters}},
            "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.port}", "connect_address": f"127.0.0.1:{node.port}",
            "data_dir": str(node.pgdata), "bin_dir": str(PG15_BIN),
            "pgpass": str(daemons.tmp / f"{node.name}.pgpass"),
            "authentication": {"superuser": {"username": "postgres", "password": "postgres"},
                               "replication": {"username": "replicator", "password": "rep"},
                               "rewind": {"username": "postgres", "password": "postgres"}},
            "parameters": {"unix_socket_directories": str(socket_dir)},
            "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                       "host replication all 127.0.0.1/32 trust"],
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False,
                 "nosync": False},
    }
    return json.dumps(config, indent=1)  # JSON is YAML


@contextlib.contextmanager
def patroni_cluster(nodes: int = 3, synchronous: bool = True) -> Iterator[PatroniCluster]:
    """etcd and ``nodes`` Patroni nodes, healthy; every process stopped and the directory
    deleted on exit, also when the body fails."""
    daemons = Daemons("zeroth-pg-patroni-")
    try:
        etcd_port, peer_port = free_port(), free_port()
        etcd_dir = daemons.mkdir("etcd")
        daemons.start("etcd", [
            "/usr/bin/etcd", "--name", "e0", "--data-dir", str(etcd_dir),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"e0=http://127.0.0.1:{peer_port}",
            "--initial-cluster-state", "new", "--log-level", "warn",
            *(["--enable-v2"] if dcs() == "etcd" else [])])
        until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{etcd_port}/health",
                                             timeout=3).status == 200, 60, "etcd answers")
        members = []
        for index in range(nodes):
            node = PatroniNode(f"pg{index + 1}", free_port(), free_port(),
                               daemons.tmp / f"pg{index + 1}", daemons.tmp / f"pg{index + 1}.yml")
            node.config.write_text(_config(daemons, node, etcd_port, synchronous))
            daemons.chown(node.config)
            daemons.pgdatas.append(node.pgdata)
            members.append(node)
        cluster = PatroniCluster(daemons, members, etcd_port, synchronous)
        # The first bootstraps (initdb) alone; the others then clone from it.
        daemons.start(members[0].name, ["/usr/bin/patroni", str(members[0].config)])
        until(lambda: members[0].role() in ("master", "primary"), 180,
              "the first Patroni node bootstraps")
        for node in members[1:]:
            daemons.start(node.name, ["/usr/bin/patroni", str(node.config)])
        wait_or_tail(cluster.wait_healthy, daemons, [node.name for node in members])
        yield cluster
    finally:
        daemons.close()
