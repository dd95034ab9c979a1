"""Where a task that ignored its cancellation waits, for the log line that abandons it.

An operator told only "a handler ignored its cancellation" has to guess which handler and which
await; a task's own ``get_stack()`` gives the outermost frame of a suspended coroutine alone (the
worker's, never the handler's). :func:`suspended_at` walks the chain of awaits down to the
innermost coroutine or generator and names its last frames. Only code names and places are
logged (file base names and function names, each bounded), never a value the handler holds.
"""

from __future__ import annotations

import asyncio
import os
from types import FrameType
from typing import Any

__all__ = ["suspended_at"]

_WALK = 200  # awaits followed at most (a chain is a few dozen deep; a cycle cannot loop)
_NAME = 80   # characters kept of a file or function name


def suspended_at(task: asyncio.Task[Any], frames: int = 3) -> str:
    """The innermost ``frames`` frames ``task`` is suspended in, innermost first, as
    ``file.py:line in function`` joined by " < "; "an unknown place" when none can be told
    (the task is done, or waits on something other than a coroutine or generator)."""
    chain: list[FrameType] = []
    awaited: Any = task.get_coro()
    for _ in range(_WALK):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        chain.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    if not chain:
        return "an unknown place"
    return " < ".join(
        f"{os.path.basename(f.f_code.co_filename)[:_NAME]}:{f.f_lineno} in "
        f"{f.f_code.co_name[:_NAME]}" for f in reversed(chain[-frames:]))
