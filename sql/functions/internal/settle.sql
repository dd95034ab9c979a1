-- sql/functions/internal/settle.sql: the one way an attempt ends (issue 33). Every lease-ending
-- function — complete_run(s), fail_run, cancel_run, pause_run, sleep_run, release_lease,
-- hand_back_to_pending, expire_recovery_lease, wait_for_event, wait_for_children, settle_runs —
-- checks its arguments, locks with zeroth._lock_settle, reads the clock, and settles with
-- zeroth._settle. Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run
-- inside the SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- ZP008 unless a single fenced call names a run, a worker and a generation.
CREATE OR REPLACE FUNCTION zeroth._require_fence(run_id uuid, worker_id text, generation bigint)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM zeroth._require(_require_fence.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(_require_fence.worker_id, 'worker_id');
    PERFORM zeroth._require(_require_fence.generation IS NOT NULL, 'generation must not be NULL');
END
$$;
COMMENT ON FUNCTION zeroth._require_fence(uuid, text, bigint) IS 'Internal: ZP008 unless run_id and generation are given and worker_id is an identifier.';
ALTER FUNCTION zeroth._require_fence(uuid, text, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_fence(uuid, text, bigint) FROM PUBLIC;

-- The one lock prologue of every lease-ending call, for one run or a batch: the admission slots
-- naming exactly (run_ids[i], generations[i]), then the run rows whose lease is that one held by
-- worker_id and not yet expired, each kind in run_id order (sql/README.md, "Lock order"). Returns
-- the addresses of what it locked (a row this transaction holds locked cannot move): the settle
-- reaches them by a TID scan, the one plan whatever the table's statistics. The caller reads the
-- clock after this returns, so a call that waited for a row judges the lease by the time it got
-- it (zeroth._lock_leased_run says why).
-- One probe per requested run: a LATERAL sub-select with a locking clause is never flattened into
-- a join, so no plan pairs the batch with itself by a filter (1,000 runs made 1,000,000
-- comparisons), and no plan reaches the rows through runs_running_idx (no predicate names the
-- status). The slots' scope by IS NOT DISTINCT FROM (= on NOT NULL columns, never an index
-- condition): a plan made before the first ANALYZE walked the scope's slots by
-- admission_slots_pkey on PostgreSQL 15 (issue 30).
CREATE OR REPLACE FUNCTION zeroth._lock_settle(
    tenant_id text, workspace_key text, worker_id text, run_ids uuid[], generations bigint[],
    OUT slot_rows tid[], OUT run_rows tid[])
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    -- Sequential scans off: each run is one primary-key probe whatever the statistics say (a
    -- generic plan made on a table analyzed while empty read zeroth.runs whole per run).
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    SELECT coalesce(array_agg(l.ctid), '{}') INTO slot_rows
      FROM (SELECT q.run_id, q.generation
              FROM unnest(_lock_settle.run_ids, _lock_settle.generations) AS q(run_id, generation)
             ORDER BY q.run_id) q
     CROSS JOIN LATERAL (
            SELECT s.ctid
              FROM zeroth.admission_slots s
             WHERE s.run_id = q.run_id AND s.lease_generation = q.generation
               AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM
                   (_lock_settle.tenant_id, _lock_settle.workspace_key)
               FOR UPDATE OF s) l;
    SELECT coalesce(array_agg(l.ctid), '{}') INTO run_rows
      FROM (SELECT q.run_id, q.generation
              FROM unnest(_lock_settle.run_ids, _lock_settle.generations) AS q(run_id, generation)
             ORDER BY q.run_id) q
     CROSS JOIN LATERAL (
            SELECT r.ctid
              FROM zeroth.runs r
             WHERE r.tenant_id = _lock_settle.tenant_id AND r.workspace_key = _lock_settle.workspace_key
               AND r.run_id = q.run_id
               AND r.lease_generation = q.generation
               AND r.lease_worker_id = _lock_settle.worker_id
               -- Already expired: refused without waiting for whoever holds the row.
               AND r.lease_expires_at >= zeroth._now()
               FOR UPDATE OF r) l;
END
$$;
COMMENT ON FUNCTION zeroth._lock_settle(text, text, text, uuid[], bigint[]) IS 'Internal: the lock prologue of every lease-ending call: lock the admission slots naming (run_ids[i], generations[i]), then the runs whose lease that is, held by worker_id and unexpired, each in run_id order; return their row addresses. Callers read the clock after it.';
ALTER FUNCTION zeroth._lock_settle(text, text, text, uuid[], bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_settle(text, text, text, uuid[], bigint[]) FROM PUBLIC;

-- The error document of an end made by someone other than the run's owner, for zeroth._settle's
-- UPDATE (its header lists the kinds): an attempt or run timeout, a hand-back that dead-letters,
-- a takeover (claim lapsed, recovery exhausted, failed or orphaned; a requeue keeps the previous
-- error), a run deadline, an unrecoverable run, a revoke past lease + grace; every other end of
-- these kinds keeps the run's error. run: the locked row as it was before the settle. A function
-- of its own so that the settle statement, which a worker runs for every completion, plans and
-- starts up one call instead of these documents' expressions (issue 30: each expression of a
-- generic plan is set up again at every execution, whichever branch runs). Takes no lock.
CREATE OR REPLACE FUNCTION zeroth._settle_stop_error(kind text, outcome text, reason text, payload jsonb,
                                                     run zeroth.runs)
    RETURNS jsonb
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN CASE WHEN _settle_stop_error.kind IN ('timeout', 'run_timeout')
           THEN zeroth._stop_error(
                    CASE WHEN _settle_stop_error.outcome = 'run_timed_out' THEN 'run_timeout'
                         ELSE 'attempt_timeout' END,
                    CASE WHEN _settle_stop_error.outcome = 'run_timed_out'
                         THEN format('the run''s deadline (%s) passed on attempt %s of %s',
                                     run.run_deadline_at, run.attempts, run.max_attempts)
                         ELSE format('the attempt''s deadline (%s) passed on attempt %s of %s',
                                     run.attempt_deadline_at, run.attempts, run.max_attempts) END,
                    run.lease_worker_id, run.lease_generation, coalesce(_settle_stop_error.payload, run.error))
           WHEN _settle_stop_error.kind = 'hand_back' AND _settle_stop_error.outcome = 'dead_lettered'
           THEN zeroth._stop_error('attempts_exhausted', format(
                    'handed back %s times without finishing (attempt %s of %s); a run '
                    'that never finishes before its worker stops is not retried again',
                    run.hand_backs + 1, run.attempts, run.max_attempts),
                run.lease_worker_id, run.lease_generation, run.error)
           WHEN _settle_stop_error.kind = 'take_over' THEN CASE
               WHEN _settle_stop_error.outcome = 'takeover_requeued' THEN run.error
               WHEN _settle_stop_error.outcome IN ('claim_lapsed', 'recovery_exhausted')
               THEN zeroth._stop_error('attempts_exhausted', CASE
                    WHEN run.status = 'pending' THEN format(
                        'worker %s claimed it and never started it (lease expired at %s) on attempt %s of %s; '
                        'a run whose claims lapse every time is not retried again',
                        run.lease_worker_id, run.lease_expires_at, run.attempts + 1, run.max_attempts)
                    ELSE format(
                        'worker %s stopped renewing its lease (expired at %s) on attempt %s of %s; '
                        'a run whose worker dies every time is not retried again',
                        run.lease_worker_id, run.lease_expires_at, run.attempts, run.max_attempts) END,
                    run.lease_worker_id, run.lease_generation, run.error)
               ELSE zeroth._stop_error(_settle_stop_error.reason, coalesce(_settle_stop_error.payload #>> '{}', format(
                        'run lease expired: worker %s stopped renewing (expired at %s)',
                        run.lease_worker_id, run.lease_expires_at)),
                    run.lease_worker_id, run.lease_generation, run.error) END
           WHEN _settle_stop_error.kind = 'deadline'
           THEN zeroth._stop_error('run_timeout', CASE
                    WHEN run.status = 'waiting' THEN format(
                        'the run''s deadline (%s) passed while it was waiting (%s)',
                        run.run_deadline_at, run.wait_reason)
                    ELSE format('the run''s deadline (%s) passed before it could start again',
                                run.run_deadline_at) END,
                run.lease_worker_id, run.lease_generation, run.error)
           WHEN _settle_stop_error.kind = 'unrecoverable'
           THEN zeroth._stop_error('recovery_failed', _settle_stop_error.payload #>> '{}',
                                   run.lease_worker_id, run.lease_generation, run.error)
           WHEN _settle_stop_error.kind = 'revoke' AND _settle_stop_error.outcome = 'takeover_cancelled'
           THEN zeroth._stop_error('taken_over', format(
                    'cancelled after worker %s stopped renewing its lease (expired at %s)',
                    run.lease_worker_id, run.lease_expires_at), run.lease_worker_id, run.lease_generation, run.error)
           ELSE run.error END;
