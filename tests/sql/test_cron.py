"""The cron dialect and next fire times, computed in SQL (sql/functions/internal/cron.sql):
standard 5 fields with ranges, steps, lists and names; the day-of-month/day-of-week OR rule; DST
in a named zone (a repeated local time fires once, at its first occurrence; a skipped one at the
end of the gap); every malformed expression refused with ZP008 naming the field and the token."""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise

import asyncpg
import pytest

NEXT = "SELECT zeroth._cron_next(cron => $1, time_zone => $2, after => $3)"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


async def fire_times(conn: asyncpg.Connection, cron: str, zone: str, after: datetime,
                     count: int) -> list[datetime]:
    times: list[datetime] = []
    for _ in range(count):
        after = await conn.fetchval(NEXT, cron, zone, after)
        times.append(after)
    return times


class TestFields:
    @pytest.mark.parametrize(("cron", "field", "values"), [
        ("*/15 * * * *", "minutes", [0, 15, 30, 45]),
        ("1-5/2,30 * * * *", "minutes", [1, 3, 5, 30]),
        ("0 9-17/4 * * *", "hours", [9, 13, 17]),
        ("0 0 * jan-Mar,DEC *", "months", [1, 2, 3, 12]),
        ("0 0 * * mon-FRI", "weekdays", [1, 2, 3, 4, 5]),
        ("0 0 * * 0,7", "weekdays", [0]),
        ("0 0 * * 5-7", "weekdays", [0, 5, 6]),
        ("0 0 1,15 * *", "days", [1, 15]),
    ])
    async def test_parses_ranges_steps_lists_and_names(self, conn, cron, field, values):
        row = await conn.fetchrow("SELECT * FROM zeroth._cron_parse(cron => $1)", cron)
        assert row[field] == values

    async def test_whitespace_between_fields_is_free(self, conn):
        row = await conn.fetchrow("SELECT * FROM zeroth._cron_parse(cron => $1)", "  5\t 4  * * * ")
        assert (row["minutes"], row["hours"]) == ([5], [4])


class TestNextFireTime:
    async def test_every_minute(self, conn):
        assert await fire_times(conn, "* * * * *", "UTC", utc("2030-01-01T00:00:30"), 2) == [
            utc("2030-01-01T00:01:00"), utc("2030-01-01T00:02:00")]

    async def test_strictly_after_an_exact_fire_time(self, conn):
        assert await conn.fetchval(NEXT, "0 * * * *", "UTC", utc("2030-01-01T05:00:00")) == utc(
            "2030-01-01T06:00:00")

    async def test_leap_day_is_found_without_walking_every_minute(self, conn):
        assert await conn.fetchval(NEXT, "0 0 29 2 *", "UTC", utc("2030-03-01T00:00")) == utc(
            "2032-02-29T00:00")

    async def test_day_of_month_or_day_of_week_when_both_are_restricted(self, conn):
        # 13th or any Friday: Friday 2030-01-04 comes first, then Friday the 11th, then the 13th.
        assert await fire_times(conn, "0 0 13 * 5", "UTC", utc("2030-01-01T00:00"), 3) == [
            utc("2030-01-04T00:00"), utc("2030-01-11T00:00"), utc("2030-01-13T00:00")]

    async def test_a_star_field_makes_both_days_required(self, conn):
        # */10 starts with *: days 1, 11, 21, 31 AND a Monday (Vixie cron and cronie alike).
        times = await fire_times(conn, "0 0 */10 * 1", "UTC", utc("2030-01-01T00:00"), 3)
        assert all(t.weekday() == 0 and t.day in (1, 11, 21, 31) for t in times)

    async def test_weekday_names_and_sunday_as_seven(self, conn):
        first = await conn.fetchval(NEXT, "30 8 * * 7", "UTC", utc("2030-01-01T00:00"))
        assert (first, first.isoweekday()) == (utc("2030-01-06T08:30"), 7)
        assert await conn.fetchval(NEXT, "30 8 * * sun", "UTC", utc("2030-01-01T00:00")) == first

    async def test_wall_clock_of_the_zone(self, conn):
        # 09:00 in New York is 14:00 UTC in winter.
        assert await conn.fetchval(NEXT, "0 9 * * *", "America/New_York",
                                   utc("2030-01-01T00:00")) == utc("2030-01-01T14:00")

    async def test_a_year_of_an_hourly_schedule_is_cheap_and_regular(self, conn):
        times = await fire_times(conn, "0 * * * *", "UTC", utc("2030-01-01T00:00"), 48)
        assert [(b - a).total_seconds() for a, b in pairwise(times)] == [3600] * 47


