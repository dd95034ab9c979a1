#!/usr/bin/env bash
# A whole zeroth_pg worker in a shell script: nothing but bash and psql.
#
# The loop a real worker runs (zeroth_pg.RunWorker does the same in Python):
#   1. claim a batch: orphans first (claim_orphaned: running runs whose worker died, handed over
#      with their latest checkpoint), then pending runs (claim_pending, batch_size);
#   2. for each claimed run: start it (start_run), do its steps, saving a checkpoint and renewing
#      the lease after each (save_checkpoint, renew_lease), then complete it (complete_run); the
#      other runs of the batch keep their leases with one batch renewal (renew_leases);
#   3. a failing attempt is failed as retryable (fail_run): back to pending with a backoff, and
#      dead-lettered once max_attempts attempts have failed;
#   4. nothing to claim: sleep --poll seconds and claim again (a real worker also LISTENs on
#      zeroth_wakeup to wake up early; polling alone is always correct, NOTIFY is only a hint).
# SIGTERM or SIGINT stops it gracefully: the run in hand goes back to pending with its checkpoints
# (hand_back_to_pending) and the claimed runs not yet started are released (release_lease).
#
# The "handler" is a demo: a run's payload {"steps": N, "fail_attempts": K} asks for N steps
# (default 3) and for its first K attempts to fail (default 0). A recovered run resumes after the
# step of its latest checkpoint.
#
# Usage:
#   examples/psql/worker_loop.sh [--until-empty] [--batch N] [--poll SECONDS] [--lease SECONDS] DSN
#   DATABASE_URL=postgresql://... examples/psql/worker_loop.sh --until-empty
# Options:
#   --until-empty   exit 0 as soon as a claim finds nothing (batch jobs, tests) instead of polling
#   --batch N       runs claimed per claim (default 10)
#   --poll S        seconds to sleep when the queue is empty (default 1)
#   --lease S       lease duration in seconds (default 30)
# Environment:
#   PSQL                the psql binary (default: psql from PATH)
#   DEPLOYMENT          deployment_ref to serve (default: psql-demo)
#   TENANT, WORKSPACE   the scope (default: the default tenant's null workspace)
#   WORKER_ID           this worker's id (default: psql-<host>-<pid>)
#   STEP_SECONDS        time one step of the demo handler takes (default 0)
#   RETRY_BASE_SECONDS  backoff base of a retry (default 1; it doubles per attempt, max 300)
#
# Any role that is a member of zeroth_worker can run it: it calls worker functions only.

set -euo pipefail

UNTIL_EMPTY=0
BATCH=10
POLL=1
LEASE=30
DSN="${DATABASE_URL:-}"
usage() {
    echo "usage: $0 [--until-empty] [--batch N] [--poll SECONDS] [--lease SECONDS] DSN" \
         "(or set DATABASE_URL)" >&2
    exit 2
}
while (($#)); do
    case "$1" in
        --until-empty) UNTIL_EMPTY=1 ;;
        --batch) BATCH="${2:?}"; shift ;;
        --poll) POLL="${2:?}"; shift ;;
        --lease) LEASE="${2:?}"; shift ;;
        -h|--help) usage ;;
        -*) echo "unknown option $1" >&2; usage ;;
        *) DSN="$1" ;;
    esac
    shift
done
[[ -n "$DSN" ]] || usage

PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-demo}"
WORKER="${WORKER_ID:-psql-${HOSTNAME:-host}-$$}"
STEP_SECONDS="${STEP_SECONDS:-0}"
RETRY_BASE_SECONDS="${RETRY_BASE_SECONDS:-1}"

# sql [-v name=value ...] <<'SQL' ... SQL
# -X ignores ~/.psqlrc; ON_ERROR_STOP makes an SQL error fail psql and so this script (set -e);
# -At prints bare values, -F a tab between columns. Values travel as psql variables (-v) and are
# quoted by psql as :'name' (then cast), never pasted into the SQL by the shell; the one thing the
# shell writes into SQL text is the name of the claim function, a constant of this script.
sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q -F $'\t' \
        -v deployment="$DEPLOYMENT" -v worker="$WORKER" -v lease="$LEASE" \
        -v tenant="${TENANT:-}" -v workspace="${WORKSPACE:-}" "$@" "$DSN"
}

