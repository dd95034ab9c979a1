"""zeroth._retry_backoff_at: when a retried attempt runs again (the settle path's backoff).

at + min(max, base * 2^(attempts - 1)) with equal jitter (half fixed, half random); a base or max
left NULL is the deployment's registered policy when it binds the session, else 1 s / 300 s —
each half on its own: a policy given half-way keeps the half it gives (an adversarial review
found a first form of the helper that dropped it when the deployment had no registration).
Internal (zeroth_owner only): called here as the superuser the `conn` fixture is.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest
from helpers import T0

BACKOFF = """SELECT zeroth._retry_backoff_at(at => $1, deployment_ref => $2, attempts => $3,
                                            retry_base_seconds => $4, retry_max_seconds => $5)"""


async def delays(conn: asyncpg.Connection, deployment: str, attempts: int,
                 base: float | None, cap: float | None, n: int = 40) -> list[float]:
    return [(await conn.fetchval(BACKOFF, T0, deployment, attempts, base, cap) - T0)
            / timedelta(seconds=1) for _ in range(n)]


def between(values: list[float], low: float, high: float) -> bool:
    return all(low <= v <= high for v in values)


class TestRetryBackoffAt:
    @pytest.mark.parametrize(("attempts", "low", "high"), [(1, 5, 10), (2, 10, 20), (3, 20, 40)])
    async def test_doubles_per_attempt_with_half_of_it_random(
            self, conn: asyncpg.Connection, attempts: int, low: float, high: float) -> None:
        values = await delays(conn, "unregistered", attempts, 10.0, 300.0)
        assert between(values, low, high), values
        assert len(set(values)) > 1  # the random half

    async def test_is_capped_at_max(self, conn: asyncpg.Connection) -> None:
        assert between(await delays(conn, "unregistered", 20, 10.0, 60.0), 30, 60)

    async def test_unset_policy_of_an_unregistered_deployment_is_1_and_300(
            self, conn: asyncpg.Connection) -> None:
        assert between(await delays(conn, "unregistered", 1, None, None), 0.5, 1)
        assert between(await delays(conn, "unregistered", 30, None, None), 150, 300)

    async def test_a_policy_given_half_way_keeps_its_half(self, conn: asyncpg.Connection) -> None:
        # base given, max from the default: 5 s at the first attempt, not the default's 1 s
        assert between(await delays(conn, "unregistered", 1, 5.0, None), 2.5, 5)
        # max given, base from the default: capped at 2 s, not the default's 300 s
        assert between(await delays(conn, "unregistered", 30, None, 2.0), 1, 2)

    async def test_unset_halves_come_from_the_registered_policy(
            self, conn: asyncpg.Connection) -> None:
        await conn.execute(
            """SELECT zeroth.register_deployment(deployment_ref => 'registered',
                   retry_base_seconds => 7, retry_max_seconds => 50)""")
        assert between(await delays(conn, "registered", 1, None, None), 3.5, 7)
        assert between(await delays(conn, "registered", 30, None, None), 25, 50)
        # a half the caller gives wins over the registration's
        assert between(await delays(conn, "registered", 1, 20.0, None), 10, 20)
        assert between(await delays(conn, "registered", 30, None, 4.0), 2, 4)
