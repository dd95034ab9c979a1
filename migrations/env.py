"""Alembic environment for zeroth_pg.

Every revision is a stub that runs one ``sql/migrations`` file (see zeroth_pg.migrate). This env:

* holds a session-level advisory lock (zeroth_pg.migrate.ADVISORY_LOCK_KEY) from before alembic
  reads the version table until after the last revision commits, so two concurrent upgrades
  serialise and the second finds the database at head and does nothing;
* creates schema ``zeroth`` (under the lock) before alembic creates its version table there;
* an upgrade to head runs every pending revision and then the function files (``sql/functions``
  in the order of its order.txt, zeroth_pg.migrate.apply_functions: skipped when exactly those
  files were applied and the catalog still holds them) in ONE transaction, with search_path
  pinned and a short lock_timeout, retried when a lock was not available: callers see the old schema
  and functions or the new ones, never a mix, and an upgrade never parks in a lock queue;
* an upgrade that stops at an older revision commits each revision on its own and leaves the
  functions alone: they are written for the head schema.

Online mode only: the offline script is ``python -m zeroth_pg.migrate sql``.
"""

from __future__ import annotations

import logging
import random
import time

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from zeroth_pg._migrate_alembic import check_same_session
from zeroth_pg._migrate_functions import PIN_SEARCH_PATH
from zeroth_pg.migrate import ADVISORY_LOCK_KEY, VERSION_SCHEMA, VERSION_TABLE, apply_functions

log = logging.getLogger("zeroth_pg.migrate")


#: An upgrade to head waits at most this long for any one lock (a table a migration alters, a view
#: or the trigger a function file replaces), then rolls back and tries again: waiting longer would
#: make every call that needs the same object queue behind the upgrade's lock request.
LOCK_TIMEOUT = "500ms"
ATTEMPTS = 40
#: SQLSTATEs after which the whole upgrade transaction is tried again: lock_not_available (the
#: lock_timeout above) and deadlock_detected (live traffic picked the upgrade as the victim).
RETRIED = ("55P03", "40P01")


def _reaches_head(script: ScriptDirectory, target: object) -> bool:
    head = script.get_current_head()
    if isinstance(target, tuple | list):  # alembic gives ("heads",)-style tuples for "heads"
        target = target[0] if len(target) == 1 else None
    if target in ("head", "heads"):
        return True
    try:
        destination = script.get_revision(target if isinstance(target, str) else None)
    except Exception:
        return False
    return destination is not None and destination.revision == head


#: How often a waiting upgrade says who holds the upgrade lock.
REPORT_EVERY = 10.0


def _take_upgrade_lock(connection: Connection) -> None:
    """The advisory lock that serialises upgrades. Any role can take an advisory lock, so a
    concurrent upgrade and a stranger look alike: the upgrade waits for either, and every
    REPORT_EVERY seconds it logs who holds the key (a stranger holding it delays upgrades only)."""
    key = {"key": ADVISORY_LOCK_KEY}
    waited, reported = 0.0, 0.0
    while not connection.execute(text("SELECT pg_try_advisory_lock(:key)"), key).scalar():
        connection.commit()
        if waited >= reported:
            holders = connection.execute(text(
                """SELECT l.pid, a.usename, a.application_name, a.state
                     FROM pg_catalog.pg_locks l
                     LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                         WHERE d.datname = pg_catalog.current_database())
                      AND l.classid::pg_catalog.int8 = (:key >> 32)
                      AND l.objid::pg_catalog.int8 = (:key & 4294967295)"""), key).all()
            connection.commit()
            log.warning("upgrade waits for the upgrade lock (key %d), held by %s",
                        ADVISORY_LOCK_KEY, [tuple(row) for row in holders] or "nobody visible")
            reported += REPORT_EVERY
        time.sleep(0.5)
        waited += 0.5


def _retried(exc: BaseException) -> bool:
    """The migrations and function files run on the raw psycopg cursor (psycopg.Error); alembic's
    own statements go through SQLAlchemy (DBAPIError wrapping one)."""
    cause = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(cause, "sqlstate", None) in RETRIED


def _pin_search_path(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute(PIN_SEARCH_PATH)
    cursor.close()
    dbapi_connection.commit()  # type: ignore[attr-defined]


def run_migrations_online() -> None:
    config = context.config
    url = config.attributes.get("zeroth_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: use zeroth_pg.migrate.upgrade(dsn)")
    engine = create_engine(url, poolclass=NullPool)
    # Before SQLAlchemy's own first queries (insert=True: ahead of the dialect's set-up), and
    # committed, so the SET outlives the transaction psycopg opened for it. A statement, not a
    # startup option: PgBouncer refuses ``options`` (zeroth_pg._migrate_functions).
    event.listen(engine, "connect", _pin_search_path, insert=True)
    to_head = _reaches_head(context.script, context.get_revision_argument())
    try:
        with engine.connect() as connection:
            _take_upgrade_lock(connection)
            try:
                connection.commit()
                check_same_session(connection)
                connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}"))
                connection.commit()
                context.configure(
                    connection=connection,
                    version_table=VERSION_TABLE,
                    version_table_schema=VERSION_SCHEMA,
                    # To head: one transaction for every pending migration and the function
                    # files, so no caller ever sees the schema between them (0008 drops every
                    # function of 0002-0007; the files create them again).
                    transaction_per_migration=not to_head,
                )
                if not to_head:
                    with context.begin_transaction():
                        check_same_session(connection)
                        context.run_migrations()
                else:
                    for attempt in range(1, ATTEMPTS + 1):
                        try:
                            with context.begin_transaction():
                                check_same_session(connection)
                                connection.execute(text(
                                    "SELECT pg_catalog.set_config('lock_timeout', :t, true)"),
                                    {"t": LOCK_TIMEOUT})
                                context.run_migrations()
                                apply_functions(connection.connection.dbapi_connection)
                            break
                        except Exception as exc:
                            if not _retried(exc) or attempt == ATTEMPTS:
                                raise
                            if connection.in_transaction():
                                connection.rollback()
                            log.warning("upgrade attempt %d of %d gave way (%s); trying again",
                                        attempt, ATTEMPTS, exc)
                            time.sleep(min(5.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1))
                if connection.in_transaction():
                    connection.commit()
            finally:
                if connection.in_transaction():
                    connection.rollback()
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY}
                )
                # The pin goes with the lock: a pooler that hands this server session to
                # another client next (transaction mode) does not hand it the pinned path.
                connection.execute(text("RESET search_path"))
                connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError(
        "zeroth_pg has no alembic offline mode; print the install script with "
        "`python -m zeroth_pg.migrate sql`"
    )
run_migrations_online()
