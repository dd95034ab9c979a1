"""The runs list's filters and keyset query (zeroth.run_list), shared by the dashboard's runs
page (zeroth_pg.web.app) and its bulk actions (zeroth_pg.web.bulk)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from zeroth_pg import _calls
from zeroth_pg.web import paging
from zeroth_pg.web._shared import NAME_MAX

__all__ = ["PAGE_SETTINGS", "RunInSeveralScopes", "bounded", "no_nul", "parse_run_filters",
           "run_filters", "run_page_query"]

#: Run first, in the transaction of every run_page_query: the page's parts walk their indexes
#: whatever the statistics. On a never-analyzed zeroth.runs the planner sizes a row by its column
#: types, and a filter it cannot estimate (a rare status, say `failed`) made a Seq Scan and a
#: sort of the whole table look cheaper than walking runs_created_not_running_idx; the margin
#: was one column's width (tests/plans/test_hot_path_indexes.py). The claim functions pin their
#: plans the same way (SET enable_seqscan = off), and like them turn JIT off with it: before
#: PostgreSQL 18 a scan the statement cannot avoid is then costed at 1e10, above every JIT
#: threshold, and compiled at each execution where the server has LLVM (docs/performance.md,
#: "JIT").
PAGE_SETTINGS = "SET LOCAL enable_seqscan = off; SET LOCAL jit = off"


class RunInSeveralScopes(Exception):
    """An action named a run by its id alone, and several scopes the role can see hold a run of
    that id (run_id is unique per scope only: a worker role may enqueue a run with an id it
    learned from another scope). The dashboard acts on none of them: the CLI with --tenant and
    --workspace does."""

    def __init__(self, run_id: uuid.UUID, scopes: Iterable[tuple[str, str | None]]) -> None:
        self.run_id = run_id
        self.scopes = [f"{tenant}/{workspace or '-'}" for tenant, workspace in scopes]
        super().__init__(f"run {run_id} exists in several scopes ({', '.join(self.scopes)}): "
                         "act on it with zeroth-pg and its --tenant and --workspace")


_STATUSES = ["pending", "running", "waiting", "completed", "failed", "cancelled"]

_PAGE_COLUMNS = """r.run_id, r.status::text AS status, r.deployment_ref, r.tenant_id,
           r.workspace_id, r.thread_id, r.attempts, r.max_attempts, r.created_at,
           r.lease_worker_id"""


def run_page_query(filters: dict[str, Any], after: tuple[datetime, uuid.UUID] | None,
                   limit: int, *, before: tuple[datetime, uuid.UUID] | None = None,
                   count: bool = False) -> tuple[str, list[Any]]:
    """The runs page's keyset query on zeroth.run_list, newest first, with a predicate only for
    each filter given (so each shape gets its own plan). zeroth.runs has no index on
    (created_at, run_id) for every run (issue 30), so a page is two parts, each with the page's
    LIMIT, merged: the runs that are not running (runs_created_not_running_idx walked) and the
    running ones (runs_running_idx: as many as there are live leases, sorted); a status filter
    keeps only its part. A run id searched for is one probe of runs_pkey, which leads with
    run_id (zeroth_pg._calls.run_by_id). Never a sort of the table:
    tests/plans/test_run_list_plan.py checks every shape's EXPLAIN at a million runs.

    ``before``: the page just newer than that cursor, OLDEST first (the same parts walked
    forwards; the caller reverses it). ``count``: ``count(*)`` of at most ``limit`` matching runs
    (a bounded count, never a scan past ``limit`` rows of a part). ``filters["statuses"]``: a
    list of statuses, any of them."""
    where: list[str] = []
    args: list[Any] = []

    def add(fragment: str, *values: Any) -> None:
        marks = [f"${len(args) + i + 1}" for i in range(len(values))]
        args.extend(values)
        where.append(fragment.format(*marks))

    for key, fragment in (("status", "r.status::text = {}"),
                          ("deployment", "r.deployment_ref = {}"),
                          ("tenant", "r.tenant_id = {}"),
                          ("workspace", "r.workspace_id = {}"),
                          ("thread", "r.thread_id = {}"),
                          ("since", "r.created_at >= {}"),
                          ("until", "r.created_at < {}")):
        if filters.get(key) is not None:
            add(fragment, filters[key])
    run_id: uuid.UUID | None = None
    search = filters.get("search")
    if search is not None:
        try:
            run_id = uuid.UUID(search)
        except ValueError:
            add("r.idempotency_key = {}", search)
    if filters.get("statuses") is not None:
        add("r.status::text = ANY({})", list(filters["statuses"]))
    if after is not None:
        add("(r.created_at, r.run_id) < ({}, {})", *after)
    if before is not None:
        add("(r.created_at, r.run_id) > ({}, {})", *before)
    direction = "ASC" if before is not None else "DESC"
    order = f"\n     ORDER BY r.created_at {direction}, r.run_id {direction}"
    if run_id is not None:
        args.extend([run_id, limit])
        found = _calls.run_by_id(_PAGE_COLUMNS, f"${len(args) - 1}", " AND ".join(where))
        if count:
            return (f"SELECT count(*) FROM ({found}\n     LIMIT ${len(args)}) AS matching",
                    args)
        return found + f"{order}\n     LIMIT ${len(args)}", args
    args.append(limit)
    page = f"LIMIT ${len(args)}"
    # Which parts the status filters leave: running, not running, or both.
    wanted = set(filters["statuses"]) if filters.get("statuses") is not None else None
    if filters.get("status") is not None:
        wanted = {filters["status"]} if wanted is None else wanted & {filters["status"]}
    parts = [status for status, keep in (
        ("r.status <> 'running'", wanted is None or bool(wanted - {"running"})),
        ("r.status = 'running'", wanted is None or "running" in wanted)) if keep]
    if count:
        counted = "\n     UNION ALL\n".join(
            f"(SELECT 1 FROM zeroth.run_list r\n     WHERE {' AND '.join([status, *where])}"
            f"\n     {page})" for status in parts or ["false"])
        return (f"SELECT count(*) FROM (SELECT 1 FROM (\n{counted}) c\n     {page}) AS matching",
                args)
    pages = "\n     UNION ALL\n".join(
        f"(SELECT {_PAGE_COLUMNS}\n      FROM zeroth.run_list r"
        f"\n     WHERE {' AND '.join([status, *where])}{order}\n     {page})"
        for status in parts or ["false"])
    return f"SELECT r.* FROM (\n{pages}) r{order}\n     {page}", args


def _opt(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


_RUN_FILTERS = ("status", "deployment", "tenant", "workspace", "thread", "search", "since",
                "until")


def run_filters(params: Any) -> dict[str, str | None]:
    """The runs list's filters as given (a query string or a form), blanks as None."""
    return {k: _opt(params.get(k)) for k in _RUN_FILTERS}


