"""A key=value DSN naming two servers, the first of them down, for the tests of both DSN forms
(tests/client/test_dsn_forms.py, tests/cli/test_dsn_forms_cli.py)."""

from __future__ import annotations

import socket

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def unused_port() -> int:
    """A TCP port nothing listens on (and, in a socket directory, no socket file)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keyword_multi_host(dsn: str) -> str:
    """``dsn`` as a libpq key=value string naming its server twice, behind a port nothing
    listens on: ``host=H,H port=DEAD,P … target_session_attrs=read-write``. A client reaches
    the database only by trying the hosts in order, as the documented failover DSN needs."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    host = params.pop("host", "127.0.0.1")
    port = params.pop("port", "5432")
    params.pop("target_session_attrs", None)
    return make_conninfo("", host=f"{host},{host}", port=f"{unused_port()},{port}",
                         target_session_attrs="read-write", **params)
