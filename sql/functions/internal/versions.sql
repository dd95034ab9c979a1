-- sql/functions/internal/versions.sql: code versions (issue 34, item 3): the check of a declared
-- version and the set of run versions a worker's version may resume under its deployment's
-- version_policy (zeroth.deployments, migration 0021).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- A code version is a label a worker declares and every run it starts records: 1 to 128
-- characters, a letter or digit first, then letters, digits and . _ - + : / (a date, a semver, a
-- git sha, "2026.12.05-abc123", "v2+build.7", "main/abc123"): no space, quote or control
-- character reaches a log line, a CLI table or a page. NULL (unversioned) passes. ZP008 otherwise.
CREATE OR REPLACE FUNCTION zeroth._check_code_version(code_version text, field text DEFAULT 'code_version')
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF code_version IS NOT NULL
       AND (length(code_version) > 128
            OR code_version !~ '^[A-Za-z0-9][A-Za-z0-9._+:/-]*$') THEN
        RAISE EXCEPTION '% must be 1 to 128 characters: a letter or digit, then letters, digits and . _ - + : / (got % characters)',
            field, length(code_version) USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._check_code_version(text, text) IS 'Internal: ZP008 unless a code version is NULL or 1 to 128 characters, a letter or digit first, then letters, digits and . _ - + : /.';
