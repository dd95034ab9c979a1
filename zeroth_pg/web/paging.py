"""Keyset paging both ways, and bounded totals, for the dashboard's lists (runs, dead letters).

A page is addressed by a cursor, never an offset: ``after_at``/``after_id`` (the older page: the
rows just below that key, newest first) or ``before_at``/``before_id`` (the newer page: the rows
just above it, fetched oldest first through the same index walked forwards, then reversed). A
"newer" page that reaches the top is the first page (full, cursor-less), so walking back always
ends on the page the operator started from.

Totals are bounded counts: ``count(*)`` of at most :data:`COUNT_CAP` + 1 matching rows, under a
statement timeout of :data:`COUNT_BUDGET_MS`; so a total is exact below the cap, shown as
"10000+" above it, and "not counted" when even that took too long (a filter that matches little
of a large table). Never an estimate.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg

__all__ = ["COUNT_BUDGET_MS", "COUNT_CAP", "Cursor", "Page", "bounded_count", "dead_page_query",
           "keyset_page", "parse_cursors"]

#: A total is exact up to this many rows, then shown as "COUNT_CAP+".
COUNT_CAP = 10_000
#: The statement timeout of one bounded count.
COUNT_BUDGET_MS = 250

Cursor = tuple[datetime, uuid.UUID]
#: (after, before, limit, count) -> (sql, args)
QueryFor = Callable[[Cursor | None, Cursor | None, int, bool], tuple[str, list[Any]]]


@dataclass
class Page:
    """One page of a list: its rows (newest first), the query parameters of the newer and the
    older page (None when there is none), and the bounded total as shown."""

    rows: list[asyncpg.Record] = field(default_factory=list)
    newer: dict[str, str] | None = None
    older: dict[str, str] | None = None
    total: str = ""


def in_range(moment: datetime, name: str) -> datetime:
    """``moment`` in UTC (a naive one taken as UTC); ValueError when it lies outside the years 1
    to 9999 once in UTC (a forged cursor or filter the database would refuse with a 500)."""
    try:
        return (moment.replace(tzinfo=UTC) if moment.tzinfo is None
                else moment.astimezone(UTC))
    except (OverflowError, ValueError):
        raise ValueError(f"{name} is out of range") from None


def _cursor(params: Mapping[str, str], prefix: str) -> Cursor | None:
    at, ident = params.get(f"{prefix}_at"), params.get(f"{prefix}_id")
    if not at and not ident:
        return None
    if not at or not ident:
        raise ValueError(f"a {prefix} cursor needs both {prefix}_at and {prefix}_id")
    moment = datetime.fromisoformat(at.strip())
    if moment.tzinfo is None:
        raise ValueError(f"{prefix}_at needs a time zone (the links carry one)")
    return in_range(moment, f"{prefix}_at"), uuid.UUID(ident.strip())


def parse_cursors(params: Mapping[str, str]) -> tuple[Cursor | None, Cursor | None]:
    """(after, before) from a request's query; ValueError for a malformed or double cursor."""
    after, before = _cursor(params, "after"), _cursor(params, "before")
    if after is not None and before is not None:
        raise ValueError("give after_* or before_*, not both")
    return after, before


async def bounded_count(conn: asyncpg.Connection, sql: str, args: list[Any]) -> str:
    """The total as shown: exact below COUNT_CAP + 1, "N+" at the cap, "not counted" when the
    count ran past COUNT_BUDGET_MS. ``sql`` counts at most its last argument's rows."""
    try:
        async with conn.transaction(readonly=True):
            await conn.execute(f"SET LOCAL statement_timeout = {int(COUNT_BUDGET_MS)}")
            found = int(await conn.fetchval(sql, *args))
    except asyncpg.QueryCanceledError:
        return f"not counted (took over {COUNT_BUDGET_MS} ms)"
    return f"{COUNT_CAP}+" if found > COUNT_CAP else str(found)


def _params(base: Mapping[str, str], prefix: str, key: Cursor) -> dict[str, str]:
    return {**base, f"{prefix}_at": key[0].isoformat(), f"{prefix}_id": str(key[1])}


async def keyset_page(conn: asyncpg.Connection, query_for: QueryFor, after: Cursor | None,
                      before: Cursor | None, size: int, key: Callable[[asyncpg.Record], Cursor],
                      base: Mapping[str, str]) -> Page:
    """The page at this cursor (see the module's docstring); ``base``: the filters' parameters,
    carried on the newer and older links."""
    page = Page()
    if before is not None:
        rows = list(await conn.fetch(*_call(query_for(None, before, size + 1, False))))
        if len(rows) > size:  # more newer rows above this page
            page.rows = list(reversed(rows[:size]))
            page.newer = _params(base, "before", key(page.rows[0]))
            page.older = _params(base, "after", key(page.rows[-1]))
        else:  # the top: the first page itself
            before = None
    if before is None:
        rows = list(await conn.fetch(*_call(query_for(after, None, size + 1, False))))
        page.rows = rows[:size]
        if len(rows) > size:
            page.older = _params(base, "after", key(page.rows[-1]))
        if after is not None:  # something newer: at least the page this cursor came from
            page.newer = _params(base, "before", key(page.rows[0]) if page.rows else after)
    page.total = await bounded_count(conn, *query_for(None, None, COUNT_CAP + 1, True))
    return page


def _call(query: tuple[str, list[Any]]) -> tuple[Any, ...]:
    sql, args = query
    return (sql, *args)


#: What a page shows of a value in a list (a dead letter's error; the run page's steps and
#: checkpoints), in characters; the query reads one more, so the page can say it was cut.
LISTED_CHARS = 1_000

_DEAD_COLUMNS = f"""d.run_id, d.tenant_id, d.workspace_id, d.deployment_ref, d.attempts,
           d.max_attempts, left(d.error::text, {LISTED_CHARS + 1}) AS error, d.dead_lettered_at,
           d.created_at"""


def dead_page_query(deployment: str | None, tenant: str | None, after: Cursor | None,
                    before: Cursor | None, limit: int, count: bool = False
                    ) -> tuple[str, list[Any]]:
    """The dead-letter page's keyset query on zeroth.dead_letters, keyed (dead_lettered_at,
    run_id), newest first (``before``: oldest first, the caller reverses); ``count``: a count of
    at most ``limit`` rows. Dead letters are a partial index's rows (runs_dead_letter_idx), few
    next to the table."""
    where = ["($1::text IS NULL OR d.deployment_ref = $1)",
             "($2::text IS NULL OR d.tenant_id = $2)"]
    args: list[Any] = [deployment, tenant]
    if after is not None:
        where.append("(d.dead_lettered_at, d.run_id) < ($3, $4)")
        args += list(after)
    elif before is not None:
        where.append("(d.dead_lettered_at, d.run_id) > ($3, $4)")
        args += list(before)
    args.append(limit)
    predicate = " AND ".join(where)
    if count:
        return (f"SELECT count(*) FROM (SELECT 1 FROM zeroth.dead_letters d WHERE {predicate}"
                f" LIMIT ${len(args)}) AS matching", args)
    order = "ASC" if before is not None else "DESC"
    return (f"SELECT {_DEAD_COLUMNS}\n      FROM zeroth.dead_letters d\n     WHERE {predicate}"
            f"\n     ORDER BY d.dead_lettered_at {order}, d.run_id {order} LIMIT ${len(args)}",
            args)
