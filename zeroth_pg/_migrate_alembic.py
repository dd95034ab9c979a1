"""The alembic glue: every revision in ``migrations/versions`` is a stub that runs one
``sql/migrations`` file (:func:`apply_sql_file`), forward only, with its version table
``zeroth.alembic_version``; :func:`upgrade` runs alembic (``migrations/env.py`` holds the advisory
lock :data:`ADVISORY_LOCK_KEY` and re-applies the function files at head), and the revision
a database or this package is at.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy.engine import URL

from zeroth_pg._libpq import libpq_dsn as _strip_driver
from zeroth_pg._migrate_functions import PIN_SEARCH_PATH, PIN_SESSION
from zeroth_pg._paths import migrations_dir, sql_migrations_dir

__all__ = [
    "ADVISORY_LOCK_KEY",
    "SQL_FILE_RE",
    "VERSION_SCHEMA",
    "VERSION_TABLE",
    "SessionMovedError",
    "alembic_config",
    "apply_sql_file",
    "check_same_session",
    "current_revision",
    "forward_only",
    "head_revision",
    "public_connect_database",
    "sql_files",
    "to_sqlalchemy_url",
    "upgrade",
    "writable_libpq_dsn",
]

#: Key of the advisory lock that serialises upgrades of one database: b"zeroth" as an integer.
#: Advisory locks are per database, so upgrades of different databases never wait on each other.
ADVISORY_LOCK_KEY = int.from_bytes(b"zeroth", "big")
VERSION_SCHEMA = "zeroth"
VERSION_TABLE = "alembic_version"

_UPGRADE_LOCK = threading.Lock()
SQL_FILE_RE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def sql_files() -> list[Path]:
    """The migration files ``sql/migrations/NNNN_slug.sql``, in the order they apply."""
    files = sorted(sql_migrations_dir().glob("*.sql"))
    bad = [f.name for f in files if not SQL_FILE_RE.match(f.name)]
    if bad:
        raise ValueError(f"migration files must be named NNNN_slug.sql: {bad}")
    return files


def to_sqlalchemy_url(dsn: str) -> URL:
    """Convert a libpq/asyncpg DSN (URI or ``key=value`` form) to a ``postgresql+psycopg`` URL.

    A unix-socket directory cannot be the URL's host, so it goes in the query as ``?host=/dir``,
    which psycopg hands to libpq unchanged.
    """
    params = conninfo_to_dict(_strip_driver(dsn))
    host = params.pop("host", None)
    port = params.pop("port", None)
    query: dict[str, str] = {k: str(v) for k, v in params.items() if v is not None}
    for key in ("user", "password", "dbname"):
        query.pop(key, None)
    tcp_host: str | None = None
    if host is not None:
        host = str(host)
        if host.startswith("/") or "," in host:
            query["host"] = host
        else:
            tcp_host = host
    return URL.create(
        "postgresql+psycopg",
        username=_opt(params.get("user")),
        password=_opt(params.get("password")),
        host=tcp_host,
        port=int(str(port)) if port and tcp_host else None,
        database=_opt(params.get("dbname")),
        query={**query, **({"port": str(port)} if port and not tcp_host else {})},
    )


def _opt(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def alembic_config(dsn: str | None = None) -> object:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if dsn is not None:
        # Through attributes, not set_main_option: configparser would interpolate '%' in the URL.
        # The search_path is pinned by a SET on each connection (migrations/env.py), not by a
        # startup option: PgBouncer refuses ``options`` (PIN_SEARCH_PATH).
        cfg.attributes["zeroth_url"] = to_sqlalchemy_url(dsn)
    return cfg


#: ``target_session_attrs`` values that need a server that takes writes (zeroth_pg/_connect.py).
_WRITABLE_ATTRS = ("read-write", "primary")
#: ``target_session_attrs`` values that ask for a server or session a migration cannot write on.
_STANDBY_ATTRS = ("read-only", "standby", "prefer-standby")
_CHECK = ("SELECT pg_catalog.pg_is_in_recovery(),"
          " pg_catalog.current_setting('transaction_read_only')")


def writable_libpq_dsn(dsn: str) -> str:
    """``dsn`` (libpq form) pinned to the one of its hosts that takes writes, by the server's
    own answer, when it asks for one (``target_session_attrs`` ``read-write`` or ``primary``, in
    the DSN, its connection service (``service``, ``PGSERVICE``: read as the asyncpg clients
    read it) or ``PGTARGETSESSIONATTRS``, or several hosts and none set: a migration writes);
    else ``dsn`` unchanged; ``read-only``, ``standby`` or ``prefer-standby``: ValueError (a
    migration writes). Each host's answer is waited for no longer than its
    ``connect_timeout`` (10 s by default): a host that lets the client in and holds the check
    (a PAUSEd PgBouncer) is given up, its connection closed, and the next one tried.

    libpq, like asyncpg, decides ``read-write`` from the ``in_hot_standby`` and
    ``default_transaction_read_only`` a server reports at connection start, which a PgBouncer
    in front reports stale after a failover (docs/dba-guide.md, "PgBouncer in front"): a
    migration through the demoted primary's PgBouncer was refused read-only, and through the
    promoted standby's it was not tried. So each host is connected to in turn with
    ``target_session_attrs=any`` and asked (``pg_is_in_recovery()``, ``transaction_read_only``:
    a query, which PgBouncer passes on), as zeroth_pg/_connect.py does for every asyncpg
    connection; the first that can write is returned as a one-host DSN with
    ``target_session_attrs=any``. None can: :class:`zeroth_pg.NoWritableServerError`, naming
    each host and why (never the password)."""
    from zeroth_pg._connect import NoWritableServerError, _service

    params = {k: str(v) for k, v in conninfo_to_dict(_strip_driver(dsn)).items()
              if v is not None}
    # A connection service's parameters count as libpq reads them (the DSN's own win).
    service = params.get("service") or os.environ.get("PGSERVICE")
    if service:
        found = _service("", {"service": service, "servicefile": params.get("servicefile")})
        params = {**found, **params}
    attrs = (params.get("target_session_attrs") or os.environ.get("PGTARGETSESSIONATTRS")
             or "").strip().lower()
    hosts = [h for h in (params.get("host") or os.environ.get("PGHOST") or "").split(",")]
    addrs = (params.get("hostaddr") or "").split(",")
    if hosts == [""] and len(addrs) > 1:
        hosts = [""] * len(addrs)  # hostaddr=a,b without host names: one host each
    if attrs in _STANDBY_ATTRS:
        raise ValueError(
            f"a migration writes: target_session_attrs={attrs} asks for a standby or a "
            "read-only session (use read-write, primary, any, or none)")
    if attrs:
        if attrs not in _WRITABLE_ATTRS:
            return dsn
    elif len(hosts) <= 1:
        return dsn
    ports = (params.get("port") or os.environ.get("PGPORT") or "").split(",")
    why: list[str] = []
    for index, host in enumerate(hosts):
        one = {**params, "host": host, "target_session_attrs": "any"}
        if not host:
            one.pop("host")  # libpq's default (or hostaddr alone), not an empty host name
        one.pop("load_balance_hosts", None)
        for key, values in (("port", ports), ("hostaddr", addrs)):
            value = values[index] if len(values) == len(hosts) else values[0]
            if value:
                one[key] = value
            else:
                one.pop(key, None)
        # A host that accepts the connection and hangs (a partition) must not stop the search.
        one.setdefault("connect_timeout", "10")
        port = one.get("port") or "5432"
        where = f"{host or one.get('hostaddr') or 'the default host'}:{port}"
        try:
            wait_s = _wait_s(one["connect_timeout"])
            row = _ask_within(make_conninfo(**one), wait_s)
        except psycopg.OperationalError as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            why.append(f"{where}: unreachable ({first})")
            continue
        except TimeoutError:
            why.append(f"{where}: no answer to the check within {wait_s:g} s")
            continue
        if row is not None and row[0]:
            why.append(f"{where}: in recovery: a standby")
        elif row is not None and attrs != "primary" and row[1] != "off":
            why.append(f"{where}: transaction_read_only is on")
        else:
            return make_conninfo(**one)
    raise NoWritableServerError(
        f"no server that takes writes among the {len(hosts)} host(s) of the connection string "
        f"({'; '.join(why)})")


def _wait_s(connect_timeout: str) -> float:
    """How long the check waits for an answer: ``connect_timeout`` as libpq reads it (at least
    2 s), 10 s when it is 0 (libpq: wait for ever) or not a number."""
    try:
        value = float(connect_timeout)
    except ValueError:
        return 10.0
    return max(2.0, value) if value > 0 else 10.0


def _ask_within(conninfo: str, wait_s: float) -> tuple[bool, str] | None:
    """(in recovery, transaction_read_only) of the server at ``conninfo``, waiting no longer
    than ``wait_s`` for the answer (``connect_timeout`` bounds the login only: a PAUSEd
    PgBouncer lets the client in and holds the query). A host that does not answer in time
    raises TimeoutError and its connection is closed, never cancelled (a cancel request
    crashed PgBouncer 1.18: zeroth_pg/_connect.py)."""
    conn = psycopg.connect(conninfo, autocommit=True)
    try:
        pgconn = conn.pgconn
        pgconn.send_query(_CHECK.encode())
        deadline = time.monotonic() + wait_s
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            select.select([pgconn.socket], [], [], left)
        row: tuple[bool, str] | None = None
        while (result := pgconn.get_result()) is not None:
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                message = (result.error_message or b"").decode("utf-8", "replace")
                raise psycopg.OperationalError(message.strip() or "the check failed")
            if row is None and result.ntuples:
                recovery, read_only = result.get_value(0, 0), result.get_value(0, 1)
                row = (recovery == b"t", (read_only or b"").decode())
        return row
    finally:
        conn.close()


def upgrade(dsn: str, revision: str = "head") -> None:
    """Apply every pending migration to the database at ``dsn`` (alembic ``upgrade head``).

    To head (the default): the pending migrations and the function files in one transaction
    (migrations/env.py). ``revision`` may name an older revision for tests of the migrations
    themselves: that upgrade stops short of head and applies no function file, so the database
    is left without working functions (the files are written for the head schema) until the
    next upgrade to head. Never stop a database that serves callers short of head. Relative
    targets (``+1``) are refused.

    Safe to run concurrently from several processes: they serialise on an advisory lock and the
    later ones find the database current. Synchronous; call it from a thread in async code.
    """
    from alembic import command

    if revision == "heads":  # one head: the same, and env.py recognises "head"
        revision = "head"
    if revision != "head" and revision not in {path.name[:4] for path in sql_files()}:
        raise ValueError(f"upgrade to 'head' or to a revision id, not {revision!r}")

    # On the host that takes writes by its own answer, whatever a pooler in front reports.
    dsn = writable_libpq_dsn(dsn)
    # alembic's `context` and `op` are process-global proxies: one upgrade per process at a time.
    with _UPGRADE_LOCK:
        command.upgrade(alembic_config(dsn), revision)  # type: ignore[arg-type]


def head_revision() -> str:
    """The newest revision id shipped with this package (e.g. ``"0002"``)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()  # type: ignore[arg-type]
    if head is None:
        raise RuntimeError("no alembic revisions found")
    return head


