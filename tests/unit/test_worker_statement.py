"""Which command text the worker sends with its session reset in one round trip (worker.one_statement)."""

from __future__ import annotations

import pytest

from pgsched.worker import one_statement


@pytest.mark.parametrize(("command", "one"), [
    ("VACUUM", True),
    ("INSERT INTO t VALUES (1);", True),
    ("DELETE FROM events WHERE at < now() - interval '7 days' ;  \n", True),
    ("CALL pgsched_demo.rollup()", True),
    ("", True),
    ("INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)", False),
    ("DO $$BEGIN PERFORM 1; END$$", False),  # one statement, but a ';' inside: the simple protocol, as before
    ("SELECT 'a;b'", False),
    ("COPY t TO '/tmp/t.csv'", False),
    ("select * from copy_log", False),  # conservative: any "copy"
    ("SELECT $1", False),  # a parameter: the simple protocol's "there is no parameter $1", as before
    ("SELECT '$5 off'", False),  # conservative: any $ and digit
    ("DO $$BEGIN PERFORM pg_sleep(0) END$$", True),  # a dollar quote is not a parameter
])
def test_only_surely_one_statement_without_copy_or_parameters_takes_the_pipeline(command: str, one: bool) -> None:
    assert one_statement(command) is one
