"""Shared by tests/security and tests/adversarial: LOGIN roles made for one test,
    and the documented grant lists.

Roles are cluster-wide, so each test role gets a unique name and is dropped when the test ends.
It gets a password too, so the tests also work against a ZEROTH_PG_TEST_DSN server that does not
trust local connections.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from zeroth_pg.testing import libpq_dsn

README = (Path(__file__).resolve().parents[1] / "sql" / "README.md").read_text(encoding="utf-8")


def readme_grants(first_cell: str) -> set[str]:
    """The backticked names in the row of sql/README.md "Roles and grants" whose first cell is
    ``first_cell`` (``zeroth_worker``, ``admin only``, ...)."""
    section = README.split("## Roles and grants", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and cells[1].strip() == first_cell:
            return set(re.findall(r"`([a-z_0-9.]+)`", "|".join(cells[2:])))
    raise AssertionError(f"no row {first_cell!r} in the Roles and grants table of sql/README.md")


def dsn_as(dsn: str, user: str, password: str) -> str:
    """``dsn`` logging in as ``user`` instead, in the same form (URI or key=value)."""
    plain = libpq_dsn(dsn)
    if "://" not in plain:
        return make_conninfo(plain, user=user, password=password)
    parts = urlsplit(plain)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


#: The password of every role login_role makes in this process, and its SCRAM-SHA-256 secret:
#: given the secret, the server does not run 4,096 rounds of PBKDF2 for every test role. Each
#: role still has its own name; a test needs a password only to log in where trust does not.
_PASSWORD = secrets.token_hex(16)
_SECRET: str | None = None
#: The admin connection kept for the roles' CREATE and DROP (of the last admin DSN used): two
#: connects a role cost the server two backend starts.
_ADMINS: dict[str, psycopg.Connection] = {}


def _scram_secret(password: str) -> str:
    """The SCRAM-SHA-256 secret PostgreSQL stores for ``password`` (RFC 5802, as
    ``CREATE ROLE ... PASSWORD 'SCRAM-SHA-256$...'`` takes it)."""
    salt, rounds = secrets.token_bytes(16), 4096
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    text = [base64.b64encode(part).decode() for part in (salt, stored_key, server_key)]
    return f"SCRAM-SHA-256${rounds}:{text[0]}${text[1]}:{text[2]}"


def _admin_execute(admin_dsn: str, *statements: tuple[Any, tuple[Any, ...]]) -> None:
    """Run ``statements`` on the kept admin connection (a new one if it broke: a test may have
    restarted its server)."""
    for attempt in (1, 2):
        conn = _ADMINS.get(admin_dsn)
        if conn is None or conn.closed or conn.broken:
            # One kept at a time: a test's own database (dropped after it) must not leave one
            # behind for every test.
            for other in _ADMINS.values():
                other.close()
            _ADMINS.clear()
            conn = _ADMINS[admin_dsn] = psycopg.connect(libpq_dsn(admin_dsn), autocommit=True)
        try:
            for statement, parameters in statements:
                conn.execute(statement, parameters)
            return
        except psycopg.OperationalError:
            if attempt == 2 or not conn.broken:
                raise


@contextlib.contextmanager
def login_role(admin_dsn: str, member_of: str | None) -> Iterator[tuple[str, str]]:
    """A new LOGIN role, member of ``member_of`` (None: of nothing, no grant at all); yields
    (name, password). At exit it is dropped, with what it owns in ``admin_dsn``'s database."""
    global _SECRET
    if _SECRET is None:
        _SECRET = _scram_secret(_PASSWORD)
    label = "nobody" if member_of is None else member_of.removeprefix("zeroth_")
    name = f"zp_test_{label}_{secrets.token_hex(4)}"
    create = pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
        pgsql.Identifier(name), pgsql.Literal(_SECRET))
    if member_of is not None:
        create += pgsql.SQL(" IN ROLE {}").format(pgsql.Identifier(member_of))
    _admin_execute(admin_dsn, (create, ()))
    try:
        yield name, _PASSWORD
    finally:
        _admin_execute(
            admin_dsn,
            ("SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a WHERE a.usename = %s",
             (name,)),
            # Whatever it owns or was granted in admin_dsn's database (a test may grant it).
            (pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(name)), ()),
            (pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)), ()))


@contextlib.contextmanager
def planted_equals_operator(admin_dsn: str) -> Iterator[None]:
    """A stranger (a LOGIN role with no grant but CREATE on public) plants ``=(name, varchar)``
    in public, which raises if it ever runs: alembic looks for its version table with
    ``relname IN ($1::VARCHAR)``, and PostgreSQL has no such operator of its own, so a planted
    one is an exact match for any session whose search_path reaches public."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    with login_role(admin_dsn, None) as (name, password), psycopg.connect(
            dsn_as(admin_dsn, name, password), autocommit=True) as stranger:
        stranger.execute(
            """CREATE FUNCTION public.hijacked(name, varchar) RETURNS boolean LANGUAGE plpgsql
                   AS $$BEGIN RAISE EXCEPTION 'hijacked operator ran'; END$$;
               CREATE OPERATOR public.= (LEFTARG = name, RIGHTARG = varchar,
                                         FUNCTION = public.hijacked)""")
        yield
