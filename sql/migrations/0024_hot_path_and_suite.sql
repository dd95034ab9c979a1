-- 0024_hot_path_and_suite: state changes for the work of the session of 2026-12-06 (third):
-- the per-run cost of the hot path and claims on a dirty table (issue 30), the test suite
-- (issue 32) and high availability (issue 35).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====

-- ===== section: WAL and index writes per run (issue 30) =====

-- ===== section: worker throughput (issue 30) =====

-- ===== section: test suite (issue 32) =====

-- ===== section: high availability (issue 35) =====
