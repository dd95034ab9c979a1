"""Where a task that ignored its cancellation waits, for the log line that abandons it.

An operator told only "a handler ignored its cancellation" has to guess which handler and which
await; a task's own ``get_stack()`` gives the outermost frame of a suspended coroutine alone (the
worker's, never the handler's). :func:`suspended_at` walks the chain of awaits down to the
innermost coroutine or generator and names its last frames.

What a handler awaits may be any object (a custom ``__await__``, a proxy whose attributes run
code), so the walk follows only real coroutines and generators, by exact type, reads only real
frames, never calls the handler's code, and never raises: anything it cannot read ends the walk.
Only code places are logged — file base names, function names, line numbers — each bounded and
reduced to printable characters, never a value the handler holds.
"""

from __future__ import annotations

import asyncio
import collections
import os
import types
from typing import Any

__all__ = ["suspended_at"]

_WALK = 200   # awaits followed at most (a handler's chain is a few dozen deep)
_NAME = 80   # characters kept of a file or function name
_UNKNOWN = "an unknown place"


def suspended_at(task: asyncio.Task[Any], frames: int = 3) -> str:
    """The innermost ``frames`` frames ``task`` is suspended in, innermost first, as
    ``file.py:line in function`` joined by " < " (ending in " < …" when the chain was longer
    than the walk follows); "an unknown place" when none can be told (the task is done, or its
    coroutine is not a plain one). Never raises."""
    try:
        return _where(task, frames)
    except Exception:  # a diagnostic: it must never cost the shutdown it reports on
        return _UNKNOWN


def _where(task: asyncio.Task[Any], frames: int) -> str:
    innermost: collections.deque[types.FrameType] = collections.deque(maxlen=frames)
    awaited: object = task.get_coro()
    cut = True
    for _ in range(_WALK):
        if type(awaited) is types.CoroutineType:
            frame, awaited = awaited.cr_frame, awaited.cr_await
        elif type(awaited) is types.GeneratorType:  # a generator-based awaitable
            frame, awaited = awaited.gi_frame, awaited.gi_yieldfrom
        else:  # a future, a custom awaitable, or the end: its frames are not ours to read
            cut = False
            break
        if type(frame) is not types.FrameType:
            cut = False
            break
        innermost.append(frame)
    if not innermost:
        return _UNKNOWN
    places = " < ".join(_place(frame) for frame in reversed(innermost))
    return places + " < …" if cut else places


def _place(frame: types.FrameType) -> str:
    code = frame.f_code
    return (f"{_printable(os.path.basename(code.co_filename))}:{int(frame.f_lineno or 0)} in "
            f"{_printable(code.co_name)}")


def _printable(name: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(name)[:_NAME])