def no_nul(values: Iterable[str | None]) -> None:
    """ValueError when a filter holds a NUL character (PostgreSQL text cannot)."""
    if any(v is not None and "\x00" in v for v in values):
        raise ValueError("a filter holds a NUL character")


def parse_run_filters(filters: dict[str, str | None]) -> dict[str, Any]:
    """The filters as run_page_query takes them; ValueError for a bad time or status, or a
    NUL character (which no text column can hold)."""
    no_nul(filters.values())
    bounded(filters)
    if filters["status"] and filters["status"] not in _STATUSES:
        raise ValueError(f"unknown status {filters['status'][:50]!r}")
    return {**filters, "since": _time(filters["since"], "since"),
            "until": _time(filters["until"], "until")}


def bounded(filters: Mapping[str, str | None]) -> None:
    """ValueError when a filter is longer than a name may be (200 characters, the bound of every
    identifier the functions take; a search 500, an idempotency key's): the value goes back into
    every pager and bulk link."""
    for key, value in filters.items():
        limit = 500 if key == "search" else NAME_MAX  # search: an idempotency key, up to 500
        if value is not None and len(value) > limit:
            raise ValueError(f"{key} is longer than {limit} characters")


def _time(value: str | None, name: str) -> datetime | None:
    text = _opt(value)
    return paging.in_range(datetime.fromisoformat(text), name) if text else None
