"""The high-availability tests run the failover soak's fleet and checks (tests/failover,
tests/chaos) against clusters that Patroni and pg_auto_failover manage (patroni_cluster.py,
auto_failover.py)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for _dir in ("failover", "chaos", "ha"):
    if str(_TESTS / _dir) not in sys.path:
        sys.path.insert(0, str(_TESTS / _dir))
