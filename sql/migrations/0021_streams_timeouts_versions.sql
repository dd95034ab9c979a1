-- 0021_streams_timeouts_versions: state changes for the work of the session of 2026-12-05
-- (night): a run event stream, attempt and run timeouts, and code versions (issue 34), the
-- settle path's last lease resets and the per-run cost of the hot path (issues 33, 30), and the
-- test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: settle path and per-run cost (issues 33, 30) =====
-- Issue 33, the last lease resets outside the settle path: a takeover (claim_for_takeover,
-- reconcile_thread_runs, claim_orphaned and the claims that end a spent lapsed claim), the end of
-- a run whose recovery raised, and an operator's cancel now end through zeroth._settle, which
-- settles only listed edges. The edges they took from pending (a lapsed claim never started) and
-- the dead-lettering of an unrecoverable run were not listed yet.
INSERT INTO zeroth.run_transitions (edge_no, from_status, outcome, to_status, label) VALUES
    (38, 'pending', 'takeover_requeued', 'pending', 'claim_for_takeover / reconcile_thread_runs, a resumable claim that lapsed before start_run (requeued, its attempt counted)'),
    (39, 'pending', 'takeover_failed', 'failed', 'claim_for_takeover / reconcile_thread_runs with a stop reason other than orphan_recovered, a claim not resumable that lapsed before start_run (stop reason in error)'),
    (40, 'pending', 'orphan_recovered', 'failed', 'claim_orphaned / claim_for_takeover with stop reason orphan_recovered (its default), a claim not resumable that lapsed before start_run'),
    (41, 'pending', 'takeover_cancelled', 'cancelled', 'claim_for_takeover of a lapsed claim with a cancel action set'),
    (42, 'pending', 'recovery_failed', 'failed', 'the takeover of a lapsed claim raised (dead-lettered, recovery_failed)'),
    (43, 'running', 'recovery_failed', 'failed', 'the takeover of an orphan raised (dead-lettered, recovery_failed)');

-- ===== section: run event stream (issue 34, item 1) =====
--
-- zeroth.run_events: a run's event stream (append_run_event, read_run_events). Numbered per run
-- 1, 2, 3… under the run's row lock (no gap a reader could skip); kind 'end' is the END that
-- zeroth._settle writes when a run that has events ends. Deleted with the run (ON DELETE CASCADE,
-- as run_steps: prune_runs and a DBA's DELETE). zeroth_reader reads its tenant's rows.
CREATE TABLE zeroth.run_events (
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    run_id           uuid        NOT NULL,
    event_id         bigint      NOT NULL,
    kind             text        NOT NULL,
    name             text        NOT NULL,
    data             jsonb       NOT NULL,
    lease_generation bigint      NOT NULL,
    created_at       timestamptz NOT NULL,
    CONSTRAINT run_events_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, event_id),
    CONSTRAINT run_events_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE,
    CONSTRAINT run_events_event_id_valid CHECK (event_id >= 1),
    CONSTRAINT run_events_kind_valid CHECK (kind IN ('event', 'end')),
    CONSTRAINT run_events_name_valid CHECK (name <> '' AND length(name) <= 200)
);
COMMENT ON TABLE zeroth.run_events IS 'A run''s event stream: events numbered 1, 2, 3… per run in commit order (append_run_event, by the live lease holder of a running run, under the run''s row lock), each with its name, a bounded JSON payload, the lease generation that wrote it and the database time; kind ''end'' is the END written by the settle path (zeroth._settle) when a run that has events ends. read_run_events reads it (and says END for a run ended with no END row). Deleted with the run. zeroth_reader reads the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.run_events.kind IS 'event (append_run_event) | end (the run ended: data holds its status and outcome).';
ALTER TABLE zeroth.run_events OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_events ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.run_events FROM PUBLIC;
CREATE POLICY run_events_reader_tenant ON zeroth.run_events FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY run_events_reader_tenant ON zeroth.run_events IS 'zeroth_reader sees the run events of the tenant named in the setting zeroth.tenant_id (none when unset).';
GRANT SELECT ON zeroth.run_events TO zeroth_reader;

