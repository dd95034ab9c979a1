-- 0023_dirty_table_and_failover: state changes for the work of the session of 2026-12-06 (second):
-- claims that stay fast on a table full of dead row versions and fewer bytes per run (issue 30),
-- high availability (issue 35) and the test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====

-- ===== section: per-run cost of the hot path (issue 30) =====

-- ===== section: high availability (issue 35) =====

-- ===== section: test suite (issue 32) =====
