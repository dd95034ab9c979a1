"""The SQL blocks of docs/dba-guide.md marked *(checked)* run through psql on a migrated database.

A block is checked when the text line before it (or before the checked blocks right above it)
says *(checked)*. They run in order in one transaction that is rolled back, except a block that
commits by itself (the prune loop), which runs alone; the database holds a run in every state so
the queries see rows.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest
from helpers import T0, make_run

from zeroth_pg.testing import run_psql


@pytest.fixture
def conn(clock_conn):
    """make_run places runs on the test clock."""
    return clock_conn


@pytest.fixture
def database_dsn(clock_database_dsn):
    """make_run places runs on the test clock."""
    return clock_database_dsn


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "dba-guide.md"
MARK = "*(checked)*"
COMMITS = re.compile(r"\bCOMMIT\b")


def checked_blocks(text: str) -> list[str]:
    blocks: list[str] = []
    checked = False
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("```"):
            body = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                body.append(inner)
            if checked and line.strip() == "```sql":
                blocks.append("\n".join(body))
            continue
        if line.strip():
            checked = MARK in line
    return blocks


BLOCKS = checked_blocks(GUIDE.read_text(encoding="utf-8"))


def test_the_guide_has_checked_blocks():
    # Guards the parser: the install check, reloptions, five monitoring queries, prune, roles.
    assert len(BLOCKS) >= 10


@pytest.fixture
async def populated(database_dsn, connect):
    db = await connect()
    for status in ("pending", "claimed", "running", "waiting", "completed", "failed"):
        await make_run(db, status)
    return database_dsn


def run_checked(dsn: str, script: str) -> None:
    done = run_psql(dsn, script, check=False)
    assert done.returncode == 0, f"{done.stderr}\n--- script ---\n{script}"
    assert "ERROR" not in done.stderr


async def test_the_blocks_run_in_order_in_one_rolled_back_transaction(populated):
    # In order, because a block may use what an earlier one created (the login roles).
    blocks = [block for block in BLOCKS if not COMMITS.search(block)]
    run_checked(populated, "BEGIN;\n" + "\n".join(blocks) + "\nROLLBACK;\n")


@pytest.mark.parametrize("block", [block for block in BLOCKS if COMMITS.search(block)])
async def test_a_block_that_commits_by_itself_runs_alone(populated, block):
    run_checked(populated, block)


async def test_the_schedule_metadata_keys_are_those_a_fired_run_carries(conn):
    # The guide names the keys of metadata.zeroth_schedule (what the dashboard shows under a
    # run's Metadata, what a handler reads): exactly those fire_due_schedules writes.
    documented = re.search(r"`metadata\.zeroth_schedule = \{([^}]*)\}`", GUIDE.read_text())
    assert documented, "docs/dba-guide.md no longer spells out metadata.zeroth_schedule"
    keys = set(re.findall(r'"(\w+)":', documented.group(1)))
    await conn.execute(
        """SELECT * FROM zeroth_test.create_schedule(name => 'doc', deployment_ref => 'doc-d',
               interval_seconds => 1, now_override => $1)""", T0)
    fired = await conn.fetch(
        """SELECT * FROM zeroth_test.fire_due_schedules(deployment_refs => '{doc-d}',
               now_override => $1)""", T0 + timedelta(seconds=1))
    run_ids = [row["run_id"] for row in fired if row["run_id"] is not None]
    assert run_ids
    metadata = json.loads(await conn.fetchval(
        "SELECT metadata::text FROM zeroth.runs WHERE run_id = $1", run_ids[0]))
    assert keys == set(metadata["zeroth_schedule"]) == {"name", "schedule_id", "fire_at"}
    assert (await conn.fetchval("SELECT schedule_id FROM zeroth.runs WHERE run_id = $1",
                                run_ids[0])) == UUID(metadata["zeroth_schedule"]["schedule_id"])