ALTER FUNCTION zeroth._check_code_version(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._check_code_version(text, text) FROM PUBLIC;

-- The key of a code version (runs.code_version_id): the first 8 bytes of its sha256, as a
-- bigint; NULL for NULL. The same in every database and on every platform, forever (a
-- collision of two versions' keys has a chance of about n^2 / 2^65 for n versions).
-- STABLE, as its body is (convert_to), so that the planner inlines it (issue 30: one declared
-- IMMUTABLE over a STABLE body is called instead, and before PostgreSQL 18 a called SQL function
-- is parsed and planned again at every call).
CREATE OR REPLACE FUNCTION zeroth._code_version_hash(code_version text) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN ('x' || left(encode(sha256(convert_to(code_version, 'UTF8')), 'hex'), 16))::bit(64)::bigint;
COMMENT ON FUNCTION zeroth._code_version_hash(text) IS 'Internal: the key of a code version (runs.code_version_id): the first 8 bytes of its sha256 as a bigint; NULL for NULL.';
ALTER FUNCTION zeroth._code_version_hash(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._code_version_hash(text) FROM PUBLIC;

-- The advisory lock of a code version's row in zeroth.code_versions (issue 34: prune_runs prunes
-- the versions no run references): the two-key form, so it shares no key with the one-key locks
-- of the wakeup gates. Every writer of a reference (the claims, an owned admission, start_run,
-- retire_code_version) tries it shared and holds it until its commit, from
-- zeroth._code_version_id on; prune_runs tries it exclusive before it deletes the version. Both
-- only try: neither ever waits on it. Two versions may share a lock (the low 31 bits of the key):
-- a prune then skips one.
CREATE OR REPLACE FUNCTION zeroth._code_version_lock(version_id bigint, OUT class_id integer,
                                                     OUT object_id integer)
    -- (PL/pgSQL: a SQL function with OUT arguments is not inlined; before PostgreSQL 18 it is
    -- parsed and planned again at every call.)
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    class_id := 1936029554;
    object_id := (_code_version_lock.version_id & 2147483647)::integer;
END
$$;
COMMENT ON FUNCTION zeroth._code_version_lock(bigint) IS 'Internal: the advisory lock (two-key form) of a code version''s zeroth.code_versions row: tried shared by every writer of a reference to it (zeroth._code_version_id) and held until commit, tried exclusive by prune_runs before it deletes the version; never waited on.';
ALTER FUNCTION zeroth._code_version_lock(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._code_version_lock(bigint) FROM PUBLIC;

-- The key of a declared code version (checked first: ZP008), its text recorded in
-- zeroth.code_versions the first time (one index probe a call; the insert never waits on another
-- writer: no unique constraint); NULL for NULL, with no statement at all. Tries the version's
-- advisory lock shared, held until commit (zeroth._code_version_lock): a prune_runs that comes
-- later sees it and skips the version, so the run's reference (uncommitted, invisible to a
-- prune) keeps its text. It only *tries*: any LOGIN role can take any advisory key, and the key
-- of a version is computable from its text, so a wait here would let a stranger stall every
-- claim of that version (tests/adversarial/test_locks.py). When the try fails (a prune deleting
-- the version this moment, or a stranger holding the key) the claim goes on without it and writes
-- a second row of the text unless two are visible (readers take one: LIMIT 1), which a prune in
-- flight cannot see and so does not delete.
CREATE OR REPLACE FUNCTION zeroth._code_version_id(code_version text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
BEGIN
    IF code_version IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM zeroth._check_code_version(code_version);
    v_id := zeroth._code_version_hash(code_version);
    IF (SELECT pg_try_advisory_xact_lock_shared(l.class_id, l.object_id)
          FROM zeroth._code_version_lock(v_id) AS l) THEN
        INSERT INTO zeroth.code_versions (version_id, code_version, first_seen_at)
        SELECT v_id, _code_version_id.code_version, zeroth._now()
         WHERE NOT EXISTS (SELECT 1 FROM zeroth.code_versions v WHERE v.version_id = v_id);
    ELSE
        -- A prune may be deleting the row this moment (uncommitted, still visible here): write a
        -- second one, which that prune cannot see, unless two are visible already (a stranger
        -- holding the key then adds no row after the first such claim).
        INSERT INTO zeroth.code_versions (version_id, code_version, first_seen_at)
        SELECT v_id, _code_version_id.code_version, zeroth._now()
         WHERE (SELECT count(*) FROM (SELECT FROM zeroth.code_versions v
                                       WHERE v.version_id = v_id LIMIT 2) AS seen) < 2;
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION zeroth._code_version_id(text) IS 'Internal: the key (zeroth._code_version_hash) of a declared code version, its text recorded in zeroth.code_versions when first seen or pruned (never waiting on another writer nor on an advisory lock: it tries the version''s advisory lock shared, held until commit, so prune_runs leaves a version being referenced alone; when the try fails it goes on and writes a second row of the text unless two are visible, which a prune in flight cannot delete); NULL for NULL; ZP008 for a malformed one.';
ALTER FUNCTION zeroth._code_version_id(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._code_version_id(text) FROM PUBLIC;

-- The key of a code version a claim declares (checked first: ZP008), recording nothing: the
-- claims record its text (zeroth._code_version_id) only once they leased a run, so a
-- zeroth_worker that leases nothing cannot grow zeroth.code_versions (read by every tenant's
-- reader, never pruned) one row a call. NULL for NULL, with no statement at all (every claim of
-- an unversioned worker calls it; the check's PERFORM is one: issue 30, sixth session).
CREATE OR REPLACE FUNCTION zeroth._declared_code_version(code_version text) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF code_version IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM zeroth._check_code_version(code_version);
    RETURN zeroth._code_version_hash(code_version);
END
$$;
COMMENT ON FUNCTION zeroth._declared_code_version(text) IS 'Internal: the key (zeroth._code_version_hash) of a code version a claim declares, checked (ZP008), its text not recorded (the claims record it with zeroth._code_version_id once they leased a run); NULL for NULL.';
ALTER FUNCTION zeroth._declared_code_version(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._declared_code_version(text) FROM PUBLIC;

-- The run versions (keys) a worker of code_version may resume in deployment_ref (one
-- primary-key lookup of zeroth.deployments; no lock): NULL when it may resume every run (policy
-- any, the default, or no registered row: the claim then filters nothing); under same, its own
-- version (none for an unversioned worker); under compatible, the whole compatible set when its
-- version is in it, else its own. Whatever the policy, a run never started (started_at NULL) or
-- started by an unversioned worker (code_version_id NULL) is claimable by every worker: the
-- claims test `serves IS NULL OR r.started_at IS NULL OR r.code_version_id IS NULL OR
-- r.code_version_id = ANY (serves)`. The policy is a DBA's (set_version_policy only), so it binds
-- every session (zeroth._policy_binds_caller's rule for a DBA's row).
-- PL/pgSQL for the reason zeroth._scope_limit gives (every claim calls it).
CREATE OR REPLACE FUNCTION zeroth._version_serves(deployment_ref text, code_version text)
    RETURNS bigint[]
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN d.version_policy <> 'any' THEN ARRAY(
                       SELECT zeroth._code_version_hash(v.code_version)
                         FROM unnest(CASE WHEN d.version_policy = 'compatible'
                                               AND _version_serves.code_version = ANY (d.compatible_versions)
                                          THEN d.compatible_versions
                                          ELSE ARRAY[_version_serves.code_version] END) AS v(code_version)
                        WHERE v.code_version IS NOT NULL)
                   END
              FROM zeroth.deployments d
             WHERE d.deployment_ref = _version_serves.deployment_ref);
END
$$;
COMMENT ON FUNCTION zeroth._version_serves(text, text) IS 'Internal: the keys (zeroth._code_version_hash) of the run versions a worker of code_version may resume under the deployment''s version_policy: NULL = every run (any, or no registry row), same = its own (none when unversioned), compatible = the set when its version is in it, else its own. Runs never started or started unversioned are claimable by every worker.';
ALTER FUNCTION zeroth._version_serves(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._version_serves(text, text) FROM PUBLIC;
