-- sql/functions/internal/errors.sql: the errors of admin transitions, the bound on a stored error
-- document and the stop document of a run ended by someone else.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Raises ZP001 when no run has this id in this scope, else ZP003 naming the status that refused.
CREATE OR REPLACE FUNCTION zeroth._explain_admin_miss(tenant_id text, workspace_key text, run_id uuid, transition text,
                                           allowed zeroth.run_status[])
    RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status FROM zeroth.runs r
     WHERE r.tenant_id = _explain_admin_miss.tenant_id
       AND r.workspace_key = _explain_admin_miss.workspace_key
       AND r.run_id = _explain_admin_miss.run_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % not found in this scope', run_id USING ERRCODE = 'ZP001';
    END IF;
    RAISE EXCEPTION '% needs a run in status %, run % is %', transition, allowed, run_id, v_status
        USING ERRCODE = 'ZP003';
END
$$;
COMMENT ON FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) IS 'Internal: raise ZP001 (no such run in scope) or ZP003 (wrong status) after an admin UPDATE matched nothing.';
ALTER FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._explain_admin_miss(text, text, uuid, text, zeroth.run_status[]) FROM PUBLIC;

-- The bound on an error document: whatever a caller or a handler supplies,
-- what is stored in runs.error (and copied to run_attempts, child_runs) is at most
-- zeroth._error_document_bytes() = 1 MiB (1,048,576 bytes of stored jsonb: pg_column_size of the
-- uncompressed document) and each top-level string of it at most zeroth._error_text_chars() =
-- 65,536 characters. These two functions are the one place the numbers live (docs/sql-api.md,
-- "Error documents"; the Python worker's constant zeroth_pg.worker matches the text bound).
CREATE OR REPLACE FUNCTION zeroth._error_text_chars() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 65536;
COMMENT ON FUNCTION zeroth._error_text_chars() IS 'Internal: the most characters a top-level string of a stored error document keeps (65,536); longer ones are cut by zeroth._bounded_error.';
ALTER FUNCTION zeroth._error_text_chars() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._error_text_chars() FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._error_document_bytes() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 1048576;
COMMENT ON FUNCTION zeroth._error_document_bytes() IS 'Internal: the largest stored error document (1,048,576 bytes of uncompressed jsonb); a larger one is replaced by its summary (zeroth._error_summary).';
ALTER FUNCTION zeroth._error_document_bytes() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._error_document_bytes() FROM PUBLIC;

-- The summary that replaces an error document too large to keep even with its strings cut:
-- {truncated: true, original_bytes, message, type, stop_reason, worker_id, lease_generation}, the
-- keys the document had as scalars (message cut to the text bound, the three names to 1,000
-- characters), message taken from a document that is itself a string. Never more than about
-- 330 KB. Reads only what it keeps: nothing here serialises the document (a 256 MB document of
-- escaped characters would not fit in a text).
CREATE OR REPLACE FUNCTION zeroth._error_summary(error jsonb, original_bytes bigint)
    RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out jsonb := jsonb_build_object('truncated', true, 'original_bytes', _error_summary.original_bytes);
    v_key text;
    v_doc jsonb := _error_summary.error #> '{}';  -- detoasted once, not at every use
BEGIN
    IF jsonb_typeof(v_doc) = 'string' THEN
        RETURN v_out || jsonb_build_object(
            'message', left(v_doc #>> '{}', zeroth._error_text_chars()));
    ELSIF jsonb_typeof(v_doc) IS DISTINCT FROM 'object' THEN
        RETURN v_out;
    END IF;
    IF jsonb_typeof(v_doc -> 'message') = 'string' THEN
        v_out := v_out || jsonb_build_object(
            'message', left(v_doc ->> 'message', zeroth._error_text_chars()));
    END IF;
    FOREACH v_key IN ARRAY ARRAY['type', 'stop_reason', 'worker_id'] LOOP
        IF jsonb_typeof(v_doc -> v_key) = 'string' THEN
            v_out := v_out || jsonb_build_object(v_key, left(v_doc ->> v_key, 1000));
        END IF;
    END LOOP;
    IF jsonb_typeof(v_doc -> 'lease_generation') = 'number'
       AND pg_column_size(v_doc -> 'lease_generation') <= 64 THEN
        v_out := v_out || jsonb_build_object('lease_generation', v_doc -> 'lease_generation');
    END IF;
    RETURN v_out;
END
$$;
COMMENT ON FUNCTION zeroth._error_summary(jsonb, bigint) IS 'Internal: the bounded stand-in for an error document too large to store: {truncated, original_bytes} and its scalar message (cut to zeroth._error_text_chars()), type, stop_reason, worker_id (cut to 1,000 characters) and lease_generation.';
ALTER FUNCTION zeroth._error_summary(jsonb, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._error_summary(jsonb, bigint) FROM PUBLIC;

-- Every error document a caller supplies (fail_run, commit_fenced's error) or a function wraps
-- (zeroth._stop_error's previous_error) passes here before it is stored. Within the bounds it is
-- returned unchanged (the common case costs one size read: pg_column_size of the detoasted
-- document; a document of at most _error_text_chars() bytes holds no longer string). Else each
-- top-level string longer than _error_text_chars() characters is cut to that many and the
-- document gets "truncated": true; if it is still larger than _error_document_bytes(), or was
-- larger than 16 times that as given (not worth taking apart), it is replaced by
-- zeroth._error_summary. Never raises on any jsonb; never serialises it to text.
CREATE OR REPLACE FUNCTION zeroth._bounded_error(error jsonb)
    RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bytes bigint;
    v_out   jsonb;
    v_cut   boolean;
    v_doc   jsonb;
BEGIN
    IF _bounded_error.error IS NULL THEN
        RETURN NULL;
    END IF;
    -- #> '{}' is the document itself, detoasted (once: a value read from a table is decompressed
    -- at every use): its size, not the compressed one such a value (a caller's temporary table
    -- included) would report.
    v_doc := _bounded_error.error #> '{}';
    v_bytes := pg_column_size(v_doc);
    IF v_bytes <= zeroth._error_text_chars() THEN
        RETURN _bounded_error.error;
    END IF;
    IF jsonb_typeof(v_doc) = 'object' AND v_bytes <= 16 * zeroth._error_document_bytes() THEN
        -- octet_length is read from the header; left() scans only the characters it keeps.
        SELECT jsonb_object_agg(e.key, CASE WHEN e.cut THEN to_jsonb(e.kept) ELSE e.value END),
               bool_or(e.cut)
          INTO v_out, v_cut
          FROM (SELECT o.key, o.value, k.kept, k.kept IS NOT NULL AS cut
                  FROM jsonb_each(v_doc) AS o
                  LEFT JOIN LATERAL (
                      SELECT left(t.s, zeroth._error_text_chars()) AS kept
                        FROM (SELECT o.value #>> '{}' AS s) AS t
                       WHERE octet_length(t.s) > zeroth._error_text_chars()
                         AND octet_length(left(t.s, zeroth._error_text_chars())) < octet_length(t.s)) AS k
                    ON jsonb_typeof(o.value) = 'string') AS e;
        IF NOT v_cut THEN
            v_out := v_doc;
        ELSE
            v_out := v_out || '{"truncated": true}'::jsonb;
        END IF;
        IF pg_column_size(v_out #> '{}') <= zeroth._error_document_bytes() THEN
            RETURN v_out;
        END IF;
    ELSIF jsonb_typeof(v_doc) = 'string'
          AND v_bytes <= zeroth._error_document_bytes()
          AND length(v_doc #>> '{}') <= zeroth._error_text_chars() THEN
        RETURN v_doc;
    ELSIF jsonb_typeof(v_doc) NOT IN ('string', 'object')
          AND v_bytes <= zeroth._error_document_bytes() THEN
        RETURN v_doc;
    END IF;
    RETURN zeroth._error_summary(v_doc, v_bytes);
END
$$;
COMMENT ON FUNCTION zeroth._bounded_error(jsonb) IS 'Internal: the error document as stored: unchanged within the bounds; else each top-level string cut to zeroth._error_text_chars() characters and "truncated": true; still over zeroth._error_document_bytes() bytes (or over 16 times that as given) → zeroth._error_summary. Never raises, never serialises the document.';
ALTER FUNCTION zeroth._bounded_error(jsonb) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._bounded_error(jsonb) FROM PUBLIC;

-- The error document of a run ended by someone other than its owner. The run's previous error is
-- kept as previous_error, bounded (zeroth._bounded_error), and replaced by its summary when the
-- whole would pass the document bound; the message (a caller's, e.g. claim_for_takeover's) is cut
-- to the text bound. So a stop document is never larger than the bound, however often a run is
-- stopped and whatever its previous error was.
CREATE OR REPLACE FUNCTION zeroth._stop_error(stop_reason text, message text, worker_id text, generation bigint, previous jsonb)
    RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_doc  jsonb := jsonb_build_object('stop_reason', left(_stop_error.stop_reason, 1000),
                                       'message', left(_stop_error.message, zeroth._error_text_chars()),
                                       'worker_id', left(_stop_error.worker_id, 1000),
                                       'lease_generation', _stop_error.generation);
    v_prev jsonb := zeroth._bounded_error(_stop_error.previous);
BEGIN
    IF v_prev IS NULL THEN
        RETURN v_doc;
    END IF;
    IF pg_column_size(v_doc #> '{}') + pg_column_size(v_prev #> '{}') + 64 > zeroth._error_document_bytes() THEN
        v_prev := zeroth._error_summary(v_prev, pg_column_size(v_prev #> '{}'));
    END IF;
    RETURN v_doc || jsonb_build_object('previous_error', v_prev);
END
$$;
COMMENT ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) IS 'Internal: the error document of a run ended by someone other than its owner ({stop_reason, message, worker_id, lease_generation[, previous_error]}), within the error document bound (zeroth._bounded_error; previous_error summarised when the whole would pass it).';
ALTER FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._stop_error(text, text, text, bigint, jsonb) FROM PUBLIC;
