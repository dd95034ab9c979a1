-- 0018_second_review: state changes for the second outside review's findings (issue 29).
--
-- Each section below names the finding it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Finding 3 (admit-and-own runs ignored the DBA's pause, concurrency limit and rate limit):
-- admit_run's lease now obeys the scope's zeroth.scope_limits row, and an admission without room
-- is admitted unleased; retry_after_s also says when the rate key has a start again.
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own, when the scope''s zeroth.scope_limits row left room for the lease: not paused, a free slot, a start of its rate key; otherwise the run is admitted unleased, pending for the ordinary claims); active_run_id and retry_after_s name the run the thread waits for (busy, queued); an admission admitted unleased because its rate key had no start left carries retry_after_s = the seconds until it has one. displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';
