-- sql/functions/internal/rate_limits.sql: rate limits (zeroth.rate_limits): take starts from a key's
-- rolling window, log the starts made, say when the next start becomes possible.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The earliest time after `at` when rate limit `name` (max_starts, period) has room for one more
-- start: the oldest logged start whose leaving makes room (the starts after it are at most
-- max_starts - 1) + period; NULL when there is room at `at` already.
CREATE OR REPLACE FUNCTION zeroth._rate_room_at(name text, at timestamptz, max_starts integer,
                                                period interval)
    RETURNS timestamptz
    -- (PL/pgSQL for the reason zeroth._notify gives.)
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT min(w.started_at) + _rate_room_at.period
              FROM (SELECT s.started_at, s.starts,
                           sum(s.starts) OVER (ORDER BY s.started_at DESC) AS newer_or_same,
                           sum(s.starts) OVER () AS used
                      FROM zeroth.rate_limit_starts s
                     WHERE s.name = _rate_room_at.name
                       AND s.started_at > _rate_room_at.at - _rate_room_at.period) AS w
             WHERE w.used >= _rate_room_at.max_starts
               AND w.newer_or_same - w.starts <= _rate_room_at.max_starts - 1);
END
$$;
COMMENT ON FUNCTION zeroth._rate_room_at(text, timestamptz, integer, interval) IS 'Internal: the earliest time rate limit `name` has room for one more start (NULL: room now): the oldest logged start whose leaving makes room, + period.';
ALTER FUNCTION zeroth._rate_room_at(text, timestamptz, integer, interval) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._rate_room_at(text, timestamptz, integer, interval) FROM PUBLIC;

-- Takes up to `wanted` starts from rate limit `name` for a claim begun at `at`. Locks the key's
-- row FOR NO KEY UPDATE SKIP LOCKED (claimers of one key serialise, none ever waits: one that
-- finds the row locked gets granted 0 and retry_at = at + 10 ms, "retry soon"), then reads the
-- clock (decided_at: the time the claim's starts happen at), so successive holders of a key
-- decide at increasing times. Prunes the log of entries at or before decided_at - period and
-- grants least(wanted, max_starts - the starts still logged): every rolling window within
-- max_starts. granted 0 with a full window: retry_at = the earliest time the window has room.
-- (The unreleased first draft had no decided_at: dropped first.)
DROP FUNCTION IF EXISTS zeroth._take_rate(text, integer, timestamptz);
CREATE OR REPLACE FUNCTION zeroth._take_rate(name text, wanted integer, at timestamptz,
                                             OUT granted integer, OUT retry_at timestamptz,
                                             OUT decided_at timestamptz)
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_max    integer;
    v_period interval;
    v_used   integer;
BEGIN
    SELECT k.max_starts, make_interval(secs => k.period_seconds) INTO v_max, v_period
      FROM zeroth.rate_limits k
     WHERE k.name = _take_rate.name
       FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN  -- another claimer holds the key right now: skip, never wait
        granted := 0;
        retry_at := _take_rate.at + interval '10 milliseconds';
        decided_at := _take_rate.at;
        RETURN;
    END IF;
    -- The clock once the key is held: the previous holder decided (and committed) before it.
    decided_at := greatest(zeroth._now(), _take_rate.at);
    DELETE FROM zeroth.rate_limit_starts s
     WHERE s.name = _take_rate.name AND s.started_at <= decided_at - v_period;
    SELECT coalesce(sum(s.starts), 0)::integer INTO v_used
      FROM zeroth.rate_limit_starts s
     WHERE s.name = _take_rate.name;
    granted := greatest(least(_take_rate.wanted, v_max - v_used), 0);
    IF granted = 0 THEN
        retry_at := zeroth._rate_room_at(_take_rate.name, decided_at, v_max, v_period);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._take_rate(text, integer, timestamptz) IS 'Internal: take up to `wanted` starts from rate limit `name` (key row locked FOR NO KEY UPDATE SKIP LOCKED, then the clock read: decided_at; log pruned; rolling window). granted 0: retry_at is when the window has room (or at + 10 ms when another claimer holds the key).';
ALTER FUNCTION zeroth._take_rate(text, integer, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_rate(text, integer, timestamptz) FROM PUBLIC;

-- Logs `starts` starts of rate limit `name` at `at` (the caller holds the key's row from
-- _take_rate): one log row per claim, merged with one of the same time, and the key's
-- last_start_at. Nothing to log: no write. Returns when the window has room again if these
-- starts filled it (NULL: room left).
CREATE OR REPLACE FUNCTION zeroth._log_rate(name text, starts integer, at timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_max    integer;
    v_period interval;
BEGIN
    IF _log_rate.starts > 0 THEN
        -- Logged at `at` rounded UP to a thousandth of the period: a start counts a little
        -- longer (at most period / 1000: never more than max_starts in any window), and a key
        -- has at most about 1000 log rows whatever max_starts and the batch sizes.
        INSERT INTO zeroth.rate_limit_starts AS s (name, started_at, starts)
        SELECT _log_rate.name,
               timestamptz 'epoch' + (b.us / 1000000) * interval '1 second'
                                   + (b.us % 1000000) * interval '1 microsecond',
               _log_rate.starts
          FROM zeroth.rate_limits k
         CROSS JOIN LATERAL (SELECT greatest(floor(k.period_seconds * 1000), 1)::bigint AS g) g
         CROSS JOIN LATERAL (SELECT (ceil((extract(epoch FROM _log_rate.at) * 1000000) / g.g)
                                     * g.g)::bigint AS us) b
         WHERE k.name = _log_rate.name
        ON CONFLICT ON CONSTRAINT rate_limit_starts_pkey
            DO UPDATE SET starts = s.starts + excluded.starts;
        UPDATE zeroth.rate_limits k
           SET last_start_at = greatest(k.last_start_at, _log_rate.at)
         WHERE k.name = _log_rate.name
        RETURNING k.max_starts, make_interval(secs => k.period_seconds) INTO v_max, v_period;
        RETURN zeroth._rate_room_at(_log_rate.name, _log_rate.at, v_max, v_period);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._log_rate(text, integer, timestamptz) IS 'Internal: log `starts` starts of rate limit `name` at `at` (the caller holds the key from _take_rate); returns when the window has room again if they filled it, else NULL.';
ALTER FUNCTION zeroth._log_rate(text, integer, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._log_rate(text, integer, timestamptz) FROM PUBLIC;

-- The run_id-NULL row of a claim (at `at`) held back by its rate limit until retry_at.
CREATE OR REPLACE FUNCTION zeroth._rate_marker(concurrency_limit integer, retry_at timestamptz,
                                               at timestamptz)
    RETURNS zeroth.claimed_run
    LANGUAGE sql IMMUTABLE
    RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               0, false, concurrency_limit, retry_at,
               greatest(extract(epoch FROM retry_at - at)::double precision, 0),
               NULL, NULL)::zeroth.claimed_run;  -- deadline_at, deadline_in: none (0021)
COMMENT ON FUNCTION zeroth._rate_marker(integer, timestamptz, timestamptz) IS 'Internal: the run_id-NULL row a claim at `at` returns when its rate limit held it back; retry_at: when a start becomes possible, retry_after: the seconds until then.';
ALTER FUNCTION zeroth._rate_marker(integer, timestamptz, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._rate_marker(integer, timestamptz, timestamptz) FROM PUBLIC;
