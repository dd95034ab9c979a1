-- set_scope_limits: admin (a DBA, as zeroth_owner): create or change the zeroth.scope_limits row
-- of one scope (tenant, workspace, deployment), the one place its claims read their limits from.
-- Each argument left NULL keeps the row's value (a new row: the defaults): paused; max_concurrency
-- (1-10000, 0 removes the limit); weight (1-1000); rate_limit (a zeroth.rate_limits key, '' removes
-- it); note. Takes effect on the next claim of every worker. Locks the scope's row. Raises ZP006,
-- ZP008 (a bad value, or a rate limit key that does not exist). Time: none.
CREATE OR REPLACE FUNCTION zeroth.set_scope_limits(
    deployment_ref  text,
    tenant_id       text    DEFAULT NULL,
    workspace_id    text    DEFAULT NULL,
    paused          boolean DEFAULT NULL,
    max_concurrency integer DEFAULT NULL,
    weight          integer DEFAULT NULL,
    rate_limit      text    DEFAULT NULL,
    note            text    DEFAULT NULL)
    RETURNS zeroth.scope_limits
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(set_scope_limits.tenant_id, set_scope_limits.workspace_id);
    v_row    zeroth.scope_limits;
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(set_scope_limits.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    PERFORM zeroth._require(set_scope_limits.workspace_id IS NULL
                            OR (set_scope_limits.workspace_id <> ''
                                AND length(set_scope_limits.workspace_id) <= 200),
                            'workspace_id must be NULL or a non-empty string of at most 200 characters');
    PERFORM zeroth._require(set_scope_limits.max_concurrency IS NULL
                            OR set_scope_limits.max_concurrency BETWEEN 0 AND 10000,
                            'max_concurrency must be between 1 and 10000 (0 removes the limit)');
    PERFORM zeroth._require(set_scope_limits.weight IS NULL
                            OR set_scope_limits.weight BETWEEN 1 AND 1000,
                            'weight must be between 1 and 1000');
    PERFORM zeroth._require(set_scope_limits.note IS NULL OR length(set_scope_limits.note) <= 1000,
                            'note must be at most 1000 characters');
    IF set_scope_limits.rate_limit IS NOT NULL AND set_scope_limits.rate_limit <> '' THEN
        PERFORM zeroth._require_identifier(set_scope_limits.rate_limit, 'rate_limit');
        IF NOT EXISTS (SELECT 1 FROM zeroth.rate_limits k WHERE k.name = set_scope_limits.rate_limit) THEN
            RAISE EXCEPTION 'no rate limit named "%" (create it with set_rate_limit first)',
                left(set_scope_limits.rate_limit, 200) USING ERRCODE = 'ZP008';
        END IF;
    END IF;
    INSERT INTO zeroth.scope_limits AS l (tenant_id, workspace_id, deployment_ref, max_concurrency,
                                          weight, paused, note, rate_limit)
    VALUES (v_tenant, set_scope_limits.workspace_id, set_scope_limits.deployment_ref,
            nullif(set_scope_limits.max_concurrency, 0), coalesce(set_scope_limits.weight, 1),
            coalesce(set_scope_limits.paused, false), set_scope_limits.note,
            nullif(set_scope_limits.rate_limit, ''))
    ON CONFLICT ON CONSTRAINT scope_limits_pkey DO UPDATE
       SET max_concurrency = CASE WHEN set_scope_limits.max_concurrency IS NULL THEN l.max_concurrency
                                  ELSE excluded.max_concurrency END,
           weight = coalesce(set_scope_limits.weight, l.weight),
           paused = coalesce(set_scope_limits.paused, l.paused),
           note = coalesce(set_scope_limits.note, l.note),
           rate_limit = CASE WHEN set_scope_limits.rate_limit IS NULL THEN l.rate_limit
                             ELSE excluded.rate_limit END
    RETURNING l.* INTO v_row;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION zeroth.set_scope_limits(text, text, text, boolean, integer, integer, text, text) IS
'set_scope_limits: admin: create or change the zeroth.scope_limits row of one scope (tenant, workspace, deployment). A NULL argument keeps the value (a new row: the defaults): paused (true: nothing in the scope is leased), max_concurrency (1-10000; 0 removes the limit), weight (1-1000), rate_limit (an existing zeroth.rate_limits key; empty string removes it), note. The next claim of every worker applies it. Granted to nobody: a member of zeroth_owner runs it. Raises ZP006 invalid_scope, ZP008 invalid_argument. Returns the row. Time: none.';
ALTER FUNCTION zeroth.set_scope_limits(text, text, text, boolean, integer, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.set_scope_limits(text, text, text, boolean, integer, integer, text, text) FROM PUBLIC;