-- ===== section: attempt and run timeouts (issue 34, item 2) =====
-- Issue 34 item 2: a run that runs too long is stopped by the database (River JobTimeout, Oban
-- timeout/1, Temporal start-to-close / schedule-to-close). Two bounds, each nullable (NULL: no
-- bound, and a run without one costs what it cost before: a NULL column is its null bit):
--   * attempt_timeout_seconds: an attempt's wall time, from its claim to its end.
--   * run_timeout_seconds: a run's total time, from its first claim to its end, across retries,
--     sleeps and waits: ended by the claim that meets it pending or the sweep that meets it
--     running past it; a run that is waiting (paused, or for an event or its children) is ended
--     only once it is pending again.
-- A deployment's defaults live in the registry beside its retry policy and lease (0020), read by
-- the claims in the same primary-key probe that reads the lease and bound by the same rule
-- (zeroth._policy_binds_caller). A run may carry its own (enqueue_run / enqueue_runs), which wins.
-- The claim fixes the deadlines on the run (attempt_deadline_at: each claim; run_deadline_at: the
-- first) and caps the lease at them; renew_lease / renew_leases never extend a lease past them
-- (ZP013 once passed). Only the functions write these columns: zeroth_worker has no UPDATE on
-- zeroth.runs, so no session moves a deadline but the owner's (a DBA's UPDATE, redrive_run).
ALTER TABLE zeroth.deployments
    ADD COLUMN attempt_timeout_seconds double precision,
    ADD COLUMN run_timeout_seconds     double precision,
    ADD CONSTRAINT deployments_timeouts_valid CHECK (
        (attempt_timeout_seconds IS NULL OR (attempt_timeout_seconds >= 1 AND attempt_timeout_seconds <= 86400 * 30))
        AND (run_timeout_seconds IS NULL OR (run_timeout_seconds >= 1 AND run_timeout_seconds <= 86400 * 365)));
COMMENT ON COLUMN zeroth.deployments.attempt_timeout_seconds IS 'Bound on an attempt''s wall time (1 <= s <= 30 days) for the runs of the deployment that carry none: the claim sets runs.attempt_deadline_at = claim time + s and caps the lease there; past it the attempt is ended as timed out (retried or dead-lettered by the retry policy). NULL: not set (no bound). Read at each claim, in the probe that reads lease_seconds; binds as the lease does (zeroth._policy_binds_caller).';
COMMENT ON COLUMN zeroth.deployments.run_timeout_seconds IS 'Bound on a run''s total time (1 <= s <= 365 days) from its first claim, for the runs of the deployment that carry none: the first claim sets runs.run_deadline_at; past it the run is failed for good (stop_reason run_timeout) and a pending one is never started. NULL: not set (no bound). Read at each claim; binds as the lease does.';
ALTER TYPE zeroth.deployment_registration
    ADD ATTRIBUTE attempt_timeout_seconds double precision,
    ADD ATTRIBUTE run_timeout_seconds     double precision;
COMMENT ON TYPE zeroth.deployment_registration IS 'The result of register_deployment / set_deployment_defaults: outcome (created, updated, unchanged, kept) and the deployment''s defaults as they now are (retry_base_seconds, retry_max_seconds, lease_seconds, attempt_timeout_seconds, run_timeout_seconds NULL: not set); previous: the values an update replaced, else NULL.';
COMMENT ON COLUMN zeroth.deployment_changes.old_values IS 'The defaults before the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020; attempt_timeout_seconds, run_timeout_seconds: since 0021; each only when set); NULL when the change created the row.';
COMMENT ON COLUMN zeroth.deployment_changes.new_values IS 'The defaults after the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020; attempt_timeout_seconds, run_timeout_seconds: since 0021; each only when set).';

-- A run's own timeouts are whole seconds (integer): the row of zeroth.runs stays as narrow as it
-- can. Its estimated width is what a plan made before the first ANALYZE counts rows by, and a
-- fourth 8-byte column tipped the runs page's plan to a sequential scan
-- (tests/plans/test_hot_path_indexes.py).
ALTER TABLE zeroth.runs
    ADD COLUMN attempt_timeout_seconds integer,
    ADD COLUMN run_timeout_seconds     integer,
    ADD COLUMN attempt_deadline_at     timestamptz,
    ADD COLUMN run_deadline_at         timestamptz,
    ADD CONSTRAINT runs_timeouts_valid CHECK (
        (attempt_timeout_seconds IS NULL OR (attempt_timeout_seconds >= 1 AND attempt_timeout_seconds <= 86400 * 30))
        AND (run_timeout_seconds IS NULL OR (run_timeout_seconds >= 1 AND run_timeout_seconds <= 86400 * 365)));
