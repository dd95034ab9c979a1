"""How the completion batcher splits a batch into settle_runs calls (zeroth_pg.worker._settle.
_by_scope): one call per (tenant, workspace) and, for retries, per retry policy; every group in
the batch's order, the groups in order of first appearance. The common batch (one scope, no
retry) is one group whether its entries share one Scope object (a worker of one scope) or
carry equal ones (a fleet worker). Pure: no database."""

from __future__ import annotations

import asyncio
from typing import Any

from leased import active, unclaimed

from zeroth_pg.types import RetryPolicy, Scope, SettleKind
from zeroth_pg.worker._settle import _by_scope, _Completion

SLOW = RetryPolicy(base_seconds=60, max_seconds=60)
FAST = RetryPolicy(base_seconds=0, max_seconds=0)


def completion(scope: Scope, kind: SettleKind = SettleKind.COMPLETE,
               policy: RetryPolicy | None = None) -> _Completion:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    return _Completion(active(unclaimed(), scope=scope), None, future, 0.0, kind, policy)


def ids(groups: list[list[_Completion]]) -> list[list[int]]:
    return [[id(c) for c in group] for group in groups]


async def test_one_scope_without_retries_is_one_group_in_order() -> None:
    scope = Scope("d", "t", None)
    batch = [completion(scope) for _ in range(5)]
    batch.append(completion(scope, SettleKind.FAIL))
    assert ids(_by_scope(batch)) == [[id(c) for c in batch]]
    assert _by_scope([]) == []


async def test_equal_scopes_of_different_objects_are_one_group() -> None:
    batch = [completion(Scope("d", "t", "w")) for _ in range(3)]
    assert ids(_by_scope(batch)) == [[id(c) for c in batch]]


async def test_scopes_and_retry_policies_split_the_batch() -> None:
    here, there = Scope("d", "t", None), Scope("d", "other", "w")
    a, b = completion(here), completion(there)
    slow, fast = completion(here, SettleKind.RETRY, SLOW), completion(here, SettleKind.RETRY, FAST)
    c, d = completion(here), completion(there, SettleKind.CANCEL)
    groups = _by_scope([a, b, slow, fast, c, d])
    # The completions of ``here`` ride with its first retry policy; ``there`` has its own call.
    assert ids(groups) == [[id(a), id(slow), id(c)], [id(b), id(d)], [id(fast)]]
