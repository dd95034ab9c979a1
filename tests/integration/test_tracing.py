"""OpenTelemetry: one trace follows a run from the request that enqueued it, across processes
and retries (zeroth_pg.tracing), recorded with the SDK's in-memory exporter.

The producer and the worker are separate processes, as in production: the only thing that
carries the trace from one to the other is the run's metadata in the database. Each process
sets its own tracer provider (a global, so the test session's own stays untouched).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[2]

_SDK = """
import asyncio, json, os, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

def dump(extra):
    spans = [{
        "name": s.name, "kind": s.kind.name, "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent": format(s.parent.span_id, "016x") if s.parent else None,
        "attributes": dict(s.attributes), "status": s.status.status_code.name,
        "events": [e.name for e in s.events],
        "links": [format(link.context.span_id, "016x") for link in s.links],
    } for s in exporter.get_finished_spans()]
    print(json.dumps({**extra, "spans": spans}))
"""

_PRODUCER = _SDK + """
import asyncpg
from zeroth_pg import LeaseManager

async def main():
    pool = await asyncpg.create_pool(os.environ["ZEROTH_PG_DSN"], min_size=1, max_size=2)
    with trace.get_tracer("test").start_as_current_span("POST /orders"):
        run = await LeaseManager(pool).enqueue_run("traced", {"n": 1}, max_attempts=3)
        await LeaseManager(pool).enqueue_runs("traced-batch", [{"payload": {}}, {"payload": {}}])
    await pool.close()
    dump({"run_id": str(run.run_id)})

asyncio.run(main())
"""

_WORKER = _SDK + """
import asyncpg
from zeroth_pg import RunWorker

async def handle(run):
    with trace.get_tracer("test").start_as_current_span("handler work"):
        pass
    if run.attempt == 1:
        await run.checkpoint({"step": 1})
        raise RuntimeError("the first attempt fails")
    return {"ok": True}

async def main():
    dsn = os.environ["ZEROTH_PG_DSN"]
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=6)
    worker = RunWorker(pool, "traced", handle, dsn=dsn, poll_interval=0.05,
                       retry_base_seconds=0, retry_max_seconds=0)
    await worker.start()
    while await pool.fetchval("SELECT status::text FROM zeroth.runs "
                              "WHERE deployment_ref = 'traced'") != "completed":
        await asyncio.sleep(0.05)
    await worker.graceful_shutdown()
    await pool.close()
    dump({})

