"""Alembic environment for zeroth_pg.

Every revision is a stub that runs one ``sql/migrations`` file (see zeroth_pg.migrate). This env:

* holds a session-level advisory lock (zeroth_pg.migrate.ADVISORY_LOCK_KEY) from before alembic
  reads the version table until after the last revision commits, so two concurrent upgrades
  serialise and the second finds the database at head and does nothing;
* creates schema ``zeroth`` (under the lock) before alembic creates its version table there;
* commits each revision in its own transaction (``transaction_per_migration``), so a failure
  leaves the database at the last good revision;
* when the database is then at head, re-applies every function file (``sql/functions``, in the
  order of its order.txt) in one more transaction, still under the lock
  (zeroth_pg.migrate.apply_functions). An upgrade that stops at an older revision leaves the
  functions alone: they are written for the head schema.

Online mode only: the offline script is ``python -m zeroth_pg.migrate sql``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from zeroth_pg.migrate import ADVISORY_LOCK_KEY, VERSION_SCHEMA, VERSION_TABLE, apply_functions


def run_migrations_online() -> None:
    config = context.config
    url = config.attributes.get("zeroth_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: use zeroth_pg.migrate.upgrade(dsn)")
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
            try:
                connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}"))
                connection.commit()
                context.configure(
                    connection=connection,
                    version_table=VERSION_TABLE,
                    version_table_schema=VERSION_SCHEMA,
                    transaction_per_migration=True,
                )
                with context.begin_transaction():
                    context.run_migrations()
                if connection.in_transaction():
                    connection.commit()
                at = connection.execute(
                    text(f"SELECT version_num FROM {VERSION_SCHEMA}.{VERSION_TABLE}")
                ).scalars().all()
                connection.commit()
                if at == [context.script.get_current_head()]:
                    apply_functions(connection.connection.dbapi_connection)
            finally:
                if connection.in_transaction():
                    connection.rollback()
                connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY}
                )
                connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError(
        "zeroth_pg has no alembic offline mode; print the install script with "
        "`python -m zeroth_pg.migrate sql`"
    )
run_migrations_online()
