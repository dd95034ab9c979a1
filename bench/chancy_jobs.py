"""The chancy job the benchmark pushes (chancy imports a job's function by its dotted name).

Only imported where chancy is installed. chancy hands the job to a keyword-only parameter
annotated as ``QueuedJob``; that annotation is evaluated here, so this module does not use
``from __future__ import annotations``.
"""

from collections.abc import Callable

from chancy import QueuedJob

#: Called with each job as its handler starts (set by bench/peers.py for a measurement).
hooks: list[Callable[[QueuedJob], None]] = []


async def noop(*, job: QueuedJob) -> None:
    for hook in hooks:
        hook(job)