END
$$;
COMMENT ON FUNCTION zeroth._settle_stop_error(text, text, text, jsonb, zeroth.runs) IS 'Internal: the error document zeroth._settle writes for an end of kind timeout, run_timeout, hand_back, take_over, deadline, unrecoverable or revoke with the given outcome (the run''s previous error when that end writes none); run is the locked row before the settle.';
ALTER FUNCTION zeroth._settle_stop_error(text, text, text, jsonb, zeroth.runs) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._settle_stop_error(text, text, text, jsonb, zeroth.runs) FROM PUBLIC;

-- When a retried attempt (outcome retried or timed_out) runs again: at + an exponential backoff
-- with equal jitter (half fixed, half random), base * 2^(attempts - 1) capped at max. A policy
-- left NULL (retry_base_seconds, retry_max_seconds) is the deployment's registered one when it
-- binds this session (zeroth._policy_binds_caller; one primary-key lookup, only then), else
-- 1 s / 300 s. attempts: the run's count before the settle. For zeroth._settle's UPDATE (a
-- function of its own for the reason zeroth._settle_stop_error gives). Takes no lock.
CREATE OR REPLACE FUNCTION zeroth._retry_backoff_at(at timestamptz, deployment_ref text, attempts integer,
                                                    retry_base_seconds double precision,
                                                    retry_max_seconds double precision)
    RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_base double precision;  -- the deployment's registered policy, when it binds this session
    v_max  double precision;
BEGIN
    IF _retry_backoff_at.retry_base_seconds IS NULL OR _retry_backoff_at.retry_max_seconds IS NULL THEN
        SELECT d.retry_base_seconds, d.retry_max_seconds INTO v_base, v_max
          FROM zeroth.deployments d
         WHERE d.deployment_ref = _retry_backoff_at.deployment_ref
           AND zeroth._policy_binds_caller(d.managed_by, d.registered_by);
    END IF;
    RETURN _retry_backoff_at.at + make_interval(secs => least(
               coalesce(_retry_backoff_at.retry_max_seconds, v_max, 300),
               coalesce(_retry_backoff_at.retry_base_seconds, v_base, 1)
               * power(2, greatest(_retry_backoff_at.attempts - 1, 0)::double precision))
           * (0.5 + random() / 2));
