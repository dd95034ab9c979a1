"""Where an abandoned handler waits (zeroth_pg.worker._stuck.suspended_at): the innermost frames
of its awaits, for the log line of a drain that abandons it. Pure state; the worker's line is
checked in tests/adversarial/test_web_and_exporter_attacks.py. A handler's awaitables are
hostile here: the walk must never raise, run their code, or print what they hold."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from zeroth_pg.worker._stuck import suspended_at

SECRET = "SECRET-VALUE"


async def _parked(awaitable: Any) -> asyncio.Task[Any]:
    async def handler() -> None:
        await awaitable

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)  # let it reach its await
    return task


async def _done(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_names_the_innermost_frames_of_the_awaits_innermost_first():
    async def inner() -> None:
        await asyncio.sleep(3600)

    task = await _parked(inner())
    place = suspended_at(task)
    await _done(task)

    assert place.startswith("tasks.py:"), place
    assert " in sleep < test_stuck_task_place.py:" in place
    assert place.endswith(" in handler")
    assert place.count(" < ") == 2


async def test_a_task_that_ended_is_an_unknown_place():
    task = await _parked(asyncio.sleep(0))
    await _done(task)
    assert suspended_at(task) == "an unknown place"


class _Hostile:
    """An awaitable whose iterator raises on every attribute, every truth test and length."""

    def __await__(self) -> Generator[Any, None, None]:
        return self._Iterator()

    class _Iterator:
        def __iter__(self) -> Any:
            return self

        def __next__(self) -> Any:
            return None  # a bare yield: the task waits (is stepped again at each turn)

        def __getattr__(self, name: str) -> Any:
            if name in ("send", "throw", "close"):  # what asyncio itself looks up
                raise AttributeError(name)
            raise KeyError(SECRET)

        def __bool__(self) -> bool:
            raise ValueError(SECRET)

        def __len__(self) -> int:
            raise ValueError(SECRET)


class _FakeFrame:
    f_lineno = SECRET * 100

    class f_code:  # a frame's attribute, mimicked
        co_filename = SECRET
        co_name = SECRET


class _Lookalike:
    """An awaitable that claims coroutine attributes pointing at a fake frame."""

    cr_frame = _FakeFrame()
    cr_await = None
    gi_frame = _FakeFrame()
    gi_yieldfrom = None

    def __await__(self) -> Generator[Any, None, None]:
        return self  # type: ignore[return-value]

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        return None


async def test_hostile_or_lookalike_awaitables_end_the_walk_without_running_or_showing_them():
    for awaitable in (_Hostile(), _Lookalike()):
        task = await _parked(awaitable)
        place = suspended_at(task)
        await _done(task)
        assert SECRET not in place, place
        assert place.endswith(" in handler"), place


async def test_a_chain_deeper_than_the_walk_says_it_was_cut_short():
    async def deep(n: int) -> None:
        if n:
            await deep(n - 1)
        else:
            await asyncio.sleep(3600)

    task = await _parked(deep(300))
    place = suspended_at(task, frames=2)
    await _done(task)

    assert place.endswith(" < …"), place
    assert place.count(" in deep") == 2


async def test_unprintable_names_cannot_forge_a_log_line():
    code = compile("async def f(aw):\n    await aw\n", "evil\nINFO forged line.py", "exec")
    scope: dict[str, Any] = {}
    exec(code, scope)

    task = await _parked(scope["f"](asyncio.sleep(3600)))
    place = suspended_at(task)
    await _done(task)

    assert "\n" not in place
    assert "evil?INFO forged line.py:2 in f" in place
