-- sql/functions/internal/generations.sql: the floor of the lease generations this server hands out.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Why a floor: a claim gives a run generation + 1, and the fence tells a lease's holders apart
-- by (worker id, generation). After a lossy (asynchronous) failover the promoted standby never
-- saw the claims the old primary made in the lag, so counting on from the number it has would
-- hand out a number a second time — and a worker still executing that lost generation under the
-- same worker id could not be told from the new holder (docs/reliability.md, issue 35). Every
-- promotion starts a new WAL timeline, and nothing a server on an earlier timeline wrote can
-- reach a later one unless it was replicated before the fork. So each timeline owns a band of
-- generations and a claim on timeline T gives max(generation + 1, floor(T) + 1). On timeline 1
-- (a server never promoted or restored) the floor is 0 and nothing changes; after a promotion
-- every new generation is above any the old primary could have handed out, unless one run was
-- claimed a whole band's worth of times on one timeline.
--
-- The bands: 2^32 generations each for timelines 1 .. 2^30 + 1 (floor(T) = (T - 1) * 2^32: every
-- timeline a real server reaches, and what this floor was when it was first released), then
-- 2^30 each up to timeline 2^32 - 1, PostgreSQL's largest (a TimeLineID is a uint32). Bands of
-- 2^32 for every timeline would not fit in a bigint: (T - 1) << 32 wraps to a negative number from
-- timeline 2^31 + 1 on, and a negative floor protects nothing. The last band ends below 2^63 - 2^59,
-- so generation + 1 never overflows either. Timelines come only from pg_walfile_name, so anything
-- outside 1 .. 2^32 - 1 is a bug: ZP008, never a wrong floor.
CREATE OR REPLACE FUNCTION zeroth._timeline_generation_floor(timeline bigint)
    RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    IF timeline < 1 OR timeline > 4294967295 THEN
        RAISE EXCEPTION 'zeroth: % is not a WAL timeline (1 to 4294967295)', timeline
            USING ERRCODE = 'ZP008';
    END IF;
    IF timeline <= 1073741825 THEN  -- 2^30 + 1
        RETURN (timeline - 1) << 32;
    END IF;
    -- Above the 2^30 + 1 bands of 2^32 (they end at 2^62 + 2^32), bands of 2^30.
    RETURN (1::bigint << 62) + (1::bigint << 32) + ((timeline - 1073741826) << 30);
END
$$;
COMMENT ON FUNCTION zeroth._timeline_generation_floor(bigint) IS 'Internal: the floor under every lease generation a claim hands out on WAL timeline timeline: (timeline - 1) * 2^32 up to timeline 2^30 + 1, then bands of 2^30, so that every timeline PostgreSQL can have (1 to 2^32 - 1) has a band of its own inside a bigint; ZP008 for anything else.';
ALTER FUNCTION zeroth._timeline_generation_floor(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._timeline_generation_floor(bigint) FROM PUBLIC;

-- The timeline is the one the server is inserting WAL on now (pg_walfile_name names the segment
-- of the current insert position on it); pg_control_checkpoint() would lag a promotion until
-- its end-of-recovery checkpoint. Read once per claim statement by the caller.
CREATE OR REPLACE FUNCTION zeroth._generation_floor()
    RETURNS bigint
    LANGUAGE sql VOLATILE AS $$
    SELECT zeroth._timeline_generation_floor(
        ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint)
$$;
COMMENT ON FUNCTION zeroth._generation_floor() IS 'Internal: the floor under every lease generation a claim hands out on this server''s current WAL timeline (zeroth._timeline_generation_floor(timeline)), so that no generation is handed out twice across a lossy failover.';
ALTER FUNCTION zeroth._generation_floor() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._generation_floor() FROM PUBLIC;
