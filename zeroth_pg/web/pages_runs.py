"""The run page's timeline: everything the database recorded about one run, in time order —
created (by its parent, linked), each attempt's start and end (worker, lease generation, how it
ended, its error as a readable traceback, collapsed), steps, event waits and their emits, sleeps,
children started and finished (linked, with their states), checkpoints, a cancel request, the
end, a dead letter, and what it waits for now."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["FAILURE_SHOWN", "failure_view", "shown", "timeline"]

#: How much of a step result or checkpoint the timeline shows inline (the sections below it
#: show them whole).
_PREVIEW = 160

_ENDED = {"completed": "completed", "failed": "failed (will retry)",
          "dead_lettered": "failed: dead-lettered", "cancelled": "cancelled",
          "recovered": "lease lost: recovered by another claim", "expired": "claimed, never "
          "started: the lease lapsed", "lease_lost": "lease taken or cleared outside the "
          "functions", "handed_back": "handed back to pending", "released": "released",
          "slept": "slept (sleep_run)", "paused": "paused", "waited": "waits (event or children)"}

#: The order of entries recorded at the same instant (others: 3).
_RANK = {"created": 0, "claimed": 1, "started": 2, "event": 4, "child-ended": 4, "cancel": 4,
         "ended": 5, "finished": 6, "dead": 7, "due": 8, "now": 8}


def _preview(value: str | None) -> str:
    if value is None:
        return ""
    try:
        text = json.dumps(json.loads(value), separators=(",", ":"))
    except (ValueError, RecursionError):  # nested deeper than Python parses: shown as stored
        text = value
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + "…"


#: How much of a stored error document the run page shows (the database bounds what it stores).
FAILURE_SHOWN = 20_000


def shown(value: str | None, limit: int) -> str | None:
    """A stored value's text as a page shows it: at most ``limit`` characters, and a line that
    says so when it was longer (the query reads one character more than a page shows)."""
    if value is None or len(value) <= limit:
        return value
    return (value[:limit] + f"\n… (cut here: only the first {limit:,} characters are shown; "
            "read the whole value in SQL)")


def failure_view(error: str | None) -> dict[str, str] | None:
    """A stored error document (``zeroth.runs.error``, ``run_attempts.error``: JSON text) as the
    run page shows it: a one-line summary (``type: message``) and the traceback with its real
    line breaks; a document some other client wrote in another shape is shown as its JSON."""
    if error is None:
        return None
    try:
        document = json.loads(error)
    except (ValueError, RecursionError):  # nested deeper than Python parses: shown as stored
        document = None
    if isinstance(document, dict) and isinstance(document.get("message", ""), str):
        kind = str(document.get("type") or "error")
        message = str(document.get("message") or "")
        trace = document.get("traceback")
        return {"summary": f"{kind}: {message}"[:500],
                "detail": (trace if isinstance(trace, str) else json.dumps(document,
                                                                          indent=2))[:FAILURE_SHOWN]}
    return {"summary": error[:500], "detail": error[:FAILURE_SHOWN]}


def timeline(run: Mapping[str, Any], attempts: Sequence[Mapping[str, Any]],
             steps: Sequence[Mapping[str, Any]], waits: Sequence[Mapping[str, Any]],
             checkpoints: Sequence[Mapping[str, Any]], children: Sequence[Mapping[str, Any]],
             now: datetime) -> list[dict[str, Any]]:
    """The entries of the run page's timeline, oldest first: dicts with ``at`` (a datetime),
    ``kind``, ``text`` and optionally ``run_id`` (a linked run), ``status``, ``failure`` (a
    :func:`zeroth_pg.web.app.failure_view`)."""

    entries: list[tuple[datetime, int, int, dict[str, Any]]] = []

    def add(at: datetime | None, kind: str, text: str, **extra: Any) -> None:
        # At one instant: a start before what happened in it, an end after it.
        if at is not None:
            entries.append((at, _RANK.get(kind, 3), len(entries),
                            {"at": at, "kind": kind, "text": text, **extra}))

    if run["parent_run_id"]:
        add(run["created_at"], "created", "started as a child of", run_id=run["parent_run_id"])
    else:
        add(run["created_at"], "created", f"enqueued for {run['deployment_ref']}")
    for a in attempts:
        who = f"attempt {a['attempt']} (generation {a['lease_generation']}) by {a['worker_id']}"
        add(a["claimed_at"], "claimed", f"{who}: claimed")
        if a["started_at"] is not None and a["started_at"] != a["claimed_at"]:
            add(a["started_at"], "started", f"{who}: started")
        if a["outcome"] is not None:
            add(a["ended_at"], "ended", f"{who}: {_ENDED.get(a['outcome'], a['outcome'])}",
                status=a["outcome"], failure=failure_view(a["error"]))
    child_steps = {c["step_key"] for c in children}  # a child's start is its step: said below
    for s in steps:
        if s["step_key"] in child_steps:
            continue
        add(s["recorded_at"], "step", f"step {s['step_key']} recorded: {_preview(s['result'])}")
    for w in waits:
        timeout = f", times out {w['timeout_at']:%Y-%m-%d %H:%M:%SZ}" if w["timeout_at"] else ""
        add(w["created_at"], "wait", f"waits for event {w['name']} (step {w['step_key']}"
            f"{timeout})")
        add(w["emitted_at"], "event", f"event {w['name']} emitted")
    for c in checkpoints:
        add(c["created_at"], "checkpoint",
            f"checkpoint #{c['checkpoint_order']} {c['checkpoint_id']}: {_preview(c['data'])}")
    for c in children:
        add(c["created_at"], "child", f"child {c['step_key']} ({c['deployment_ref']}) started"
            + (", detached" if c["detached"] else ""), run_id=c["child_run_id"],
            status=c["status"])
        add(c["finished_at"], "child-ended", f"child {c['step_key']} ended",
            run_id=c["child_run_id"], status=c["status"])
    add(run["cancel_requested_at"], "cancel", f"cancel requested ({run['cancel_action']})")
    if run["finished_at"] is not None:
        add(run["finished_at"], "finished", f"finished: {run['status']}", status=run["status"])
    add(run["dead_lettered_at"], "dead", "dead-lettered (redrive to run it again)",
        status="failed")
    if run["status"] == "pending" and run["run_after"] is not None and run["run_after"] > now:
        add(run["run_after"], "due", "due (sleeping or scheduled until then)", status="pending")
    if run["status"] == "waiting":
        add(now, "now", "waiting: " + (run["wait_reason"] or "its thread's turn"),
            status="waiting")
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    return [e[3] for e in entries]
