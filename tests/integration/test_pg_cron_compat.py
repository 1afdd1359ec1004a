"""The pg_cron compatibility schema (sql/compat/pg_cron.sql): pg_cron's own regression calls
(expected/pg_cron-test.out of citusdata/pg_cron 1.4, plus the step checks of later releases)
give pg_cron's accept/reject, except the supersets listed in DIFFERENCES (the README's table);
pg_cron's permission rules; cron.job and cron.job_run_details over pgsched's catalog; and the
install rules (on request, never beside the pg_cron extension).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from pgsched.errors import PgCronConflict
from tests.conftest import PgServer
from tests.integration.helpers import Conn, rows, scalar, snapshot

PASSWORD = "compat-pw"


@dataclass(frozen=True)
class Call:
    label: str
    who: str  # 'super' or 'user' (pg_cron's pgcron_cront)
    statement: str  # {user}, {dbno}, {dbyes}, {restart_job}, {user_job} are filled in
    pg_cron: bool  # pg_cron accepts it
    sqlstate: str | None = None  # when refused: the SQLSTATE pgsched gives


# pg_cron's regression calls, in its order, each with pg_cron's outcome.
CALLS = [
    Call("vacuum daily", "super", "SELECT cron.schedule('0 10 * * *', 'VACUUM')", True),
    Call("input too long", "super", "SELECT cron.schedule(repeat('a', 1000), '')", False, "22023"),
    Call("missing parts", "super", "SELECT cron.schedule('* * * *', 'SELECT 1')", False, "22023"),
    Call("trailing characters", "super", "SELECT cron.schedule('5 secondc', 'SELECT 1')", False, "22023"),
    Call("trailing word", "super", "SELECT cron.schedule('50 seconds c', 'SELECT 1')", False, "22023"),
    Call("negative seconds", "super", "SELECT cron.schedule('-1 seconds', 'SELECT 1')", False, "22023"),
    Call("zero seconds", "super", "SELECT cron.schedule('0 seconds', 'SELECT 1')", False, "22023"),
    Call("60 seconds", "super", "SELECT cron.schedule('60 seconds', 'SELECT 1')", False),
    Call("10000000000 seconds", "super", "SELECT cron.schedule('10000000000 seconds', 'SELECT 1')", False),
    Call("@restar", "super", "SELECT cron.schedule('@restar', 'ALTER EXTENSION pg_cron UPDATE')", False, "22023"),
    Call("@restart", "super", "SELECT cron.schedule('@restart', 'SELECT 1')", True),
    Call("named", "super", "SELECT cron.schedule('myvacuum', '0 10 * * *', 'VACUUM')", True),
    Call("same name, new schedule", "super", "SELECT cron.schedule('myvacuum', '0 11 * * *', 'VACUUM')", True),
    Call("same name, new command", "super", "SELECT cron.schedule('myvacuum', '0 11 * * *', 'VACUUM FULL')", True),
    Call("unschedule by name", "super", "SELECT cron.unschedule('myvacuum')", True),
    Call("alter nothing", "super", "SELECT cron.alter_job({restart_job})", False, "22023"),
    Call("alter to a missing database", "super",
         "SELECT cron.alter_job(job_id := {restart_job}, database := 'hopedoesnotexist')", False, "3D000"),
    Call("schedule in a database the user may not connect to", "super",
         "SELECT cron.schedule_in_database(job_name := 'can not connect', schedule := '0 11 * * *', "
         "command := 'VACUUM', database := '{dbno}', username := '{user}')", False, "42501"),
    Call("schedule for a missing user", "super",
         "SELECT cron.schedule_in_database(job_name := 'user does not exist', schedule := '0 11 * * *', "
         "command := 'VACUUM', database := '{dbyes}', username := 'pgcron_useraqwxszedc')", False, "42704"),
    Call("alter to a database the user may not connect to", "super",
         "SELECT cron.alter_job(job_id := {restart_job}, database := '{dbno}', username := '{user}')", False, "42501"),
    Call("user schedules", "user", "SELECT cron.schedule('My vacuum', '0 11 * * *', 'VACUUM')", True),
    Call("user schedules for another user", "user",
         "SELECT cron.schedule_in_database(job_name := 'his vacuum', schedule := '0 11 * * *', command := 'VACUUM', "
         "database := current_database(), username := 'anotheruser')", False, "42501"),
    Call("user changes the username", "user", "SELECT cron.alter_job(job_id := {user_job}, username := 'anotheruser')",
         False, "42501"),
    Call("user alters a job not theirs", "user",
         "SELECT cron.alter_job(job_id := {restart_job}, database := '{dbyes}')", False, "42704"),
    Call("user moves their job to a database they may use", "user",
         "SELECT cron.alter_job(job_id := {user_job}, database := '{dbyes}')", True),
    Call("user moves their job to a database they may not use", "user",
         "SELECT cron.alter_job(job_id := {user_job}, database := '{dbno}')", False, "42501"),
    Call("superuser gives a job to the user", "super",
         "SELECT cron.alter_job(job_id := {restart_job}, username := '{user}')", True),
    Call("superuser schedules for the user", "super",
         "SELECT cron.schedule_in_database(job_name := 'his vacuum', schedule := '0 11 * * *', command := 'VACUUM', "
         "database := current_database(), username := '{user}')", True),
    Call("1 second", "super", "SELECT cron.schedule('1 second', 'SELECT 1')", True),
    Call("mixed case with spaces", "super", "SELECT cron.schedule(' 30 sEcOnDs ', 'SELECT 1')", True),
    Call("59 seconds", "super", "SELECT cron.schedule('59 seconds', 'SELECT 1')", True),
    Call("double space", "super", "SELECT cron.schedule('17  seconds ', 'SELECT 1')", True),
    # pg_cron 1.5 and later
    Call("step out of range", "super", "SELECT cron.schedule('*/5000000000 10 * * *', 'SELECT 1')", False, "22023"),
    Call("step of 60 minutes", "super", "SELECT cron.schedule('*/60 10 * * *', 'SELECT 1')", False, "22023"),
]

# Where pgsched deliberately accepts more than pg_cron (README, "pg_cron compatibility").
DIFFERENCES = {
    "60 seconds": "pgsched takes any positive interval, pg_cron only 1-59 seconds",
    "10000000000 seconds": "pgsched takes any positive interval, pg_cron only 1-59 seconds",
}


@dataclass
class Setup:
    admin: Conn
    user: Conn
    names: dict[str, str]


@pytest.fixture
def cron_db(pg_server: PgServer, db: str) -> Iterator[Setup]:
    """A pgsched database with the compatibility schema, pg_cron's test role and two databases:
    one the role may connect to and one it may not."""
    tag = uuid.uuid4().hex[:8]
    names = {"user": f"pgcron_cront_{tag}", "dbno": f"pgsched_test_dbno_{tag}", "dbyes": f"pgsched_test_dbyes_{tag}"}
    with psycopg.connect(db, autocommit=True) as admin:
        result = migrate.init(admin, pg_cron_compat=True)
        assert result.pg_cron_compat
        for d in ("dbno", "dbyes"):
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(names[d])))
        admin.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(names["dbno"])))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(names["user"]),
                                                                           sql.Literal(PASSWORD)))
        params = psycopg.conninfo.conninfo_to_dict(db)
        params.update(user=names["user"], password=PASSWORD)
        try:
            with psycopg.connect(psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()}),
                                 autocommit=True) as user:
                yield Setup(admin, user, names)
        finally:
            admin.execute(sql.SQL("DELETE FROM pgsched.job WHERE owner::text = {}").format(
                sql.Literal(names["user"])))
            for d in ("dbno", "dbyes"):
                pg_server.drop_db(names[d])
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(names["user"])))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(names["user"])))


def test_pg_cron_regression_calls_give_pg_cron_outcomes(cron_db: Setup) -> None:
    names = dict(cron_db.names)
    outcomes: list[tuple[str, bool, bool]] = []
    for call in CALLS:
        conn = cron_db.admin if call.who == "super" else cron_db.user
        statement = call.statement.format(**names)
        before = snapshot(cron_db.admin)
        try:
            result = scalar(conn, statement)
            accepted = True
        except psycopg.Error as e:
            accepted = False
            assert e.sqlstate == call.sqlstate, (call.label, e.sqlstate, e.diag.message_primary)
            assert snapshot(cron_db.admin) == before, f"{call.label}: refused but wrote"
        expected = call.pg_cron if call.label not in DIFFERENCES else not call.pg_cron
        outcomes.append((call.label, call.pg_cron, accepted))
        assert accepted == expected, (call.label, statement)
        if call.label == "@restart":
            names["restart_job"] = str(result)
        if call.label == "user schedules":
            names["user_job"] = str(result)
        if call.label == "named":
            names["named_job"] = str(result)
        if call.label.startswith("same name"):
            assert str(result) == names["named_job"], "the same name again updates the job"
    agree = sum(pg == ours for _, pg, ours in outcomes)
    assert (agree, len(outcomes)) == (len(CALLS) - len(DIFFERENCES), len(CALLS))


def test_cron_job_shows_pg_cron_columns(cron_db: Setup) -> None:
    a, u, n = cron_db.admin, cron_db.user, cron_db.names
    unnamed = scalar(a, "SELECT cron.schedule('0 10 * * *', 'VACUUM')")
    named = scalar(a, "SELECT cron.schedule('myvacuum', '0 10 * * *', 'VACUUM')")
    assert scalar(a, "SELECT cron.schedule('myvacuum', '0 11 * * *', 'VACUUM FULL')") == named
    mine = scalar(u, "SELECT cron.schedule('My vacuum', '*/5 * * * *', 'SELECT 1')")
    assert rows(a, "SELECT jobid, jobname, schedule, command, username, active, database, nodename "
                   "FROM cron.job ORDER BY jobid") == [
        {"jobid": unnamed, "jobname": None, "schedule": "0 10 * * *", "command": "VACUUM", "username": "postgres",
         "active": True, "database": scalar(a, "SELECT current_database()"), "nodename": "localhost"},
        {"jobid": named, "jobname": "myvacuum", "schedule": "0 11 * * *", "command": "VACUUM FULL",
         "username": "postgres", "active": True, "database": scalar(a, "SELECT current_database()"),
         "nodename": "localhost"},
        {"jobid": mine, "jobname": "My vacuum", "schedule": "*/5 * * * *", "command": "SELECT 1",
         "username": n["user"], "active": True, "database": scalar(a, "SELECT current_database()"),
         "nodename": "localhost"},
    ]
    # A role sees its own jobs only (pg_cron's rule), even though pgsched.jobs would show it more
    # if it were a member of the database owner.
    assert [r["jobid"] for r in rows(u, "SELECT jobid FROM cron.job")] == [mine]
    # and changes only its own
    with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist or you don't own it"):
        u.execute("SELECT cron.unschedule(%s::bigint)", (named,))
    with pytest.raises(psycopg.errors.UndefinedObject, match="does not exist or you don't own it"):
        u.execute("SELECT cron.alter_job(%s, active := false)", (named,))
    # alter_job: each attribute
    a.execute("SELECT cron.alter_job(%s, schedule := '*/10 * * * *', command := 'SELECT 2', active := false)",
              (mine,))
    assert rows(u, "SELECT schedule, command, active FROM cron.job") == [
        {"schedule": "*/10 * * * *", "command": "SELECT 2", "active": False}]
    assert scalar(a, "SELECT scheduled FROM pgsched.jobs WHERE job_id = %s", (mine,)) is False
    assert scalar(u, "SELECT cron.unschedule(%s::bigint)", (mine,)) is True
    assert scalar(u, "SELECT count(*) FROM cron.job") == 0


def test_schedule_in_database_runs_as_the_named_user_in_the_named_database(cron_db: Setup) -> None:
    a, n = cron_db.admin, cron_db.names
    a.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(n["dbno"]),
                                                                    sql.Identifier(n["user"])))
    job = scalar(a, "SELECT cron.schedule_in_database('elsewhere', '0 3 * * *', 'SELECT 1', %s, %s, false)",
                 (n["dbno"], n["user"]))
    assert rows(a, "SELECT username, database, active, jobname FROM cron.job WHERE jobid = %s", (job,)) == [
        {"username": n["user"], "database": n["dbno"], "active": False, "jobname": "elsewhere"}]
    assert scalar(a, "SELECT database FROM pgsched.jobs WHERE job_id = %s", (job,)) == n["dbno"]


def test_run_details_map_outcomes(cron_db: Setup) -> None:
    a = cron_db.admin
    job = scalar(a, "SELECT cron.schedule('x', '0 3 * * *', 'SELECT 1')")
    a.execute("""INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, message)
                 VALUES (%(j)s, '2026-01-01', '2026-01-01', '2026-01-01 00:00:01', 'success', NULL),
                        (%(j)s, '2026-01-02', '2026-01-02', '2026-01-02 00:00:01', 'failure', 'boom'),
                        (%(j)s, '2026-01-03', '2026-01-03', '2026-01-03 00:00:01', 'timeout', 'too slow'),
                        (%(j)s, '2026-01-04', '2026-01-04', NULL, 'running', NULL)""", {"j": job})
    assert [(r["status"], r["return_message"]) for r in rows(
        a, "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s ORDER BY start_time", (job,))] == [
        ("succeeded", None), ("failed", "boom"), ("failed", "timeout: too slow"), ("running", None)]
    assert scalar(cron_db.user, "SELECT count(*) FROM cron.job_run_details") == 0


def test_schedule_and_unschedule_of_null_give_null_and_do_nothing(cron_db: Setup) -> None:
    """As pg_cron's (STRICT): unscheduling a job looked up by a name that is gone is a no-op."""
    a = cron_db.admin
    scalar(a, "SELECT cron.schedule('kept', '0 3 * * *', 'SELECT 1')")
    before = snapshot(a)
    for call in ("cron.unschedule((SELECT jobid FROM cron.job WHERE jobname = 'gone'))", "cron.unschedule(NULL::text)",
                 "cron.schedule(NULL, 'SELECT 1')", "cron.schedule('n', NULL, 'SELECT 1')",
                 "cron.schedule('n', '0 3 * * *', NULL)"):
        assert scalar(a, f"SELECT {call}") is None, call
    assert snapshot(a) == before


