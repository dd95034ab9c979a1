"""A RunWorker's default id: short (it is written into the run's row, and so into the WAL, at every
claim: issue 30) and still one per worker."""

from __future__ import annotations

import re

import asyncpg
import pytest

from zeroth_pg.worker import RunWorker
from zeroth_pg.worker._sources import default_worker_id


async def _noop(_run: object) -> None:
    return None


def test_the_default_id_is_twelve_hex_digits_drawn_anew_each_time():
    ids = {default_worker_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{12}", worker_id) for worker_id in ids)


async def test_workers_built_without_an_id_get_distinct_short_ids_and_a_given_id_is_kept(
        pool: asyncpg.Pool):
    first = RunWorker(pool, "default-id", _noop)
    second = RunWorker(pool, "default-id", _noop)
    named = RunWorker(pool, "default-id", _noop, worker_id="a-name-given-by-its-operator")
    assert re.fullmatch(r"[0-9a-f]{12}", first.worker_id)
    assert first.worker_id != second.worker_id
    assert named.worker_id == "a-name-given-by-its-operator"


@pytest.mark.parametrize("worker_id", ["", "w" * 201])
async def test_a_worker_id_every_claim_would_refuse_is_refused_at_construction(
        pool: asyncpg.Pool, worker_id: str):
    # Not taken for "no id" (an empty one became a random id), nor left for every claim to
    # refuse with ZP008 while the worker runs (zeroth._require_identifier: 1 to 200).
    with pytest.raises(ValueError, match="1 to 200 characters"):
        RunWorker(pool, "default-id", _noop, worker_id=worker_id)
    assert RunWorker(pool, "default-id", _noop, worker_id="w" * 200).worker_id == "w" * 200


@pytest.mark.parametrize("worker_id", ["w\x00", "w\ud800"], ids=["nul", "lone-surrogate"])
async def test_a_worker_id_postgresql_cannot_hold_is_refused_at_construction(
        pool: asyncpg.Pool, worker_id: str):
    # 1 to 200 characters, yet no text value can carry it (PostgreSQL's text has no NUL; a lone
    # surrogate has no UTF-8): every claim of such a worker fails as an empty id's did, while
    # the worker runs and polls for ever. (A --worker-id whose bytes are not UTF-8 reaches
    # Python as lone surrogates: surrogateescape.)
    from zeroth_pg.client import LeaseManager
    from zeroth_pg.errors import DatabaseError

    with pytest.raises(DatabaseError):
        await LeaseManager(pool).claim_and_start("default-id", worker_id)
    with pytest.raises(ValueError, match="worker_id"):
        RunWorker(pool, "default-id", _noop, worker_id=worker_id)