STOP=0
trap 'STOP=1' TERM INT

# Runs claimed and not finished yet: run_id → generation. The first is the one in hand.
declare -A HELD=()
declare -a ORDER=()

# claim FUNCTION LIMIT: claim up to LIMIT runs and append one tab-separated line per claimed run
# to CLAIMED: run_id, generation, attempt (after start_run), steps, fail_attempts, step to resume
# after. (The claim runs in $(...), not in <(...), so that a failing psql stops the script.)
# The payload is decoded without raising: a cast that failed here would roll the claim back and
# stop the script before anything was recorded, and it would claim the same poison run first
# again on every restart. A value that is not a whole number comes back as -1 and the run is
# failed for good (process).
claim() {
    local out
    out=$(claim_sql "$@")
    [[ -z "$out" ]] || mapfile -t -O "${#CLAIMED[@]}" CLAIMED <<<"$out"
}
claim_sql() {
    local limit_arg
    if [[ "$1" == claim_orphaned ]]; then limit_arg="claim_limit"; else limit_arg="batch_size"; fi
    sql -v limit="$2" <<SQL
SELECT c.run_id, c.lease_generation,
       c.attempts + CASE WHEN c.status = 'pending' THEN 1 ELSE 0 END,
       CASE WHEN coalesce(c.payload ->> 'steps', '3') ~ '^[0-9]{1,6}$'
            THEN coalesce(c.payload ->> 'steps', '3')::int ELSE -1 END,
       CASE WHEN coalesce(c.payload ->> 'fail_attempts', '0') ~ '^[0-9]{1,6}$'
            THEN coalesce(c.payload ->> 'fail_attempts', '0')::int ELSE -1 END,
       coalesce((c.checkpoint_data ->> 'step')::int, 0)
  FROM zeroth.$1(deployment_ref => :'deployment', worker_id => :'worker',
                 tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''),
                 $limit_arg => :'limit'::int, lease_seconds => :'lease'::float8) c
 WHERE c.run_id IS NOT NULL;
SQL
}

# fenced RUN GENERATION [-v ...]: psql with the fence of one lease as variables.
fenced() {
    local run_id="$1" generation="$2"
    shift 2
    sql -v run_id="$run_id" -v gen="$generation" "$@"
}

