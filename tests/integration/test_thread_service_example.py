"""examples/thread_service driven over HTTP (httpx, in-process ASGI transport) while two real
``python -m zeroth_pg.worker`` processes execute its runs (handlers.py), all on one database.

Checks the HTTP contract of docs/threads.md end to end: admit (202 / 409 / 200 reused / 422),
enqueue and join (200 once ended), cancel of a run a worker owns (204 with wait: the worker
stopped on NOTIFY), interrupt of a live owner (202 queued, then the new run runs), 404s.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_worker_processes import WorkerProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "thread_service"
DEPLOYMENT = "thread-service"


def load_app_module() -> Any:
    spec = importlib.util.spec_from_file_location("thread_service_app", EXAMPLE / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def service(database_dsn: str, monkeypatch: pytest.MonkeyPatch
                  ) -> AsyncIterator[tuple[httpx.AsyncClient, list[WorkerProcess]]]:
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE))  # handlers:chat
    monkeypatch.setenv("ZEROTH_PG_DSN", database_dsn)  # the handler's own pool
    procs = [await WorkerProcess.spawn(database_dsn, DEPLOYMENT, "handlers:chat")
             for _ in range(2)]
    app = load_app_module().create_app(database_dsn, grace_seconds=1)
    try:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://service") as client:
            for proc in procs:
                await proc.started()
            yield client, procs
    finally:
        for proc in procs:
            await proc.stop()


async def wait_running(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        run = (await client.get(f"/runs/{run_id}")).json()
        if run["status"] == "running":
            return run  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"run {run_id} never started: {run}"
        await asyncio.sleep(0.02)


async def test_thread_service_over_http_with_two_worker_processes(service: Any) -> None:
    client, procs = service

    # Admit, refuse a second run, queue a third, replay an idempotent admission.
    first = await client.post("/threads/t-1/runs", json={"message": "hi", "steps": 4,
                                                          "step_seconds": 0.1},
                              headers={"Idempotency-Key": "turn-1"})
    assert first.status_code == 202
    assert first.json()["outcome"] == "admitted"
    first_id = first.json()["run_id"]
    assert first.headers["Location"] == f"/runs/{first_id}"
    busy = await client.post("/threads/t-1/runs", json={"message": "again"})
    assert busy.status_code == 409
    assert busy.json()["active_run_id"] == first_id
    queued = await client.post("/threads/t-1/runs?strategy=enqueue", json={"message": "next"})
    assert (queued.status_code, queued.json()["outcome"]) == (202, "queued")
    replay = await client.post("/threads/t-1/runs", json={"message": "hi"},
                               headers={"Idempotency-Key": "turn-1"})
    assert (replay.status_code, replay.json()["run_id"]) == (200, first_id)

    # Both end in order; join answers 200 with the output and the typed accounting.
    done = await client.get(f"/runs/{first_id}/join?timeout=15")
    assert done.status_code == 200
    assert done.json()["status"] == "completed"
    assert done.json()["output"]["reply"] == "echo: hi"
    assert done.json()["accounting"]["llm_call_count"] == 4
    nxt = await client.get(f"/runs/{queued.json()['run_id']}/join?timeout=15")
    assert (nxt.status_code, nxt.json()["status"]) == (200, "completed")
    listed = (await client.get("/threads/t-1/runs")).json()
    assert [run["run_id"] for run in listed] == [queued.json()["run_id"], first_id]

    # Cancel a run a worker owns: the service is not the owner; with wait, 204 once it ended.
    slow = (await client.post("/threads/t-2/runs", json={"steps": 1000})).json()["run_id"]
    owner = (await wait_running(client, slow))["worker_id"]
    assert owner in {proc.worker_id for proc in procs}
    sent = time.monotonic()
    cancelled = await client.post(f"/runs/{slow}/cancel?action=interrupt&wait=10")
    assert cancelled.status_code == 204
    print(f"\n[thread service] POST cancel (wait) on a worker-owned run -> 204 in "
          f"{time.monotonic() - sent:.3f} s")
    ended = (await client.get(f"/runs/{slow}")).json()
    assert (ended["status"], ended["cancel_action"]) == ("cancelled", "interrupt")
    again = await client.post(f"/runs/{slow}/cancel")
    assert again.status_code == 409

    # Interrupt a live owner: 202 queued behind it, then the new run runs.
    long = (await client.post("/threads/t-3/runs", json={"steps": 1000})).json()["run_id"]
    await wait_running(client, long)
    interrupt = await client.post("/threads/t-3/runs?strategy=interrupt", json={"message": "stop"})
    assert interrupt.status_code == 202
    assert interrupt.json()["outcome"] == "queued"
    assert interrupt.json()["displaced"] == [{"run_id": long, "outcome": "cancel_requested"}]
    assert int(interrupt.headers["Retry-After"]) >= 1
    replaced = await client.get(f"/runs/{interrupt.json()['run_id']}/join?timeout=15")
    assert (replaced.status_code, replaced.json()["output"]["reply"]) == (200, "echo: stop")
    assert (await client.get(f"/runs/{long}")).json()["status"] == "cancelled"

    # Bad input and unknown runs.
    assert (await client.post("/threads/t-1/runs?strategy=steal")).status_code == 422
    assert (await client.post("/threads/t-1/runs", content=b"[1]")).status_code == 422
    unknown = "00000000-0000-0000-0000-000000000000"
    assert (await client.post(f"/runs/{unknown}/cancel")).status_code == 404
    assert (await client.get(f"/runs/{unknown}/join?timeout=1")).status_code == 404
    assert (await client.get("/runs/not-a-uuid")).status_code == 404
