"""``zeroth-pg db stop`` and ``db url`` with no embedded server running: stop is idempotent (exit
0, "was not running"), url is a lookup that fails (exit 4, nothing on stdout), and each one's
``--help`` says so. No server is started: the data directory is empty."""

from __future__ import annotations

import json
from pathlib import Path

from test_embedded_cli import db_cli


def test_db_stop_exits_0_and_db_url_exits_4_when_no_server_runs(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    stop = db_cli("db", "stop", data_dir=data_dir)
    assert (stop.returncode, stop.stdout) == (0, "")
    assert "was not running" in stop.stderr
    as_json = db_cli("db", "stop", "--json", data_dir=data_dir)
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["stopped"] is False

    url = db_cli("db", "url", data_dir=data_dir)
    assert (url.returncode, url.stdout) == (4, "")
    assert "not running" in url.stderr
    assert db_cli("db", "url", "--json", data_dir=data_dir).returncode == 4
    assert not data_dir.exists() or not any(data_dir.iterdir())  # nothing was started


def test_db_stop_and_url_help_state_their_exit_codes(tmp_path: Path) -> None:
    stop = " ".join(db_cli("db", "stop", "--help", data_dir=tmp_path).stdout.split())
    url = " ".join(db_cli("db", "url", "--help", data_dir=tmp_path).stdout.split())
    assert "Exit 0 whether it was running or not" in stop
    assert "Exit 0 with the DSN; 4 when no embedded server is running" in url
