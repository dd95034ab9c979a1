-- 0022_agent_gaps_and_run_cost: state changes for the work of the session of 2026-12-06: what
-- long agent runs still lacked (run deadlines of waiting runs, stream and version limits; issue
-- 34), the per-run cost of the hot path (issue 30), high availability (issue 35) and the test
-- suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: run deadlines of waiting runs, one settle path (issue 34) =====

-- ===== section: stream limits and code versions (issue 34) =====
--
-- A run's event stream is bounded in events (each event was bounded at 64 kB, the number was
-- not): deployments.max_run_events (NULL: the default, 10,000), checked by append_run_event under
-- the run's row lock, past it ZP014 and nothing stored. A DBA's column: zeroth_worker has no
-- UPDATE on zeroth.deployments, so no worker raises its own bound.
ALTER TABLE zeroth.deployments
    ADD COLUMN max_run_events integer,
    ADD CONSTRAINT deployments_max_run_events_valid CHECK (
        max_run_events IS NULL OR max_run_events BETWEEN 100 AND 10000000);
COMMENT ON COLUMN zeroth.deployments.max_run_events IS 'Bound on the events one run of the deployment may append to its stream (append_run_event; END is not counted): 100 to 10,000,000; NULL: the default, 10,000. Past it append_run_event raises ZP014 and stores nothing. Set by a DBA (UPDATE zeroth.deployments): no function or worker writes it; read at each append past the 100th event of a run.';

-- zeroth.code_versions was never pruned: prune_runs (called for every tenant) now deletes the
-- versions no run references. "No run references it" is a probe of this index per version; it
-- holds only the runs that carry a version (an unversioned run is never in it).
CREATE INDEX runs_code_version_idx ON zeroth.runs (code_version_id)
    WHERE code_version_id IS NOT NULL;
COMMENT ON INDEX zeroth.runs_code_version_idx IS 'Every run that records a code version, by version (prune_runs: whether any run still references a zeroth.code_versions row). Runs without a version are not in it.';

-- admit_run and start_run take the caller's code_version (trailing, DEFAULT NULL: every call that
-- worked before works the same): an owned admission and a first start record it as a claim does.
-- Their files create the new signatures; the old ones would stay beside them and make calls
-- ambiguous, so they go here (IF EXISTS: a fresh install creates the functions after the
-- migrations).
DROP FUNCTION IF EXISTS zeroth.admit_run(text, text, text, text, jsonb, text, text, double precision, double precision, text, jsonb, uuid, integer, integer, boolean, bigint);
DROP FUNCTION IF EXISTS zeroth.start_run(uuid, text, bigint, text, text);

-- ===== section: per-run cost of the hot path (issue 30) =====

-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
