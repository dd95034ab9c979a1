-- 0020_settle_and_registry: state changes for the work of the session of 2026-12-05 (evening):
-- one settle path and the state machine as data (issue 33), the registry's retry policy and
-- default lease and the operator's day (issue 31), the per-run cost of the hot path (issue 30).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Issue 31, the operator's day, item "fire now twice": zeroth.fire_schedule_now takes an optional
-- idempotency_key (a double click or a retried POST returns the first call's run). The function
-- file creates the four-argument signature; the three-argument one would stay beside it and make
-- every call that names three arguments ambiguous, so it goes here (IF EXISTS: a fresh install
-- creates the functions after the migrations).
DROP FUNCTION IF EXISTS zeroth.fire_schedule_now(text, text, text);
