"""This tier moves time: its databases carry the test clock (testing.install_test_clock)."""

import pytest


@pytest.fixture
def conn(clock_conn):
    return clock_conn


@pytest.fixture
def database_dsn(clock_database_dsn):
    return clock_database_dsn
