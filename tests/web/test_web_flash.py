"""The signed message of an action's redirect (zeroth_pg/web/flash.py): what it carries, and when it
stops showing. The attacks (a crafted link, a forged, tampered or borrowed value) are in
tests/adversarial/test_web_and_exporter_attacks.py."""

from __future__ import annotations

from zeroth_pg.web import flash

SECRET = b"s" * 32


def test_a_signed_message_reads_back_for_its_session_only():
    token = flash.sign(SECRET, "session-a", {"done": "pause hourly"}, now=1000.0)
    assert flash.read(SECRET, "session-a", token, now=1000.0) == {"done": "pause hourly"}
    assert flash.read(SECRET, "session-b", token, now=1000.0) == {}
    assert flash.read(b"t" * 32, "session-a", token, now=1000.0) == {}
    assert flash.read(SECRET, "", token, now=1000.0) == {}


def test_a_signed_message_expires():
    token = flash.sign(SECRET, "session-a", {"emitted": "x", "woken": "1"}, now=1000.0)
    last = 1000.0 + flash.FLASH_SECONDS
    assert flash.read(SECRET, "session-a", token, now=last) == {"emitted": "x", "woken": "1"}
    assert flash.read(SECRET, "session-a", token, now=last + 1) == {}


def test_only_the_message_keys_come_back():
    token = flash.sign(SECRET, "s", {"done": "x", "deployment": "mail"}, now=0.0)
    assert flash.read(SECRET, "s", token, now=0.0) == {"done": "x"}
    for junk in ("", "a.b", "a.b.c.d", "1.!!!.00", "x" * 5000):
        assert flash.read(SECRET, "s", junk, now=0.0) == {}
