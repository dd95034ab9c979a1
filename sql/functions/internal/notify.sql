-- sql/functions/internal/notify.sql: opaque NOTIFY payloads (keys derived from zeroth.notification_secret).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The payload a notification about `subject` carries: 128 bits of sha256(secret, kind, subject),
-- hex. Without the secret a listener learns nothing from it and cannot compute the key of any
-- other subject; NULL parts (the null workspace) hash apart from every string.
CREATE OR REPLACE FUNCTION zeroth._notify_key(kind text, subject text[]) RETURNS text
    LANGUAGE sql STABLE
    -- The subject as an array literal: quoted elements and an unquoted NULL, so no character
    -- inside an identifier can make two subjects alike (a joined string with separator
    -- characters could: (t, NULL, d) and (t, chr(30), d) got the same key).
    RETURN (SELECT left(encode(sha256(convert_to(
                       s.secret || chr(31) || kind || chr(31) || subject::text, 'UTF8')), 'hex'), 32)
              FROM zeroth.notification_secret s);
COMMENT ON FUNCTION zeroth._notify_key(text, text[]) IS 'Internal: the opaque NOTIFY payload for a subject: 32 hex digits of sha256(secret, kind, subject).';
ALTER FUNCTION zeroth._notify_key(text, text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify_key(text, text[]) FROM PUBLIC;

-- Every NOTIFY of the package, and only while the notification queue is less than half full.
-- NOTIFY and LISTEN need no privilege: a LOGIN role with no grant can LISTEN, sit idle in a
-- transaction (so the queue's tail cannot advance) and fill the rest of the queue with its own
-- notifications. A transaction that notifies into a full queue fails at COMMIT, where no function
-- can catch it, so a full queue would have failed every enqueue, completion and cancel that
-- notifies (red-team finding F2: successful runs ended dead-lettered). A notification is only a
-- hint (workers poll), so dropping it while the queue is under pressure loses nothing; at half
-- full there is room left for every notification this transaction can still add before it
-- commits. Monitor pg_notification_queue_usage() and set idle_in_transaction_session_timeout
-- (docs/dba-guide.md).
CREATE OR REPLACE FUNCTION zeroth._notify(channel text, payload text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT pg_notify(channel, payload) WHERE pg_notification_queue_usage() < 0.5;
    END;
COMMENT ON FUNCTION zeroth._notify(text, text) IS 'Internal: pg_notify(channel, payload) unless the notification queue is half full or more (a notification is a hint; a full queue fails the notifying transaction at COMMIT).';
ALTER FUNCTION zeroth._notify(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify(text, text) FROM PUBLIC;

-- Work may be claimable in (deployment, tenant, workspace): NOTIFY zeroth_wakeup with that
-- scope's key. PostgreSQL folds identical payloads within one transaction, so a batch notifies once.
CREATE OR REPLACE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT zeroth._notify('zeroth_wakeup', zeroth._notify_key('wakeup', ARRAY[tenant_id, workspace_id, deployment_ref]));
    END;
COMMENT ON FUNCTION zeroth._notify_wakeup(text, text, text) IS 'Internal: NOTIFY zeroth_wakeup with the opaque key of (tenant, workspace, deployment).';
ALTER FUNCTION zeroth._notify_wakeup(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify_wakeup(text, text, text) FROM PUBLIC;

-- A cancel was requested for a run the worker holds: NOTIFY zeroth_control with the worker's key.
-- The worker confirms with renew_leases (which reports cancel_requested) before it stops anything.
CREATE OR REPLACE FUNCTION zeroth._notify_control(worker_id text) RETURNS void
    LANGUAGE sql VOLATILE
    BEGIN ATOMIC
        SELECT zeroth._notify('zeroth_control', zeroth._notify_key('control', ARRAY[worker_id]));
    END;
COMMENT ON FUNCTION zeroth._notify_control(text) IS 'Internal: NOTIFY zeroth_control with the opaque key of a worker id.';
ALTER FUNCTION zeroth._notify_control(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify_control(text) FROM PUBLIC;
