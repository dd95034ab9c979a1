-- sql/functions/internal/notify.sql: opaque NOTIFY payloads (keys derived from zeroth.notification_secret).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- The payload a notification about `subject` carries: 128 bits of sha256(secret, kind, subject),
-- hex. Without the secret a listener learns nothing from it and cannot compute the key of any
-- other subject; NULL parts (the null workspace) hash apart from every string.
-- PL/pgSQL, not SQL: a scalar SQL function with a query is not inlined, and before PostgreSQL 18
-- it is parsed and planned again at every call (~50 µs of every enqueue and claim on PostgreSQL
-- 15; issue 30); PL/pgSQL keeps its plan for the session.
CREATE OR REPLACE FUNCTION zeroth._notify_key(kind text, subject text[]) RETURNS text
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- The subject as an array literal: quoted elements and an unquoted NULL, so no character
    -- inside an identifier can make two subjects alike (a joined string with separator
    -- characters could: (t, NULL, d) and (t, chr(30), d) got the same key).
    RETURN (SELECT left(encode(sha256(convert_to(
                       s.secret || chr(31) || _notify_key.kind || chr(31) || _notify_key.subject::text,
                       'UTF8')), 'hex'), 32)
              FROM zeroth.notification_secret s);
END
$$;
COMMENT ON FUNCTION zeroth._notify_key(text, text[]) IS 'Internal: the opaque NOTIFY payload for a subject: 32 hex digits of sha256(secret, kind, subject).';
ALTER FUNCTION zeroth._notify_key(text, text[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify_key(text, text[]) FROM PUBLIC;

-- Every NOTIFY of the package, and only while the notification queue is less than half full.
-- NOTIFY and LISTEN need no privilege: a LOGIN role with no grant can LISTEN, sit idle in a
-- transaction (so the queue's tail cannot advance) and fill the rest of the queue with its own
-- notifications. A transaction that notifies into a full queue fails at COMMIT, where no function
-- can catch it, so a full queue would have failed every enqueue, completion and cancel that
-- notifies (successful runs would end dead-lettered). A notification is only a
-- hint (workers poll), so dropping it while the queue is under pressure loses nothing; at half
-- full there is room left for every notification this transaction can still add before it
-- commits. Monitor pg_notification_queue_usage() and set idle_in_transaction_session_timeout
-- (docs/dba-guide.md).
-- PL/pgSQL, not SQL: before PostgreSQL 18 a SQL function that is not inlined is parsed and
-- planned again at every call (issue 30); PL/pgSQL keeps its plans for the session.
CREATE OR REPLACE FUNCTION zeroth._notify(channel text, payload text) RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF pg_notification_queue_usage() < 0.5 THEN
        PERFORM pg_notify(channel, payload);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._notify(text, text) IS 'Internal: pg_notify(channel, payload) unless the notification queue is half full or more (a notification is a hint; a full queue fails the notifying transaction at COMMIT).';
ALTER FUNCTION zeroth._notify(text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._notify(text, text) FROM PUBLIC;

-- Wakeups are sent only to a scope that has an idle worker: the wakeup gate (docs/performance.md,
-- "NOTIFY"). PostgreSQL takes one cluster-wide lock in the commit of every transaction that
-- queued a notification and holds it until that commit is flushed, so notifying transactions
-- commit one at a time (no group commit): with a NOTIFY in every enqueue, 64 concurrent producers
-- on a durable server lost 55-69% of their throughput. A worker only needs a wakeup while it
-- waits for work, so a waiting worker says so with session advisory locks, and a writer notifies
-- only when it sees one.
--
-- The gate of a scope is 8 advisory locks, one bigint key per stripe (zeroth._wakeup_lock: 61
-- bits of the scope's wakeup key, the stripe 0..7 in the low 3). A worker that found nothing to claim takes every stripe it can
-- in exclusive mode, session-level (announce_idle) and then claims once more; when it has more
-- work than slots it lets them go (announce_busy). Nothing may be written on that session: a
-- session's own locks never conflict with its writes, so they would never notify (F4). A writer that made work claimable tries the shared lock
-- of ONE stripe (its transaction id modulo the stripe count), transaction-level:
--   * the try fails: a waiting worker holds the stripe → NOTIFY (as before);
--   * the try succeeds: nobody waits on this stripe now, and the writer now holds the stripe until
--     it commits, so no worker can take it before this run is committed and visible. A worker
--     that did not get every stripe keeps claiming on a short backoff, and a worker that gets the
--     stripe claims once more right after: the run is found by that claim, not by a NOTIFY.
-- No writer ever waits (try locks), writers never conflict with each other (shared), and a writer
-- that holds its stripe for a long transaction hides only its stripe from the waiting workers.
-- The gate is a hint like the NOTIFY it gates: a stranger who takes these locks (advisory locks
-- need no privilege) can make writers notify (today's cost) or keep workers from taking a stripe
-- (those writers' runs are found by the workers' polls: latency, never a lost run).
CREATE OR REPLACE FUNCTION zeroth._wakeup_lock(tenant_id text, workspace_id text, deployment_ref text)
    RETURNS bigint
    LANGUAGE sql STABLE
    -- 61 bits of a key of its own ('wakeup_gate', not the NOTIFY payload's 'wakeup': a stranger
    -- who hears a payload cannot match it to a lock in pg_locks) and the
    -- stripe in the low 3: two scopes share a gate only if 61 bits of sha256 agree (32 bits
    -- collide at ~77,000 scopes).
    RETURN ('x' || left(zeroth._notify_key('wakeup_gate', ARRAY[tenant_id, workspace_id, deployment_ref]), 16))
               ::bit(64)::bigint & ~7::bigint;
COMMENT ON FUNCTION zeroth._wakeup_lock(text, text, text) IS 'Internal: the advisory lock key of stripe 0 of a scope''s wakeup gate (61 bits of its own opaque key, low 3 bits zero); stripe s is key + s.';
ALTER FUNCTION zeroth._wakeup_lock(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._wakeup_lock(text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._wakeup_stripes() RETURNS integer
    LANGUAGE sql IMMUTABLE
    RETURN 8;
COMMENT ON FUNCTION zeroth._wakeup_stripes() IS 'Internal: how many advisory locks (stripes) a scope''s wakeup gate has.';
ALTER FUNCTION zeroth._wakeup_stripes() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._wakeup_stripes() FROM PUBLIC;

-- The stripes of the gate at `lock` that this session holds (session level, exclusive), from
-- pg_locks: announce_idle and announce_busy read them instead of trusting the caller, so a
-- client that lost count can neither take a stripe twice (session locks are re-entrant: it stayed
-- held after announce_busy) nor believe it holds one it does not. A bigint
-- advisory key k shows as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
-- (PL/pgSQL for the reason zeroth._notify_key gives.)
CREATE OR REPLACE FUNCTION zeroth._wakeup_stripes_held(lock bigint) RETURNS integer[]
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(l.objid::bigint - (_wakeup_stripes_held.lock & 4294967295)
                                      ORDER BY l.objid), '{}')::integer[]
              FROM pg_catalog.pg_locks l
             WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
               AND l.mode = 'ExclusiveLock' AND l.objsubid = 1
               AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                  WHERE d.datname = current_database())
               AND l.classid::bigint = (_wakeup_stripes_held.lock >> 32) & 4294967295
               AND l.objid::bigint - (_wakeup_stripes_held.lock & 4294967295)
                   BETWEEN 0 AND zeroth._wakeup_stripes() - 1);
END
$$;
COMMENT ON FUNCTION zeroth._wakeup_stripes_held(bigint) IS 'Internal: the stripes of the wakeup gate at this key that this session holds (from pg_locks).';
ALTER FUNCTION zeroth._wakeup_stripes_held(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._wakeup_stripes_held(bigint) FROM PUBLIC;

-- The gate of a whole deployment: fleet workers that serve every scope of a deployment
-- (claim_and_start_scopes) wait on it (announce_idle_deployment), since they cannot hold the gate
-- of every scope there is. Same stripes and rules as a scope's gate, under a label of its own.
CREATE OR REPLACE FUNCTION zeroth._wakeup_lock_deployment(deployment_ref text)
    RETURNS bigint
    LANGUAGE sql STABLE
    RETURN ('x' || left(zeroth._notify_key('wakeup_gate_deployment', ARRAY[deployment_ref]), 16))
               ::bit(64)::bigint & ~7::bigint;
COMMENT ON FUNCTION zeroth._wakeup_lock_deployment(text) IS 'Internal: the advisory lock key of stripe 0 of a deployment''s wakeup gate (fleet workers serving every scope of it); stripe s is key + s.';
ALTER FUNCTION zeroth._wakeup_lock_deployment(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._wakeup_lock_deployment(text) FROM PUBLIC;

-- The two halves every announce function shares, for the gate whose stripe 0 is `lock`: take
-- the stripes this session does not hold yet (session-level, exclusive, never waiting) and
-- return every stripe it then holds; or let go of every stripe it holds and count them.
CREATE OR REPLACE FUNCTION zeroth._take_wakeup_stripes(lock bigint) RETURNS integer[]
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_held integer[] := zeroth._wakeup_stripes_held(lock);
BEGIN
    FOR v_stripe IN 0 .. zeroth._wakeup_stripes() - 1 LOOP
        IF NOT v_stripe = ANY (v_held) AND pg_try_advisory_lock(lock + v_stripe) THEN
            v_held := v_held || v_stripe;
        END IF;
    END LOOP;
    RETURN (SELECT coalesce(array_agg(s ORDER BY s), '{}') FROM unnest(v_held) s);
END
$$;
COMMENT ON FUNCTION zeroth._take_wakeup_stripes(bigint) IS 'Internal: take the stripes of the gate at this key the session does not hold (session advisory locks, try only); every stripe it holds after.';
ALTER FUNCTION zeroth._take_wakeup_stripes(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_wakeup_stripes(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION zeroth._release_wakeup_stripes(lock bigint) RETURNS integer
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_released integer := 0;
    v_stripe integer;
BEGIN
    -- Once each: _take_wakeup_stripes never takes a stripe the session holds (a lock the
    -- session took itself as well stays held, its own business).
    FOR v_stripe IN SELECT unnest(zeroth._wakeup_stripes_held(lock)) LOOP
        IF pg_advisory_unlock(lock + v_stripe) THEN
            v_released := v_released + 1;
        END IF;
    END LOOP;
    RETURN v_released;
END
$$;
COMMENT ON FUNCTION zeroth._release_wakeup_stripes(bigint) IS 'Internal: let go of every stripe of the gate at this key the session holds; how many.';
ALTER FUNCTION zeroth._release_wakeup_stripes(bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._release_wakeup_stripes(bigint) FROM PUBLIC;

-- Work may be claimable in (deployment, tenant, workspace). Two gates, each as described above:
-- the scope's (its workers) and the deployment's (fleet workers serving every scope of it). For
-- each: NOTIFY zeroth_wakeup with that gate's key if a worker waits on this transaction's stripe
-- of it, else hold that stripe (shared) until commit. PostgreSQL folds identical payloads within
-- one transaction, so a batch notifies once per key. Advisory locks are never fast-path locks:
-- each one a transaction keeps takes an entry of the server's shared lock table until it ends,
-- so a transaction that enqueues into thousands of scopes would run the table out of memory.
-- After 64 of them (counted in the transaction-local setting
-- zeroth.wakeup_gate_locks) it simply notifies: one serialised commit for a transaction that
-- large costs little. Anyone can set that setting in their own session; it only decides whether
-- their own transaction notifies.
CREATE OR REPLACE FUNCTION zeroth._notify_wakeup(deployment_ref text, tenant_id text, workspace_id text) RETURNS void
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_taken  text := current_setting('zeroth.wakeup_gate_locks', true);
    v_count  integer := CASE WHEN v_taken ~ '^[0-9]{1,6}$' THEN v_taken::integer ELSE 0 END;
    v_stripe bigint := pg_current_xact_id()::text::bigint % zeroth._wakeup_stripes();
    v_before integer := v_count;
BEGIN
    IF v_count < 64 AND pg_try_advisory_xact_lock_shared(
           zeroth._wakeup_lock(tenant_id, workspace_id, deployment_ref) + v_stripe) THEN
        v_count := v_count + 1;  -- nobody waits on this stripe; a worker that takes it looks once more
    ELSE
        PERFORM zeroth._notify('zeroth_wakeup', zeroth._notify_key('wakeup', ARRAY[tenant_id, workspace_id, deployment_ref]));
    END IF;
    IF v_count < 64 AND pg_try_advisory_xact_lock_shared(
           zeroth._wakeup_lock_deployment(deployment_ref) + v_stripe) THEN
        v_count := v_count + 1;
    ELSE
        PERFORM zeroth._notify('zeroth_wakeup', zeroth._notify_key('wakeup_deployment', ARRAY[deployment_ref]));
    END IF;
    IF v_count <> v_before THEN
        PERFORM set_config('zeroth.wakeup_gate_locks', v_count::text, true);
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._notify_wakeup(text, text, text) IS 'Internal: for the scope''s wakeup gate and the deployment''s: NOTIFY zeroth_wakeup with that gate''s opaque key if a worker waits on this transaction''s stripe of it, or after 64 gate locks in this transaction; else hold that stripe (shared) until commit.';
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
