"""A job that runs in another database of the server (issue 19: pg_cron's schedule_in_database).

Its run's session opens in that database as the job's owner (pgsched/worker.py); the scheduler
keeps its catalog in its own. A database that goes away later disables the job, with the
connection's refusal as the reason, and the scheduler goes on with the other jobs.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from tests.acceptance.conftest import ServeFactory, query, wait_for
from tests.conftest import PgServer


def test_a_job_runs_in_its_database_and_is_disabled_when_it_is_dropped(db: str, pg_server: PgServer,
                                                                       serve: ServeFactory) -> None:
    other = pg_server.create_db(template=None)  # no pgsched there: only the job's table
    with psycopg.connect(pg_server.dsn(other), autocommit=True) as c:
        c.execute("CREATE TABLE effect (at timestamptz DEFAULT clock_timestamp(), db text DEFAULT current_database())")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE TABLE here (at timestamptz DEFAULT clock_timestamp())")
        elsewhere = c.execute("SELECT pgsched.schedule('elsewhere', '1 second', 'INSERT INTO effect DEFAULT VALUES')"
                              ).fetchone()
        assert elsewhere is not None
        c.execute("SELECT pgsched.alter_job(%s, database => %s)", (elsewhere[0], other))
        c.execute("SELECT pgsched.schedule('home', '1 second', 'INSERT INTO here DEFAULT VALUES')")
    serve(db, "--max-workers", "2")
    wait_for(lambda: query(pg_server.dsn(other), "SELECT count(*) AS n FROM effect")[0]["n"] >= 2, 30,
             "the job to run in its database")
    assert {r["db"] for r in query(pg_server.dsn(other), "SELECT db FROM effect")} == {other}
    assert query(db, "SELECT count(*) AS n FROM pgsched.job_run WHERE job_id = %s "
                     "AND outcome IN ('failure', 'timeout', 'crash')", (elsewhere[0],))[0]["n"] == 0

    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(other)))
    row = wait_for(lambda: next(iter(query(db, "SELECT state, disabled_reason FROM pgsched.job_stats "
                                               "WHERE job_id = %s AND state = 'disabled'", (elsewhere[0],))), None),
                   30, "the job to be disabled")
    assert other in str(row["disabled_reason"])
    # The other job goes on.
    n = query(db, "SELECT count(*) AS n FROM here")[0]["n"]
    wait_for(lambda: query(db, "SELECT count(*) AS n FROM here")[0]["n"] >= n + 2, 30, "the home job to run on")
