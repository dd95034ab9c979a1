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
--
--

-- ===== section: test suite (issue 32) =====
--
--
--
