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
-- 2^32 generations: a claim on timeline T gives max(generation + 1, (T - 1) * 2^32 + 1). On
-- timeline 1 (a server never promoted or restored) the floor is 0 and nothing changes; after a
-- promotion every new generation is above any the old primary could have handed out, unless one
-- run was claimed 2^32 times on one timeline.
--
-- The timeline is the one the server is inserting WAL on now (pg_walfile_name names the segment
-- of the current insert position on it); pg_control_checkpoint() would lag a promotion until
-- its end-of-recovery checkpoint. Read once per claim statement by the caller.
CREATE OR REPLACE FUNCTION zeroth._generation_floor()
    RETURNS bigint
    LANGUAGE sql VOLATILE AS $$
    SELECT (('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint
            - 1) << 32
$$;
COMMENT ON FUNCTION zeroth._generation_floor() IS 'Internal: (timeline - 1) * 2^32, the floor under every lease generation a claim hands out on this server''s current WAL timeline, so that no generation is handed out twice across a lossy failover.';
ALTER FUNCTION zeroth._generation_floor() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._generation_floor() FROM PUBLIC;
