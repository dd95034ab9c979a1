"""The status of a claimed or enqueued run, read from its row (zeroth_pg.client._run_status):
every status the database writes is its RunStatus member, and a value that is none is refused
as RunStatus(value) refuses it. Pure: no database."""

from __future__ import annotations

import pytest

from zeroth_pg.client import _run_status
from zeroth_pg.types import RunStatus


@pytest.mark.parametrize("status", list(RunStatus))
def test_every_status_value_is_its_member(status: RunStatus) -> None:
    assert _run_status(str(status.value)) is status
    assert _run_status(str(status.value)) is RunStatus(status.value)


@pytest.mark.parametrize("value", ["", "Running", "done", "pending "])
def test_a_value_that_is_no_status_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="RunStatus"):
        _run_status(value)
