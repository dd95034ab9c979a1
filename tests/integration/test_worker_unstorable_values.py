"""What a handler returns or raises that PostgreSQL cannot store, or that is too large to
store or log, fails that run only, with an error document within the bound; the runs beside it
go on (RunWorker in the test's event loop, against a real database).

* an output jsonb cannot hold (U+0000, a lone surrogate) fails that run only, never the runs
  completed with it in the same batch; an exception message holding such characters still fails
  its run, with a sanitised error document;
* an output larger than the worker's bound fails its run, not retryable, before anything is
  sent, and the next run completes;
* a 50 MB exception message, a huge list argument, KeyError, chained exception or class name:
  the run fails with every text of its error document within the bound (the cut one marked),
  and no log record of the worker is longer than the bound;
* an error document the database refuses is replaced by a minimal one: the run fails at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest
import worker_probes
from helpers import metric, unique_deployment, wait_until
from worker_probes import (
    FOREVER,
    CompletionSpy,
    all_worker_errors,
    stored_run,
    wait_for_status,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_an_unstorable_output_fails_its_run_and_not_the_runs_completed_with_it(
        pool, spawn_worker):
    dep = unique_deployment("harden")
    outputs: dict[str, Any] = {
        "nul": {"text": "a\x00b"},
        "surrogate": ["lone \ud800 half"],
        "nul_key": {"k\x00": 1},
    }
    good = [f"good-{n}" for n in range(5)]
    kinds = [*outputs, *good]
    release = asyncio.Event()
    arrived: set[str] = set()

    async def handler(ctx: RunContext) -> Any:
        kind = ctx.payload["kind"]
        arrived.add(kind)
        await release.wait()  # every handler returns in the same turn of the event loop
        return outputs.get(kind, {"kind": kind})

    completed = metric("zeroth_runs_completed_total", dep)
    dead = metric("zeroth_runs_dead_lettered_total", dep)
    errors = all_worker_errors(dep)
    runs = await LeaseManager(pool).enqueue_runs(
        dep, [{"payload": {"kind": kind}, "max_attempts": 3} for kind in kinds])
    by_kind = dict(zip(kinds, (run.run_id for run in runs), strict=True))
    worker = await spawn_worker(dep, handler, max_concurrency=len(kinds), start=False)
    spy = CompletionSpy(worker)
    await worker.start()
    await wait_until(lambda: arrived == set(kinds), "every handler to start", within=10)
    release.set()

    await wait_until(lambda: worker.active_run_ids == [], "every run to settle", within=10)
    for kind in good:
        row = await stored_run(pool, by_kind[kind])
        assert (row["status"], row["output"], row["error"]) == ("completed", {"kind": kind}, None)
    # The storable outputs finished together and went out as one settle_runs call.
    assert [sorted(batch) for batch in spy.batches] == [sorted(by_kind[kind] for kind in good)]
    why = {"nul": "U+0000", "surrogate": "a lone UTF-16 surrogate", "nul_key": "U+0000"}
    for kind, character in why.items():
        row = await stored_run(pool, by_kind[kind])
        assert row["status"] == "failed", kind
        assert (row["attempts"], row["dead_lettered_at"], row["output"]) == (1, None, None), kind
        assert row["error"]["type"] == "ValueError"
        assert row["error"]["message"] == (
            f"PostgreSQL cannot store the output: a string contains {character}")
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = ANY($1::uuid[])",
        list(by_kind.values())) == 0
    assert metric("zeroth_runs_completed_total", dep) == completed + len(good)
    assert metric("zeroth_runs_dead_lettered_total", dep) == dead
    assert all_worker_errors(dep) == errors  # no batch was refused, no worker error


@pytest.mark.parametrize(("max_attempts", "status", "outcome"), [
    (1, "failed", "dead-lettered"), (2, "pending", "retry scheduled")])
async def test_an_exception_message_jsonb_cannot_hold_still_fails_the_run_sanitised(
        pool, spawn_worker, max_attempts, status, outcome):
    dep = unique_deployment("harden")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        raise RuntimeError("nul \x00 and lone \ud800 in the message")

    handler_errors = metric("zeroth_handler_errors_total", dep)
    errors = all_worker_errors(dep)
    # The retry, if any, is an hour away: the run stays as the first failure left it.
    worker = await spawn_worker(dep, handler, retry_base_seconds=FOREVER,
                                retry_max_seconds=FOREVER)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=max_attempts)).run_id

    async def failed_once() -> dict[str, Any] | None:  # a fresh run is pending too
        row = await stored_run(pool, run)
        return row if row["error"] is not None else None

    row = await wait_until(failed_once, "the first failure to be written", within=10)
    await wait_until(lambda: worker.active_run_ids == [], "the run to settle", within=10)
    assert row["status"] == status

    print(f"\nmax_attempts {max_attempts}: {outcome}")
    assert calls == [1]
    assert (row["attempts"], row["lease_worker_id"], row["output"]) == (1, None, None)
    assert (row["dead_lettered_at"] is not None) is (max_attempts == 1)
    error = row["error"]
    assert error["type"] == "RuntimeError"  # the handler's error, not the WorkerError fallback
    assert error["message"] == "nul \ufffd and lone \ufffd in the message"
    assert "nul \ufffd and lone \ufffd in the message" in error["traceback"]
    assert error["lease_generation"] == 1
    assert metric("zeroth_handler_errors_total", dep) == handler_errors + 1
    assert all_worker_errors(dep) == errors


async def test_an_output_larger_than_jsonb_holds_fails_its_run_and_the_next_run_completes(
        pool, spawn_worker, monkeypatch):
    """A 256 MB output was refused by the server (54000), retried as transient for ever while
    renewals kept its lease alive, and every completion after it queued behind. The worker now
    fails it non-retryably before sending (the limit is lowered here so the test stays small; the
    server side of 54000 is covered by the client's error mapping)."""
    from zeroth_pg import _jsonb

    monkeypatch.setattr(_jsonb, "MAX_JSONB_CHARACTERS", 1000)
    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        return {"text": "x" * 2000} if ctx.payload["kind"] == "big" else {"ok": 1}

    lm = LeaseManager(pool)
    big = await lm.enqueue_run(dep, payload={"kind": "big"}, max_attempts=3)
    small = await lm.enqueue_run(dep, payload={"kind": "small"})
    await spawn_worker(dep, handler)

    failed = await wait_for_status(pool, big.run_id, "failed")
    assert failed["attempts"] == 1  # not retried
    assert "cannot store the output" in failed["error"]["message"]
    assert (await wait_for_status(pool, small.run_id, "completed"))["output"] == {"ok": 1}


HUGE = 50 * 2**20  # a 50 MB message (one string shared by the hostile runs)


async def test_a_huge_exception_message_is_stored_and_logged_bounded_beside_innocent_runs(
        pool, spawn_worker, caplog):
    """Two runs raise ``ValueError(f"bad response: {body}")`` with a 50 MB body beside two runs
    that return at once, all claimed together. The innocent runs complete (no lease lost); each
    hostile run fails with an error document within the bound whose message says it was cut;
    no log record of the worker is longer than the bound (the worker logged, regex-scanned and
    JSON-encoded the whole message on the event loop, and stored it)."""
    from zeroth_pg.errors import MAX_ERROR_DOCUMENT_BYTES, MAX_ERROR_TEXT_BYTES

    dep = unique_deployment("harden")
    body = "x" * HUGE

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["hostile"]:
            raise ValueError(f"bad response: {body}")
        return {"i": ctx.payload["i"]}

    lm = LeaseManager(pool)
    runs = await lm.enqueue_runs(dep, [{"payload": {"hostile": i % 2 == 0, "i": i},
                                        "max_attempts": 1} for i in range(4)])
    lost = metric("zeroth_lease_lost_total", dep)
    caplog.set_level(logging.INFO, logger="zeroth_pg")
    await spawn_worker(dep, handler, max_concurrency=8)
    for i, run in enumerate(runs):
        hostile = i % 2 == 0
        row = await wait_for_status(pool, run.run_id, "failed" if hostile else "completed",
                                    within=60)
        if not hostile:
            assert row["output"] == {"i": i}
            continue
        size = await pool.fetchval(
            "SELECT octet_length(r.error::text) FROM zeroth.runs r WHERE r.run_id = $1",
            run.run_id)
        assert size <= MAX_ERROR_DOCUMENT_BYTES
        error = row["error"]
        assert error["type"] == "ValueError"
        message = error["message"]
        assert message.startswith("bad response: xxx")
        assert len(message.encode()) <= MAX_ERROR_TEXT_BYTES
        assert message.endswith(" characters]")
        assert "\u2026[truncated " in message
        assert len(error["traceback"].encode()) <= MAX_ERROR_TEXT_BYTES
        assert "ValueError: bad response: xxx" in error["traceback"]
    assert metric("zeroth_lease_lost_total", dep) == lost
    worker_records = [r for r in caplog.records if r.name.startswith("zeroth_pg")]
    failures = [r for r in worker_records if "failed" in r.getMessage()
                and "ValueError" in r.getMessage()]
    assert len(failures) == 2
    assert all("[truncated " in r.getMessage() for r in failures)
    assert max(len(r.getMessage().encode()) for r in worker_records) <= (
        MAX_ERROR_TEXT_BYTES + 1024)


class HugeNameError(Exception):
    pass


HugeNameError.__name__ = "HugeName" + "E" * 2**20


@pytest.mark.parametrize(("make", "field", "chained"), [
    (lambda: ValueError(list(range(2_000_000))), "message", False),
    (lambda: KeyError("k" * 5 * 2**20), "message", False),
    (lambda: ValueError("outer " * 2**20), "message", True),
    (HugeNameError, "type", False),
], ids=["huge-list-argument", "huge-key-error", "huge-chained", "huge-type-name"])
async def test_an_odd_handler_exception_is_stored_within_the_bound(pool, spawn_worker, make,
                                                                   field, chained):
    """An exception whose str() would build megabytes (a list argument, a KeyError's repr),
    one raised while handling another huge one, or one of a class with a megabyte name: its
    run fails with every text of its error document within the bound, the cut one marked."""
    from zeroth_pg.errors import MAX_ERROR_DOCUMENT_BYTES, MAX_ERROR_TEXT_BYTES

    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        exc = make()
        if chained:
            try:
                raise RuntimeError("inner " * 2**20)
            except RuntimeError:
                raise exc  # noqa: B904 - the implicit chain (__context__) is the point
        raise exc

    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await wait_for_status(pool, run, "failed")
    error = row["error"]
    assert await pool.fetchval(
        "SELECT octet_length(r.error::text) FROM zeroth.runs r WHERE r.run_id = $1",
        run) <= MAX_ERROR_DOCUMENT_BYTES
    for text in ("type", "message", "traceback"):
        assert len(error[text].encode()) <= MAX_ERROR_TEXT_BYTES, text
    assert "truncated " in error[field] or "..." in error[field]
    if chained:
        assert "During handling of the above exception" in error["traceback"]
    assert not worker.stopping


async def test_a_refused_error_document_still_fails_its_run_at_once(pool, spawn_worker):
    """When the error document itself is refused (a value the database cannot hold, or above
    the database's own bound), the worker writes a minimal one: the run fails now, with what
    refused it, instead of waiting for its lease to expire (the state had moved to settling,
    so the last-resort failure wrote nothing)."""
    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        raise ValueError("boom")

    worker = await spawn_worker(dep, handler, start=False)
    lm = worker.lease_manager
    real_settle_runs = lm.settle_runs
    documents: list[dict[str, Any]] = []

    async def settle_runs(worker_id: str, settlements: Any, **kwargs: Any) -> Any:
        sent = []
        for item in settlements:
            if item.error is not None:
                documents.append(dict(item.error))
                if len(documents) == 1:  # the first document holds a value jsonb cannot store
                    item = dataclasses.replace(item, error={**item.error, "poison": "\x00"})
            sent.append(item)
        return await real_settle_runs(worker_id, sent, **kwargs)

    lm.settle_runs = settle_runs  # type: ignore[method-assign]
    await worker.start()
    run = (await lm.enqueue_run(dep, max_attempts=1)).run_id
    row = await wait_for_status(pool, run, "failed")
    assert (row["attempts"], row["lease_worker_id"]) == (1, None)
    error = row["error"]
    assert (error["type"], error["message"]) == ("ValueError", "boom")
    assert "InvalidArgumentError" in error["refused"]
    assert len(documents) == 2