class TestDaylightSaving:
    """Europe/Berlin: 2030-03-31 02:00 → 03:00 (no 02:xx), 2030-10-27 03:00 → 02:00 (02:xx
    twice)."""

    async def test_a_skipped_local_time_fires_when_the_gap_ends(self, conn):
        # 02:30 does not exist that night: it fires at 03:00 CEST = 01:00 UTC; next day 02:30.
        times = await fire_times(conn, "30 2 * * *", "Europe/Berlin", utc("2030-03-30T12:00"), 2)
        assert times == [utc("2030-03-31T01:00"), utc("2030-04-01T00:30")]

    async def test_several_skipped_times_fold_into_one_fire(self, conn):
        times = await fire_times(conn, "*/20 * * * *", "Europe/Berlin", utc("2030-03-31T00:30"), 4)
        # 01:40 CET, then 02:00/02:20/02:40 do not exist → 03:00 CEST once, then 03:20 CEST.
        assert times == [utc("2030-03-31T00:40"), utc("2030-03-31T01:00"),
                         utc("2030-03-31T01:20"), utc("2030-03-31T01:40")]

    async def test_a_repeated_local_time_fires_once_at_its_first_occurrence(self, conn):
        # 02:30 happens at 00:30 UTC (CEST) and at 01:30 UTC (CET): only the first fires.
        times = await fire_times(conn, "30 2 * * *", "Europe/Berlin", utc("2030-10-26T12:00"), 2)
        assert times == [utc("2030-10-27T00:30"), utc("2030-10-28T01:30")]

    async def test_the_repeated_hour_is_not_fired_again(self, conn):
        times = await fire_times(conn, "*/30 * * * *", "Europe/Berlin", utc("2030-10-26T23:45"), 4)
        # 02:00 CEST, 02:30 CEST, then 02:00/02:30 CET are the same wall times: next is 03:00 CET.
        assert times == [utc("2030-10-27T00:00"), utc("2030-10-27T00:30"),
                         utc("2030-10-27T02:00"), utc("2030-10-27T02:30")]

    async def test_from_inside_the_second_pass_the_next_new_wall_time_fires(self, conn):
        # A schedule looked at during the second 02:xx (01:10 UTC): 02:20 CET already fired as
        # 02:20 CEST, so the next is 03:00 CET.
        assert await conn.fetchval(NEXT, "*/20 * * * *", "Europe/Berlin",
                                   utc("2030-10-27T01:10")) == utc("2030-10-27T02:00")

    async def test_new_york_spring_forward(self, conn):
        # 2030-03-10 02:00 EST → 03:00 EDT: 02:15 fires at 03:00 EDT = 07:00 UTC.
        assert await conn.fetchval(NEXT, "15 2 * * *", "America/New_York",
                                   utc("2030-03-09T12:00")) == utc("2030-03-10T07:00")


BAD = [
    ("", "must not be empty"),
    ("@hourly", 'cron macro "@hourly" is not supported'),
    ("@reboot", "is not supported"),
    ("* * * * * *", "must have 5 fields"),
    ("0 * * * * 2030", "seconds and year fields are not supported"),
    ("* * * *", "got 4"),
    ("60 * * * *", "cron minute: 60 is out of range 0-59"),
    ("* 24 * * *", "cron hour: 24 is out of range 0-23"),
    ("* * 0 * *", "cron day-of-month: 0 is out of range 1-31"),
    ("* * 32 * *", "cron day-of-month: 32 is out of range"),
    ("* * * 13 *", "cron month: 13 is out of range 1-12"),
    ("* * * * 8", "cron day-of-week: 8 is out of range 0-7"),
    ("5-1 * * * *", 'cron minute: reversed range (token "5-1")'),
    ("* * * DEC-JAN *", "cron month: reversed range"),
    ("*/0 * * * *", 'cron minute: step 0 (token "*/0")'),
    ("*/x * * * *", 'step "x" is not a positive integer'),
    ("*/-1 * * * *", "is not a positive integer"),
    ("1,,2 * * * *", 'cron minute: empty item in list "1,,2"'),
    ("1, * * * *", "empty item"),
    ("5/10 * * * *", "a step needs * or a range a-b before it"),
    ("1/2/3 * * * *", "more than one step"),
    ("1-2-3 * * * *", 'malformed token "1-2-3"'),
    ("x * * * *", 'cron minute: "x" is not a number'),
    ("* * * * MONDAY", 'cron day-of-week: "MONDAY" is not a number or a name'),
    ("* * * JANUARY *", 'cron month: "JANUARY" is not a number or a name'),
    ("* * * * JAN", 'cron day-of-week: "JAN" is not a number'),
    ("? * * * *", 'cron minute: "?" is not a number'),
    ("* * L * *", 'cron day-of-month: "L" is not a number'),
    ("0 0 31 2 *", 'never fires: day-of-month 31 never occurs in month 2'),
    ("0 0 30,31 2 *", "never fires"),
    ("0 0 31 4,6,9,11 *", "never fires"),
]


class TestMalformed:
    @pytest.mark.parametrize(("cron", "fragment"), BAD)
    async def test_refused_with_a_message_naming_what_is_wrong(self, conn, cron, fragment):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetch("SELECT * FROM zeroth._cron_parse(cron => $1)", cron)
        assert caught.value.sqlstate == "ZP008"
        assert fragment in caught.value.message

    async def test_feb_29_is_not_never(self, conn):
        await conn.fetch("SELECT * FROM zeroth._cron_parse(cron => '0 0 29 2 *')")

    async def test_feb_31_with_a_restricted_weekday_fires_on_that_weekday(self, conn):
        # Both restricted: OR rule, so Mondays of February.
        first = await conn.fetchval(NEXT, "0 0 31 2 mon", "UTC", utc("2030-01-01T00:00"))
        assert (first.month, first.isoweekday()) == (2, 1)