END
$$;
COMMENT ON FUNCTION zeroth._retry_backoff_at(timestamptz, text, integer, double precision, double precision) IS 'Internal: when a retried attempt runs again: at + min(max, base * 2^(attempts - 1)) with equal jitter; a NULL base or max is the deployment''s registered policy when it binds this session, else 1 s / 300 s.';
ALTER FUNCTION zeroth._retry_backoff_at(timestamptz, text, integer, double precision, double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._retry_backoff_at(timestamptz, text, integer, double precision, double precision) FROM PUBLIC;

-- Settles runs the caller locked (zeroth._lock_settle: run_rows, slot_rows) to their outcomes, in
-- one statement: run_ids[i] under generations[i] with kinds[i], one of
--   complete (payloads[i]: the output; SQL NULL keeps it, JSON null clears it), fail (not
--   retryable; payloads[i]: the bounded error), retry (retryable: backoff from retry_base_seconds,
--   retry_max_seconds while attempts < max_attempts, else dead-lettered), cancel, hand_back,
--   release, expire (expire_recovery_lease), sleep (run_afters[i]: T; payloads[i]: a checkpoint
--   to number), pause and wait (reasons[i]: the wait_reason; a wait yields to a cancel request),
--   timeout (issue 34 item 2: the attempt's deadline passed — retried with backoff as retry, or
--   dead-lettered with no attempt left; past the run's deadline (at >= run_deadline_at), or when
--   that is the deadline the holder stopped at (no later than the attempt's), the run fails for
--   good: run_timed_out) and run_timeout (run_timed_out whatever the clock: the orphan
--   sweep's end of a run past its run deadline), both with error {stop_reason attempt_timeout |
--   run_timeout} (payloads[i], the holder's error, kept as its previous error); and deadline
--   (zeroth._end_past_run_deadline: a pending or waiting run that nobody holds a live lease on,
--   past its run deadline — a claim or the sweep meets it — run_timed_out, error {stop_reason
--   run_timeout}; worker_id is the holder of a lapsed claim, NULL for none, whose attempt is
--   counted and recorded as expired);
--   and three ends of another worker's lease, for the callers that locked the run without holding
--   it (worker_id is then the run's holder as they locked it, NULL for none): take_over
--   (zeroth._take_over: the lease + grace ran out; reasons[i]: the stop reason of a run not
--   resumable, payloads[i]: its message as a JSON string, NULL: the default), unrecoverable
--   (zeroth._end_unrecoverable; payloads[i]: the message as a JSON string), revoke (zeroth._cancel:
--   an operator's cancel; reasons[i]: the cancel action) and clear (clear_lease).
-- The kind and the locked row decide the outcome (completed, retried, failed, dead_lettered,
-- cancelled, handed_back, released, expired, slept, paused, waited, timed_out, run_timed_out; for
-- take_over takeover_cancelled, claim_lapsed, takeover_failed or orphan_recovered,
-- recovery_exhausted, takeover_requeued; recovery_failed; for revoke cancel_requested or
-- takeover_cancelled; for clear expired (running) or released), and
-- zeroth.run_transitions the edge: an outcome whose (status, outcome) is not listed changes
-- nothing. The fence is in the UPDATE's predicate (worker, generation, the status it was decided
-- on, and the lease live at `at` — expired for take_over and unrecoverable, either for revoke
-- and clear), so
-- a row changed between the lock and the settle (a DBA's UPDATE in the same transaction) is
-- refused, never half-written. In the same statement the lease is cleared (expired in place for
-- `expired`), and the rows of what follows are made; each of these is then written by a
-- statement of its own that runs only when it has rows (issue 30: the most frequent end, a
-- completion at the first claim with no slot and no events, plans and starts up none of them),
-- under the same row locks and in the same transaction: the slots freed, and the ended attempt
-- of every outcome but `expired` (which ends
-- none, and of a run that had no holder) written to zeroth.run_attempt_log — but for a completion
-- at the run's first claim (lease generation 1), whose holder and claim time stay in the runs row
-- instead (completed_worker_id, completed_claimed_at; the view zeroth.run_attempts shows that
-- attempt from there: issue 30, one heap row and one index entry fewer a run) — with the row
-- marked (attempt_recorded_generation) so the
-- trigger runs_attempt_history leaves it alone (a row that already carried that mark — a DBA
-- reopened a recorded generation by hand — is left to the trigger instead: one row either way). Then zeroth_wakeup once per deployment that had a
-- slot freed, a run due now, or a lease given back (release, expire, hand_back, take_over,
-- unrecoverable, clear).
-- The run event stream (issue 34): a run that ended (completed, failed, cancelled) and has
-- events gets its END row and a zeroth_run_events hint; one that emitted nothing gets neither
-- (read_run_events makes its END from its status).
-- The error documents of the ends made by someone other than the owner and the retry backoff
-- are computed by zeroth._settle_stop_error and zeroth._retry_backoff_at, called only for the
-- rows that need them.
-- One row per requested run, in input order: the outcome settled (NULL when refused), the status
-- it was decided on, the new status, run_after and checkpoint_seq, and sqlstate: NULL settled,
-- ZP002 not the caller's live lease (fenced out), ZP012 held but the edge is not listed.
-- Planned with nested loops and sequential scans off: the runs and slots are reached by their
-- addresses (a TID scan) and paired with the request by a hash join; a nested loop over the two
-- (a generic plan's guess of 10 rows picks one) compared every run with every request
-- (1,000,000 comparisons for 1,000 runs), and a plan made before the first ANALYZE walked the
-- scope by runs_pkey on PostgreSQL 15 (issue 30).
CREATE OR REPLACE FUNCTION zeroth._settle(
    tenant_id text, workspace_key text, worker_id text,
    run_ids uuid[], generations bigint[], kinds text[],
    payloads jsonb[], run_afters timestamptz[], reasons text[],
    retry_base_seconds double precision, retry_max_seconds double precision,
    run_rows tid[], slot_rows tid[], at timestamptz)
    RETURNS TABLE (ord integer, run_id uuid, outcome text, from_status zeroth.run_status,
                   to_status zeroth.run_status, run_after timestamptz, checkpoint_seq bigint,
                   sqlstate text)
    LANGUAGE plpgsql VOLATILE
    -- JIT off, as in every function that turns a plan node off: a statement that cannot avoid
    -- the node (a LATERAL row lock needs a nested loop) is costed at 1e10 and JIT-compiled at
    -- each execution, 0.3-1.1 s of CPU where the server has LLVM (docs/performance.md, "JIT").
    SET jit = off
    SET enable_nestloop = off
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_ord      integer[];
    v_outcome  text[];
    v_from     zeroth.run_status[];
    v_to       zeroth.run_status[];
    v_after    timestamptz[];
    v_seq      bigint[];
    v_state    text[];
    v_deps     text[];
    v_ws       text;
    -- the ended attempts to log, a column each
    v_log_runs        uuid[];
    v_log_attempts    integer[];
    v_log_generations bigint[];
    v_log_claimed     timestamptz[];
    v_log_started     timestamptz[];
    v_log_outcomes    text[];
    v_log_errors      jsonb[];
    -- the END rows of the streams of runs that ended (issue 34), a column each
    v_end_runs        uuid[];
    v_end_ids         bigint[];
    v_end_data        jsonb[];
    v_end_generations bigint[];
    v_settled_runs    uuid[];    -- each settled run once
    v_settled_slot_generations bigint[];  -- the generation whose slots it frees, NULL: every one
BEGIN
    WITH requested AS (
        SELECT q.ord::integer AS ord, q.run_id, q.generation, q.kind,
               _settle.payloads[q.ord] AS payload, _settle.run_afters[q.ord] AS run_after,
               _settle.reasons[q.ord] AS reason
          FROM unnest(_settle.run_ids, _settle.generations, _settle.kinds)
               WITH ORDINALITY AS q(run_id, generation, kind, ord)
    ), held AS MATERIALIZED (
        -- The locked rows, as they are before the settle (the fence: `decided`).
        SELECT r.run_id, r.lease_generation, r.status, r.attempts, r.max_attempts, r.hand_backs,
               r.cancel_requested_at, r.lease_acquired_at, r.started_at,
               r.attempt_recorded_generation AS old_mark,
               r.lease_worker_id, r.lease_expires_at, r.resumable, r.cancel_action,
               -- issue 34 item 2: a timeout at the run's deadline ends the run
               r.run_deadline_at, r.attempt_deadline_at, r.completed_worker_id
          FROM zeroth.runs r
         WHERE r.ctid = ANY (_settle.run_rows)
           AND r.run_id = ANY (_settle.run_ids)  -- a key probe, never a walk of runs_pkey
           AND (r.tenant_id, r.workspace_key) IS NOT DISTINCT FROM
               (_settle.tenant_id, _settle.workspace_key)
    ), decided AS MATERIALIZED (
        SELECT q.ord, q.run_id, q.generation, q.kind, q.payload, q.run_after, q.reason,
               h.status AS from_status, h.attempts, h.lease_acquired_at, h.started_at, h.old_mark,
               h.lease_expires_at AS old_expires,
               -- The attempt kept in the runs row, not in run_attempt_log (issue 30): a
               -- completion at the first claim, unless a DBA reopened that generation by hand
               -- (the trigger records it then) or the row already keeps one (a DBA reopened the
               -- run by hand: this end goes to the log).
               (q.kind = 'complete' AND h.status = 'running' AND q.generation = 1
                AND h.old_mark IS DISTINCT FROM q.generation
                AND h.completed_worker_id IS NULL) AS in_row,
               CASE q.kind
                   -- issue 34 item 2: an attempt timeout retries as retry does, unless the run's
                   -- own deadline has passed too, or is the one the holder stopped at (it comes
                   -- no later than the attempt's).
                   WHEN 'timeout' THEN CASE WHEN h.run_deadline_at <= _settle.at
                                              OR h.run_deadline_at <= coalesce(h.attempt_deadline_at,
                                                                               'infinity')
                                            THEN 'run_timed_out'
                                            WHEN h.attempts < h.max_attempts THEN 'timed_out'
                                            ELSE 'dead_lettered' END
                   WHEN 'run_timeout' THEN 'run_timed_out'
                   -- A run nobody holds, past its run deadline: pending (due or not) or waiting.
                   WHEN 'deadline' THEN CASE WHEN h.status IN ('pending', 'waiting') THEN 'run_timed_out' END
                   WHEN 'complete' THEN 'completed'
                   WHEN 'fail' THEN 'failed'
                   WHEN 'retry' THEN CASE WHEN h.attempts < h.max_attempts THEN 'retried'
                                          ELSE 'dead_lettered' END
                   WHEN 'cancel' THEN 'cancelled'
                   -- The first max_attempts hand-backs give the attempt back; one that finds no
                   -- attempt left after them dead-letters the run (no shutdown loop for ever).
                   WHEN 'hand_back' THEN CASE WHEN h.hand_backs >= h.max_attempts
                                                   AND h.attempts >= h.max_attempts
                                              THEN 'dead_lettered' ELSE 'handed_back' END
                   -- A running run keeps its holder with an expired lease (a running run without
                   -- a lease would be stranded); claim_orphaned recovers it.
                   WHEN 'release' THEN CASE WHEN h.status = 'running' THEN 'expired'
                                            ELSE 'released' END
                   WHEN 'expire' THEN 'expired'
                   -- A running run's pending cancel request wins over going to sleep or waiting.
                   WHEN 'sleep' THEN CASE WHEN h.status = 'running' AND h.cancel_requested_at IS NOT NULL
                                          THEN 'cancelled' ELSE 'slept' END
                   WHEN 'pause' THEN 'paused'
                   WHEN 'wait' THEN CASE WHEN h.status = 'running' AND h.cancel_requested_at IS NOT NULL
                                         THEN 'cancelled' ELSE 'waited' END
                   -- The takeover decision (zeroth._take_over's header), first match wins.
                   WHEN 'take_over' THEN CASE
                       WHEN h.cancel_action IS NOT NULL THEN 'takeover_cancelled'
                       WHEN h.status = 'pending' AND h.attempts + 1 >= h.max_attempts THEN 'claim_lapsed'
                       WHEN NOT h.resumable THEN CASE WHEN q.reason = 'orphan_recovered'
                                                      THEN 'orphan_recovered' ELSE 'takeover_failed' END
                       WHEN h.status = 'running' AND h.attempts >= h.max_attempts THEN 'recovery_exhausted'
                       ELSE 'takeover_requeued' END
                   WHEN 'unrecoverable' THEN 'recovery_failed'
                   -- An operator's cancel of a running run ends it only for its live holder
                   -- (cancelled) or past lease + grace (taken over): zeroth._cancel decides which.
                   WHEN 'revoke' THEN CASE WHEN h.status = 'running' AND h.lease_expires_at < _settle.at
                                           THEN 'takeover_cancelled' ELSE 'cancel_requested' END
                   -- An operator's clear_lease: as a release, whoever holds the lease.
                   WHEN 'clear' THEN CASE WHEN h.status = 'running' THEN 'expired' ELSE 'released' END
               END AS outcome
          FROM requested q
          JOIN held h ON h.run_id = q.run_id AND h.lease_generation = q.generation
                     -- The fence: the caller's live lease; for the ends of another's lease, the
                     -- holder the caller locked, lapsed (take_over, unrecoverable) or as it was.
                     AND CASE WHEN q.kind IN ('take_over', 'unrecoverable')
                              THEN h.lease_worker_id = _settle.worker_id AND h.lease_expires_at < _settle.at
                              WHEN q.kind IN ('revoke', 'clear')
                              THEN h.lease_worker_id IS NOT DISTINCT FROM _settle.worker_id
                              -- no live lease (none, or a lapsed claim's), the run deadline passed
                              WHEN q.kind = 'deadline'
                              THEN h.lease_worker_id IS NOT DISTINCT FROM _settle.worker_id
                                   AND coalesce(h.lease_expires_at < _settle.at, true)
                                   AND h.run_deadline_at <= _settle.at
                              ELSE h.lease_worker_id = _settle.worker_id AND h.lease_expires_at >= _settle.at END
    ), edges AS MATERIALIZED (
        SELECT d.*, t.to_status
          FROM decided d
          LEFT JOIN zeroth.run_transitions t
                 ON t.from_status = d.from_status AND t.outcome = d.outcome
    ), settled AS (
        UPDATE zeroth.runs r
           SET status = e.to_status,
               output = CASE WHEN e.outcome = 'completed' AND e.payload IS NOT NULL
                             THEN nullif(e.payload, 'null'::jsonb) ELSE r.output END,
               -- The error documents of the ends made by someone other than the run's owner
               -- (timeouts, a dead-lettering hand-back, takeovers, deadlines, revokes) are written
               -- by zeroth._settle_stop_error, reached only for those kinds: this statement's
               -- plan and executor start-up carry one call, not every document's expressions.
               error = CASE WHEN e.kind IN ('fail', 'retry') THEN e.payload
                            WHEN e.kind IN ('timeout', 'run_timeout', 'hand_back', 'take_over', 'deadline',
                                            'unrecoverable', 'revoke')
                            THEN zeroth._settle_stop_error(e.kind, e.outcome, e.reason, e.payload, r)
                            ELSE r.error END,
               run_after = CASE WHEN e.outcome IN ('retried', 'timed_out')
                               THEN zeroth._retry_backoff_at(_settle.at, r.deployment_ref, r.attempts,
                                                              _settle.retry_base_seconds,
                                                              _settle.retry_max_seconds)
                               WHEN e.outcome = 'slept' THEN e.run_after
                               ELSE r.run_after END,
               finished_at = CASE WHEN e.to_status IN ('completed', 'failed', 'cancelled') THEN _settle.at
                                  WHEN e.outcome IN ('retried', 'handed_back', 'slept', 'waited', 'timed_out',
                                                     'takeover_requeued')
                                  THEN NULL
                                  ELSE r.finished_at END,
               dead_lettered_at = CASE WHEN e.outcome IN ('dead_lettered', 'claim_lapsed', 'recovery_exhausted',
                                                          'recovery_failed') THEN _settle.at
                                       WHEN e.kind IN ('fail', 'retry', 'timeout', 'run_timeout', 'deadline')
                                       THEN NULL
                                       ELSE r.dead_lettered_at END,
               -- Waiting and sleeping are not failures: the attempt is given back.
               attempts = CASE WHEN e.outcome IN ('slept', 'paused', 'waited')
                                    OR (e.outcome = 'handed_back' AND r.hand_backs < r.max_attempts)
                               THEN greatest(r.attempts - 1, 0)
                               -- A lapsed claim never started counts its attempt when taken over.
                               WHEN e.kind = 'take_over' AND r.status = 'pending' THEN r.attempts + 1
                               WHEN e.kind = 'deadline' AND r.lease_worker_id IS NOT NULL
                               THEN r.attempts + 1
                               ELSE r.attempts END,
               hand_backs = CASE WHEN e.kind = 'hand_back' THEN r.hand_backs + 1 ELSE r.hand_backs END,
               wait_reason = CASE WHEN e.to_status = 'waiting' THEN e.reason
                                  WHEN e.kind IN ('wait', 'revoke', 'deadline') THEN NULL
                                  ELSE r.wait_reason END,
               thread_queued_at = CASE WHEN e.kind = 'revoke' THEN NULL ELSE r.thread_queued_at END,
               checkpoint_seq = CASE WHEN e.outcome = 'slept' AND e.payload IS NOT NULL
                                     THEN r.checkpoint_seq + 1 ELSE r.checkpoint_seq END,
               cancel_requested_at = CASE WHEN e.kind IN ('cancel', 'revoke')
                                          THEN coalesce(r.cancel_requested_at, _settle.at)
                                          ELSE r.cancel_requested_at END,
               cancel_action = CASE WHEN e.kind = 'cancel' THEN coalesce(r.cancel_action, 'cancel')
                                    WHEN e.kind = 'revoke' THEN coalesce(r.cancel_action, e.reason)
                                    ELSE r.cancel_action END,
               updated_at = _settle.at,
               -- The lease, cleared once for every kind; `expired` keeps the holder with a lapsed
               -- lease (and expire_recovery_lease the recovery checkpoint).
               lease_worker_id = CASE WHEN e.outcome = 'expired' THEN r.lease_worker_id END,
               lease_acquired_at = CASE WHEN e.outcome = 'expired' THEN r.lease_acquired_at END,
               lease_expires_at = CASE WHEN e.outcome = 'expired'
                                       THEN least(r.lease_expires_at, _settle.at - interval '1 microsecond') END,
               admission_slot = NULL,
               completed_worker_id = CASE WHEN e.in_row THEN r.lease_worker_id ELSE r.completed_worker_id END,
               completed_claimed_at = CASE WHEN e.in_row THEN r.lease_acquired_at ELSE r.completed_claimed_at END,
               recovery_checkpoint_id = CASE WHEN e.kind = 'expire' THEN r.recovery_checkpoint_id END,
               -- (no attempt ended: a lease expired in place, or a run with no holder revoked)
               attempt_recorded_generation = CASE WHEN e.outcome = 'expired' OR r.lease_worker_id IS NULL
                                                  THEN r.attempt_recorded_generation
                                                  ELSE r.lease_generation END
          FROM edges e
         WHERE r.ctid = ANY (_settle.run_rows)
           AND r.run_id = ANY (_settle.run_ids)  -- a key probe, never a walk of runs_pkey
           AND (r.tenant_id, r.workspace_key) IS NOT DISTINCT FROM
               (_settle.tenant_id, _settle.workspace_key)
           AND r.run_id = e.run_id
           AND e.to_status IS NOT NULL
           AND r.status = e.from_status
           AND r.lease_generation = e.generation
           AND CASE WHEN e.kind IN ('take_over', 'unrecoverable')
                    THEN r.lease_worker_id = _settle.worker_id AND r.lease_expires_at < _settle.at
                    WHEN e.kind IN ('revoke', 'clear')
                    THEN r.lease_worker_id IS NOT DISTINCT FROM _settle.worker_id
                    WHEN e.kind = 'deadline'
                    THEN r.lease_worker_id IS NOT DISTINCT FROM _settle.worker_id
                         AND coalesce(r.lease_expires_at < _settle.at, true)
                         AND r.run_deadline_at <= _settle.at
                    ELSE r.lease_worker_id = _settle.worker_id AND r.lease_expires_at >= _settle.at END
        RETURNING e.ord, e.run_id, e.generation, e.kind, e.outcome, e.from_status, e.attempts AS old_attempts,
                  e.lease_acquired_at AS old_acquired, e.started_at AS old_started, e.old_mark, e.old_expires, e.in_row,
                  r.tenant_id, r.workspace_key, r.status AS new_status, r.run_after, r.checkpoint_seq,
                  r.error, r.wait_reason, r.deployment_ref, r.workspace_id, r.dead_lettered_at,
                  -- The run event stream's last event (issue 34), for runs that ended: NULL for a
                  -- run that emitted nothing (one probe of run_events_pkey; read_run_events makes
                  -- its END from its status), else its END is numbered after it, under the run
                  -- row lock this call holds, as append_run_event numbers.
                  CASE WHEN r.status IN ('completed', 'failed', 'cancelled')
                       THEN (SELECT max(ev.event_id) FROM zeroth.run_events ev
                              WHERE ev.tenant_id = r.tenant_id AND ev.workspace_key = r.workspace_key
                                AND ev.run_id = r.run_id) END AS last_event_id,
                  -- The ended attempt goes to run_attempt_log (zeroth._record_attempt's rules for
                  -- the same ends), unless it is an `expired` (no attempt ended), a revoked run that
                  -- had no holder, a generation already marked recorded (a DBA reopened it by
                  -- hand: the trigger records this end, its WHEN sees the mark was not set by this
                  -- update) or an attempt kept in the runs row.
                  (e.outcome <> 'expired' AND _settle.worker_id IS NOT NULL
                   AND e.old_mark IS DISTINCT FROM e.generation AND NOT e.in_row) AS logged,
                  -- and its outcome there:
                  CASE WHEN e.kind IN ('timeout', 'run_timeout') THEN 'timed_out'
                       -- the lapsed claim (never started) a deadline end closes
                       WHEN e.kind = 'deadline' THEN 'expired'
                       WHEN e.outcome = 'retried' THEN 'failed'
                       WHEN e.outcome IN ('paused', 'waited')
                       THEN CASE WHEN r.wait_reason LIKE 'event:%' OR r.wait_reason LIKE 'children:%'
                                 THEN 'waited' ELSE 'paused' END
                       -- The ends of another's lease, labelled as the trigger labels them.
                       WHEN e.outcome IN ('takeover_cancelled', 'cancel_requested') THEN 'cancelled'
                       WHEN e.outcome IN ('claim_lapsed', 'recovery_exhausted', 'recovery_failed')
                       THEN 'dead_lettered'
                       WHEN e.outcome IN ('takeover_requeued', 'takeover_failed', 'orphan_recovered')
                       THEN CASE WHEN e.from_status = 'running' THEN 'recovered' ELSE 'expired' END
                       -- clear_lease of a claim whose lease had already lapsed
                       WHEN e.outcome = 'released' AND e.old_expires < _settle.at THEN 'expired'
                       ELSE e.outcome END AS logged_outcome
    )
    SELECT array_agg(q.ord ORDER BY q.ord),
           array_agg(s.outcome ORDER BY q.ord),
           array_agg(e.from_status ORDER BY q.ord),
           array_agg(s.new_status ORDER BY q.ord),
           array_agg(s.run_after ORDER BY q.ord),
           array_agg(s.checkpoint_seq ORDER BY q.ord),
           array_agg(CASE WHEN s.ord IS NOT NULL THEN NULL
                          WHEN e.ord IS NOT NULL AND e.to_status IS NULL THEN 'ZP012'
                          ELSE 'ZP002' END ORDER BY q.ord),
           coalesce(array_agg(DISTINCT s.deployment_ref)
                        FILTER (WHERE (s.new_status = 'pending' AND s.run_after <= _settle.at)
                                   OR s.kind IN ('release', 'expire', 'hand_back', 'take_over',
                                                 'unrecoverable', 'clear')), '{}'),
           min(s.workspace_id),
           -- The ended attempts to log: its number is runs.attempts when running (else the one a
           -- start would have counted), it started at the later of its start and its claim.
           array_agg(s.run_id) FILTER (WHERE s.logged),
           array_agg(CASE WHEN s.from_status = 'running' THEN s.old_attempts ELSE s.old_attempts + 1 END)
               FILTER (WHERE s.logged),
           array_agg(s.generation) FILTER (WHERE s.logged),
           array_agg(s.old_acquired) FILTER (WHERE s.logged),
           array_agg(CASE WHEN s.from_status = 'running' THEN greatest(s.old_started, s.old_acquired) END)
               FILTER (WHERE s.logged),
           array_agg(s.logged_outcome) FILTER (WHERE s.logged),
           array_agg(CASE WHEN s.logged_outcome IN ('failed', 'dead_lettered', 'timed_out')
                            OR s.new_status = 'failed'
                          THEN s.error END) FILTER (WHERE s.logged),
           -- The END rows: numbered after the stream's last event, with the outcome as
           -- read_run_events states it for an END it makes (status, or dead_lettered): one
           -- vocabulary whether the run emitted events or not, never the settle path's internal
           -- outcome names (recovery_exhausted, claim_lapsed…).
           array_agg(s.run_id) FILTER (WHERE s.last_event_id IS NOT NULL),
           array_agg(s.last_event_id + 1) FILTER (WHERE s.last_event_id IS NOT NULL),
           array_agg(jsonb_build_object('status', s.new_status,
                                        'outcome', CASE WHEN s.dead_lettered_at IS NOT NULL THEN 'dead_lettered'
                                                        ELSE s.new_status::text END))
               FILTER (WHERE s.last_event_id IS NOT NULL),
           array_agg(s.generation) FILTER (WHERE s.last_event_id IS NOT NULL),
           -- The settled runs, each once, and the generation whose slots they free (NULL: every
           -- slot naming the run, for revoke and clear, as the operator's calls always did).
           array_agg(s.run_id) FILTER (WHERE s.ord IS NOT NULL),
           array_agg(CASE WHEN s.kind NOT IN ('revoke', 'clear') THEN s.generation END)
               FILTER (WHERE s.ord IS NOT NULL)
      INTO v_ord, v_outcome, v_from, v_to, v_after, v_seq, v_state, v_deps, v_ws,
           v_log_runs, v_log_attempts, v_log_generations, v_log_claimed, v_log_started, v_log_outcomes,
           v_log_errors, v_end_runs, v_end_ids, v_end_data, v_end_generations,
           v_settled_runs, v_settled_slot_generations
      FROM requested q
      LEFT JOIN edges e ON e.ord = q.ord
      LEFT JOIN settled s ON s.ord = q.ord;

    -- What the settle statement left to statements of their own, each only when it has rows, so
    -- that the most frequent end (a completion at the first claim, no admission slot, no events)
    -- plans and starts up none of them (issue 30). Under the row locks this call holds, in the
    -- same transaction: one outcome either way.
    IF v_log_runs IS NOT NULL THEN
        INSERT INTO zeroth.run_attempt_log (tenant_id, workspace_key, run_id, attempt, lease_generation,
                                            worker_id, claimed_at, started_at, ended_at, outcome, error)
        SELECT _settle.tenant_id, _settle.workspace_key, a.run_id, a.attempt, a.generation,
               _settle.worker_id, a.claimed_at, a.started_at, _settle.at, a.outcome, a.error
          FROM unnest(v_log_runs, v_log_attempts, v_log_generations, v_log_claimed, v_log_started,
                      v_log_outcomes, v_log_errors)
               AS a(run_id, attempt, generation, claimed_at, started_at, outcome, error);
    END IF;
    -- The slots of the settled runs freed; each freed slot's deployment is woken below.
    IF cardinality(_settle.slot_rows) > 0 THEN
        -- By address (a TID scan, the one plan whatever the statistics), each slot's run found in
        -- the settled runs by array_position: no join and no run_id condition that a plan could
        -- serve from admission_slots_run_idx (a cached plan walked every occupied slot of the
        -- database through it).
        WITH freed AS (
            UPDATE zeroth.admission_slots sl
               SET run_id = NULL, lease_generation = NULL
             WHERE sl.ctid = ANY (_settle.slot_rows)
               AND array_position(v_settled_runs, sl.run_id) IS NOT NULL
               AND sl.lease_generation IS NOT DISTINCT FROM coalesce(
                       v_settled_slot_generations[array_position(v_settled_runs, sl.run_id)],
                       sl.lease_generation)
            RETURNING sl.deployment_ref
        )
        SELECT coalesce(array_agg(DISTINCT x.deployment_ref), '{}') INTO v_deps
          FROM (SELECT u.deployment_ref FROM unnest(v_deps) AS u(deployment_ref)
                UNION ALL
                SELECT f.deployment_ref FROM freed f) x;
    END IF;
    -- The END of the streams of the runs that ended and have events (issue 34).
    IF v_end_runs IS NOT NULL THEN
        INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id, kind, name, data,
                                       lease_generation, created_at)
        SELECT _settle.tenant_id, _settle.workspace_key, x.run_id, x.event_id, 'end', 'end', x.data,
               x.generation, _settle.at
          FROM unnest(v_end_runs, v_end_ids, v_end_data, v_end_generations)
               AS x(run_id, event_id, data, generation);
    END IF;

    -- Most ends free nothing a waiting worker could take (a failure, a cancel without a slot):
    -- no statement then.
    IF cardinality(v_deps) > 0 THEN
        PERFORM zeroth._notify_wakeup(d.deployment_ref, _settle.tenant_id, v_ws)
           FROM unnest(v_deps) AS d(deployment_ref);
    END IF;
    -- Subscribers of the streams that got their END (none for runs that emitted nothing: no
    -- statement then, the IF is a plain expression).
    IF v_end_runs IS NOT NULL THEN
        PERFORM zeroth._notify_run_events(_settle.tenant_id, _settle.workspace_key, x.run_id)
           FROM unnest(v_end_runs) AS x(run_id);
    END IF;

    RETURN QUERY
    SELECT u.ord, _settle.run_ids[u.ord], u.outcome, u.from_status, u.to_status, u.run_after,
           u.checkpoint_seq, u.sqlstate
      FROM unnest(v_ord, v_outcome, v_from, v_to, v_after, v_seq, v_state)
           AS u(ord, outcome, from_status, to_status, run_after, checkpoint_seq, sqlstate)
     ORDER BY u.ord;
END
$$;
COMMENT ON FUNCTION zeroth._settle(text, text, text, uuid[], bigint[], text[], jsonb[], timestamptz[], text[], double precision, double precision, tid[], tid[], timestamptz) IS 'Internal: the one settle path. Settles the runs the caller locked (zeroth._lock_settle) to their outcomes in one statement — the edge looked up in zeroth.run_transitions, the fence in the UPDATE''s predicate, the lease cleared — then frees the slots, writes the ended attempts to run_attempt_log and the END of event streams (each only when there are rows), and notifies zeroth_wakeup once per deployment. One row per requested run: outcome (NULL refused), from/to status, run_after, checkpoint_seq, sqlstate (NULL settled, ZP002 fenced out, ZP012 edge not listed).';
ALTER FUNCTION zeroth._settle(text, text, text, uuid[], bigint[], text[], jsonb[], timestamptz[], text[], double precision, double precision, tid[], tid[], timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._settle(text, text, text, uuid[], bigint[], text[], jsonb[], timestamptz[], text[], double precision, double precision, tid[], tid[], timestamptz) FROM PUBLIC;

-- Raises ZP003 for a single-run wrapper whose settle found the caller's live lease on a run whose
-- status has no such edge (settle reported ZP012): a status the call does not end (a claim not
-- started), or an edge a DBA removed from zeroth.run_transitions — never reported as a lost lease
-- nor as an outcome that did not happen. Quiet otherwise (fenced out: a return value).
CREATE OR REPLACE FUNCTION zeroth._raise_unlisted_edge(transition text, run_id uuid,
                                                       status zeroth.run_status, sqlstate text)
    RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF _raise_unlisted_edge.sqlstate = 'ZP012' THEN
        RAISE EXCEPTION '% cannot end run % from status %: no such edge in zeroth.run_transitions',
            transition, run_id, status
            USING ERRCODE = 'ZP003';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._raise_unlisted_edge(text, uuid, zeroth.run_status, text) IS 'Internal: ZP003 when a single-run settle reported ZP012 (the caller holds the live lease, but the run''s status has no such edge); quiet otherwise.';
ALTER FUNCTION zeroth._raise_unlisted_edge(text, uuid, zeroth.run_status, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._raise_unlisted_edge(text, uuid, zeroth.run_status, text) FROM PUBLIC;

-- The single-run form of the settle path: check the fence's arguments (ZP008), lock
-- (zeroth._lock_settle), read the clock (or use `at`, a time the caller read after its own lock
-- of the same rows) and settle run_id under generation with `kind` (zeroth._settle). Returns the
-- settle's row.
CREATE OR REPLACE FUNCTION zeroth._settle_one(
    tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, kind text,
    payload jsonb DEFAULT NULL, run_after timestamptz DEFAULT NULL, reason text DEFAULT NULL,
    retry_base_seconds double precision DEFAULT NULL, retry_max_seconds double precision DEFAULT NULL,
    at timestamptz DEFAULT NULL,
    OUT outcome text, OUT from_status zeroth.run_status, OUT to_status zeroth.run_status,
    OUT settled_run_after timestamptz, OUT checkpoint_seq bigint, OUT sqlstate text)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_lock record;
BEGIN
    PERFORM zeroth._require_fence(_settle_one.run_id, _settle_one.worker_id, _settle_one.generation);
    v_lock := zeroth._lock_settle(_settle_one.tenant_id, _settle_one.workspace_key, _settle_one.worker_id,
                                  ARRAY[_settle_one.run_id], ARRAY[_settle_one.generation]);
    SELECT s.outcome, s.from_status, s.to_status, s.run_after, s.checkpoint_seq, s.sqlstate
      INTO outcome, from_status, to_status, settled_run_after, checkpoint_seq, sqlstate
      FROM zeroth._settle(_settle_one.tenant_id, _settle_one.workspace_key, _settle_one.worker_id,
                          ARRAY[_settle_one.run_id], ARRAY[_settle_one.generation], ARRAY[_settle_one.kind],
                          ARRAY[_settle_one.payload], ARRAY[_settle_one.run_after], ARRAY[_settle_one.reason],
                          _settle_one.retry_base_seconds, _settle_one.retry_max_seconds,
                          v_lock.run_rows, v_lock.slot_rows, coalesce(_settle_one.at, zeroth._now())) s;
END
$$;
COMMENT ON FUNCTION zeroth._settle_one(text, text, uuid, text, bigint, text, jsonb, timestamptz, text, double precision, double precision, timestamptz) IS 'Internal: the settle path for one run: check run_id, worker_id, generation (ZP008), lock (zeroth._lock_settle), settle with kind (zeroth._settle) at the clock read after the lock (or `at`); returns the settle''s row.';
ALTER FUNCTION zeroth._settle_one(text, text, uuid, text, bigint, text, jsonb, timestamptz, text, double precision, double precision, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._settle_one(text, text, uuid, text, bigint, text, jsonb, timestamptz, text, double precision, double precision, timestamptz) FROM PUBLIC;
