"""zeroth_pg: a Postgres-native durable run dispatcher.

PostgreSQL is the queue: every transition of a run is a PL/pgSQL function in schema ``zeroth``;
:class:`LeaseManager` calls them one to one over asyncpg.
"""

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import (
    CheckpointConflictError,
    ConnectionLostError,
    DatabaseError,
    FenceColumnWriteError,
    InvalidArgumentError,
    InvalidScopeError,
    InvalidTransitionError,
    LeaseLostError,
    RetryableError,
    RunNotFoundError,
    UnknownColumnError,
    ZerothError,
)
from zeroth_pg.types import (
    CancelOutcome,
    ClaimedRun,
    EnqueuedRun,
    FailOutcome,
    LeaseClaimResult,
    LeaseRenewal,
    OrphanClaimResult,
    RunStatus,
)
from zeroth_pg.worker import RunContext, RunWorker

__all__ = [
    "CancelOutcome",
    "CheckpointConflictError",
    "ClaimedRun",
    "ConnectionLostError",
    "DatabaseError",
    "EnqueuedRun",
    "FailOutcome",
    "FenceColumnWriteError",
    "InvalidArgumentError",
    "InvalidScopeError",
    "InvalidTransitionError",
    "LeaseClaimResult",
    "LeaseLostError",
    "LeaseManager",
    "LeaseRenewal",
    "OrphanClaimResult",
    "RetryableError",
    "RunContext",
    "RunNotFoundError",
    "RunStatus",
    "RunWorker",
    "UnknownColumnError",
    "ZerothError",
]

__version__ = "0.1.0"
