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
    RunCompletion,
    RunStatus,
)

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
    "RunCompletion",
    "RunContext",
    "RunNotFoundError",
    "RunStatus",
    "RunWorker",
    "UnknownColumnError",
    "ZerothError",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The worker is imported lazily so that `python -m zeroth_pg.worker` does not import the module
    # twice (once as zeroth_pg.worker via this package, once as __main__).
    if name in ("RunContext", "RunWorker"):
        from zeroth_pg import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'zeroth_pg' has no attribute {name!r}")
