"""What a handler's exception becomes (zeroth_pg.errors.describe): every text within
MAX_ERROR_TEXT_BYTES, the document within MAX_ERROR_DOCUMENT_BYTES, never raising, and always
storable: each document is written with zeroth.fail_run on a really claimed run and read back
unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from leased import WORKER, claim

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import (
    MAX_ERROR_DOCUMENT_BYTES,
    MAX_ERROR_TEXT_BYTES,
    bounded_text,
    describe,
    handler_exit,
)

MB = 2**20


def _raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as a handler's exception has."""
    try:
        raise exc
    except BaseException as caught:  # any exception, as a handler's
        return caught


def _cyclic() -> BaseException:
    first, second = ValueError("a" * MB), KeyError("b")
    first.__context__, second.__context__ = second, first
    return first


def _long_chain() -> BaseException:
    exc: BaseException = ValueError("root " * MB)
    for i in range(50):
        try:
            raise RuntimeError(f"level {i} " + "y" * MB) from exc
        except RuntimeError as chained:
            exc = chained
    return exc


class _ArgsRaise(Exception):
    @property  # type: ignore[override]
    def args(self) -> Any:
        raise RuntimeError("no args for you")


class _StrNotStr(Exception):
    def __str__(self) -> Any:
        return 42


def _noted() -> BaseException:
    exc = ValueError("with notes")
    for _ in range(100):
        exc.add_note("n" * MB)
    return exc


def _deep() -> BaseException:
    def recurse(n: int) -> None:
        if n == 0:
            raise ValueError("at the bottom " * 10_000)
        recurse(n - 1)

    try:
        recurse(600)
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


CASES: dict[str, Callable[[], BaseException]] = {
    "nul-characters": lambda: ValueError("\x00" * MB),
    "lone-surrogates": lambda: ValueError("\ud800" * MB),
    "four-byte-characters": lambda: ValueError("\U0001f600" * MB),
    "json-escaped-controls": lambda: ValueError("\x01" * MB),
    "huge-dict-argument": lambda: ValueError({i: "v" * 1000 for i in range(100_000)}),
    "many-arguments": lambda: ValueError(*range(100_000)),
    "cyclic-chain": _cyclic,
    "long-chain": _long_chain,
    "args-raise": _ArgsRaise,
    "str-returns-int": _StrNotStr,
    "huge-notes": _noted,
    "deep-traceback": _deep,
    "exception-group": lambda: ExceptionGroup("g" * MB, [ValueError("m" * MB)] * 1000),
    "system-exit-huge-code": lambda: handler_exit(SystemExit("usage: " + "u" * 10 * MB)),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_described_exception_is_bounded_and_stored_unchanged(pool: asyncpg.Pool,
                                                                      name: str) -> None:
    exc = _raised(CASES[name]())
    described = describe(exc)
    for text in (described.type, described.message, described.traceback):
        assert isinstance(text, str)
        assert len(text.encode()) <= MAX_ERROR_TEXT_BYTES
    document = described.document(worker_id=WORKER, lease_generation=1)
    assert len(json.dumps(document, ensure_ascii=False).encode()) <= MAX_ERROR_DOCUMENT_BYTES

    lm = LeaseManager(pool)
    (run,) = await claim(lm, 1, prefix="errdoc")
    assert await lm.fail_run(run.run_id, WORKER, generation=run.lease_generation,
                             error=document, retryable=False) is not None
    stored = await pool.fetchval("SELECT r.error::text FROM zeroth.runs r WHERE r.run_id = $1",
                                 run.run_id)
    assert json.loads(stored) == document


@pytest.mark.parametrize("tail", [False, True], ids=["head", "tail"])
@pytest.mark.parametrize("text", ["x" * MB, "é" * MB, "\U0001f600" * MB, "\ud800x" * MB],
                         ids=["ascii", "two-byte", "four-byte", "surrogates"])
def test_bounded_text_keeps_its_end_within_the_limit_and_counts_the_cut(text: str,
                                                                        tail: bool) -> None:
    for limit in (100, 1000, MAX_ERROR_TEXT_BYTES):
        cut = bounded_text(text, limit, tail=tail)
        assert len(cut.encode()) <= limit
        marker = cut[:cut.index("\u2026")] if tail else cut[cut.rindex("\u2026") + 1:]
        kept = len(cut) - len(marker) - 1
        assert marker == f"[truncated {len(text) - kept} characters]"
        assert "\x00" not in cut
        cut.encode()  # no lone surrogate left: UTF-8 encodes it


def test_a_short_text_is_kept_whole() -> None:
    assert bounded_text("bad response: 404") == "bad response: 404"
    assert bounded_text("nul \x00 here") == "nul \ufffd here"
