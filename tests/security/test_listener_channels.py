"""The listener only ever LISTENs on the fixed channels the SQL functions notify."""

from __future__ import annotations

import re

import pytest

from zeroth_pg import migrate
from zeroth_pg.notify import CHANNELS, CONTROL_CHANNEL, WAKEUP_CHANNEL, Notifier

#: The SQL that runs: the migrations (state) and the function files (code).
SQL_SOURCES = migrate.sql_files() + migrate.function_files()


def ignore(_channel: str, _payload: dict[str, object]) -> None:
    return None


class TestChannelNames:
    @pytest.mark.parametrize("channels", [
        ("zeroth_wakeup", "zeroth_wakeup2"),
        ("ZEROTH_WAKEUP",),
        ('zeroth_wakeup"; DROP TABLE zeroth.runs; --',),
        ("",),
        (),
    ])
    def test_a_channel_outside_the_fixed_set_is_refused(self, channels):
        with pytest.raises(ValueError, match="listens on"):
            Notifier("postgresql://unused", on_notification=ignore, channels=channels)

    def test_every_fixed_channel_is_accepted(self):
        notifier = Notifier("postgresql://unused", on_notification=ignore,
                            channels=tuple(sorted(CHANNELS)))
        assert set(notifier.channels) == CHANNELS

    def test_the_default_is_wakeup_and_control(self):
        notifier = Notifier("postgresql://unused", on_notification=ignore)
        assert notifier.channels == (WAKEUP_CHANNEL, CONTROL_CHANNEL)


class TestChannelsMatchTheSql:
    def test_every_notify_in_the_sql_names_a_literal_fixed_channel(self):
        # Every notification goes through zeroth._notify (which drops it while the queue is half
        # full); its callers name the channel as a literal.
        text = "\n".join(path.read_text(encoding="utf-8") for path in SQL_SOURCES)
        direct = re.findall(r"pg_notify\(\s*([^,]*),", text)
        assert set(direct) == {"channel"}, f"pg_notify outside zeroth._notify: {direct}"
        calls = re.findall(r"(?:SELECT|PERFORM)\s+zeroth\._notify\(\s*([^,]*),", text)
        assert calls, "no zeroth._notify call found: the pattern is stale"
        literals = {re.fullmatch(r"'([a-z_]+)'", call.strip()) for call in calls}
        assert None not in literals, f"a notification with a computed channel: {calls}"
        assert {match.group(1) for match in literals if match} == CHANNELS
