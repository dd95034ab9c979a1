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
--
--

-- ===== section: attempt and run timeouts (issue 34, item 2) =====
--
--
--

-- ===== section: code versions (issue 34, item 3) =====
--
--
--

-- ===== section: test suite (issue 32) =====
--
--
--
