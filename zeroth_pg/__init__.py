"""zeroth_pg: a Postgres-native durable run dispatcher.

PostgreSQL is the queue: every transition of a run is a PL/pgSQL function in schema ``zeroth``;
:class:`LeaseManager` calls them one to one over asyncpg.

The names below are imported on first use, so that importing a submodule (the pytest plugin
``zeroth_pg.testing``, loaded into every pytest session) does not import asyncpg.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zeroth_pg._connect import NoWritableServerError, connect, create_pool
    from zeroth_pg._libpq import asyncpg_dsn
    from zeroth_pg.app import App, Deployment, SyncRunContext
    from zeroth_pg.client import LeaseManager
    from zeroth_pg.errors import (
        CallTimeoutError,
        CheckpointConflictError,
        ChildRunConflictError,
        ConnectionLostError,
        DatabaseError,
        DeadlinePassedError,
        EventTimeoutError,
        FenceColumnWriteError,
        InvalidArgumentError,
        InvalidNameError,
        InvalidPayloadError,
        InvalidScopeError,
        InvalidTransitionError,
        LeaseLostError,
        NonRetryableError,
        ReservedKeyError,
        RetryableError,
        RunEventLimitError,
        RunNotFoundError,
        ScheduleNotFoundError,
        StepResultError,
        TransitionNotListedError,
        UnknownColumnError,
        ZerothError,
    )
    from zeroth_pg.types import (
        CancelOutcome,
        ChildOutcome,
        ChildStart,
        ChildWait,
        ChildWaitOutcome,
        ClaimedRun,
        CompleteAndClaimResult,
        DeploymentDefaults,
        DeploymentRegistration,
        EmitResult,
        EnqueuedRun,
        EventWait,
        EventWaitOutcome,
        FailOutcome,
        LeaseClaimResult,
        LeaseRenewal,
        OrphanClaimResult,
        RateLimited,
        RetryPolicy,
        RunCompletion,
        RunEvent,
        RunEventKind,
        RunSettled,
        RunStatus,
        Schedule,
        ScheduleFire,
        ScheduleFiring,
        ScheduleRegistration,
        Scope,
        ScopedRun,
        ScopesClaimResult,
        SettleKind,
        Settlement,
        SettleOutcome,
        SleepOutcome,
        SleepResult,
        StepResult,
    )
    from zeroth_pg.worker import PeriodicSchedule, RunContext, RunSlept, RunWorker

#: Where each public name lives.
_HOMES = {
    **dict.fromkeys(("App", "Deployment", "SyncRunContext"), "zeroth_pg.app"),
    "LeaseManager": "zeroth_pg.client",
    "asyncpg_dsn": "zeroth_pg._libpq",
    **dict.fromkeys(("NoWritableServerError", "connect", "create_pool"), "zeroth_pg._connect"),
    **dict.fromkeys(
        ("CallTimeoutError", "CheckpointConflictError", "ChildRunConflictError",
         "ConnectionLostError",
         "DatabaseError", "DeadlinePassedError", "EventTimeoutError",
         "FenceColumnWriteError", "InvalidArgumentError", "InvalidNameError",
         "InvalidPayloadError",
         "InvalidScopeError", "InvalidTransitionError", "LeaseLostError", "NonRetryableError",
         "ReservedKeyError", "RetryableError", "RunEventLimitError", "RunNotFoundError",
         "ScheduleNotFoundError",
         "StepResultError", "TransitionNotListedError",
         "UnknownColumnError", "ZerothError"),
        "zeroth_pg.errors"),
    **dict.fromkeys(
        ("CancelOutcome", "ChildOutcome", "ChildStart", "ChildWait", "ChildWaitOutcome",
         "ClaimedRun", "CompleteAndClaimResult", "DeploymentDefaults",
         "DeploymentRegistration", "EmitResult", "EnqueuedRun",
         "EventWait", "EventWaitOutcome", "FailOutcome", "LeaseClaimResult",
         "LeaseRenewal", "OrphanClaimResult", "RateLimited", "RetryPolicy", "RunCompletion",
         "RunEvent", "RunEventKind", "RunStatus", "Schedule", "ScheduleFire", "ScheduleFiring",
         "ScheduleRegistration",
         "Scope", "ScopedRun", "ScopesClaimResult", "SettleKind", "SettleOutcome", "Settlement",
         "SleepOutcome", "SleepResult", "StepResult", "RunSettled"),
        "zeroth_pg.types"),
    "PeriodicSchedule": "zeroth_pg.worker",
    "RunContext": "zeroth_pg.worker",
    "RunSlept": "zeroth_pg.worker",
    "RunWorker": "zeroth_pg.worker",
}

__all__ = [
    "App",
    "CallTimeoutError",
    "CancelOutcome",
    "CheckpointConflictError",
    "ChildOutcome",
    "ChildRunConflictError",
    "ChildStart",
    "ChildWait",
    "ChildWaitOutcome",
    "ClaimedRun",
    "CompleteAndClaimResult",
    "ConnectionLostError",
    "DatabaseError",
    "DeadlinePassedError",
    "Deployment",
    "DeploymentDefaults",
    "DeploymentRegistration",
    "EmitResult",
    "EnqueuedRun",
    "EventTimeoutError",
    "EventWait",
    "EventWaitOutcome",
    "FailOutcome",
    "FenceColumnWriteError",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidPayloadError",
    "InvalidScopeError",
    "InvalidTransitionError",
    "LeaseClaimResult",
    "LeaseLostError",
    "LeaseManager",
    "LeaseRenewal",
    "NoWritableServerError",
    "NonRetryableError",
    "OrphanClaimResult",
    "PeriodicSchedule",
    "RateLimited",
    "ReservedKeyError",
    "RetryPolicy",
    "RetryableError",
    "RunCompletion",
    "RunContext",
    "RunEvent",
    "RunEventKind",
    "RunEventLimitError",
    "RunNotFoundError",
    "RunSettled",
    "RunSlept",
    "RunStatus",
    "RunWorker",
    "Schedule",
    "ScheduleFire",
    "ScheduleFiring",
    "ScheduleNotFoundError",
    "ScheduleRegistration",
    "Scope",
    "ScopedRun",
    "ScopesClaimResult",
    "SettleKind",
    "SettleOutcome",
    "Settlement",
    "SleepOutcome",
    "SleepResult",
    "StepResult",
    "StepResultError",
    "SyncRunContext",
    "TransitionNotListedError",
    "UnknownColumnError",
    "ZerothError",
    "asyncpg_dsn",
    "connect",
    "create_pool",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'zeroth_pg' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
