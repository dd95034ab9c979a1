"""The migrating role that docs/security.md promises works: not a superuser, only a member of
zeroth_owner (the three roles exist already: a DBA made them, or another database's install),
with CREATE on the database for itself and for zeroth_owner. It installs every migration, and
the result follows the rules."""

from __future__ import annotations

import psycopg
from psycopg import sql as pgsql
from roles import dsn_as, login_role

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn

ROLES = ("zeroth_owner", "zeroth_worker", "zeroth_reader")


def test_a_member_of_zeroth_owner_installs_everything(empty_database_dsn):
    with psycopg.connect(libpq_dsn(empty_database_dsn), autocommit=True) as admin:
        existing = {row[0] for row in admin.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (list(ROLES),))}
        for role in sorted(set(ROLES) - existing):
            admin.execute(pgsql.SQL("CREATE ROLE {} NOLOGIN").format(pgsql.Identifier(role)))
    with login_role(empty_database_dsn, "zeroth_owner") as (name, password):
        with psycopg.connect(libpq_dsn(empty_database_dsn), autocommit=True) as admin:
            database = admin.execute("SELECT current_database()").fetchone()
            assert database is not None
            admin.execute(pgsql.SQL("GRANT CREATE ON DATABASE {} TO {}, zeroth_owner").format(
                pgsql.Identifier(database[0]), pgsql.Identifier(name)))
        dsn = dsn_as(empty_database_dsn, name, password)
        with psycopg.connect(libpq_dsn(dsn)) as conn:
            row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            assert row.fetchone() == (False,)

        migrate.upgrade(dsn)

        assert migrate.current_revision(dsn) == migrate.head_revision()
        with psycopg.connect(libpq_dsn(empty_database_dsn)) as admin:
            owners = admin.execute(
                """SELECT DISTINCT pg_get_userbyid(p.proowner) FROM pg_proc p
                    WHERE p.pronamespace = 'zeroth'::regnamespace""").fetchall()
            unpinned = admin.execute(
                """SELECT count(*) FROM pg_proc p
                    WHERE p.pronamespace = 'zeroth'::regnamespace AND left(p.proname, 1) <> '_'
                      AND NOT p.prosecdef""").fetchone()
        assert owners == [("zeroth_owner",)]
        assert unpinned == (0,)
