"""The high-availability tests run the failover soak's fleet and checks (tests/failover,
tests/chaos) against clusters that Patroni and pg_auto_failover manage (patroni_cluster.py,
auto_failover.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]
for _dir in ("failover", "chaos", "ha"):
    if str(_TESTS / _dir) not in sys.path:
        sys.path.insert(0, str(_TESTS / _dir))

from ha_processes import missing  # noqa: E402 — after the path above

#: Set by .ci/run as root: a missing manager package fails the HA tests instead of skipping them.
REQUIRE_ENV = "ZEROTH_PG_REQUIRE_HA"


def require(programs: tuple[str, ...], packages: str) -> None:
    """Skip (saying which programs and packages are missing), or fail under
    ZEROTH_PG_REQUIRE_HA=1, when this machine lacks one of ``programs``."""
    if lacking := missing(*programs):
        reason = (f"needs {', '.join(lacking)}: apt-get install {packages} (Debian 12; .ci/run "
                  "installs them)")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but the HA test {reason}")
        pytest.skip(reason)
