-- 0012_rate_limits: rate limits (issue 15): at most max_starts starts per period_seconds on a named
-- key, enforced fleet-wide inside every claim, on the database clock, in a rolling window.
--
--   * zeroth.rate_limits: name → max_starts, period_seconds. Written by zeroth_owner (a DBA, by
--     zeroth.set_rate_limit or plain SQL); last_start_at is kept by the claims. A claim locks the
--     key's row FOR UPDATE SKIP LOCKED: claimers of one key serialise without ever waiting.
--   * zeroth.rate_limit_starts: the sliding log of a key's starts, one row per claim that started
--     something (started_at rounded up to period / 1000, how many: at most ~1000 rows a key). A claim starts k more only if the starts logged after
--     (now - period) plus k stay within max_starts; it prunes the entries older than the window.
--   * zeroth.scope_limits.rate_limit: the key a (tenant, workspace, deployment) scope draws from.
--     Several scopes may share one key (one provider's quota used by several kinds of work).
--   * claimed_run / scope_claimed_run gain retry_at and retry_after: set when the scope's rate
--     limit held the claim back (the run_id-NULL row) or cut its batch short (every claimed row):
--     the earliest database time a start becomes possible, and the seconds from the claim's
--     database time until then (what a worker sleeps: no clock of its own involved).

CREATE TABLE zeroth.rate_limits (
    name           text             NOT NULL,
    max_starts     integer          NOT NULL,
    period_seconds double precision NOT NULL,
    last_start_at  timestamptz,
    note           text,
    CONSTRAINT rate_limits_pkey PRIMARY KEY (name),
    CONSTRAINT rate_limits_name_valid CHECK (name <> '' AND length(name) <= 200),
    CONSTRAINT rate_limits_max_starts_valid CHECK (max_starts BETWEEN 1 AND 1000000),
    CONSTRAINT rate_limits_period_valid CHECK (period_seconds >= 0.001 AND period_seconds <= 86400)
);
COMMENT ON TABLE zeroth.rate_limits IS 'Rate limits a DBA sets: at most max_starts starts in any rolling window of period_seconds, fleet-wide, for every scope whose zeroth.scope_limits row names the key (rate_limit). Every claim reads the row on each call. Written by zeroth_owner (zeroth.set_rate_limit or SQL); zeroth_reader sees the keys its tenant''s scopes use.';
COMMENT ON COLUMN zeroth.rate_limits.max_starts IS 'Starts allowed in any window of period_seconds (1-1000000).';
COMMENT ON COLUMN zeroth.rate_limits.period_seconds IS 'The rolling window, in seconds (0.001-86400).';
COMMENT ON COLUMN zeroth.rate_limits.last_start_at IS 'Kept by the claims: the database time of the last claim that started runs under the key.';
COMMENT ON COLUMN zeroth.rate_limits.note IS 'Free text for the DBA (whose quota this is).';
ALTER TABLE zeroth.rate_limits OWNER TO zeroth_owner;
ALTER TABLE zeroth.rate_limits ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.rate_limits FROM PUBLIC;

CREATE TABLE zeroth.rate_limit_starts (
    name       text        NOT NULL,
    started_at timestamptz NOT NULL,
    starts     integer     NOT NULL,
    CONSTRAINT rate_limit_starts_pkey PRIMARY KEY (name, started_at),
    CONSTRAINT rate_limit_starts_name_fkey FOREIGN KEY (name) REFERENCES zeroth.rate_limits (name)
        ON UPDATE CASCADE ON DELETE CASCADE,
    CONSTRAINT rate_limit_starts_starts_positive CHECK (starts >= 1)
);
COMMENT ON TABLE zeroth.rate_limit_starts IS 'The sliding log of each rate limit: how many runs the claims started under the key at each database time, rounded up to a thousandth of the period (a start counts at most period/1000 longer, never shorter; at most about 1000 rows per key). Written by the claims only (pruned of entries older than the window by the claim itself); no role but zeroth_owner reads it.';
ALTER TABLE zeroth.rate_limit_starts OWNER TO zeroth_owner;
ALTER TABLE zeroth.rate_limit_starts ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.rate_limit_starts FROM PUBLIC;

ALTER TABLE zeroth.scope_limits ADD COLUMN rate_limit text
    CONSTRAINT scope_limits_rate_limit_fkey REFERENCES zeroth.rate_limits (name)
        ON UPDATE CASCADE ON DELETE RESTRICT;
COMMENT ON COLUMN zeroth.scope_limits.rate_limit IS 'The zeroth.rate_limits key the scope''s starts count against (NULL: no rate limit). Several scopes may name one key and share its budget. A key still named here cannot be deleted.';
CREATE INDEX scope_limits_rate_limit_idx ON zeroth.scope_limits (rate_limit)
    WHERE rate_limit IS NOT NULL;

GRANT SELECT ON zeroth.rate_limits TO zeroth_reader;
CREATE POLICY rate_limits_reader_tenant ON zeroth.rate_limits FOR SELECT TO zeroth_reader
    USING (EXISTS (SELECT 1 FROM zeroth.scope_limits l
                    WHERE l.rate_limit = rate_limits.name
                      AND l.tenant_id = current_setting('zeroth.tenant_id', true)));
COMMENT ON POLICY rate_limits_reader_tenant ON zeroth.rate_limits IS 'zeroth_reader sees the keys named by a scope of the tenant in the setting zeroth.tenant_id (none when unset).';

ALTER TYPE zeroth.claimed_run ADD ATTRIBUTE retry_at timestamptz;
ALTER TYPE zeroth.claimed_run ADD ATTRIBUTE retry_after double precision;
ALTER TYPE zeroth.scope_claimed_run ADD ATTRIBUTE retry_at timestamptz;
ALTER TYPE zeroth.scope_claimed_run ADD ATTRIBUTE retry_after double precision;
COMMENT ON TYPE zeroth.claimed_run IS 'A row of a claim: a leased run, or with run_id NULL what the claim saw instead (active_count, concurrency_saturated, concurrency_limit). retry_at / retry_after (seconds from the claim''s database time): the scope''s rate limit held the claim back (run_id NULL) or cut its batch short (claimed rows); no start is possible before then.';
COMMENT ON TYPE zeroth.scope_claimed_run IS 'A row of claim_and_start_scopes: a claimed run with its scope (tenant, workspace, deployment), or a row with run_id NULL per scope that had claimable work but no free slot (saturated, or paused: concurrency_limit 0) or was held back by its rate limit (retry_at: the earliest time a start becomes possible).';
