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
-- zeroth.lock_stripes (0008) has been unused since 0009: thread admissions lock a row of
-- zeroth.thread_locks and slot creation takes no shared lock, and no function of
-- sql/functions reads it. Its 17,408 rows were still copied into every database and read by
-- every whole-table check (the fuzz and hostile-caller tiers checksum every table after each
-- call: this table was 97% of that work). Its comment promised a later migration would drop it.
-- CASCADE: in a database upgraded from 0008 or earlier in this same upgrade, 0008's SQL-standard
-- bodies (_lock_thread, _thread_stripe) still depend on it here; the function files, applied
-- after this file in the same transaction, put back every function that still exists.
DROP TABLE zeroth.lock_stripes CASCADE;

-- ===== section: high availability (issue 35) =====