# renew_batch: one renew_leases call for every held run but the one in hand (its steps renew
# it), at most every lease/3 seconds, so the rest of a batch keeps its leases while it waits.
RENEWED_AT=$SECONDS
renew_batch() {
    ((${#ORDER[@]} > 1 && (SECONDS - RENEWED_AT) * 3 >= ${LEASE%.*})) || return 0
    RENEWED_AT=$SECONDS
    local ids="" gens="" run_id
    for run_id in "${ORDER[@]:1}"; do
        ids+="${ids:+,}$run_id"
        gens+="${gens:+,}${HELD[$run_id]}"
    done
    sql -v ids="{$ids}" -v gens="{$gens}" >/dev/null <<'SQL'
SELECT l.run_id, l.renewed
  FROM zeroth.renew_leases(
           worker_id => :'worker', run_ids => :'ids'::uuid[], generations => :'gens'::bigint[],
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''),
           lease_seconds => :'lease'::float8) l;
SQL
}

forget() {
    unset 'HELD[$1]'
    ORDER=("${ORDER[@]:1}")
}

# process RUN GENERATION ATTEMPT STEPS FAIL_ATTEMPTS RESUME_AFTER
process() {
    local run_id="$1" gen="$2" attempt="$3" steps="$4" fail_attempts="$5" step="$6" ok outcome
    ok=$(fenced "$run_id" "$gen" <<'SQL'
SELECT zeroth.start_run(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
)
    if [[ "$ok" != t ]]; then echo "lease lost on $run_id before it started"; return; fi
    echo "started $run_id generation $gen attempt $attempt (resuming after step $step)"

    if ((steps < 0 || fail_attempts < 0)); then
        # A payload this handler can never run: fail it for good, not retry it.
        outcome=$(fenced "$run_id" "$gen" <<'SQL'
SELECT zeroth.fail_run(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           error => jsonb_build_object('message',
                        'payload: steps and fail_attempts must be whole numbers'),
           retryable => false,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
)
        echo "failed $run_id: bad payload: ${outcome:-lease lost}"
        return
    fi

    if ((attempt <= fail_attempts)); then
        # A transient error: retryable, so fail_run schedules a retry or dead-letters the run.
        outcome=$(fenced "$run_id" "$gen" -v attempt="$attempt" \
                         -v base="$RETRY_BASE_SECONDS" <<'SQL'
SELECT zeroth.fail_run(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           error => jsonb_build_object('message', 'simulated transient failure',
                                       'attempt', :'attempt'::int),
           retryable => true, retry_base_seconds => :'base'::float8,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
)
        echo "failed $run_id attempt $attempt: ${outcome:-lease lost}"
        return
    fi

    local resumed_from="$step"
    while ((step < steps)); do
        if ((STOP)); then
            ok=$(fenced "$run_id" "$gen" <<'SQL'
SELECT zeroth.hand_back_to_pending(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
)
            echo "stopping: handed back $run_id after step $step: $ok"
            return
        fi
        sleep "$STEP_SECONDS"
        renew_batch
        step=$((step + 1))
        # One round trip: extend the lease and save the step, both fenced by (worker, generation).
        ok=$(fenced "$run_id" "$gen" -v step="$step" <<'SQL'
SELECT zeroth.renew_lease(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''),
           lease_seconds => :'lease'::float8)
   AND zeroth.save_checkpoint(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           data => jsonb_build_object('step', :'step'::int),
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''))
       IS NOT NULL;
SQL
)
        if [[ "$ok" != t ]]; then echo "lease lost on $run_id at step $step"; return; fi
        echo "checkpoint $run_id step $step"
    done

    ok=$(fenced "$run_id" "$gen" -v steps="$steps" -v resumed="$resumed_from" \
                -v attempt="$attempt" <<'SQL'
SELECT zeroth.complete_run(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           output => jsonb_build_object('steps', :'steps'::int, 'resumed_from', :'resumed'::int,
                                        'attempt', :'attempt'::int, 'worker', :'worker'),
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
)
    echo "completed $run_id: $ok"
}

# release_unstarted: give back the claimed runs nobody started (shutdown).
release_unstarted() {
    local run_id
    for run_id in "${ORDER[@]}"; do
        fenced "$run_id" "${HELD[$run_id]}" >/dev/null <<'SQL'
SELECT zeroth.release_lease(
           run_id => :'run_id', worker_id => :'worker', generation => :'gen'::bigint,
           tenant_id => nullif(:'tenant', ''), workspace_id => nullif(:'workspace', ''));
SQL
        echo "stopping: released $run_id"
    done
}

echo "worker $WORKER serving deployment $DEPLOYMENT (batch $BATCH, lease ${LEASE}s)"
while ((!STOP)); do
    CLAIMED=()
    claim claim_orphaned "$BATCH"
    if ((${#CLAIMED[@]} < BATCH)); then
        claim claim_pending $((BATCH - ${#CLAIMED[@]}))
    fi
    if ((${#CLAIMED[@]} == 0)); then
        if ((UNTIL_EMPTY)); then
            echo "queue empty: exiting (--until-empty)"
            exit 0
        fi
        sleep "$POLL" || true
        continue
    fi

    HELD=()
    ORDER=()
    for line in "${CLAIMED[@]}"; do
        IFS=$'\t' read -r run_id gen _ <<<"$line"
        HELD[$run_id]="$gen"
        ORDER+=("$run_id")
        echo "claimed $run_id generation $gen"
    done
    for line in "${CLAIMED[@]}"; do
        if ((STOP)); then
            release_unstarted
            break
        fi
        renew_batch
        IFS=$'\t' read -r run_id gen attempt steps fail_attempts resume_after <<<"$line"
        process "$run_id" "$gen" "$attempt" "$steps" "$fail_attempts" "$resume_after"
        forget "$run_id"
    done
done
echo "stopped"