asyncio.run(main())
"""


async def _run(code: str, dsn: str) -> dict[str, Any]:
    env = {**os.environ, "ZEROTH_PG_DSN": dsn}
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


async def test_one_trace_follows_a_run_from_its_request_across_processes_and_retries(
        database_dsn):
    produced = await _run(_PRODUCER, database_dsn)
    (request,) = _named(produced["spans"], "POST /orders")
    (send,) = _named(produced["spans"], "send traced")
    assert (send["kind"], send["parent"], send["trace_id"]) == (
        "PRODUCER", request["span_id"], request["trace_id"])
    assert send["attributes"] == {
        "messaging.system": "zeroth_pg", "messaging.destination.name": "traced",
        "messaging.operation.type": "send", "messaging.operation.name": "enqueue_run",
        "zeroth.tenant_id": "default", "messaging.message.id": produced["run_id"]}
    (batch,) = _named(produced["spans"], "send traced-batch")
    assert batch["attributes"]["messaging.batch.message_count"] == 2

    conn = await asyncpg.connect(database_dsn)
    try:
        carriers = await conn.fetch("SELECT deployment_ref, metadata -> 'otel' AS otel "
                                    "FROM zeroth.runs ORDER BY deployment_ref")
    finally:
        await conn.close()
    # The trace context the enqueue wrote: W3C traceparent 00-<trace id>-<send span id>-<flags>,
    # sampled (flags bit 0).
    version, trace_id, parent_id, flags = json.loads(carriers[0]["otel"])["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", send["trace_id"], send["span_id"])
    assert int(flags, 16) & 1
    assert {json.loads(c["otel"])["traceparent"].split("-")[2] for c in carriers[1:]} == {
        batch["span_id"]}

    spans = (await _run(_WORKER, database_dsn))["spans"]
    attempts = sorted(_named(spans, "process traced"),
                      key=lambda s: s["attributes"]["zeroth.attempt"])
    assert [a["attributes"]["zeroth.attempt"] for a in attempts] == [1, 2]
    for attempt in attempts:  # each attempt: a child of the enqueue, in the request's trace
        assert (attempt["kind"], attempt["trace_id"], attempt["parent"]) == (
            "CONSUMER", send["trace_id"], send["span_id"])
        assert attempt["attributes"]["messaging.message.id"] == produced["run_id"]
        assert attempt["attributes"]["messaging.operation.type"] == "process"
    first, second = attempts
    assert (first["status"], first["events"]) == ("ERROR", ["exception"])
    assert first["attributes"]["zeroth.outcome"] == "handler failed"
    assert (second["status"], second["attributes"]["zeroth.outcome"]) == ("UNSET", "completed")

    def children(parent: dict[str, Any]) -> list[str]:
        return sorted(s["name"] for s in spans if s["parent"] == parent["span_id"])

    assert children(first) == ["checkpoint traced", "handler work"]
    assert children(second) == ["complete traced", "handler work"]
    receives = _named(spans, "receive traced")
    assert receives
    assert all(r["kind"] == "CONSUMER" for r in receives)
    assert {link for r in receives for link in r["links"]} == {send["span_id"]}


async def test_without_opentelemetry_runs_carry_no_trace_and_work_as_before(database_dsn):
    """The otel extra missing (its import fails): no span, no metadata key, same behaviour."""
    code = """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        import asyncio, os, asyncpg
        from zeroth_pg import LeaseManager, RunWorker, tracing
        assert not tracing.enabled()

        async def handle(run):
            await run.checkpoint({"x": 1})
            return {"ok": True}

        async def main():
            dsn = os.environ["ZEROTH_PG_DSN"]
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=6)
            await LeaseManager(pool).enqueue_run("untraced", {}, metadata={"k": "v"})
            worker = RunWorker(pool, "untraced", handle, dsn=dsn, poll_interval=0.05)
            await worker.start()
            while await pool.fetchval("SELECT status::text FROM zeroth.runs") != "completed":
                await asyncio.sleep(0.05)
            await worker.graceful_shutdown()
            await pool.close()
            print("{}")

        asyncio.run(main())
        """
    await _run(code, database_dsn)
    conn = await asyncpg.connect(database_dsn)
    try:
        metadata = await conn.fetchval("SELECT metadata::text FROM zeroth.runs")
    finally:
        await conn.close()
    assert metadata == '{"k": "v"}'


async def test_a_caller_that_set_the_trace_key_itself_keeps_it(database_dsn):
    """Another client's carrier in metadata.otel is never overwritten by the enqueue."""
    code = _SDK + """
import asyncpg
from zeroth_pg import LeaseManager

async def main():
    pool = await asyncpg.create_pool(os.environ["ZEROTH_PG_DSN"], min_size=1, max_size=2)
    mine = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    with trace.get_tracer("test").start_as_current_span("request"):
        await LeaseManager(pool).enqueue_run("kept", {}, metadata={"otel": mine})
    await pool.close()
    dump({})

asyncio.run(main())
"""
    await _run(code, database_dsn)
    conn = await asyncpg.connect(database_dsn)
    try:
        otel = await conn.fetchval("SELECT metadata -> 'otel' ->> 'traceparent' "
                                   "FROM zeroth.runs")
    finally:
        await conn.close()
    assert otel == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_huge_exception_is_recorded_on_the_span_within_the_bound(database_dsn):
    """A handler's exception with a 20 MB message is recorded on the attempt's span as an
    ``exception`` event whose message and stack trace are within the bound (the SDK's
    record_exception would copy the whole message, and format the whole traceback, into the span
    on the event loop)."""
    from zeroth_pg.errors import MAX_ERROR_TEXT_BYTES

    code = _SDK + """
import asyncpg
from zeroth_pg import LeaseManager, RunWorker

async def handle(run):
    raise ValueError("bad response: " + "x" * (20 * 2**20))

async def main():
    dsn = os.environ["ZEROTH_PG_DSN"]
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=6)
    await LeaseManager(pool).enqueue_run("traced-huge", {}, max_attempts=1)
    worker = RunWorker(pool, "traced-huge", handle, dsn=dsn, poll_interval=0.05)
    await worker.start()
    while await pool.fetchval("SELECT status::text FROM zeroth.runs "
                              "WHERE deployment_ref = 'traced-huge'") != "failed":
        await asyncio.sleep(0.05)
    await worker.graceful_shutdown()
    await pool.close()
    events = [{"span": s.name, "name": e.name,
               "sizes": {k: len(str(v).encode()) for k, v in e.attributes.items()},
               "message_end": str(e.attributes.get("exception.message", ""))[-40:]}
              for s in exporter.get_finished_spans() for e in s.events]
    print(json.dumps({"events": events}))

asyncio.run(main())
"""
    events = (await _run(code, database_dsn))["events"]
    recorded = [e for e in events if e["span"] == "process traced-huge"]
    assert [e["name"] for e in recorded] == ["exception"]
    (event,) = recorded
    assert event["sizes"]["exception.type"] == len("ValueError")
    assert event["sizes"]["exception.message"] <= MAX_ERROR_TEXT_BYTES
    assert event["sizes"]["exception.stacktrace"] <= MAX_ERROR_TEXT_BYTES
    assert event["message_end"].endswith(" characters]")
    assert all(size <= MAX_ERROR_TEXT_BYTES for e in events for size in e["sizes"].values())
