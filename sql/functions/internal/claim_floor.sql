-- sql/functions/internal/claim_floor.sql: the claim floor, where a session's claims of a scope
-- start reading runs_claim_pending_idx (issue 30, the dirty table).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).
--
-- Why: the claims read the pending runs of a scope in claim order (priority DESC, run_after,
-- created_at) from runs_claim_pending_idx. Every run claimed since the last VACUUM (pending
-- → running is not a HOT update) and every pending run deleted leaves its entry there, at the head
-- of its scope, and while some transaction pins the xmin horizon (an idle session in a
-- transaction, a long report, a monitor) no scan may mark such an entry dead: each claim fetched
-- the heap row of every one of them before it reached the first live run (200,000 dead runs: a
-- claim went from 14 ms to 276 ms p99 on PostgreSQL 15).
--
-- The head is as dirty once the horizon moves on: a scan that finds such an entry's row dead to
-- everyone marks the entry dead (LP_DEAD) and later scans skip it without fetching the row — but
-- not its leaf page, which only VACUUM empties and unlinks. At 3,000 runs/s that is ~150 pages of
-- skipped entries more every second until autovacuum (issue 30, the PG 18 decay: a claim read
-- 116 blocks of the index after a VACUUM and 680 at 200,000 dead tuples; W = 64 fell from 4,000
-- to 2,500 runs/s between autovacuums).
--
-- What: a claim whose scan from the head of the scope passed over more than 100 + 2 × its batch
-- entries it could not take, or read more than 20 + its batch / 10 pages of the index (a dirty
-- head; counted with the backend's statistics counters, zeroth._claim_floor_after_full_scan)
-- remembers, in a setting
-- of its session named by the scope (zeroth.claim_floor_<0-63 by the md5 of the scope>), the position of the
-- first run it locked (its claim-order key: priority, run_after, created_at; the run_id is kept
-- beside them, but the index has no such column, so runs with an equal key are all read from
-- the first of them, the claimed ones included; the runs of one enqueue_runs batch have distinct
-- keys, created_at a microsecond apart in input order, so a floor lands exactly inside a batch);
-- on a clean head it keeps none and every claim reads from the head in exact claim order, as
-- before. The next claim of that session in that scope reads the floor's priority level from that
-- position on — an exact start of the index scan, so the dead entries before it are never read —
-- and the levels above and below it from their heads (priority order between levels stays exact).
-- The floor is a hint, never the truth: what it hides is found by a full scan from the head, which
-- a session makes at its first claim of a scope and again once `bound` has passed since its last
-- one (bound: 50 times what the last full scan took, at least 1 s, at most 60 s, by the test clock
-- zeroth._now()). A run that sorts below the floor a session holds — returned to pending with its
-- old run_after (hand_back_to_pending, release_lease of a claim not yet started, a lapsed claim, a
-- takeover that requeues, a thread's next run), enqueued with a run_after in the past or by a
-- transaction that stayed open for more than a second (its run_after is its start), or left
-- pending by a claim that rolled back — is claimed by that session at its next full scan at the
-- latest, so it waits at most `bound` longer than it would have (sessions whose floor is lower see
-- it at once). To keep the common case of that last one out, a floor is never more recent than
-- one second before the claim's time: a run enqueued by a transaction open for less than a second
-- is never hidden. The setting is the session's own (set_config(..., false)); a rolled-back claim
-- rolls it back too; behind a transaction pooler it moves with the server connection, which is
-- harmless for a hint: any value, even one a client wrote, only delays runs by at most the bound.

-- The one-expression helpers below are declared exactly as volatile as their bodies (an array's
-- text, text || integer and to_regclass are STABLE, the statistics counters VOLATILE), so that
-- the planner inlines them into every caller: one declared IMMUTABLE over a STABLE body is not
-- inlined but called, and before PostgreSQL 18 a SQL function that is called is parsed and
-- planned again at each call (issue 30: 40-80 µs a claim on PostgreSQL 15, 5-10 on 18).

-- A scope as its claim floor names it: the md5 of (tenant_id, workspace_key, deployment_ref).
CREATE OR REPLACE FUNCTION zeroth._claim_floor_scope(tenant_id text, workspace_key text,
                                                    deployment_ref text)
    RETURNS text
    LANGUAGE sql STABLE
    RETURN md5(ARRAY[tenant_id, workspace_key, deployment_ref]::text);
COMMENT ON FUNCTION zeroth._claim_floor_scope(text, text, text) IS 'Internal: the md5 of a scope (tenant_id, workspace_key, deployment_ref) that its claim floor''s value ends with.';
ALTER FUNCTION zeroth._claim_floor_scope(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_scope(text, text, text) FROM PUBLIC;

-- The name of the session setting that holds a scope's claim floor: one of 64
-- (zeroth.claim_floor_0 … _63, by the scope's md5), not one per scope. A session that claims
-- across thousands of scopes would otherwise add a setting per scope, and PostgreSQL 15 re-sorts
-- its list of settings at each new one and walks it at the end of every call with a SET clause
-- (every SECURITY DEFINER function): 4,000 of them made such a call about 4 times slower. Two
-- scopes of one bucket overwrite each other's floor (the value names its scope: the other's is
-- no floor), which costs only a full scan.
CREATE OR REPLACE FUNCTION zeroth._claim_floor_setting(tenant_id text, workspace_key text,
                                                      deployment_ref text)
    RETURNS text
    LANGUAGE sql STABLE
    RETURN 'zeroth.claim_floor_' || get_byte(decode(zeroth._claim_floor_scope(tenant_id, workspace_key,
                                                                              deployment_ref), 'hex'), 0) % 64;
COMMENT ON FUNCTION zeroth._claim_floor_setting(text, text, text) IS 'Internal: the name of the session setting (zeroth.claim_floor_0 to _63, by the md5 of the scope) that holds the claim floor of one scope; the value names its scope.';
ALTER FUNCTION zeroth._claim_floor_setting(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_setting(text, text, text) FROM PUBLIC;

-- The claimers a floor was set for: its claims filter by serves (the code versions a claimer may
-- resume, zeroth._version_serves; NULL: every run), so a floor set past runs one claimer may not
-- take is no floor for a claimer that may.
CREATE OR REPLACE FUNCTION zeroth._claim_floor_serves(serves bigint[])
    RETURNS text
    LANGUAGE sql STABLE
    RETURN CASE WHEN serves IS NULL THEN 'any' ELSE md5(serves::text) END;
COMMENT ON FUNCTION zeroth._claim_floor_serves(bigint[]) IS 'Internal: the claimers (by their serves array) a claim floor holds for: ''any'' or the md5 of the array.';
ALTER FUNCTION zeroth._claim_floor_serves(bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_serves(bigint[]) FROM PUBLIC;

-- The floor of this session for a scope, and whether the claim must scan from the head instead
-- (full_scan: no valid floor, one for other claimers, one written at a time after `at`, or bound
-- passed since the last full scan). full_scan or not, (priority, run_after, created_at) is
-- where the claim reads from: the floor, never more recent than one second before at; for a full
-- scan the lowest position there is (the lowest priority, then -infinity: the claims read the
-- levels above the floor's from their heads, so that is every run). kept_priority: the floor's
-- priority when a valid one was stored (NULL: none). run_id: the first locked run's id, kept in the
-- value for the record; the claims compare (priority, run_after, created_at) only (the index has no
-- run_id).
CREATE OR REPLACE FUNCTION zeroth._claim_floor(
    tenant_id text, workspace_key text, deployment_ref text, serves bigint[], at timestamptz,
    OUT priority integer, OUT run_after timestamptz, OUT created_at timestamptz, OUT run_id uuid,
    OUT full_scan boolean, OUT full_at timestamptz, OUT bound_ms integer,
    OUT kept_priority integer)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_value text := current_setting(zeroth._claim_floor_setting(_claim_floor.tenant_id,
                                                                _claim_floor.workspace_key,
                                                                _claim_floor.deployment_ref), true);
    v_parts text[];
BEGIN
    full_scan := true;
    priority := -2147483648;
    run_after := '-infinity';
    created_at := '-infinity';
    run_id := '00000000-0000-0000-0000-000000000000';
    -- serves priority run_after created_at run_id full_at bound_ms scope (times in microseconds
    -- since the epoch; scope: zeroth._claim_floor_scope, as 64 scopes share a setting). Anything
    -- else, another scope's floor or a client's own value too, is no floor: a time of more than 17
    -- digits (beyond about 3,100 years from 1970, where a time before 4713 BC would fail every
    -- claim of the session with 'timestamp out of range'; _set_claim_floor writes none there),
    -- a bound outside what zeroth._claim_floor_bound gives (1 to 60 s: a longer one would hide
    -- runs longer than the documented 60 s).
    -- Split and checked field by field: one anchored pattern over the whole value, with its
    -- counted repetitions, took 1.2-2.5 ms a call on PostgreSQL 18 (every claim of a session
    -- that holds a floor; at W = 64 about a quarter of the server's time per run); these take
    -- ~16 µs. The checks come before any cast, each in an IF of its own (SQL does not promise
    -- to evaluate OR's arms in order).
    v_parts := string_to_array(v_value, ' ');
    IF cardinality(v_parts) IS DISTINCT FROM 8
       OR v_parts[1] IS DISTINCT FROM zeroth._claim_floor_serves(_claim_floor.serves)
       OR v_parts[8] IS DISTINCT FROM zeroth._claim_floor_scope(_claim_floor.tenant_id,
                                                                _claim_floor.workspace_key,
                                                                _claim_floor.deployment_ref) THEN
        RETURN;
    END IF;
    IF NOT (v_parts[2] ~ '^-?[0-9]{1,10}$' AND v_parts[3] ~ '^-?[0-9]{1,17}$'
            AND v_parts[4] ~ '^-?[0-9]{1,17}$' AND v_parts[6] ~ '^-?[0-9]{1,17}$'
            AND v_parts[7] ~ '^[0-9]{1,9}$'
            AND v_parts[5] ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$') THEN
        RETURN;
    END IF;
    IF v_parts[2]::bigint NOT BETWEEN -2147483648 AND 2147483647
       OR v_parts[7]::integer NOT BETWEEN 1000 AND 60000 THEN
        RETURN;
    END IF;
    kept_priority := v_parts[2]::integer;
    full_at := zeroth._claim_floor_time(v_parts[6]::bigint);
    bound_ms := v_parts[7]::integer;
    IF full_at > _claim_floor.at
       OR _claim_floor.at - full_at >= make_interval(secs => bound_ms / 1000.0) THEN
        RETURN;
    END IF;
    full_scan := false;
    priority := kept_priority;
    run_after := zeroth._claim_floor_time(v_parts[3]::bigint);
    created_at := zeroth._claim_floor_time(v_parts[4]::bigint);
    run_id := v_parts[5]::uuid;
    -- Never more recent than a second before the claim: a run enqueued by a transaction that
    -- began before the floor's run and committed after it was set stays in view.
    IF run_after >= _claim_floor.at - interval '1 second' THEN
        run_after := _claim_floor.at - interval '1 second';
        created_at := '-infinity';
        run_id := '00000000-0000-0000-0000-000000000000';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._claim_floor(text, text, text, bigint[], timestamptz) IS 'Internal: where this session''s claim of a scope reads runs_claim_pending_idx from (its claim floor, a hint kept in a session setting, never more recent than at - 1 s), or full_scan: from the head (no valid floor, or its bound passed since the session''s last full scan).';
ALTER FUNCTION zeroth._claim_floor(text, text, text, bigint[], timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor(text, text, text, bigint[], timestamptz) FROM PUBLIC;

-- A time as the floor stores it (microseconds since the epoch; numeric extract: exact) and back.
-- NULL for a time no floor can hold: infinite (a run_after a DBA set to -infinity: the cast would
-- fail every claim that locks that run first) or beyond 17 digits (which _claim_floor refuses).
CREATE OR REPLACE FUNCTION zeroth._claim_floor_us(at timestamptz)
    RETURNS bigint
    LANGUAGE sql STABLE
    RETURN CASE WHEN isfinite(at)
                     AND abs(extract(epoch FROM at) * 1000000) < 100000000000000000
                THEN (extract(epoch FROM at) * 1000000)::bigint END;
COMMENT ON FUNCTION zeroth._claim_floor_us(timestamptz) IS 'Internal: a time as a claim floor stores it, microseconds since the epoch.';
ALTER FUNCTION zeroth._claim_floor_us(timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_us(timestamptz) FROM PUBLIC;

-- The time a floor stored (to_timestamp of the whole seconds is exact, the microseconds added as
-- an interval).
CREATE OR REPLACE FUNCTION zeroth._claim_floor_time(us bigint)
    RETURNS timestamptz
    LANGUAGE sql STABLE
    RETURN to_timestamp((us / 1000000)::double precision) + (us % 1000000) * interval '1 microsecond';
COMMENT ON FUNCTION zeroth._claim_floor_time(bigint) IS 'Internal: the time a claim floor stored as microseconds since the epoch.';
ALTER FUNCTION zeroth._claim_floor_time(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_time(bigint) FROM PUBLIC;

-- Keeps a claim floor for this session (until the end of the session, or the rollback of the
-- transaction): the position (priority, run_after, created_at, run_id) of the first run a claim
-- locked, or after a full scan that found nothing (priority, at, at, nil); full_at: when the
-- session last scanned the scope from its head; bound_ms: how long until it must again. A
-- position no floor can hold (an infinite or far-off time: zeroth._claim_floor_us NULL) keeps
-- none (''), and the next claim reads from the head. Returns the value kept.
-- One expression (LANGUAGE sql, inlined): its callers assign it (v := …), which PL/pgSQL
-- evaluates without a statement of its own; the PL/pgSQL function it replaces
-- (_keep_claim_floor, void) cost every floored claim two statements, its PERFORM and its
-- set_config (issue 30, sixth session).
DROP FUNCTION IF EXISTS zeroth._keep_claim_floor(text, text, text, bigint[], integer, timestamptz, timestamptz, uuid, timestamptz, integer);
CREATE OR REPLACE FUNCTION zeroth._set_claim_floor(
    tenant_id text, workspace_key text, deployment_ref text, serves bigint[], priority integer,
    run_after timestamptz, created_at timestamptz, run_id uuid, full_at timestamptz,
    bound_ms integer)
    RETURNS text
    LANGUAGE sql VOLATILE
    RETURN set_config(
        zeroth._claim_floor_setting(tenant_id, workspace_key, deployment_ref),
        CASE WHEN zeroth._claim_floor_us(run_after) IS NULL
                  OR zeroth._claim_floor_us(created_at) IS NULL
                  OR zeroth._claim_floor_us(full_at) IS NULL
             THEN ''
             ELSE concat_ws(' ', zeroth._claim_floor_serves(serves), priority,
                            zeroth._claim_floor_us(run_after), zeroth._claim_floor_us(created_at),
                            run_id, zeroth._claim_floor_us(full_at), bound_ms,
                            zeroth._claim_floor_scope(tenant_id, workspace_key, deployment_ref)) END,
        false);
COMMENT ON FUNCTION zeroth._set_claim_floor(text, text, text, bigint[], integer, timestamptz, timestamptz, uuid, timestamptz, integer) IS 'Internal: keep this session''s claim floor of a scope (a session setting, rolled back with the transaction): the claim-order position a claim''s scan starts at, when the session last scanned from the head and for how long that holds; none ('''') for a position no floor can hold. Returns the value kept.';
ALTER FUNCTION zeroth._set_claim_floor(text, text, text, bigint[], integer, timestamptz, timestamptz, uuid, timestamptz, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._set_claim_floor(text, text, text, bigint[], integer, timestamptz, timestamptz, uuid, timestamptz, integer) FROM PUBLIC;

-- How long a full scan that took `took` lets the session use its floor: 50 times as long (so the
-- full scans cost at most 2% of a session's time), at least 1 s, at most 60 s (the bound a hidden
-- run waits at most).
CREATE OR REPLACE FUNCTION zeroth._claim_floor_bound(took interval)
    RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN least(60000, greatest(1000, ceil(50 * 1000 * extract(epoch FROM took))))::integer;
COMMENT ON FUNCTION zeroth._claim_floor_bound(interval) IS 'Internal: how long (ms) a claim floor holds after a full scan that took `took`: 50 times that, at least 1 s, at most 60 s.';
ALTER FUNCTION zeroth._claim_floor_bound(interval) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_bound(interval) FROM PUBLIC;

-- After a claim's (or a look's) full scan from the head of the scope: wasted is how many entries
-- of runs_claim_pending_idx it read and could not take (dead, locked by another claimer, leased,
-- pinned to another version: pg_stat_get_xact_tuples_returned around the scan, less the runs it
-- locked), pages how many blocks of that index it read (pg_stat_get_xact_blocks_fetched around the
-- scan), want how many runs it asked for, took how long it ran. The head is dirty when it wasted
-- more than 100 + 2 × want entries — more than the runs a few claims like this one leave behind,
-- which the scans of an unpinned table mark dead as they pass — or read more than 20 + want / 10
-- pages: a clean head costs the descent of the index (3–4 pages per claim-order range read, at
-- most 3 ranges) and the leaf pages of the entries taken (about 100 a page); more is leaf pages of
-- entries already marked dead, which a scan skips without returning (so wasted misses them) but
-- still reads, page by page, until VACUUM. On a dirty head the session keeps a floor: the first
-- run the scan locked (priority, run_after, created_at, run_id), or with none (at, at, nil) at the
-- level of the floor it had (0 if none), for the bound that `took` gives
-- (zeroth._claim_floor_bound). Else the head is clean enough, and the session keeps no floor: its
-- claims take runs in exact claim order from the head, as every claim did before issue 30 (and
-- mark the dead entries they pass). (With track_counts off both counts are 0: never a floor.)
-- (The signature before the fourth session, without pages, is dropped first.)
DROP FUNCTION IF EXISTS zeroth._claim_floor_after_full_scan(text, text, text, bigint[], integer, integer, timestamptz, timestamptz, uuid, timestamptz, bigint, interval);
DROP FUNCTION IF EXISTS zeroth._claim_floor_after_full_scan(text, text, text, bigint[], integer, integer, timestamptz, timestamptz, uuid, timestamptz, bigint, integer, interval);
CREATE OR REPLACE FUNCTION zeroth._claim_floor_after_full_scan(
    tenant_id text, workspace_key text, deployment_ref text, serves bigint[],
    kept_priority integer, priority integer, run_after timestamptz, created_at timestamptz,
    run_id uuid, at timestamptz, wasted bigint, pages bigint, want integer, took interval)
    RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_kept text;  -- (assigned, not PERFORMed: an expression, no statement of its own)
BEGIN
    IF coalesce(_claim_floor_after_full_scan.wasted, 0) > 100 + 2 * _claim_floor_after_full_scan.want
       OR coalesce(_claim_floor_after_full_scan.pages, 0)
          > 20 + _claim_floor_after_full_scan.want / 10 THEN
        v_kept := zeroth._set_claim_floor(
            _claim_floor_after_full_scan.tenant_id, _claim_floor_after_full_scan.workspace_key,
            _claim_floor_after_full_scan.deployment_ref, _claim_floor_after_full_scan.serves,
            coalesce(_claim_floor_after_full_scan.priority,
                     _claim_floor_after_full_scan.kept_priority, 0),
            coalesce(_claim_floor_after_full_scan.run_after, _claim_floor_after_full_scan.at),
            coalesce(_claim_floor_after_full_scan.created_at, _claim_floor_after_full_scan.at),
            coalesce(_claim_floor_after_full_scan.run_id, '00000000-0000-0000-0000-000000000000'),
            _claim_floor_after_full_scan.at,
            zeroth._claim_floor_bound(_claim_floor_after_full_scan.took));
    ELSIF _claim_floor_after_full_scan.kept_priority IS NOT NULL THEN
        v_kept := set_config(zeroth._claim_floor_setting(_claim_floor_after_full_scan.tenant_id,
                                                       _claim_floor_after_full_scan.workspace_key,
                                                       _claim_floor_after_full_scan.deployment_ref),
                           '', false);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._claim_floor_after_full_scan(text, text, text, bigint[], integer, integer, timestamptz, timestamptz, uuid, timestamptz, bigint, bigint, integer, interval) IS 'Internal: after a full scan of a scope''s pending runs, keep a claim floor for this session when the head is dirty (the scan wasted more than 100 + 2 × want entries of runs_claim_pending_idx, or read more than 20 + want / 10 of its pages: entries already marked dead, skipped but still read until VACUUM), else drop it (exact claim order).';
ALTER FUNCTION zeroth._claim_floor_after_full_scan(text, text, text, bigint[], integer, integer, timestamptz, timestamptz, uuid, timestamptz, bigint, bigint, integer, interval) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_floor_after_full_scan(text, text, text, bigint[], integer, integer, timestamptz, timestamptz, uuid, timestamptz, bigint, bigint, integer, interval) FROM PUBLIC;

-- Entries of runs_claim_pending_idx this backend's scans have returned so far (its statistics
-- counter, not yet flushed ones included): read around a full scan to count what it wasted.
CREATE OR REPLACE FUNCTION zeroth._claim_index_entries_read()
    RETURNS bigint
    LANGUAGE sql VOLATILE
    -- (to_regclass: a name looked up at each call, so this body holds no dependency on the index)
    RETURN pg_stat_get_xact_tuples_returned(to_regclass('zeroth.runs_claim_pending_idx'));
COMMENT ON FUNCTION zeroth._claim_index_entries_read() IS 'Internal: the entries of runs_claim_pending_idx this backend''s index scans returned so far (pg_stat_get_xact_tuples_returned), read around a claim''s full scan.';
ALTER FUNCTION zeroth._claim_index_entries_read() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_index_entries_read() FROM PUBLIC;

-- Blocks of runs_claim_pending_idx this backend has read so far (its statistics counter, not yet
-- flushed ones included; shared-buffer hits and reads alike): read around a claim's full scan to
-- count the pages it walked, those of entries already marked dead too.
CREATE OR REPLACE FUNCTION zeroth._claim_index_pages_read()
    RETURNS bigint
    LANGUAGE sql VOLATILE
    -- (to_regclass: a name looked up at each call, so this body holds no dependency on the index)
    RETURN pg_stat_get_xact_blocks_fetched(to_regclass('zeroth.runs_claim_pending_idx'));
COMMENT ON FUNCTION zeroth._claim_index_pages_read() IS 'Internal: the blocks of runs_claim_pending_idx this backend read so far (pg_stat_get_xact_blocks_fetched), read around a claim''s full scan.';
ALTER FUNCTION zeroth._claim_index_pages_read() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._claim_index_pages_read() FROM PUBLIC;
