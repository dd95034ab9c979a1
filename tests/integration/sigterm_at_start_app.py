"""A worker app (``--app sigterm_at_start_app:handler``) whose process sends itself SIGTERM the
moment the worker logs that it started: the earliest a supervisor that waits for that line can
stop it (tests/integration/test_worker_processes.py, TestGracefulShutdown)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from zeroth_pg.worker import RunContext


class _SigtermWhenStarted(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if " started for " in record.getMessage():
            os.kill(os.getpid(), signal.SIGTERM)


logging.getLogger("zeroth_pg.worker").addHandler(_SigtermWhenStarted())


async def handler(ctx: RunContext) -> dict[str, Any]:
    return {}
