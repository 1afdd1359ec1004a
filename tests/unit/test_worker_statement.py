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
])
def test_only_text_that_is_surely_one_statement_and_no_copy_takes_the_pipeline(command: str, one: bool) -> None:
    assert one_statement(command) is one
