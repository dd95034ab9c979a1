#!/usr/bin/env bash
# Periodic runs with nothing but psql: a DBA creates, changes, pauses, resumes and deletes a
# schedule in SQL, and a firer loop turns its due fire times into runs.
#
# The time lives in the database: cron parsing, time zones and next fire times are computed by
# the zeroth.* functions on the database clock, and each (schedule, fire time) becomes exactly one
# run whoever fires it (a Python worker, this loop, pg_cron), so any number of firers may run.
# With pg_cron instead of a loop, one line fires every minute (pg_cron's finest grain; seconds
# need a firer like this loop or a worker):
#   SELECT cron.schedule('zeroth-fire', '* * * * *',
#          $$SELECT count(*) FROM zeroth.fire_due_schedules(deployment_refs => '{report}')$$);
#
# Usage:
#   examples/psql/schedules.sh 'postgresql://dba@host/db'     (a member of zeroth_owner: the
#                                                              schedule functions are admin only)
#   DATABASE_URL='postgresql://...' examples/psql/schedules.sh
# Environment:
#   PSQL          the psql binary (default: psql from PATH)
#   DEPLOYMENT    the deployment the schedule's runs are for (default: a fresh one per invocation)
#   FIRE_SECONDS  how long the firer loop runs (default 3)

set -euo pipefail

DSN="${1:-${DATABASE_URL:-}}"
if [[ -z "$DSN" ]]; then
    echo "usage: $0 DSN   (or set DATABASE_URL)" >&2
    exit 2
fi
PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-schedules-$(date +%s)-$$}"
FIRE_SECONDS="${FIRE_SECONDS:-3}"

# As in lifecycle.sh: values travel as psql variables (-v) and are quoted by psql (:'name').
sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q -F ' ' -v deployment="$DEPLOYMENT" "$@" "$DSN"
}

echo "deployment $DEPLOYMENT"

# --- 1. A DBA creates two schedules -------------------------------------------------------------
# A cron schedule on the wall clock of Berlin (weekdays at 07:30), and one every second that
# catches up at most 5 missed fire times after an outage.
sql <<'SQL'
SELECT 'created ' || name || ' next ' || to_char(next_fire_at AT TIME ZONE time_zone, 'Dy HH24:MI') || ' ' || time_zone
  FROM zeroth.create_schedule(name => 'morning-report', deployment_ref => :'deployment',
                              cron => '30 7 * * mon-fri', time_zone => 'Europe/Berlin',
                              payload => '{"report": "daily"}');
SELECT 'created ' || name || ' every ' || interval_seconds || 's'
  FROM zeroth.create_schedule(name => 'tick', deployment_ref => :'deployment',
                              interval_seconds => 1, missed_fire_policy => 'catch_up',
                              catch_up_limit => 5, payload => '{"tick": true}');
SQL

# A bad expression is refused with a message that says what is wrong (SQLSTATE ZP008).
if sql -c "SELECT zeroth.create_schedule(name => 'bad', deployment_ref => 'x', cron => '0 0 31 2 *')" \
        2>/tmp/zeroth-schedules-err.$$; then
    echo "a bad expression was accepted" >&2
    exit 1
fi
echo "refused: $(grep -o 'never fires.*' /tmp/zeroth-schedules-err.$$)"
rm -f /tmp/zeroth-schedules-err.$$

# --- 2. The firer loop ----------------------------------------------------------------------
# fire_due_schedules returns one row per fire time it turned into a run (or one row with
# schedule_id NULL), and on every row next_due_at: sleep until then, at most a second.
end=$((SECONDS + FIRE_SECONDS))
while (( SECONDS < end )); do
    out=$(sql <<'SQL'
SELECT coalesce(f.name || ' fired ' || to_char(f.fire_at AT TIME ZONE 'UTC', 'HH24:MI:SS') || ' run ' || f.run_id, '-'),
       greatest(0.02, least(1.0, extract(epoch FROM f.next_due_at - clock_timestamp())))::numeric(6,3)
  FROM zeroth.fire_due_schedules(deployment_refs => ARRAY[:'deployment']) f;
SQL
)
    sleep_for=0.5
    while read -r line; do
        sleep_for="${line##* }"
        what="${line% *}"
        [[ "$what" == "-" ]] || echo "$what"
    done <<<"$out"
    sleep "$sleep_for"
done

# --- 3. Pause, change, resume, list, delete -------------------------------------------------
sql <<'SQL'
SELECT 'paused ' || name || ': ' || paused FROM zeroth.pause_schedule(name => 'tick');
SELECT 'while paused: ' || count(*) || ' fired'
  FROM zeroth.fire_due_schedules(deployment_refs => ARRAY[:'deployment']) f
 WHERE f.schedule_id IS NOT NULL;
SELECT 'altered ' || name || ' every ' || interval_seconds || 's'
  FROM zeroth.alter_schedule(name => 'tick', interval_seconds => 60);
SELECT 'resumed ' || name || ': paused ' || paused FROM zeroth.resume_schedule(name => 'tick');
SELECT 'schedule ' || name || ' ' || coalesce(cron, 'every ' || interval_seconds || 's')
       || ' fired ' || fire_count || ' managed_by ' || managed_by
  FROM zeroth.list_schedules(deployment_refs => ARRAY[:'deployment']);
SELECT 'runs ' || count(*) || ' distinct fire times ' || count(DISTINCT metadata -> 'zeroth_schedule' ->> 'fire_at')
  FROM zeroth.runs WHERE deployment_ref = :'deployment';
SELECT 'deleted ' || zeroth.delete_schedule(name => 'morning-report');
SQL