def pinned_connection(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to ``dsn`` whose search_path is pinned by its first
    statement (PIN_SEARCH_PATH: a SET, which a session-mode PgBouncer passes on, where a startup
    ``options`` is refused)."""
    conn = psycopg.connect(_strip_driver(dsn), autocommit=True)
    try:
        conn.execute(PIN_SEARCH_PATH)
    except BaseException:
        conn.close()
        raise
    return conn


def current_revision(dsn: str) -> str | None:
    """The revision the database at ``dsn`` is at, or None when zeroth_pg is not installed."""
    with pinned_connection(dsn) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{VERSION_SCHEMA}.{VERSION_TABLE}",)
        ).fetchone()
        if row is None or not row[0]:
            return None
        rows = conn.execute(
            pgsql.SQL("SELECT version_num FROM {}.{}").format(
                pgsql.Identifier(VERSION_SCHEMA), pgsql.Identifier(VERSION_TABLE)
            )
        ).fetchall()
    if len(rows) > 1:
        raise RuntimeError(f"several alembic heads recorded: {[r[0] for r in rows]}")
    return str(rows[0][0]) if rows else None


def public_connect_database(dsn: str) -> str | None:
    """The database at ``dsn``, as a quoted identifier, when PUBLIC holds CONNECT on it (the
    PostgreSQL default); None when it does not.

    zeroth_worker, zeroth_reader and zeroth_owner are cluster-wide roles: a LOGIN member made for
    one database is a member in every database of the cluster it can connect to, so a cluster that
    holds several zeroth_pg databases confines each login role with CONNECT (docs/security.md,
    "Three group roles"). ``zeroth-pg verify`` warns with this.
    """
    with pinned_connection(dsn) as conn:
        row = conn.execute(
            "SELECT has_database_privilege('public', current_database(), 'CONNECT'), "
            "quote_ident(current_database())").fetchone()
    return None if row is None or not row[0] else str(row[1])


def apply_sql_file(filename: str) -> None:
    """Run one ``sql/migrations`` file inside the current alembic migration's transaction.

    Called by the revision stubs. The text goes to psycopg's cursor with no parameters, so it is
    sent as-is: ``%`` in RAISE formats and ``:name`` in PL/pgSQL bodies are not placeholders
    (SQLAlchemy's ``text()``, and so ``op.execute``, would treat ``:name`` as a bind parameter).
    """
    from alembic import op

    path = sql_migrations_dir() / filename
    text = path.read_text(encoding="utf-8")
    dbapi_conn = op.get_bind().connection.dbapi_connection
    if dbapi_conn is None:
        raise RuntimeError("alembic connection has no DBAPI connection")
    cur = dbapi_conn.cursor()
    try:
        cur.execute(PIN_SESSION)
        cur.execute(text)
    finally:
        cur.close()


def forward_only(revision: str) -> None:
    """The ``downgrade()`` of every revision: zeroth_pg migrations only go forward."""
    raise NotImplementedError(
        f"zeroth_pg migrations are forward-only; cannot downgrade revision {revision}. "
        "Restore from a backup, or write a new forward migration that undoes the change."
    )


class SessionMovedError(RuntimeError):
    """The upgrade's statements did not all reach one server session."""


def check_same_session(connection: Any) -> None:
    """The upgrade's session (``connection``, SQLAlchemy's) still holds its lock and its pinned
    search_path. Both are session state (the advisory lock; the SET of migrations/env.py's
    connect listener): through a pooler in transaction mode, consecutive transactions may run on
    different server sessions, the lock would stay behind on one and the pin reach other
    clients. Refused, instead, before any migration runs."""
    # Every operator named: this query is the one that must not trust the search_path.
    held, path = connection.execute(sqlalchemy.text(
        """SELECT EXISTS (SELECT FROM pg_catalog.pg_locks l
                           WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
                             AND l.objsubid OPERATOR(pg_catalog.=) 1
                             AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                             AND l.classid OPERATOR(pg_catalog.=) CAST(:high AS pg_catalog.oid)
                             AND l.objid OPERATOR(pg_catalog.=) CAST(:low AS pg_catalog.oid)),
                  pg_catalog.current_setting('search_path')"""),
        {"high": ADVISORY_LOCK_KEY >> 32, "low": ADVISORY_LOCK_KEY & 0xFFFFFFFF}).one()
    # quote_all_identifiers (a database's setting) quotes the names it reports.
    if not held or path.replace(" ", "").replace('"', "") != "pg_catalog,pg_temp":
        raise SessionMovedError(
            "the upgrade's transactions do not reach one server session (a pooler in "
            "transaction mode?): its lock and its pinned search_path are session state. "
            "Upgrade through a direct connection or a pooler in session mode.")
