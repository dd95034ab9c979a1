-- sql/functions/internal/arguments.sql: argument checks and scope keys shared by every public function.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

CREATE OR REPLACE FUNCTION zeroth._workspace_key(workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN workspace_id IS NULL THEN '' ELSE 'w:' || workspace_id END;
COMMENT ON FUNCTION zeroth._workspace_key(text) IS 'Internal: maps a workspace id (NULL is the null workspace) to the non-null scope key stored in runs.workspace_key.';
ALTER FUNCTION zeroth._workspace_key(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._workspace_key(text) FROM PUBLIC;

-- Seed scope rule (seed-spec §4): tenant NULL means 'default' unless a workspace is named, in which
-- case the scope is impossible and NULL is returned, so `tenant_id = NULL` matches nothing.
CREATE OR REPLACE FUNCTION zeroth._scope_tenant(tenant_id text, workspace_id text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN tenant_id IS NULL AND workspace_id IS NOT NULL THEN NULL
                ELSE coalesce(tenant_id, 'default') END;
COMMENT ON FUNCTION zeroth._scope_tenant(text, text) IS 'Internal: effective tenant of a call (NULL = the call can match nothing).';
ALTER FUNCTION zeroth._scope_tenant(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_tenant(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._lease_interval(lease_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF lease_seconds IS NULL OR lease_seconds = 'NaN'::float8 OR lease_seconds <= 0 OR lease_seconds > 86400 THEN
        RAISE EXCEPTION 'lease_seconds must be in (0, 86400], got %', coalesce(lease_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => lease_seconds);
END
$$;
COMMENT ON FUNCTION zeroth._lease_interval(double precision) IS 'Internal: validates a lease duration in seconds (ZP008 unless 0 < s <= 86400).';
ALTER FUNCTION zeroth._lease_interval(double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lease_interval(double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._grace_interval(grace_seconds double precision) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF grace_seconds IS NULL OR grace_seconds = 'NaN'::float8 OR grace_seconds < 0 OR grace_seconds > 86400 THEN
        RAISE EXCEPTION 'grace_seconds must be in [0, 86400], got %', coalesce(grace_seconds::text, 'NULL')
            USING ERRCODE = 'ZP008';
    END IF;
    RETURN make_interval(secs => grace_seconds);
END
$$;
COMMENT ON FUNCTION zeroth._grace_interval(double precision) IS 'Internal: validates a takeover grace in seconds (ZP008 unless 0 <= s <= 86400).';
ALTER FUNCTION zeroth._grace_interval(double precision) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._grace_interval(double precision) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._require(condition boolean, message text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF condition IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require(boolean, text) IS 'Internal: raises ZP008 invalid_argument with the message unless the condition is true.';
ALTER FUNCTION zeroth._require(boolean, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require(boolean, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._require_identifier(value text, name text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IS NULL OR value = '' OR length(value) > 200 THEN
        RAISE EXCEPTION '% must be a non-empty string of at most 200 characters', name USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require_identifier(text, text) IS 'Internal: ZP008 unless value is a non-empty identifier of at most 200 characters.';
ALTER FUNCTION zeroth._require_identifier(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_identifier(text, text) FROM PUBLIC;

-- A caller's idempotency key may not start with 'zeroth-schedule:': fire_due_schedules keys each
-- fire so, and a run planted under the key of a future fire time would pass for that fire. The
-- prefix is matched exactly, as the unique index compares keys. Raises ZP011.
CREATE OR REPLACE FUNCTION zeroth._require_caller_key(idempotency_key text, name text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF starts_with(idempotency_key, 'zeroth-schedule:') THEN
        RAISE EXCEPTION '% may not start with ''zeroth-schedule:'' (reserved for the runs of schedules)', name
            USING ERRCODE = 'ZP011';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require_caller_key(text, text) IS 'Internal: ZP011 reserved_key when a caller''s idempotency key starts with zeroth-schedule: (the keys of fire_due_schedules).';
ALTER FUNCTION zeroth._require_caller_key(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_caller_key(text, text) FROM PUBLIC;

-- Checks the (run_ids, generations) arrays of a batch call: same length, no NULL, no repeated
-- run, at most 1000 entries (one statement's worth). Raises ZP008.
-- Whether a run's idempotency key fits its index (runs_idempotency_key_idx): PostgreSQL refuses an
-- index row over 2704 bytes (54000), a refusal the caller could only retry for ever. Identifiers
-- are bounded in characters, and 200 four-byte characters are 800 bytes, so the key's bytes are
-- bounded together with the scope's.
CREATE OR REPLACE FUNCTION zeroth._key_fits(tenant_id text, workspace_key text, deployment_ref text,
                                            idempotency_key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN idempotency_key IS NULL
        OR octet_length(tenant_id) + octet_length(workspace_key) + octet_length(deployment_ref)
           + octet_length(idempotency_key) <= 2600;
COMMENT ON FUNCTION zeroth._key_fits(text, text, text, text) IS 'Internal: true unless tenant, workspace key, deployment and idempotency key together exceed 2600 bytes (the idempotency index refuses rows over 2704).';
ALTER FUNCTION zeroth._key_fits(text, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._key_fits(text, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._require_lease_batch(run_ids uuid[], generations bigint[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- One statement, the checks in order (the first false one raises): a batch call runs this on
    -- every completion, and each PERFORM is a statement of its own.
    PERFORM zeroth._require(run_ids IS NOT NULL AND generations IS NOT NULL
                            AND cardinality(run_ids) = cardinality(generations),
                            'run_ids and generations must be arrays of the same length'),
            -- One dimension, subscripts from 1 (or empty): the callers pair the arrays by position.
            zeroth._require(coalesce(array_ndims(run_ids), 1) = 1
                            AND coalesce(array_ndims(generations), 1) = 1
                            AND coalesce(array_lower(run_ids, 1), 1) = 1
                            AND coalesce(array_lower(generations, 1), 1) = 1,
                            'run_ids and generations must be one-dimensional arrays indexed from 1'),
            zeroth._require(array_position(run_ids, NULL) IS NULL
                            AND array_position(generations, NULL) IS NULL,
                            'run_ids and generations must not contain NULL'),
            zeroth._require(cardinality(run_ids) <= 1000, 'at most 1000 runs per call'),
            zeroth._require(cardinality(run_ids) = (SELECT count(DISTINCT u) FROM unnest(run_ids) AS u),
                            'run_ids must not repeat a run');
END
$$;
COMMENT ON FUNCTION zeroth._require_lease_batch(uuid[], bigint[]) IS 'Internal: ZP008 unless run_ids and generations are equal-length one-dimensional arrays indexed from 1, NULL-free, at most 1000 long, without a repeated run.';
ALTER FUNCTION zeroth._require_lease_batch(uuid[], bigint[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_lease_batch(uuid[], bigint[]) FROM PUBLIC;
