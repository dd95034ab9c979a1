"""docs/sql-api.md is generated from the catalog, and the catalog agrees with itself.

The committed file must equal what ``python -m zeroth_pg.docs`` writes for a database migrated to
head; each public function's COMMENT must name exactly the SQLSTATEs and NOTIFY channels that its
body (and the zeroth functions it calls) can raise and send.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import psycopg
import pytest

from zeroth_pg.docs import (
    DOCS_COMMAND,
    read_functions,
    sql_api_markdown,
    state_machine_markdown,
)
from zeroth_pg.testing import libpq_dsn

SQL_API = Path(__file__).resolve().parents[2] / "docs" / "sql-api.md"
STATE_MACHINE = SQL_API.parent / "state-machine.md"


@pytest.fixture
def functions(database_dsn):
    with psycopg.connect(libpq_dsn(database_dsn), autocommit=True) as conn:
        return {fn.name: fn for fn in read_functions(conn)}


class TestSqlApiDoc:
    def test_committed_sql_api_md_matches_the_catalog(self, database_dsn):
        fresh = sql_api_markdown(database_dsn)
        committed = SQL_API.read_text(encoding="utf-8") if SQL_API.exists() else ""

        diff = "".join(list(difflib.unified_diff(
            committed.splitlines(True), fresh.splitlines(True), "docs/sql-api.md",
            "catalog"))[:60])
        assert committed == fresh, (
            f"docs/sql-api.md is stale: regenerate it with `{DOCS_COMMAND}`\n{diff}")

    def test_every_public_function_has_a_section(self, functions):
        text = SQL_API.read_text(encoding="utf-8")
        public = sorted(name for name in functions if not name.startswith("_"))
        assert public
        assert [name for name in public if f"\n### {name}\n" not in text] == []


class TestStateMachineDoc:
    def test_the_status_diagram_is_generated_from_the_transition_table(self, database_dsn):
        """docs/state-machine.md's status diagram is zeroth.run_transitions, edge for edge."""
        committed = STATE_MACHINE.read_text(encoding="utf-8")
        fresh = state_machine_markdown(database_dsn, committed)
        diff = "".join(list(difflib.unified_diff(
            committed.splitlines(True), fresh.splitlines(True), "docs/state-machine.md",
            "zeroth.run_transitions"))[:60])
        assert committed == fresh, (
            f"docs/state-machine.md's diagram is stale: regenerate it with `{DOCS_COMMAND}`\n"
            f"{diff}")

    def test_every_edge_of_the_table_is_a_line_of_the_diagram(self, database_dsn):
        with psycopg.connect(libpq_dsn(database_dsn), autocommit=True) as conn:
            edges = conn.execute("SELECT count(*) FROM zeroth.run_transitions").fetchone()[0]
        block = STATE_MACHINE.read_text(encoding="utf-8").split("```mermaid\n", 1)[1]
        block = block.split("```", 1)[0]
        assert edges > 30
        assert block.count(" --> ") == edges


class TestBodiesAndComments:
    def test_codes_and_channels_are_followed_through_internal_helpers(self, functions):
        # complete_run raises nothing itself: ZP003 comes from _explain_fenced_miss, ZP008 from
        # _require, and the wakeup from _notify_wakeup.
        complete = functions["complete_run"]
        assert (complete.raises, complete.notifies) == (
            ("ZP003", "ZP008"), ("zeroth_run_events", "zeroth_wakeup"))
        # request_cancel ends through the settle path (kind revoke): the END of a run that has
        # events reaches zeroth_run_events through zeroth._settle, as every lease-ending call.
        assert functions["request_cancel"].notifies == (
            "zeroth_control", "zeroth_run_events", "zeroth_wakeup")
        assert functions["prune_runs"].notifies == ()

    def test_each_comment_names_exactly_what_the_body_raises_and_notifies(self, functions):
        wrong = {}
        for fn in functions.values():
            if fn.name.startswith("_"):
                continue
            said = (tuple(sorted(set(re.findall(r"\bZP[0-9A-Z]{3}\b", fn.comment)))),
                    tuple(sorted(set(re.findall(r"\bzeroth_(?:wakeup|control|run_events)\b",
                                                fn.comment)))))
            # Every lease-ending function reaches zeroth_run_events through zeroth._settle (the
            # END of a run that has events): said once there and in docs/state-machine.md, not
            # in each of their comments. Where a function sends it itself, its comment says so.
            notifies = tuple(c for c in fn.notifies if c != "zeroth_run_events"
                             or fn.name == "append_run_event")
            done = (tuple(code for code in fn.raises if code.startswith("ZP")), notifies)
            if said != done:
                wrong[fn.name] = {"comment": said, "body": done}
        assert wrong == {}
