-- 0021_streams_timeouts_versions: state changes for the work of the session of 2026-12-05
-- (night): a run event stream, attempt and run timeouts, and code versions (issue 34), the
-- settle path's last lease resets and the per-run cost of the hot path (issues 33, 30), and the
-- test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: settle path and per-run cost (issues 33, 30) =====
--
--
--

-- ===== section: run event stream (issue 34, item 1) =====
--
--
--

-- ===== section: attempt and run timeouts (issue 34, item 2) =====
--
--
--

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
