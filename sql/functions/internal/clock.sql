-- sql/functions/internal/clock.sql: the database clock every transition reads once per call.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Database time, sampled once per call as v_now. There is no way to pass another clock: no
-- function takes a time argument. Tests replace this function in their own database (only its
-- owner or a superuser can), see zeroth_pg.testing.install_test_clock.
CREATE OR REPLACE FUNCTION zeroth._now() RETURNS timestamptz
    LANGUAGE sql VOLATILE
    RETURN clock_timestamp();
COMMENT ON FUNCTION zeroth._now() IS 'Internal: the database clock, clock_timestamp() (not now(): a caller may make several calls in one transaction).';
ALTER FUNCTION zeroth._now() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._now() FROM PUBLIC;
