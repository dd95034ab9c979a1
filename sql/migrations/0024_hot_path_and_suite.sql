-- 0024_hot_path_and_suite: state changes for the work of the session of 2026-12-06 (third):
-- the per-run cost of the hot path and claims on a dirty table (issue 30), the test suite
-- (issue 32) and high availability (issue 35).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====

-- ===== section: WAL and index writes per run (issue 30) =====
-- fillfactor 80 → 70: a run's row grows from its enqueue to its completion (the lease, the start
-- and finish times, the completing worker kept in the row), and with 20% of a page free the
-- claims and completions of the runs inserted on it outgrow it: the new version goes to another
-- page, written whole (no prefix/suffix compression) after a heap LOCK record of the old one, and
-- the next access of the index entries of the old page cleans them up (btree DELETE). With 30%
-- free those updates stay on their page (bench/per_run_cost.py, worker at concurrency 1: about
-- 25 bytes of WAL a run fewer, and no larger a table: the finished rows fill the room). Only
-- rows inserted from now on are placed by it: no rewrite, a SHARE UPDATE EXCLUSIVE lock.
ALTER TABLE zeroth.runs SET (fillfactor = 70);

-- ===== section: worker throughput (issue 30) =====

-- ===== section: test suite (issue 32) =====

-- ===== section: high availability (issue 35) =====
