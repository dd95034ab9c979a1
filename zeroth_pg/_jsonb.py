"""JSON as PostgreSQL's jsonb takes it: the one encoder and the one storability check used by the
client (every argument it sends), the worker (a handler's output) and the App (a payload checked
before it is enqueued).

``json.dumps`` accepts values jsonb refuses: a string holding U+0000 or a lone UTF-16 surrogate,
and text longer than jsonb holds. The server would refuse the whole statement (a batch of
completions, an enqueue of many runs); these checks name the one value instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from zeroth_pg.errors import InvalidArgumentError

__all__ = ["MAX_JSONB_CHARACTERS", "encode", "encode_bounded", "json_problem", "storage_problem",
           "unstorable"]

#: jsonb holds at most 256 MB; a value whose JSON text is longer cannot be stored.
MAX_JSONB_CHARACTERS = 255 * 2**20

#: What json.dumps raises for a value that is not JSON: a set, an object, NaN, a circular
#: reference; RecursionError: nested deeper than the encoder goes (a RuntimeError, which once
#: escaped as one and failed a run as retryable).
NOT_JSON = (TypeError, ValueError, RecursionError)

_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")

#: json.dumps(value, allow_nan=False) without building an encoder per call (json.dumps reuses
#: its own only for the default options): the worker checks every handler's output with it.
_STRICT = json.JSONEncoder(allow_nan=False)


def unstorable(value: Any) -> str | None:
    """Why PostgreSQL's jsonb cannot store ``value`` (a string, or a key, holding U+0000 or a
    lone surrogate), or None when it can."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if (found := _UNSTORABLE_CHARACTER.search(item)) is not None:
                what = "U+0000" if found.group() == "\x00" else "a lone UTF-16 surrogate"
                return f"a string contains {what}"
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def encode(value: Any) -> str:
    """``value`` as the JSON text the client sends (cast to jsonb in SQL); raises
    :class:`~zeroth_pg.errors.InvalidArgumentError` for a value that is not JSON or that jsonb
    cannot hold."""
    try:
        text = json.dumps(value, allow_nan=False)
    except NOT_JSON as exc:
        raise InvalidArgumentError(f"not JSON: {exc}") from exc
    # json.dumps writes both unstorable characters as \u escapes: only then is a scan needed.
    if ("\\u0000" in text or "\\ud" in text) and (why := unstorable(value)) is not None:
        raise InvalidArgumentError(f"PostgreSQL cannot store this JSON value: {why}")
    return text


def encode_bounded(value: Any, limit: int, what: str) -> str:
    """:func:`encode`, refusing (:class:`~zeroth_pg.errors.InvalidArgumentError`) a value whose
    JSON text passes ``limit`` characters as soon as the encoder has written that much: the work
    is bounded by the limit, not by the value (a handler's 300 MB event stalls nothing). The text
    is measured as jsonb prints it (``", "`` and ``": "`` separators, non-ASCII escaped: at least
    as long as its UTF-8), so a value within the limit here is within the database's bound."""
    size = 0
    try:
        for chunk in json.JSONEncoder(allow_nan=False).iterencode(value):
            size += len(chunk)
            if size > limit:
                raise InvalidArgumentError(f"{what} is larger than {limit} characters of JSON")
    except NOT_JSON as exc:
        raise InvalidArgumentError(f"{what} is not JSON: {exc}") from exc
    return encode(value)


def json_problem(value: Any) -> str | None:
    """Why ``value`` cannot be sent as JSON (not JSON, or not storable), None when it can."""
    try:
        json.dumps(value, allow_nan=False)
    except NOT_JSON as exc:
        return str(exc)
    return unstorable(value)


def storage_problem(value: Any, what: str) -> tuple[str, Exception] | None:
    """Why PostgreSQL cannot store ``value`` (``what`` names it in the message), as a short
    label and the exception that says so, or None when it can: not JSON (the encoder's own
    exception), longer than jsonb holds, or holding a character jsonb refuses. Retrying cannot
    change any of these."""
    try:
        text = _STRICT.encode(value)
    except NOT_JSON as exc:
        return f"{what} is not JSON", exc
    if len(text) > MAX_JSONB_CHARACTERS:
        return f"{what} too large", ValueError(
            f"PostgreSQL cannot store the {what}: {len(text)} characters of JSON, more than "
            f"jsonb holds ({MAX_JSONB_CHARACTERS})")
    # The encoder writes both unstorable characters as \u escapes (as in encode): only a text
    # holding one needs the walk over the value.
    if ("\\u0000" in text or "\\ud" in text) and (why := unstorable(value)) is not None:
        return f"{what} not storable", ValueError(f"PostgreSQL cannot store the {what}: {why}")
    return None