COMMENT ON COLUMN zeroth.runs.attempt_timeout_seconds IS 'This run''s own bound (whole seconds, 1 to 30 days) on an attempt''s wall time (enqueue_run / enqueue_runs), over the deployment''s; NULL: the deployment''s (zeroth.deployments.attempt_timeout_seconds), if any.';
COMMENT ON COLUMN zeroth.runs.run_timeout_seconds IS 'This run''s own bound (whole seconds, 1 to 365 days) on its total time from its first claim (enqueue_run / enqueue_runs), over the deployment''s; NULL: the deployment''s, if any.';
COMMENT ON COLUMN zeroth.runs.attempt_deadline_at IS 'The current (or last) attempt''s deadline on the database clock, fixed by the claim that leased it (claim time + the attempt timeout); the lease never runs past it. NULL: no bound.';
COMMENT ON COLUMN zeroth.runs.run_deadline_at IS 'The run''s deadline on the database clock, fixed by its first claim (claim time + the run timeout) and kept by every later one; past it the run is failed for good (stop_reason run_timeout). NULL: no bound. redrive_run clears it.';

-- The claim's answer carries the deadline the worker stops its handler at (the earlier of the
-- attempt's and the run's; NULL: none) and the seconds from the claim's database time to it
-- (deadline_in: a worker measures it on its own monotonic clock, whatever its wall clock says);
-- the renewal's answer says why a renewal was refused.
ALTER TYPE zeroth.claimed_run
    ADD ATTRIBUTE deadline_at timestamptz,
    ADD ATTRIBUTE deadline_in double precision;
ALTER TYPE zeroth.scope_claimed_run
    ADD ATTRIBUTE deadline_at timestamptz,
    ADD ATTRIBUTE deadline_in double precision;
ALTER TYPE zeroth.lease_renewal ADD ATTRIBUTE sqlstate text;
-- An enqueue_runs item may carry the run's own timeouts.
ALTER TYPE zeroth.enqueue_item
    ADD ATTRIBUTE attempt_timeout_seconds integer,
    ADD ATTRIBUTE run_timeout_seconds     integer;
COMMENT ON TYPE zeroth.lease_renewal IS 'Result row of renew_leases: one per requested (run_id, generation); sqlstate ZP013 when the lease was not renewed because the attempt''s or the run''s deadline passed (since 0021), else NULL.';

-- An attempt ended by its deadline is recorded as such in the attempt history.
ALTER TABLE zeroth.run_attempts
    DROP CONSTRAINT run_attempts_outcome_valid,
    ADD CONSTRAINT run_attempts_outcome_valid CHECK (outcome = ANY (ARRAY['completed', 'failed', 'dead_lettered', 'cancelled', 'recovered', 'expired', 'lease_lost', 'handed_back', 'released', 'slept', 'paused', 'waited', 'timed_out']));
COMMENT ON COLUMN zeroth.run_attempts.outcome IS 'How the attempt ended (rows here are ended attempts; NULL only in zeroth.attempt_history''s open rows). completed | failed (error) | dead_lettered (error) | cancelled | recovered (its lease expired and another worker or a takeover took the run) | expired (claimed, never started, the lease lapsed) | lease_lost (lease taken or cleared outside the functions'' rules: clear_lease, a DBA) | handed_back | released | slept | paused | waited | timed_out (its attempt or run deadline passed; error: stop_reason attempt_timeout or run_timeout).';

-- The timeout ends as edges of the state machine (zeroth._settle kinds timeout, run_timeout).
INSERT INTO zeroth.run_transitions (edge_no, from_status, outcome, to_status, label) VALUES
    (44, 'running', 'timed_out', 'pending', 'the attempt''s deadline passed, attempts < max_attempts: settle_runs / fail_run kind timeout by the holder, or claim_orphaned after the lease lapsed at the deadline (settled, run_after = backoff, stop_reason attempt_timeout); with no attempt left: dead_lettered'),
    (45, 'running', 'run_timed_out', 'failed', 'the run''s deadline passed: the holder''s settle of kind timeout, or claim_orphaned (settled, stop_reason run_timeout, not retried)'),
    (46, 'pending', 'run_timed_out', 'failed', 'a claim finds a pending run past its run deadline: never started (stop_reason run_timeout)');

-- register_deployment and set_deployment_defaults take the two timeouts (trailing, DEFAULT NULL:
-- every call that worked before works the same); their files create the new signatures, and the
-- old ones would stay beside them and make calls ambiguous, so they go here (IF EXISTS: a fresh
-- install creates the functions after the migrations). enqueue_run likewise takes the per-run
-- override.
DROP FUNCTION IF EXISTS zeroth.register_deployment(text, integer, integer, double precision, double precision, double precision);
DROP FUNCTION IF EXISTS zeroth.set_deployment_defaults(text, integer, integer, text, double precision, double precision, double precision, text[]);
DROP FUNCTION IF EXISTS zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, jsonb, uuid, text);
-- The claims' internal helpers take the deployment's timeouts (trailing, DEFAULT NULL).
DROP FUNCTION IF EXISTS zeroth._lease_locked_runs(text, text, uuid[], tid[], integer[], text, timestamptz, interval, integer, integer, boolean);
DROP FUNCTION IF EXISTS zeroth._claim_in_scope(text, text, text, text, integer, text, integer, timestamptz, interval, boolean);


