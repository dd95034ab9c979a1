"""Debian's PostgreSQL 15 as a user installs it (initdb's settings: 100 connections, fsync on,
autovacuum at its defaults), for the tests that check what its users meet; the rest of the suite
runs on the session's server (PostgreSQL 18, embedded). A throwaway cluster from
bench.harness.debian_server, run as the embedded wheel's OS user when we are root.

Without the binaries (``apt-get install postgresql-15``) a test skips, saying so; with
``ZEROTH_PG_REQUIRE_HA=1`` (CI as root, which installs them for tests/ha) it fails instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from bench.harness import Server, ServerUnavailable, debian_server

#: As in tests/ha: set, a missing PostgreSQL 15 fails the test instead of skipping it.
REQUIRE_ENV = "ZEROTH_PG_REQUIRE_HA"


@contextlib.contextmanager
def stock_postgresql_15() -> Iterator[Server]:
    """The server, stopped and deleted on exit; its databases from ``server.database(label)``."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(debian_server(15, settings=()))
        except ServerUnavailable as unavailable:
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(f"{REQUIRE_ENV}=1 but {unavailable}")
            pytest.skip(f"{unavailable} (apt-get install postgresql-15)")
        yield server
