"""The chaos soak's audit trail and its offline history checker.

Two append-only tables live next to ``zeroth`` in the soak's database (:data:`AUDIT_DDL`):

* ``chaos_history`` — every write the database *accepted* on a run: one row per changed
  ``zeroth.runs`` row (trigger ``chaos_runs_history``) or checkpoint row
  (``chaos_checkpoints_history``). A trigger row commits with the write or not at all, so the
  table is exactly the accepted history. It keeps the lease before and after (generation,
  worker, expiry, admission slot), the writing function's database time (``updated_at``, or the
  checkpoint's ``created_at``), the trigger's own ``clock_timestamp()`` and, where the value
  written names it, the writer's generation, worker and write id: the handler puts
  ``generation``/``worker_id``/``eid`` into every checkpoint and progress it writes and into its
  output; the worker puts ``lease_generation``/``worker_id`` into every error it records.
* ``chaos_events`` — what happened *outside* the fence: every handler start, every fenced write
  the handler attempted and what the database answered (``attempt`` then ``accepted``,
  ``refused`` or ``in_doubt``), written on the handler's own connection before and after the
  write; and every fault the harness injected (``kill``, ``stop``, ``cont``, ``terminate``,
  ``restart``), with the leases the victim held.

A trigger sees one row at a time, so what holds *between* tables is sampled instead: while the
fleet runs, the soak snapshots every live lease with the admission slot it is held in
(:data:`SLOTS_QUERY`: one statement, so one MVCC snapshot of ``zeroth.runs`` and
``zeroth.admission_slots``). A slot is live exactly while the run it names holds that
generation's live lease in it, so in every snapshot a live slotted lease is named by its slot,
and a scope under ``max_concurrency`` has at most that many live leases, each in a slot.

:func:`check_history` replays all of it after the run and returns the invariant violations and
the figures of the report. It needs nothing but the rows, so tests/chaos/test_history_checker.py
feeds it hand-made histories and snapshots to prove each check can fail.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

__all__ = ["AUDIT_DDL", "EVENTS_QUERY", "HISTORY_QUERY", "RUNS_QUERY", "SLOTS_QUERY", "Report",
           "check_history"]

AUDIT_DDL = r"""
CREATE TABLE public.chaos_history (
    id                bigserial   PRIMARY KEY,
    kind              text        NOT NULL,
    run_id            uuid        NOT NULL,
    tenant_id         text        NOT NULL,
    old_status        text,
    new_status        text,
    old_generation    bigint,
    new_generation    bigint,
    old_worker        text,
    new_worker        text,
    old_expires       timestamptz,
    new_expires       timestamptz,
    acquired_at       timestamptz,
    slot              integer,
    fn_now            timestamptz,
    writer_generation bigint,
    writer_worker     text,
    writer_event      uuid,
    writer_calls      text[],
    data              jsonb,
    at                timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE public.chaos_events (
    id         bigserial   PRIMARY KEY,
    event_id   uuid        NOT NULL UNIQUE,
    source     text        NOT NULL CHECK (source IN ('handler', 'harness')),
    kind       text        NOT NULL,
    run_id     uuid,
    worker_id  text,
    generation bigint,
    write_id   uuid,
    data       jsonb       NOT NULL DEFAULT '{}',
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Append-only: nothing may rewrite the evidence.
CREATE FUNCTION public.chaos_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END
$$;
CREATE TRIGGER chaos_history_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON public.chaos_history
    FOR EACH STATEMENT EXECUTE FUNCTION public.chaos_refuse_change();
CREATE TRIGGER chaos_events_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON public.chaos_events
    FOR EACH STATEMENT EXECUTE FUNCTION public.chaos_refuse_change();

-- The zeroth functions run as zeroth_owner (SECURITY DEFINER); the recorders run as their
-- creator so they may append whatever role wrote. The writer fields are read only from values the
-- soak's own handler and the worker put there; writer_calls is the call stack of zeroth functions
-- that made the write (innermost first, the public function called last), from PG_CONTEXT: it
-- tells a holder's own write (fail_run, settle_runs, …) from an end of a lapsed lease made by
-- someone else (zeroth._take_over, zeroth._end_unrecoverable, inside claim_orphaned).
CREATE FUNCTION public.chaos_writer_calls() RETURNS text[]
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_context text;
BEGIN
    GET DIAGNOSTICS v_context = PG_CONTEXT;
    RETURN ARRAY(SELECT coalesce(m[1], m[2])
                   FROM regexp_matches(v_context,
                                       'function zeroth\.(\w+)\(|SQL function "(\w+)"', 'g')
                        WITH ORDINALITY AS f(m, n)
                  ORDER BY n);
END
$$;
CREATE FUNCTION public.chaos_record_run() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_kind   text;
    v_writer jsonb;
BEGIN
    v_kind := CASE
        WHEN NEW.lease_generation <> OLD.lease_generation THEN 'claim'
        WHEN NEW.status <> OLD.status THEN CASE NEW.status::text
            WHEN 'running' THEN 'start'
            WHEN 'completed' THEN 'complete'
            WHEN 'failed' THEN 'fail'
            WHEN 'cancelled' THEN 'cancel'
            WHEN 'pending' THEN CASE WHEN NEW.error IS DISTINCT FROM OLD.error
                                     THEN 'retry' ELSE 'hand_back' END
            ELSE 'status' END
        WHEN NEW.checkpoint_seq <> OLD.checkpoint_seq THEN NULL  -- chaos_record_checkpoint has it
        WHEN NEW.progress IS DISTINCT FROM OLD.progress THEN 'commit'
        WHEN NEW.lease_worker_id IS NULL AND OLD.lease_worker_id IS NOT NULL THEN 'release'
        WHEN NEW.lease_expires_at > OLD.lease_expires_at THEN 'renew'
        WHEN NEW.lease_expires_at < OLD.lease_expires_at THEN 'expire'
        ELSE 'touch' END;
    IF v_kind IS NULL THEN
        RETURN NULL;
    END IF;
    v_writer := CASE v_kind WHEN 'commit' THEN NEW.progress WHEN 'complete' THEN NEW.output
                            WHEN 'fail' THEN NEW.error WHEN 'retry' THEN NEW.error END;
    INSERT INTO public.chaos_history (
        kind, run_id, tenant_id, old_status, new_status, old_generation, new_generation,
        old_worker, new_worker, old_expires, new_expires, acquired_at, slot, fn_now,
        writer_generation, writer_worker, writer_event, writer_calls, data)
    VALUES (v_kind, NEW.run_id, NEW.tenant_id, OLD.status::text, NEW.status::text,
            OLD.lease_generation, NEW.lease_generation, OLD.lease_worker_id, NEW.lease_worker_id,
            OLD.lease_expires_at, NEW.lease_expires_at, NEW.lease_acquired_at, NEW.admission_slot,
            NEW.updated_at,
            coalesce(v_writer ->> 'generation', v_writer ->> 'lease_generation')::bigint,
            v_writer ->> 'worker_id', (v_writer ->> 'eid')::uuid, public.chaos_writer_calls(),
            CASE WHEN v_kind = 'commit' THEN NEW.progress
                 WHEN v_kind IN ('fail', 'retry') THEN NEW.error - 'traceback' END);
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_runs_history AFTER UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION public.chaos_record_run();

-- A checkpoint row carries the generation its writer passed; the run row (already updated in
-- this transaction) carries the lease that let it through.
CREATE FUNCTION public.chaos_record_checkpoint() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO public.chaos_history (
        kind, run_id, tenant_id, old_status, new_status, old_generation, new_generation,
        old_worker, new_worker, old_expires, new_expires, acquired_at, slot, fn_now,
        writer_generation, writer_worker, writer_event, writer_calls, data)
    SELECT 'checkpoint', r.run_id, r.tenant_id, r.status::text, r.status::text,
           r.lease_generation, r.lease_generation, r.lease_worker_id, r.lease_worker_id,
           r.lease_expires_at, r.lease_expires_at, r.lease_acquired_at, r.admission_slot,
           NEW.created_at, NEW.lease_generation, NEW.data ->> 'worker_id',
           (NEW.data ->> 'eid')::uuid, public.chaos_writer_calls(), NEW.data
      FROM zeroth.runs r
     WHERE r.tenant_id = NEW.tenant_id AND r.workspace_key = NEW.workspace_key
       AND r.run_id = NEW.run_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_checkpoints_history AFTER INSERT OR UPDATE ON zeroth.checkpoints
    FOR EACH ROW EXECUTE FUNCTION public.chaos_record_checkpoint();
"""

HISTORY_QUERY = "SELECT h.* FROM public.chaos_history h ORDER BY h.id"
EVENTS_QUERY = "SELECT e.* FROM public.chaos_events e ORDER BY e.id"
RUNS_QUERY = """
    SELECT r.run_id, r.tenant_id, r.status::text AS status, r.lease_worker_id, r.lease_generation,
           r.created_at
      FROM zeroth.runs r"""

# One snapshot: every live lease, with the slot row its admission_slot points at (a slot names
# (run_id, lease_generation) and nothing else). Liveness is judged by clock_timestamp(), read
# after the snapshot was taken: a lease live then was live, in the snapshot's rows, at the moment
# of the snapshot, so no claim committed before it can have seen that lease expired. (By now(),
# which is earlier, a lease a claim had just retired could look live.)
SLOTS_QUERY = """
    SELECT statement_timestamp() AS at, r.tenant_id, r.workspace_key, r.deployment_ref, r.run_id,
           r.lease_worker_id, r.lease_generation, r.lease_expires_at,
           r.admission_slot AS slot_no, s.slot_no IS NOT NULL AS slot_exists,
           s.run_id AS slot_run_id, s.lease_generation AS slot_generation
      FROM zeroth.runs r
      LEFT JOIN zeroth.admission_slots s
        ON s.tenant_id = r.tenant_id AND s.workspace_key = r.workspace_key
       AND s.deployment_ref = r.deployment_ref AND s.slot_no = r.admission_slot
     WHERE r.lease_worker_id IS NOT NULL AND r.lease_expires_at >= clock_timestamp()"""

# Each WAL timeline owns a band of 2^32 lease generations (sql/functions/internal/generations.sql).
GENERATION_BAND = 2**32
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
TERMINAL_KINDS = frozenset({"complete", "fail", "cancel"})
# Every write that ends a generation's work on the run (at most one per generation).
OUTCOME_KINDS = TERMINAL_KINDS | {"retry", "hand_back"}
# Fenced by (worker, generation, live lease) in their UPDATE predicate.
LIVE_FENCED_KINDS = TERMINAL_KINDS | {"start", "touch", "checkpoint", "commit", "renew", "retry"}
# Fenced by the exact (worker, generation) only: giving a lease back needs no live lease.
EXACT_FENCED_KINDS = frozenset({"hand_back", "release", "expire"})
# The ends of a lapsed lease made by someone other than its holder (the orphan sweep's
# claim_orphaned: a run out of attempts dead-lettered, one nobody may resume failed, one whose
# recovery raised ended): settle kinds take_over and unrecoverable, fenced on the lease having
# EXPIRED at the writing function's time. Told apart by the call stack the trigger recorded
# (writer_calls), not by the kind, which is the run's new status: a sweep's `fail` is not the
# holder's write, and the holder's own `fail` stays fenced on its live lease.
LAPSED_LEASE_ENDS = frozenset({"_take_over", "_end_unrecoverable"})
# What such an end writes: the run failed, cancelled or requeued (its lease dropped). Anything
# else under that call stack (a completion, progress, a start, a renewal) is no end of a lapsed
# lease and stays fenced on its holder's live lease.
LAPSED_LEASE_END_KINDS = frozenset({"fail", "cancel", "retry", "hand_back", "release", "expire"})
MAX_LISTED = 25  # violations listed per check; the count is always complete

Row = Mapping[str, Any]


@dataclass(slots=True)
class _Window:
    """One generation's live lease in database time. It starts when the claim decided
    (``acquired_at``, the claim's clock) and its row was written (``claimed_at``, the trigger's
    clock, after every lock the claim took); it ends at its last expiry, or earlier where a write
    cleared it (``cleared_at``, the trigger's clock, before that write committed)."""

    run_id: UUID
    tenant_id: str
    generation: int
    slot: int | None
    acquired_at: datetime
    claimed_at: datetime
    expires: datetime
    cleared_at: datetime | None = None

    def ends_before(self, later: _Window) -> bool:
        """A lapsed lease expired before the later claim decided (the claim's own predicate); a
        cleared one was cleared before the later claim locked what the clear freed."""
        if self.cleared_at is not None and self.cleared_at < self.expires:
            return self.cleared_at < later.claimed_at
        return self.expires < later.acquired_at

    @property
    def end(self) -> datetime:
        return self.expires if self.cleared_at is None else min(self.expires, self.cleared_at)


@dataclass(slots=True)
class Report:
    """What the checker found: violations per check, and the soak's figures."""

    violations: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, check: str, message: str) -> None:
        found = self.violations.setdefault(check, [])
        found.append(message)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> dict[str, Any]:
        """Per check: how many violations, and the first few."""
        return {check: {"count": len(found), "first": found[:MAX_LISTED]}
                for check, found in sorted(self.violations.items())}


def check_history(
    history: Sequence[Row],
    events: Sequence[Row],
    runs: Sequence[Row],
    *,
    lease_seconds: float,
    fleet_limits: Mapping[str, int] | None = None,
    slot_samples: Sequence[Row] = (),
    min_stale_refused: int = 50,
) -> Report:
    """Replay the accepted history and the events against the invariants (listed in
    docs/reliability.md). ``fleet_limits`` maps a tenant to the ``max_concurrency`` its workers
    claimed with; ``slot_samples`` are the rows of the :data:`SLOTS_QUERY` snapshots, each with
    the number of its snapshot as ``sample``; ``min_stale_refused`` is how many refused stale
    writes make the run count."""
    report = Report()
    by_run: dict[UUID, list[Row]] = defaultdict(list)
    for row in history:
        by_run[row["run_id"]].append(row)

    _check_final_states(report, runs)
    _check_outcomes(report, runs, by_run)
    _check_fence(report, history, lease_seconds)
    windows = _check_generations_and_windows(report, by_run)
    _check_fleet_limits(report, windows, fleet_limits or {})
    _check_slot_samples(report, slot_samples, fleet_limits or {})
    _check_handler_log(report, history, events, by_run)
    _count_stale_writes(report, events, by_run, min_stale_refused)
    _figures(report, history, events, runs, by_run)
    return report


# -- invariants -------------------------------------------------------------------------------


def _check_final_states(report: Report, runs: Sequence[Row]) -> None:
    for run in runs:
        if run["status"] not in TERMINAL_STATUSES or run["lease_worker_id"] is not None:
            report.fail("all_runs_terminal",
                        f"run {run['run_id']} ends {run['status']} leased by "
                        f"{run['lease_worker_id']} (generation {run['lease_generation']})")


def _check_outcomes(report: Report, runs: Sequence[Row], by_run: Mapping[UUID, list[Row]]
                    ) -> None:
    for run in runs:
        rows = by_run.get(run["run_id"], [])
        terminal = [row for row in rows if row["kind"] in TERMINAL_KINDS]
        if len(terminal) != 1:
            report.fail("one_terminal_outcome_per_run",
                        f"run {run['run_id']}: {len(terminal)} accepted terminal outcomes "
                        f"{[(r['kind'], r['old_generation']) for r in terminal]}")
        elif terminal[0]["new_status"] != run["status"]:
            report.fail("one_terminal_outcome_per_run",
                        f"run {run['run_id']}: outcome {terminal[0]['new_status']} but the run "
                        f"is {run['status']}")
        per_generation = Counter(row["old_generation"] for row in rows
                                 if row["kind"] in OUTCOME_KINDS)
        for generation, count in sorted(per_generation.items()):
            if count > 1:
                report.fail("one_outcome_per_generation",
                            f"run {run['run_id']} generation {generation}: {count} outcomes")


def ends_lapsed_lease(row: Row) -> bool:
    """Whether the write is an end of a lapsed lease by someone other than its holder (as the
    trigger saw the call stack: :data:`LAPSED_LEASE_ENDS`)."""
    return (row["kind"] in LAPSED_LEASE_END_KINDS
            and not LAPSED_LEASE_ENDS.isdisjoint(row.get("writer_calls") or ()))


def _check_fence(report: Report, history: Sequence[Row], lease_seconds: float) -> None:
    """Every accepted write came from the generation (and worker) holding the lease, and the
    lease was live at the writing function's database time unless the write only gives it back;
    an end of the lease by someone else (the orphan sweep) was made on a lease expired at its
    database time. A write's database time is when the function decided, under the row lock it
    holds until commit: the commit may come later, past the expiry, and no other generation can
    have claimed meanwhile (a claim needs that lock, and finds the run ended)."""
    lease = timedelta(seconds=lease_seconds)
    for row in history:
        kind = row["kind"]
        if kind == "claim":
            continue
        where = f"{kind} #{row['id']} of run {row['run_id']}"
        if ends_lapsed_lease(row):
            if row["old_worker"] is None or not row["old_expires"] < row["fn_now"]:
                report.fail("no_stale_accepted_write",
                            f"{where}: ended by {row['writer_calls'][-1]} at {row['fn_now']} "
                            f"while worker {row['old_worker']} held a lease live until "
                            f"{row['old_expires']}")
            continue
        if kind not in LIVE_FENCED_KINDS | EXACT_FENCED_KINDS:
            report.fail("no_stale_accepted_write", f"{where}: a write no worker should make")
            continue
        if row["old_worker"] is None:
            report.fail("no_stale_accepted_write", f"{where}: accepted with no lease held")
            continue
        writer_generation, writer_worker = row["writer_generation"], row["writer_worker"]
        if writer_generation is not None and writer_generation != row["old_generation"]:
            report.fail("no_stale_accepted_write",
                        f"{where}: generation {writer_generation} wrote while "
                        f"{row['old_generation']} held the lease")
        if writer_worker is not None and writer_worker != row["old_worker"]:
            report.fail("no_stale_accepted_write",
                        f"{where}: worker {writer_worker} wrote while {row['old_worker']} held "
                        "the lease")
        if kind in LIVE_FENCED_KINDS:
            # A renewal does not touch updated_at; its database time is the new expiry - lease.
            written_at = row["new_expires"] - lease if kind == "renew" else row["fn_now"]
            if row["old_expires"] < written_at:
                report.fail("no_stale_accepted_write",
                            f"{where}: accepted at {written_at} on a lease that expired at "
                            f"{row['old_expires']} (writer {writer_worker} generation "
                            f"{writer_generation}, calls {row.get('writer_calls')}, data "
                            f"{row['data']})")


def _check_generations_and_windows(report: Report, by_run: Mapping[UUID, list[Row]]
                                   ) -> list[_Window]:
    """Generations only grow, by one per claim (or to a new timeline's band after a failover);
    the live lease windows of a run never overlap."""
    windows: list[_Window] = []
    for run_id, rows in by_run.items():
        current: _Window | None = None
        run_windows: list[_Window] = []
        for row in rows:
            old, new = row["old_generation"], row["new_generation"]
            if row["kind"] == "claim":
                # By one per claim; or, on a promoted server's first claim of the run, up to
                # the first generation of its WAL timeline's band (internal/generations.sql).
                if new != old + 1 and not (new > old and (new - 1) % GENERATION_BAND == 0):
                    report.fail("generations_increase",
                                f"run {run_id}: claim moved generation {old} → {new}")
                if run_windows and new <= run_windows[-1].generation:
                    report.fail("generations_increase",
                                f"run {run_id}: generation {new} claimed after "
                                f"{run_windows[-1].generation}")
                if current is not None:
                    current.expires = row["old_expires"]
                current = _Window(run_id, row["tenant_id"], new, row["slot"], row["acquired_at"],
                                  row["at"], row["new_expires"])
                run_windows.append(current)
                continue
            if new != old:
                report.fail("generations_increase",
                            f"run {run_id}: {row['kind']} #{row['id']} changed generation "
                            f"{old} → {new}")
            if current is None:
                continue
            if row["new_worker"] is None:
                current.cleared_at = row["at"]
                current = None
            else:
                current.expires = row["new_expires"]
        _check_disjoint(report, "lease_windows_disjoint", f"run {run_id}", run_windows)
        windows.extend(run_windows)
    return windows


def _check_disjoint(report: Report, check: str, where: str, windows: Sequence[_Window]) -> None:
    """Each lease (of one run, or of one admission slot) ended before the next was claimed."""
    for before, after in itertools.pairwise(windows):
        if not before.ends_before(after):
            report.fail(check, f"{where}: run {before.run_id} generation {before.generation} "
                        f"live until {before.end}, run {after.run_id} generation "
                        f"{after.generation} claimed at {after.acquired_at} (row written "
                        f"{after.claimed_at})")


def _check_fleet_limits(report: Report, windows: Iterable[_Window], limits: Mapping[str, int]
                        ) -> None:
    """Under max_concurrency every lease holds one of the scope's admission slots, and the
    leases of one slot never overlap: so no more than that many are ever live at once."""
    for tenant, limit in sorted(limits.items()):
        by_slot: dict[int, list[_Window]] = defaultdict(list)
        for window in windows:
            if window.tenant_id != tenant:
                continue
            if window.slot is None:
                report.fail("fleet_limit", f"run {window.run_id} generation "
                            f"{window.generation} claimed without an admission slot")
            else:
                by_slot[window.slot].append(window)
        if len(by_slot) > limit:
            report.fail("fleet_limit", f"tenant {tenant} used slots {sorted(by_slot)} "
                        f"(max_concurrency {limit})")
        for slot, held in sorted(by_slot.items()):
            held.sort(key=lambda window: window.claimed_at)
            _check_disjoint(report, "fleet_limit", f"tenant {tenant} slot {slot}", held)
        report.figures.setdefault("admission_slots_used", {})[tenant] = len(by_slot)


def _check_slot_samples(report: Report, samples: Sequence[Row], limits: Mapping[str, int]
                        ) -> None:
    """In every snapshot, each live lease held in an admission slot is named by that slot with
    its generation (a live slotted lease is never missing from its slot), and a scope under
    max_concurrency has no more live leases than that, each in a slot. A tenant under a limit
    whose slotted leases were never seen live makes the check vacuous: that fails too."""
    by_sample: dict[Any, list[Row]] = defaultdict(list)
    for row in samples:
        by_sample[row["sample"]].append(row)
    peak: Counter[str] = Counter()
    checked = 0
    for sample, rows in sorted(by_sample.items()):
        live: Counter[tuple[str, str, str]] = Counter()
        for row in rows:
            scope = (row["tenant_id"], row["workspace_key"], row["deployment_ref"])
            lease = (f"run {row['run_id']} generation {row['lease_generation']} "
                     f"(worker {row['lease_worker_id']}, live until {row['lease_expires_at']})")
            where = f"snapshot {sample} at {rows[0]['at']}: {lease}"
            slot = row["slot_no"]
            if slot is None:
                if scope[0] in limits:
                    report.fail("live_slotted_leases_within_limit",
                                f"{where} holds no admission slot under max_concurrency "
                                f"{limits[scope[0]]}")
                continue
            live[scope] += 1
            checked += 1
            named = (row["slot_run_id"], row["slot_generation"])
            if named != (row["run_id"], row["lease_generation"]):
                held_by = ("no such slot row" if not row["slot_exists"] else
                           "nothing" if named == (None, None) else
                           f"run {named[0]} generation {named[1]}")
                report.fail("live_lease_named_by_its_slot",
                            f"{where} is held in slot {slot} of {scope}, which names {held_by}")
        for scope, count in sorted(live.items()):
            tenant = scope[0]
            peak[tenant] = max(peak[tenant], count)
            if tenant in limits and count > limits[tenant]:
                report.fail("live_slotted_leases_within_limit",
                            f"snapshot {sample} at {rows[0]['at']}: {count} live leases in "
                            f"admission slots of {scope} (max_concurrency {limits[tenant]})")
    for tenant, limit in sorted(limits.items()):
        if peak[tenant] == 0:
            report.fail("admission_slots_sampled",
                        f"no snapshot saw a live lease in an admission slot of tenant {tenant} "
                        f"(max_concurrency {limit}): the slot checks proved nothing")
    report.figures["slot_snapshots"] = {
        "with_live_leases": len(by_sample),
        "live_slotted_leases_checked": checked,
        "live_slotted_leases_peak": dict(sorted(peak.items())),
    }


def _check_handler_log(report: Report, history: Sequence[Row], events: Sequence[Row],
                       by_run: Mapping[UUID, list[Row]]) -> None:
    """The handler's own log agrees with the database: what it saw accepted is in the history,
    what it saw refused is not; it only ever ran generations that were claimed by its worker,
    and a recovered run resumed from the last checkpoint accepted before its claim."""
    accepted_writes = {row["writer_event"] for row in history if row["writer_event"] is not None}
    for event in events:
        if event["source"] != "handler":
            continue
        kind, write_id = event["kind"], event["write_id"]
        if kind == "accepted" and write_id not in accepted_writes:
            report.fail("handler_log_agrees", f"write {write_id} of run {event['run_id']} "
                        "was answered accepted but is not in the history")
        elif kind == "refused" and write_id in accepted_writes:
            report.fail("no_stale_accepted_write", f"write {write_id} of run {event['run_id']} "
                        f"(generation {event['generation']}) was answered refused but landed")
        elif kind == "handler_start":
            _check_handler_start(report, event, by_run.get(event["run_id"], []))


def _check_handler_start(report: Report, event: Row, rows: Sequence[Row]) -> None:
    generation, worker = event["generation"], event["worker_id"]
    claim = next((row for row in rows if row["kind"] == "claim"
                  and row["new_generation"] == generation), None)
    if claim is None or claim["new_worker"] != worker:
        report.fail("handler_log_agrees", f"run {event['run_id']}: worker {worker} ran "
                    f"generation {generation}, claimed by "
                    f"{None if claim is None else claim['new_worker']}")
        return
    steps = [row["data"]["step"] for row in rows
             if row["kind"] == "checkpoint" and row["id"] < claim["id"]]
    expected = steps[-1] if steps else 0
    if event["data"].get("resumed_step") != expected:
        report.fail("resumes_from_last_checkpoint",
                    f"run {event['run_id']} generation {generation} resumed at step "
                    f"{event['data'].get('resumed_step')}, last checkpoint was {expected}")


def _count_stale_writes(report: Report, events: Sequence[Row], by_run: Mapping[UUID, list[Row]],
                        minimum: int) -> None:
    """Refused writes, split by why: a newer generation had been claimed before the attempt
    (superseded), or the lease had only lapsed (expired)."""
    attempts = {event["write_id"]: event for event in events
                if event["source"] == "handler" and event["kind"] == "attempt"}
    outcomes = Counter(event["kind"] for event in events if event["source"] == "handler"
                       and event["kind"] in ("accepted", "refused", "in_doubt"))
    superseded = 0
    for event in events:
        if event["source"] != "handler" or event["kind"] != "refused":
            continue
        attempt = attempts.get(event["write_id"], event)
        superseded += any(row["kind"] == "claim" and row["new_generation"] > event["generation"]
                          and row["at"] < attempt["at"] for row in by_run.get(event["run_id"], []))
    refused = outcomes["refused"]
    report.figures["stale_writes"] = {
        "refused": refused,
        "refused_superseded": superseded,
        "refused_expired": refused - superseded,
        "in_doubt": outcomes["in_doubt"],
        "accepted": len(report.violations.get("no_stale_accepted_write", [])),
        "handler_writes_accepted": outcomes["accepted"],
    }
    if refused < minimum:
        report.fail("fence_exercised", f"only {refused} stale writes were refused (need at "
                    f"least {minimum}): the faults did not exercise the fence")


# -- figures ------------------------------------------------------------------------------------


def _percentiles(values: Sequence[float]) -> dict[str, Any]:
    """Count, p50, p99 and max (nearest rank), rounded to milliseconds."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3)

    return {"n": len(ordered), "p50": rank(0.50), "p99": rank(0.99), "max": round(ordered[-1], 3)}


def _reclaim_latencies(events: Sequence[Row], by_run: Mapping[UUID, list[Row]], fault: str
                       ) -> tuple[list[float], int]:
    """Seconds from a fault on a worker to the claim that took each lease it held."""
    latencies: list[float] = []
    missing = 0
    for event in events:
        if event["source"] != "harness" or event["kind"] != fault:
            continue
        for run_id, generation in event["data"].get("leases", []):
            claim = next((row for row in by_run.get(UUID(run_id), [])
                          if row["kind"] == "claim" and row["old_generation"] == generation),
                         None)
            if claim is None:
                missing += 1  # completed by a write in flight when the fault hit
            else:
                latencies.append((claim["acquired_at"] - event["at"]).total_seconds())
    return latencies, missing


def _figures(report: Report, history: Sequence[Row], events: Sequence[Row], runs: Sequence[Row],
             by_run: Mapping[UUID, list[Row]]) -> None:
    figures = report.figures
    finished = [row["fn_now"] for row in history if row["kind"] in TERMINAL_KINDS]
    created = [run["created_at"] for run in runs]
    elapsed = (max(finished) - min(created)).total_seconds() if finished and created else 0.0
    figures["runs"] = len(runs)
    figures["final_status"] = dict(sorted(Counter(run["status"] for run in runs).items()))
    figures["elapsed_s"] = round(elapsed, 2)
    figures["runs_per_s"] = round(len(finished) / elapsed, 1) if elapsed else None
    kill, kill_missing = _reclaim_latencies(events, by_run, "kill")
    stop, stop_missing = _reclaim_latencies(events, by_run, "stop")
    figures["kill_to_reclaim_s"] = {**_percentiles(kill), "not_reclaimed": kill_missing}
    figures["stop_to_reclaim_s"] = {**_percentiles(stop), "not_reclaimed": stop_missing}
    starts = Counter(event["run_id"] for event in events
                     if event["source"] == "handler" and event["kind"] == "handler_start")
    figures["executions_per_run"] = _histogram(starts.get(run["run_id"], 0) for run in runs)
    figures["claims_per_run"] = _histogram(
        sum(row["kind"] == "claim" for row in by_run.get(run["run_id"], [])) for run in runs)
    figures["accepted_writes"] = dict(sorted(Counter(row["kind"] for row in history).items()))
    # A handler's error document names its type; a run ended by someone else (a hand-back that
    # used up its attempts: zeroth._stop_error) names its stop_reason instead.
    figures["failed_attempts_by_error"] = dict(sorted(Counter(
        row["data"].get("type") or f"stop:{row['data'].get('stop_reason')}" for row in history
        if row["kind"] in ("retry", "fail") and row["data"]).items()))
    figures["faults"] = dict(sorted(Counter(
        event["kind"] for event in events if event["source"] == "harness").items()))


def _histogram(counts: Iterable[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(counts).items())}
