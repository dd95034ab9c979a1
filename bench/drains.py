"""Every system of the suite as one uniform *drain*, for the scenarios that treat them alike
(``commits``, ``pressure``).

A :class:`Drain` is a name, the :class:`bench.systems.System` it runs on (its ``dsn``, ``conn``,
``reset()``, ``enqueue(n)``), ``run(n, concurrency)`` → seconds to drain n enqueued runs, the
jobs table (what the pressure scenario's readers scan and whose size it follows) and whether
``system.latency(n, gap)`` measures its pickup latency.

A system added to the suite later plugs in with one entry in :data:`FACTORIES` (a function of
the ``Systems`` object returning its Drain, or None when it is not there), or with none at all:
a system in ``Systems.all()`` that no entry covers is taken as it is when it has
``drain(n, *, concurrency)`` and a ``jobs_table`` attribute (``latency(n, gap)`` is used when it
has one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

DrainFn = Callable[[int, int], Awaitable[float]]


@dataclass(frozen=True)
class Drain:
    name: str
    system: Any  # a bench.systems.System
    run: DrainFn  # (n, concurrency) -> seconds until n runs are finished
    jobs_table: str  # qualified as it is queried, e.g. "zeroth.runs"
    latency: bool = True  # system.latency(n, gap) is this drain's pickup-latency probe
    runs_share: float = 1.0  # slow systems drain this share of a scenario's runs


def _pgqueuer_batch(concurrency: int) -> int:
    """pgqueuer's default batch (10), within its rule max_concurrent_tasks >= 2 × batch."""
    return max(1, min(10, concurrency // 2))


FACTORIES: dict[str, Callable[[Any], Drain | None]] = {
    "zeroth-worker": lambda s: Drain(
        "zeroth-worker", s.zeroth, lambda n, c: s.zeroth.drain_worker(n, concurrency=c),
        "zeroth.runs"),
    "zeroth-lease": lambda s: Drain(
        "zeroth-lease", s.zeroth, lambda n, c: s.zeroth.drain_lease(n, concurrency=c),
        "zeroth.runs", latency=False),
    "pgqueuer": lambda s: Drain(
        "pgqueuer", s.pgqueuer,
        lambda n, c: s.pgqueuer.drain(n, concurrency=c, batch=_pgqueuer_batch(c)), "pgqueuer"),
    "procrastinate": lambda s: Drain(
        "procrastinate", s.procrastinate,
        lambda n, c: s.procrastinate.drain(n, concurrency=c), "procrastinate_jobs",
        runs_share=0.5),
    "raw": lambda s: Drain("raw", s.raw, lambda n, c: s.raw.drain(n, concurrency=c), "raw_jobs"),
    "seed": lambda s: Drain(
        "seed", s.seed, lambda n, c: s.seed.drain(n, concurrency=c), "seed_runs"),
}


def _generic(system: Any) -> Drain | None:
    if not (callable(getattr(system, "drain", None)) and getattr(system, "jobs_table", None)):
        return None
    return Drain(system.label, system, lambda n, c: system.drain(n, concurrency=c),
                 system.jobs_table, latency=callable(getattr(system, "latency", None)))


def drains(systems: Any) -> tuple[list[Drain], list[str]]:
    """The drains of every system present, and the labels of systems that could not be
    included (no factory, and no ``drain``/``jobs_table`` to take them generically)."""
    found: list[Drain] = []
    for factory in FACTORIES.values():
        try:
            drain = factory(systems)
        except AttributeError:  # that system is not in this Systems
            continue
        if drain is not None:
            found.append(drain)
    covered = {id(d.system) for d in found}
    skipped: list[str] = []
    for system in systems.all():
        if id(system) in covered:
            continue
        generic = _generic(system)
        if generic is None:
            skipped.append(getattr(system, "label", type(system).__name__))
        else:
            found.append(generic)
    return found, skipped


def runs(drain: Drain, n: int) -> int:
    return max(50, int(n * drain.runs_share))
