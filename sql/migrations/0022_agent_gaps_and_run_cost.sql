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

-- ===== section: per-run cost of the hot path (issue 30) =====

-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
