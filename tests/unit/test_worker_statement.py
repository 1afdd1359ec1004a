"""Which command text the worker sends with its session reset in one round trip (worker.one_statement),
and which refusals of a new session pass (worker.passing_refusal)."""

from __future__ import annotations

import psycopg
import pytest

from pgsched import worker
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


@pytest.mark.parametrize(("message", "code"), [
    ('connection to server on socket "/tmp/.s.PGSQL.5432" failed: FATAL:  sorry, too many clients already', "53300"),
    ("connection failed: FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
     "53300"),
    ('FATAL:  too many connections for role "alice"', "53300"),
    ('FATAL:  too many connections for database "app"', "53300"),
    ("FATAL:  the database system is starting up", "57P03"),
    ("FATAL:  the database system is shutting down", "57P03"),
    ('connection to server at "db" (10.0.0.1), port 5432 failed: Connection refused', "08001"),
    ('FATAL:  role "alice" is not permitted to log in', None),
    ('FATAL:  password authentication failed for user "alice"', None),
    ('FATAL:  no pg_hba.conf entry for host "10.0.0.2", user "alice", database "app"', None),
    ("fe_sendauth: no password supplied", None),
    ('FATAL:  database "gone" does not exist', None),
    ('FATAL:  permission denied for database "app"', None),
])
def test_a_refused_session_passes_only_for_want_of_slots_or_a_server_not_ready(message: str, code: str | None) -> None:
    """What fails a run (retried) rather than disabling its job: pgsched.worker.passing_refusal."""
    assert worker.passing_refusal(psycopg.OperationalError(message)) == code
