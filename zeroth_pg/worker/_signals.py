"""SIGTERM and SIGINT while a worker runs (:meth:`RunWorker.run_until_stopped`): the first asks
for a graceful drain, the second hurries it, and a third finds the default action again and ends
the process at once (the leases then expire and an orphan sweep recovers the runs, counting their
attempts)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

__all__ = ["drain_signals"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def drain_signals(install: bool, *, first: Callable[[], bool],
                  again: Callable[[signal.Signals], None]) -> Iterator[None]:
    """While inside (and ``install``), a SIGTERM or SIGINT calls ``first()``, which says whether
    it took the signal as the first; if not, ``again(sig)`` is called and the default action is
    restored for the next one."""
    loop = asyncio.get_running_loop()
    installed = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal installed
        if first():
            return
        again(sig)
        for each in SIGNALS:
            loop.remove_signal_handler(each)
            signal.signal(each, signal.SIG_DFL)
        installed = False

    if install:
        for sig in SIGNALS:
            loop.add_signal_handler(sig, on_signal, sig)
        installed = True
    try:
        yield
    finally:
        if installed:
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)
