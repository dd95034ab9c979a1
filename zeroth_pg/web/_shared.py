"""What the dashboard's page modules share with :mod:`zeroth_pg.web.app`: the request context
(rendering, the pool, the POST checks), the one timestamp format of every page, and the parsing of
form fields into bounded values (bad input: :class:`BadInput`, a 400 page, nothing changed)."""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = ["BadInput", "Context", "form_bool", "form_int", "form_json", "form_name",
           "form_optional_name", "run_url", "short_time"]

log = logging.getLogger("zeroth_pg.web")

#: The longest name (deployment, tenant, workspace, schedule, event) a form may carry: the
#: database's own bound for identifiers (zeroth._require_identifier).
NAME_MAX = 200
#: The largest JSON payload a form may send (an event's payload; a form body is read up to
#: 64 KiB).
JSON_MAX = 32_768


def run_url(run_id: Any, tenant_id: str | None, workspace_id: str | None) -> str:
    """The run page of ``run_id`` in one scope. Run ids are unique per scope only (a caller may
    choose one), so every link to a run names its scope: ``/runs/{id}`` alone opens the first
    scope that holds the id, which need not be the one the link came from."""
    if tenant_id is None:
        return f"/runs/{run_id}"
    return f"/runs/{run_id}?" + urllib.parse.urlencode(
        {"tenant": tenant_id, "workspace": workspace_id or ""})


class BadInput(ValueError):
    """A form or query field the dashboard refuses before it reaches the database."""


@dataclass(frozen=True)
class Context:
    """The helpers of :func:`zeroth_pg.web.app.create_app` that every page module uses."""

    render: Callable[..., HTMLResponse]
    pool: Callable[[], asyncpg.Pool]
    check_post: Callable[[Request], Awaitable[tuple[dict[str, Any], Response | None]]]
    refused: Callable[[Request, asyncpg.PostgresError], Response]
    actions: bool

    def bad_input(self, request: Request, exc: BadInput) -> Response:
        log.warning("web input refused: %s", exc)
        return self.render(request, "error.html", status_code=400, message=f"bad input: {exc}")

    async def act(self, request: Request, what: str, target: str, sql: str,
                  *args: Any) -> asyncpg.Record | None:
        """Run one action's SQL function as the DSN's role, logged (who, what, from where)."""
        async with self.pool().acquire() as conn:
            role = await conn.fetchval("SELECT current_user")
            log.warning("web action %s %s as %s from %s", what, target[:300], role,
                        request.client.host if request.client else "?")
            row: asyncpg.Record | None = await conn.fetchrow(sql, *args)
            return row


def short_time(value: datetime | None) -> Markup:
    """A timestamp as every page shows it: ``2026-12-05 15:04:05Z`` (UTC, to the second), the full
    value (microseconds, offset) in the title; the empty string for None."""
    if value is None:
        return Markup("")
    if not isinstance(value, datetime):
        return Markup(escape(str(value)))
    full = value.isoformat()
    shown = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value.tzinfo else (
        value.strftime("%Y-%m-%d %H:%M:%S"))
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(full, shown)


def form_name(form: Mapping[str, Any], key: str) -> str:
    """A required name field: non-empty after trimming, at most :data:`NAME_MAX` characters."""
    value = form_optional_name(form, key)
    if value is None:
        raise BadInput(f"{key} is required")
    return value


def form_optional_name(form: Mapping[str, Any], key: str) -> str | None:
    """An optional name field (empty: None), at most :data:`NAME_MAX` characters, no control
    characters."""
    value = str(form.get(key) or "").strip()
    if not value:
        return None
    if len(value) > NAME_MAX:
        raise BadInput(f"{key} is longer than {NAME_MAX} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadInput(f"{key} holds a control character")
    return value


def form_int(form: Mapping[str, Any], key: str, low: int, high: int, *,
             blank: int | None = None) -> int | None:
    """An integer field in [low, high]; a blank field is ``blank``."""
    text = str(form.get(key) or "").strip()
    if not text:
        return blank
    try:
        value = int(text, 10)
    except ValueError:
        raise BadInput(f"{key} must be a whole number, not {text[:40]!r}") from None
    if not low <= value <= high:
        raise BadInput(f"{key} must be between {low} and {high}")
    return value


def form_float(form: Mapping[str, Any], key: str, low: float, high: float) -> float:
    """A required number field in [low, high]."""
    text = str(form.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"{key} must be a number, not {text[:40]!r}") from None
    if not low <= value <= high:  # NaN fails too
        raise BadInput(f"{key} must be between {low:g} and {high:g}")
    return value


def form_bool(form: Mapping[str, Any], key: str) -> bool:
    """A yes/no field: ``true`` or ``false`` exactly."""
    text = str(form.get(key) or "")
    if text not in ("true", "false"):
        raise BadInput(f"{key} must be true or false")
    return text == "true"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def form_json(form: Mapping[str, Any], key: str) -> str:
    """A JSON field (blank: ``null``), at most :data:`JSON_MAX` characters, as canonical text."""
    text = str(form.get(key) or "").strip() or "null"
    if len(text) > JSON_MAX:
        raise BadInput(f"{key} is larger than {JSON_MAX} characters")
    try:
        return json.dumps(json.loads(text, parse_constant=_no_constant))
    except ValueError as exc:
        raise BadInput(f"{key} is not JSON: {exc}") from None
    except RecursionError:
        raise BadInput(f"{key} is nested too deeply") from None