def test_install_is_refused_beside_the_pg_cron_extension_or_a_foreign_cron_schema(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE SCHEMA cron")
        with pytest.raises(PgCronConflict, match="pgsched did not create it"):
            migrate.init(c, pg_cron_compat=True)
        assert scalar(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'cron'::regnamespace") == 0
        c.execute("DROP SCHEMA cron")
        # Without the flag nothing is installed; with it, it stays installed through later inits.
        assert migrate.init(c).pg_cron_compat is False
        assert scalar(c, "SELECT to_regnamespace('cron')") is None
        assert migrate.init(c, pg_cron_compat=True).pg_cron_compat is True
        assert migrate.init(c).pg_cron_compat is True
        assert scalar(c, "SELECT to_regprocedure('cron.schedule(text, text, text)') IS NOT NULL") is True


def test_a_user_deletes_its_own_finished_runs_through_job_run_details(cron_db: Setup) -> None:
    """pg_cron's README cleanup, DELETE FROM cron.job_run_details WHERE end_time < ...: each user's own
    rows, ended ones only; a run in progress and a row that keeps a run from happening twice (a run
    trigger_job started on a scheduler) stay, and are not counted; another role's rows are not its to
    delete (it does not see them)."""
    a, u = cron_db.admin, cron_db.user
    mine = scalar(u, "SELECT cron.schedule('mine', '0 3 * * *', 'SELECT 1')")
    theirs = scalar(a, "SELECT cron.schedule('theirs', '0 3 * * *', 'SELECT 1')")
    me = scalar(a, "SELECT instance_id FROM pgsched._register_instance_v2('h', 1, 'test', 4)")
    for job in (mine, theirs):
        a.execute("""INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, trigger,
                                                  instance_id)
                     VALUES (%(j)s, '2026-01-01', '2026-01-01', '2026-01-01 00:00:01', 'success', 'schedule', NULL),
                            (%(j)s, '2026-01-02', '2026-01-02', '2026-01-02 00:00:01', 'failure', 'schedule', NULL),
                            (%(j)s, '2026-01-03', '2026-01-03', '2026-01-03 00:00:01', 'success', 'manual', %(i)s),
                            (%(j)s, '2026-01-04', '2026-01-04', NULL, 'running', 'schedule', NULL)""",
                  {"j": job, "i": me})
    cur = u.execute("DELETE FROM cron.job_run_details WHERE end_time < '2026-01-05' OR end_time IS NULL")
    assert cur.rowcount == 2
    assert rows(a, "SELECT jobid, status, start_time::date::text AS day FROM cron.job_run_details "
                   "ORDER BY jobid, start_time") == [
        {"jobid": mine, "status": "succeeded", "day": "2026-01-03"},
        {"jobid": mine, "status": "running", "day": "2026-01-04"}] + [
        {"jobid": theirs, "status": s, "day": d} for s, d in (("succeeded", "2026-01-01"), ("failed", "2026-01-02"),
                                                              ("succeeded", "2026-01-03"), ("running", "2026-01-04"))]
    # The function behind it, called directly, tells another role nothing: a run of a job it may not
    # act for is as one that is not there.
    theirs_run = scalar(a, "SELECT run_id FROM pgsched.job_run WHERE job_id = %s AND outcome = 'failure'", (theirs,))
    assert scalar(u, "SELECT cron._forget_run(%s)", (theirs_run,)) is False
    assert scalar(u, "SELECT cron._forget_run(-1)") is False
    # The superuser's cleanup reaches every role's rows, as pg_cron's, a job's whose owner was dropped
    # included.
    a.execute("CREATE ROLE pgcron_gone_owner LOGIN")
    gone = scalar(a, "SELECT cron.schedule('gone_owner', '0 3 * * *', 'SELECT 1')")
    a.execute("UPDATE pgsched.job SET owner = 'pgcron_gone_owner'::regrole WHERE job_id = %s", (gone,))
    a.execute("""INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, trigger)
                 VALUES (%s, '2026-01-01', '2026-01-01', '2026-01-01 00:00:01', 'failure', 'schedule')""", (gone,))
    a.execute("DROP ROLE pgcron_gone_owner")
    assert a.execute("DELETE FROM cron.job_run_details WHERE status = 'failed'").rowcount == 2
    assert scalar(a, "SELECT count(*) FROM pgsched.job_run WHERE outcome = 'failure'") == 0
    a.execute("DELETE FROM pgsched.job WHERE job_id = %s", (gone,))


def test_pg_cron_s_functions_leave_a_pgsched_job_of_another_kind_of_the_same_name_alone(cron_db: Setup) -> None:
    """A procedure job named 'pj' (pgsched's add_job) is not a pg_cron job: cron.schedule('pj', ...)
    and cron.schedule_in_database('pj', ...) do not turn it into a command job and
    cron.unschedule('pj') does not delete it (each refused, nothing written)."""
    a = cron_db.admin
    a.execute("CREATE PROCEDURE public.pj_proc(job_id int, config jsonb) LANGUAGE sql AS 'SELECT 1'")
    pj = scalar(a, "SELECT pgsched.add_job('pj_proc', '1 hour', job_name => 'pj')")
    before = snapshot(a)
    for call, sqlstate in (("cron.schedule('pj', '0 3 * * *', 'SELECT 1')", "42710"),
                           ("cron.schedule_in_database('pj', '0 3 * * *', 'SELECT 1', current_database())", "42710"),
                           ("cron.unschedule('pj')", "42704")):
        with pytest.raises(psycopg.Error) as e:
            scalar(a, f"SELECT {call}")
        assert e.value.sqlstate == sqlstate and "pj" in str(e.value), (call, e.value)
        assert snapshot(a) == before
    assert scalar(a, "SELECT kind FROM pgsched.job WHERE job_id = %s", (pj,)) == "proc"
