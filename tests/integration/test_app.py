"""The application API (zeroth_pg.App): deployments declared with a decorator, enqueued with
arguments checked against the handler's signature, served by one worker — async handlers on the
loop, plain functions in a thread of their own — on real sessions, with no test hook.

Who could break it: a caller that passes the wrong arguments (refused, nothing enqueued); another
client that writes a payload the handler cannot take (that run fails for good, its neighbours do
not); a sync handler that blocks (the loop still renews its lease and serves other runs), that
ignores a cancel (its writes are refused once the worker stopped it), or that raises.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

import asyncpg
import pytest
from helpers import wait_until

import zeroth_pg
from zeroth_pg import App, InvalidPayloadError, LeaseLostError, NonRetryableError, RetryPolicy
from zeroth_pg.client import LeaseManager

WITHIN = 30.0


async def run_row(pool: asyncpg.Pool, run_id: Any) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status::text AS status, payload::text AS payload, output::text AS output, "
        "error::text AS error, attempts, max_attempts, priority, tenant_id, "
        "run_after - clock_timestamp() AS delay FROM zeroth.runs WHERE run_id = $1", run_id)


async def finished(pool: asyncpg.Pool, run_id: Any) -> asyncpg.Record:
    async def done() -> asyncpg.Record | None:
        row = await run_row(pool, run_id)
        return row if row["status"] in ("completed", "failed", "cancelled") else None
    return await wait_until(done, f"run {run_id} to finish", within=WITHIN)


async def run_count(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM zeroth.runs")


class TestDeclaring:
    def test_the_decorator_registers_a_deployment_that_stays_callable(self, app):
        @app.deployment("greet", max_attempts=5, priority=2)
        async def greet(run, name: str) -> dict[str, str]:
            """Says hello."""
            return {"hello": name}

        assert app.deployments["greet"] is greet
        assert (greet.name, greet.max_attempts, greet.priority) == ("greet", 5, 2)
        assert greet.__doc__ == "Says hello."
        coroutine = greet(None, "x")
        assert asyncio.iscoroutine(coroutine)
        coroutine.close()

    def test_the_name_defaults_to_the_function_name_and_may_not_repeat(self, app):
        @app.deployment()
        def resize(run, width: int) -> None: ...

        assert app.deployments["resize"].is_async is False
        with pytest.raises(ValueError, match="registered already"):
            app.deployment("resize")(lambda run: None)

    @pytest.mark.parametrize(("source", "message"), [
        ("def h(run, priority: int): ...", "option of enqueue"),
        ("def h(run, *items: int): ...", "positional-only or \\*args"),
        ("def h(run, a, /, b): ...", "positional-only or \\*args"),
        ("def h(*, to: str): ...", "first positional parameter"),
        ("def h(run, when: datetime.datetime): ...", "not a JSON type"),
        ("def h(run, keys: dict[int, str]): ...", "keys are strings"),
        ("def h(run, tags: set[str]): ...", "not a JSON type"),
        ("def h(run, x: 'Missing'): ...", "cannot resolve the annotations"),
        ("def h(run, x: float = float('nan')): ...", "default is not JSON"),
    ])
    def test_a_handler_whose_arguments_cannot_be_json_is_refused_when_declared(
            self, app, source, message):
        namespace: dict[str, Any] = {"datetime": __import__("datetime")}
        exec(source, namespace)
        with pytest.raises(TypeError, match=message):
            app.deployment("bad")(namespace["h"])
        assert "bad" not in app.deployments

    def test_callable_objects_and_partials_are_handlers_too(self, app):
        class Scaler:
            async def __call__(self, run, value: int, factor: int = 2) -> int:
                return value * factor

        def scale(run, value: int, factor: int) -> int:
            return value * factor

        scaler = app.deployment("scaler")(Scaler())
        doubler = app.deployment("doubler")(functools.partial(scale, factor=2))
        assert (scaler.is_async, doubler.is_async) == (True, False)
        assert scaler.payload(3) == {"value": 3}
        with pytest.raises(InvalidPayloadError, match="value: expected an integer"):
            doubler.payload(value="3")

    def test_a_local_concurrency_must_be_positive(self, app):
        with pytest.raises(ValueError, match="at least 1"):
            app.deployment("x", concurrency=0)(lambda run: None)


class TestEnqueue:
    async def test_arguments_become_the_payload_and_options_the_run(self, app, pool):
        @app.deployment("send-email", max_attempts=5, priority=3)
        async def send_email(run, to: str, subject: str, cc: list[str] | None = None): ...

        queued = await send_email.enqueue(to="a@b", subject="hi", tenant_id="acme")
        row = await run_row(pool, queued.run_id)
        assert json.loads(row["payload"]) == {"to": "a@b", "subject": "hi"}
        assert (row["tenant_id"], row["max_attempts"], row["priority"]) == ("acme", 5, 3)
        override = await send_email.enqueue("c@d", "yo", cc=["e@f"], max_attempts=1,
                                            priority=9)
        row = await run_row(pool, override.run_id)
        assert json.loads(row["payload"]) == {"to": "c@d", "subject": "yo", "cc": ["e@f"]}
        assert (row["max_attempts"], row["priority"]) == (1, 9)

    @pytest.mark.parametrize(("call", "message"), [
        (lambda d: d.enqueue(to="a@b"), "missing 'subject'"),
        (lambda d: d.enqueue(to="a@b", subject="s", bcc="x"), "unexpected argument 'bcc'"),
        (lambda d: d.enqueue(to=1, subject="s"), "to: expected a string, got an integer"),
        (lambda d: d.enqueue(to="a", subject="s", cc=["x", 2]), r"cc: .*\[1\]"),
        (lambda d: d.enqueue(to="a", subject="s", size=True), "size: expected an integer"),
        (lambda d: d.enqueue(to="a", subject="s", mode="loud"), "expected one of"),
        (lambda d: d.enqueue(to="a", subject="s", extra={"k": {1, 2}}), "not storable"),
        (lambda d: d.enqueue(to="a", subject="s", extra={"k": float("inf")}), "not storable"),
        (lambda d: d.enqueue(to="a\x00", subject="s"), "U\\+0000"),
        (lambda d: d.enqueue("a", "s", None, 0, "quiet", None, 1), "6 positional argument"),
        (lambda d: d.enqueue("a", to="b", subject="s"), "several values for argument 'to'"),
    ])
    async def test_arguments_that_do_not_fit_the_handler_are_refused_and_nothing_is_enqueued(
            self, app, pool, call, message):
        @app.deployment("send-email")
        async def send_email(run, to: str, subject: str, cc: list[str] | None = None,
                             size: int = 0, mode: Literal["quiet", "normal"] = "normal",
                             extra: dict[str, Any] | None = None): ...

        with pytest.raises(InvalidPayloadError, match=message) as caught:
            await call(send_email)
        assert isinstance(caught.value, zeroth_pg.InvalidArgumentError)  # ZP008's class too
        assert await run_count(pool) == 0

    async def test_a_refusal_names_every_problem_and_the_argument_of_an_unstorable_value(
            self, app, pool):
        @app.deployment("send-email")
        async def send_email(run, to: str, subject: str,
                             extra: dict[str, Any] | None = None): ...

        with pytest.raises(InvalidPayloadError) as caught:
            await send_email.enqueue(to="a", extra={"k": {1, 2}})  # subject missing too
        message = str(caught.value)
        assert "missing 'subject'" in message
        assert "extra: not storable as JSON" in message
        huge_name = "k" * 1_000_000
        with pytest.raises(InvalidPayloadError) as caught:
            await send_email.enqueue(to="a", subject="s", **{huge_name: 1})
        assert len(str(caught.value)) < 1_000  # a caller's argument name is bounded
        assert await run_count(pool) == 0

    async def test_enqueue_many_names_every_bad_payload_not_only_the_first(self, app, pool):
        @app.deployment("thumb")
        async def thumb(run, path: str, width: int = 100): ...

        with pytest.raises(InvalidPayloadError) as caught:
            await thumb.enqueue_many([{"path": "a"}, {"width": 1}, "x",  # type: ignore[list-item]
                                      {"path": "b", "width": "wide"}])
        message = str(caught.value)
        assert "3 bad payload(s)" in message
        for named in ("payload [1]", "missing 'path'", "payload [2] is not a mapping",
                      "payload [3]", "width"):
            assert named in message
        with pytest.raises(InvalidPayloadError) as caught:
            await thumb.enqueue_many([{"width": 1}] * 50)
        assert "50 bad payload(s)" in str(caught.value)
        assert "and 30 more" in str(caught.value)
        assert await run_count(pool) == 0

    async def test_numbers_follow_json_and_annotated_unions_are_checked(self, app, pool):
        @app.deployment("measure")
        async def measure(run, ratio: float, label: Annotated[str | None, "doc"],
                          **tags: int): ...

        await measure.enqueue(ratio=1, label=None, retries=3)  # an int is a JSON number
        with pytest.raises(InvalidPayloadError, match="retries: expected an integer"):
            await measure.enqueue(ratio=1.5, label="x", retries="3")
        with pytest.raises(InvalidPayloadError, match="matches none of"):
            await measure.enqueue(ratio=1.5, label=3)
        assert await run_count(pool) == 1

    async def test_configure_binds_options_and_conn_enqueues_in_the_callers_transaction(
            self, app, pool):
        @app.deployment("audit")
        async def audit(run, event: str): ...

        with pytest.raises(TypeError, match="unknown enqueue option"):
            audit.configure(tenant="acme")
        async with pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            await audit.configure(conn=conn, tenant_id="acme").enqueue(event="login")
            await transaction.rollback()
        assert await run_count(pool) == 0  # rolled back with the caller's transaction
        unopened = App()  # no DSN: it would start the embedded server if it opened a pool
        unopened.deployment("audit")(audit.fn)
        async with pool.acquire() as conn:
            await unopened.deployments["audit"].configure(conn=conn).enqueue(event="inside")
        assert unopened._pool is None  # the caller's connection was enough
        assert await run_count(pool) == 1
        await pool.execute("DELETE FROM zeroth.runs")
        queued = await audit.configure(tenant_id="acme", workspace_id="w1").enqueue(event="x")
        assert (await run_row(pool, queued.run_id))["tenant_id"] == "acme"

    async def test_enqueue_many_checks_every_payload_before_sending_any(self, app, pool):
        @app.deployment("thumb", max_attempts=4)
        async def thumb(run, path: str, width: int = 100): ...

        with pytest.raises(InvalidPayloadError, match=r"payload \[1\]: .*width"):
            await thumb.enqueue_many([{"path": "a"}, {"path": "b", "width": "wide"}])
        with pytest.raises(InvalidPayloadError, match=r"payload \[0\] is not a mapping"):
            await thumb.enqueue_many(["a"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="enqueue_many takes no option"):
            await thumb.enqueue_many([{"path": "a"}], idempotency_key="k")
        assert await run_count(pool) == 0
        runs = await thumb.enqueue_many([{"path": "a"}, {"path": "b", "width": 5}],
                                        tenant_id="acme", priority=7)
        rows = [await run_row(pool, r.run_id) for r in runs]
        assert [json.loads(r["payload"]) for r in rows] == [{"path": "a"},
                                                            {"path": "b", "width": 5}]
        assert {(r["tenant_id"], r["priority"], r["max_attempts"]) for r in rows} == {
            ("acme", 7, 4)}


class TestServing:
    async def test_one_worker_serves_async_and_sync_deployments(self, app, pool, serve):
        loop_thread = threading.get_ident()
        threads: dict[str, int] = {}

        @app.deployment("greet")
        async def greet(run, name: str) -> dict[str, str]:
            threads["greet"] = threading.get_ident()
            return {"hello": name, "tenant": run.scope.tenant_id}

        @app.deployment("shout")
        def shout(run, text: str) -> dict[str, str]:
            threads["shout"] = threading.get_ident()
            run.progress({"step": 1})  # a blocking, fenced write from the thread
            run.checkpoint({"upper": text.upper()})
            return {"shout": text.upper(), "attempt": run.attempt}

        a = await greet.enqueue(name="world", tenant_id="acme")
        b = await shout.enqueue(text="hi", tenant_id="globex")
        await serve()
        assert json.loads((await finished(pool, a.run_id))["output"]) == {
            "hello": "world", "tenant": "acme"}
        assert json.loads((await finished(pool, b.run_id))["output"]) == {
            "shout": "HI", "attempt": 1}
        assert threads["greet"] == loop_thread
        assert threads["shout"] != loop_thread
        assert await pool.fetchval("SELECT count(*) FROM zeroth.checkpoints "
                                   "WHERE run_id = $1", b.run_id) == 1

    async def test_a_blocked_sync_handler_blocks_neither_the_loop_nor_its_lease(
            self, app, pool, serve):
        release = threading.Event()

        @app.deployment("slow")
        def slow(run) -> str:
            release.wait(WITHIN)
            return "done"

        @app.deployment("fast")
        async def fast(run) -> str:
            return "fast"

        blocked = await slow.enqueue()
        # Renewed every 1 s (a lease of 3 s: a renewal held up on a loaded machine does not
        # lose it).
        await serve(lease_duration=3.0)
        await wait_until(lambda: pool.fetchval(
            "SELECT status = 'running' FROM zeroth.runs WHERE run_id = $1", blocked.run_id),
            "the slow run to start", within=WITHIN)
        first = await pool.fetchval("SELECT lease_expires_at FROM zeroth.runs "
                                    "WHERE run_id = $1", blocked.run_id)
        quick = await fast.enqueue()
        assert (await finished(pool, quick.run_id))["output"] == '"fast"'  # loop not blocked
        await wait_until(lambda: pool.fetchval(
            "SELECT lease_expires_at > $2::timestamptz + interval '1.5 seconds' FROM zeroth.runs "
            "WHERE run_id = $1", blocked.run_id, first), "two renewals", within=WITHIN)
        release.set()
        row = await finished(pool, blocked.run_id)
        assert (row["status"], row["attempts"]) == ("completed", 1)

    async def test_a_sync_handler_sees_a_cancel_and_its_writes_are_refused_after_it(
            self, app, pool, serve):
        seen: dict[str, Any] = {}
        polling = threading.Event()

        @app.deployment("loop")
        def loop(run) -> str:
            polling.set()
            while not run.cancel_requested:
                threading.Event().wait(0.01)
            seen["stop_requested"] = run.stop_requested
            # The worker settles the run as cancelled; wait until it let go of this thread.
            while not run._stopped.is_set():
                threading.Event().wait(0.01)
            try:
                run.progress({"late": True})
            except LeaseLostError as exc:
                seen["refused"] = str(exc)
            return "ignored"

        queued = await loop.enqueue()
        await serve()
        await asyncio.to_thread(polling.wait, WITHIN)
        await LeaseManager(pool).request_cancel(queued.run_id)
        row = await finished(pool, queued.run_id)
        assert row["status"] == "cancelled"
        await wait_until(lambda: "refused" in seen, "the thread's late write", within=WITHIN)
        assert seen == {"stop_requested": True, "refused": "the worker stopped this run"}
        assert await pool.fetchval("SELECT progress FROM zeroth.runs WHERE run_id = $1",
                                   queued.run_id) is None

    async def test_a_stored_payload_that_does_not_fit_fails_that_run_without_retry(
            self, app, pool, serve):
        @app.deployment("typed")
        def typed(run, count: int) -> int:
            return count * 2

        lm = LeaseManager(pool)  # another client, writing payloads the handler cannot take
        wrong = await lm.enqueue_run("typed", {"count": "two"}, max_attempts=5)
        unknown = await lm.enqueue_run("typed", {"count": 1, "colour": "red"}, max_attempts=5)
        right = await typed.enqueue(count=21)
        await serve()
        for bad, message in ((wrong, "count: expected an integer"),
                             (unknown, "unexpected argument 'colour'")):
            row = await finished(pool, bad.run_id)
            assert (row["status"], row["attempts"]) == ("failed", 1)
            error = json.loads(row["error"])
            assert error["type"] == "InvalidPayloadError"
            assert message in error["message"]
        assert (await finished(pool, right.run_id))["output"] == "42"

    async def test_non_retryable_error_fails_at_once_and_a_retry_policy_sets_the_backoff(
            self, app, pool, serve):
        @app.deployment("charge")
        async def charge(run, card: str) -> None:
            raise NonRetryableError(f"card {card} declined")

        @app.deployment("fetch", retry=RetryPolicy(base_seconds=3600, max_seconds=7200))
        def fetch(run) -> None:
            raise ConnectionError("upstream down")

        declined = await charge.enqueue(card="4242", max_attempts=5)
        flaky = await fetch.enqueue(max_attempts=5)
        await serve()
        row = await finished(pool, declined.run_id)
        assert (row["status"], row["attempts"]) == ("failed", 1)
        assert json.loads(row["error"])["message"] == "card 4242 declined"
        row = await wait_until(lambda: pool.fetchrow(
            "SELECT status::text, run_after - clock_timestamp() AS delay FROM zeroth.runs "
            "WHERE run_id = $1 AND attempts = 1 AND status = 'pending'", flaky.run_id),
            "the retry to be scheduled", within=WITHIN)
        assert row["delay"].total_seconds() > 1000  # the deployment's policy, not 1 s

    async def test_a_deployment_limit_bounds_its_handlers_and_not_the_others(
            self, app, pool, serve):
        running = {"narrow": 0, "wide": 0}
        peak = {"narrow": 0, "wide": 0}
        release = asyncio.Event()

        def tracked(name: str) -> Callable[..., Awaitable[None]]:
            async def handle(run) -> None:
                running[name] += 1
                peak[name] = max(peak[name], running[name])
                try:
                    await release.wait()
                finally:
                    running[name] -= 1
            return handle

        narrow = app.deployment("narrow", concurrency=2)(tracked("narrow"))
        wide = app.deployment("wide")(tracked("wide"))
        await narrow.enqueue_many([{}] * 6)
        await wide.enqueue_many([{}] * 6)
        await serve(max_concurrency=8)
        await wait_until(lambda: running == {"narrow": 2, "wide": 6},
                         "2 narrow and 6 wide handlers to run", within=WITHIN)
        release.set()
        await wait_until(lambda: pool.fetchval(
            "SELECT count(*) = 12 FROM zeroth.runs WHERE status = 'completed'"),
            "every run to complete", within=WITHIN)
        assert peak == {"narrow": 2, "wide": 6}

    async def test_a_worker_of_some_deployments_leaves_the_others(self, app, pool, serve):
        @app.deployment("served")
        async def served(run) -> int:
            return 1

        @app.deployment("other")
        async def other(run) -> int:
            return 2

        a, b = await served.enqueue(), await other.enqueue()
        with pytest.raises(ValueError, match="no deployment 'nope'"):
            await app.worker(["nope"])
        await serve("served")
        assert (await finished(pool, a.run_id))["status"] == "completed"
        assert (await run_row(pool, b.run_id))["status"] == "pending"


async def test_an_app_opens_its_own_pool_from_a_dsn_and_closes_it(database_dsn):
    app = App(database_dsn)

    @app.deployment("own")
    async def own(run) -> None: ...

    async with app:
        queued = await own.enqueue()
        pool = await app.open()
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs WHERE run_id = $1",
                                   queued.run_id) == 1
    assert pool._closed
