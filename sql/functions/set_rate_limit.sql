-- set_rate_limit: admin. Create or change rate limit `name`: at most max_starts starts in any
-- rolling window of period_seconds, for every scope whose zeroth.scope_limits row names it
-- (rate_limit). Takes effect on the next claim of every worker; the starts already logged stay
-- counted. Locks: the key's row (waits for a claim holding it: a few milliseconds). Granted to
-- nobody: run it as a member of zeroth_owner (a DBA), like the plain INSERT/UPDATE it replaces.
-- Raises ZP008 (a bad name, max_starts outside 1-1000000, period outside 0.001-86400 s).
-- Returns true when the key was created. Time: none.
CREATE OR REPLACE FUNCTION zeroth.set_rate_limit(
    name           text,
    max_starts     integer,
    period_seconds double precision,
    note           text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_created boolean;
BEGIN
    PERFORM zeroth._require_identifier(set_rate_limit.name, 'name');
    PERFORM zeroth._require(set_rate_limit.max_starts IS NOT NULL
                            AND set_rate_limit.max_starts BETWEEN 1 AND 1000000,
                            'max_starts must be between 1 and 1000000');
    PERFORM zeroth._require(set_rate_limit.period_seconds IS NOT NULL
                            AND set_rate_limit.period_seconds >= 0.001
                            AND set_rate_limit.period_seconds <= 86400,
                            'period_seconds must be between 0.001 and 86400');
    INSERT INTO zeroth.rate_limits AS k (name, max_starts, period_seconds, note)
    VALUES (set_rate_limit.name, set_rate_limit.max_starts, set_rate_limit.period_seconds,
            set_rate_limit.note)
    ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
       SET max_starts = excluded.max_starts, period_seconds = excluded.period_seconds,
           note = coalesce(excluded.note, k.note)
    RETURNING (xmax = 0) INTO v_created;
    RETURN v_created;
END
$$;
COMMENT ON FUNCTION zeroth.set_rate_limit(text, integer, double precision, text) IS
'set_rate_limit: admin. Create or change rate limit name: at most max_starts starts in any rolling window of period_seconds, for every scope whose zeroth.scope_limits row names it (rate_limit); the next claim of every worker applies it. Granted to nobody: a member of zeroth_owner runs it. Raises ZP008. Returns true when the key was created. Time: none.';
ALTER FUNCTION zeroth.set_rate_limit(text, integer, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.set_rate_limit(text, integer, double precision, text) FROM PUBLIC;