-- ===== section: code versions (issue 34, item 3) =====
--
-- A run records the version of the code that started it (runs.code_version_id: a 64-bit key of
-- the string the claiming worker declares, the first 8 bytes of its sha256; its text in
-- zeroth.code_versions; NULL: unversioned, as every run before this migration). A deployment
-- chooses which versions may resume a started run (deployments.version_policy: any, the default
-- and the behaviour before; same; compatible, with compatible_versions), set only by a DBA's
-- zeroth.set_version_policy; zeroth.retire_code_version moves the runs pinned to a version no
-- worker serves any more to another version, or fails them. Both are audited in
-- zeroth.code_version_changes.
-- A bigint on the run, not the text: a NULL column costs a run nothing (the null bitmap keeps its
-- size up to 72 columns), but the planner sizes a never-analyzed table's rows by the average
-- width of every column's type, and a text column (32 bytes) made the dashboard's runs page with
-- a status filter plan a sequential scan of zeroth.runs before its first ANALYZE
-- (tests/plans/test_hot_path_indexes.py); a bigint (8) does not. A key computed from the text,
-- not a serial id: a claim never waits for another transaction that is inserting the same new
-- version (a unique constraint would make it wait for that transaction's end), so
-- zeroth.code_versions has no unique constraint, and two first claims of a version at once may
-- both write its (identical) row.
CREATE TABLE zeroth.code_versions (
    version_id    bigint NOT NULL,
    code_version  text NOT NULL,
    first_seen_at timestamptz NOT NULL,
    CONSTRAINT code_versions_valid CHECK (
        length(code_version) <= 128 AND code_version ~ '^[A-Za-z0-9][A-Za-z0-9._+:/-]*$')
);
CREATE INDEX code_versions_version_id_idx ON zeroth.code_versions (version_id);
COMMENT ON TABLE zeroth.code_versions IS 'The text of every code version a worker declared in a claim (or an operator named in retire_code_version): version_id is the first 8 bytes of sha256(code_version) (zeroth._code_version_hash), the key runs.code_version_id holds. No unique constraint, so that no claim waits on another''s insert: a version first seen by two claims at once may have two identical rows. Written only by the functions; names no tenant: zeroth_reader reads every row.';
ALTER TABLE zeroth.code_versions OWNER TO zeroth_owner;
ALTER TABLE zeroth.code_versions ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.code_versions FROM PUBLIC;
GRANT SELECT ON zeroth.code_versions TO zeroth_reader;
CREATE POLICY code_versions_reader_all ON zeroth.code_versions FOR SELECT TO zeroth_reader
    USING (true);
COMMENT ON POLICY code_versions_reader_all ON zeroth.code_versions IS 'zeroth_reader sees every version: a label of code, it names no tenant.';
ALTER TABLE zeroth.runs ADD COLUMN code_version_id bigint;
COMMENT ON COLUMN zeroth.runs.code_version_id IS 'The code version of the worker that started the run, as its key (zeroth._code_version_hash; the text in zeroth.code_versions): the claim''s code_version, written by every lease of a run not yet started and kept once it started; NULL: started by an unversioned worker, or not started. Under its deployment''s version_policy (zeroth.deployments) only a worker of a version allowed to serve it resumes a started run; zeroth.retire_code_version moves it.';
ALTER TABLE zeroth.deployments
    ADD COLUMN version_policy text NOT NULL DEFAULT 'any',
    ADD COLUMN compatible_versions text[],
    ADD CONSTRAINT deployments_version_policy_valid CHECK (
        version_policy IN ('any', 'same', 'compatible')
        AND (compatible_versions IS NULL) = (version_policy <> 'compatible'));
COMMENT ON COLUMN zeroth.deployments.version_policy IS 'Which code versions may resume a started run of the deployment (a run never started is claimable by every version): any (the default: every version), same (only the version that started it: runs.code_version_id), compatible (the same version, or any two versions both in compatible_versions). A run with no recorded version is resumed by every version. Set only by zeroth.set_version_policy (a DBA), so it binds every session.';
COMMENT ON COLUMN zeroth.deployments.compatible_versions IS 'version_policy compatible: the set of code versions that may resume each other''s runs; NULL under any other policy.';

CREATE TABLE zeroth.code_version_changes (
    change_id           bigint GENERATED ALWAYS AS IDENTITY,
    deployment_ref      text NOT NULL,
    changed_at          timestamptz NOT NULL,
    changed_by          text NOT NULL,
    acting_role         text,
    action              text NOT NULL,
    version_policy      text,
    compatible_versions text[],
    code_version        text,
    to_version          text,
    run_count           integer,
    message             text,
    CONSTRAINT code_version_changes_pkey PRIMARY KEY (change_id),
    CONSTRAINT code_version_changes_action_valid CHECK (action IN ('set_policy', 'move', 'fail'))
);
COMMENT ON TABLE zeroth.code_version_changes IS 'The audit log of code versions: each zeroth.set_version_policy that changed a deployment''s version_policy (action set_policy: the new policy and set) and each zeroth.retire_code_version (action move: the runs pinned to code_version moved to to_version; fail: ended with stop_reason code_version_retired; run_count: how many), with the database time and who (changed_by: session_user; acting_role: the SET ROLE in force). Names no tenant: zeroth_reader reads every row. Nothing deletes rows but a DBA.';
ALTER TABLE zeroth.code_version_changes OWNER TO zeroth_owner;
ALTER TABLE zeroth.code_version_changes ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.code_version_changes FROM PUBLIC;
GRANT SELECT ON zeroth.code_version_changes TO zeroth_reader;
CREATE POLICY code_version_changes_reader_all ON zeroth.code_version_changes FOR SELECT TO zeroth_reader
    USING (true);
COMMENT ON POLICY code_version_changes_reader_all ON zeroth.code_version_changes IS 'zeroth_reader sees every change: a deployment is global and the log names no tenant.';

-- The active runs that carry a version: what zeroth.pinned_runs counts and
-- zeroth.retire_code_version moves, without reading the whole table. Partial: a run of an
-- unversioned worker (code_version_id NULL) never enters it, so it costs the default path nothing.
CREATE INDEX runs_code_version_active_idx ON zeroth.runs (deployment_ref, code_version_id)
    WHERE code_version_id IS NOT NULL AND status IN ('pending', 'running', 'waiting');
COMMENT ON INDEX zeroth.runs_code_version_active_idx IS 'The active runs of a deployment by code version (zeroth.pinned_runs, zeroth.retire_code_version). Runs without a version are not in it.';

-- The one edge code versions add to the state machine (docs/state-machine.md's diagram is drawn
-- from zeroth.run_transitions): retire_code_version's fail of a pending run. Not a settle outcome
-- (no worker asks for it: zeroth._settle never looks it up); numbered 60, apart from the edges
-- other sections of this migration may add after 37.
INSERT INTO zeroth.run_transitions (edge_no, from_status, outcome, to_status, label) VALUES
    (60, 'pending', 'version_retired', 'failed', 'retire_code_version fail (admin: a code version no worker serves; dead-lettered, code_version_retired)');

-- The claims take an optional code_version (their last argument). The function files create the
-- new signatures; the old ones would stay beside them and make every call that names the old
-- arguments ambiguous, so they go here (IF EXISTS: a fresh install creates the functions after
-- the migrations). A caller in any language that passes no code_version calls the new ones.
DROP FUNCTION IF EXISTS zeroth.claim_pending(text, text, text, text, integer, integer, double precision);
DROP FUNCTION IF EXISTS zeroth.claim_and_start(text, text, text, text, integer, integer, double precision);
DROP FUNCTION IF EXISTS zeroth.claim_and_start_scopes(text[], text, text[], text[], integer, integer, double precision);
DROP FUNCTION IF EXISTS zeroth.claim_orphaned(text, text, text, text, integer, integer, double precision, double precision);
DROP FUNCTION IF EXISTS zeroth.claim_orphaned_scopes(text[], text, text[], text[], integer, integer, double precision, double precision);
DROP FUNCTION IF EXISTS zeroth.complete_and_claim(text, text, uuid[], bigint[], jsonb[], text, text, integer, integer, double precision);
-- An internal LANGUAGE sql helper whose body names zeroth._claim_orphaned's old signature (which
-- claim_orphaned.sql drops): it goes first, and claim_orphaned_scopes.sql creates it again.
DROP FUNCTION IF EXISTS zeroth._claim_orphaned_rows(text, text, text, text, integer, integer, double precision, double precision, boolean);


-- ===== section: test suite (issue 32) =====
--
--
--
