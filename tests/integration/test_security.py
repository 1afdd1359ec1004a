"""Owner isolation in SQL (issue 5): who sees, changes and runs which jobs, and what a
session cannot become.

Three roles at least: two job owners (alice, bob) and the scheduler's role, a
non-superuser that owns the database and runs `pgsched init`, so it owns the schema
and its tables. Roles are cluster-wide: each test session makes its own, with a
unique suffix, and drops them at the end. docs/security.md lists every escape
attempt tested here with its result.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from tests.conftest import PgServer
from tests.integration.helpers import Conn, rows, scalar, snapshot

PASSWORD = "pgsched-test-only"

# Job targets, created by a superuser in public: job_ok is executable by everyone,
# job_secret only by bob; bob_definer is a SECURITY DEFINER function owned by bob
# that alice may not execute; public.ran records what ran as whom.
OWNER_SETUP_SQL = """
CREATE TABLE public.ran (job_id integer, who text, via text);
GRANT SELECT, INSERT ON public.ran TO PUBLIC;
CREATE FUNCTION public.job_ok(job_id integer, config jsonb) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO public.ran VALUES (job_id, current_user, 'job_ok') $$;
CREATE PROCEDURE public.job_fail(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'PS009', MESSAGE = coalesce(config->>'secret', 'failed on purpose');
END $$;
CREATE FUNCTION public.job_secret(job_id integer, config jsonb) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO public.ran VALUES (job_id, current_user, 'job_secret') $$;
REVOKE EXECUTE ON FUNCTION public.job_secret(integer, jsonb) FROM PUBLIC;
CREATE FUNCTION public.bob_definer() RETURNS text LANGUAGE sql SECURITY DEFINER
    SET search_path = pg_catalog AS $$ SELECT current_user::text $$;
REVOKE EXECUTE ON FUNCTION public.bob_definer() FROM PUBLIC;
"""


@dataclass
class OwnerDb:
    """A database installed by the scheduler's role, and the roles that use it."""

    server: PgServer
    dbname: str
    scheduler: str
    alice: str
    bob: str
    nologin: str
    team: str
    dbowner: str
    superuser: str

    def dsn(self, user: str | None = None) -> str:
        dsn = self.server.dsn(self.dbname)
        return dsn if user is None else dsn_as(dsn, user)

    def connect(self, user: str | None = None) -> Conn:
        return psycopg.connect(self.dsn(user), autocommit=True)


@contextmanager
def cluster_roles(pg_server: PgServer, login: tuple[str, ...],
                  nologin: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """Roles named `<key>_<unique suffix>` (roles are cluster-wide), with PASSWORD, dropped at the end.
    Databases where they own objects must be dropped first."""
    suffix = uuid.uuid4().hex[:8]
    names = {k: f"{k}_{suffix}" for k in login + nologin}
    created: list[str] = []
    try:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
            for key, role in names.items():
                admin.execute(sql.SQL("CREATE ROLE {} {} PASSWORD {}").format(
                    sql.Identifier(role), sql.SQL("LOGIN" if key in login else "NOLOGIN"), sql.Literal(PASSWORD)))
                created.append(role)
        yield names
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
            for role in reversed(created):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def dsn_as(dsn: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params.update(user=user, password=PASSWORD)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items() if v is not None})


@contextmanager
def owner_database(pg_server: PgServer) -> Iterator[OwnerDb]:
    """Roles with a unique suffix, a database owned by the scheduler's role, `pgsched init`
    run by that role (a non-superuser: PL/Python cannot be installed and is skipped)."""
    with cluster_roles(pg_server, ("pgsched_scheduler", "alice", "bob", "team", "dbowner"), ("nologin",)) as names:
        dbname = pg_server.create_db(template=None)
        try:
            with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
                # alice may act as `nologin` and `team` (SET ROLE); nobody is a member of bob.
                admin.execute(sql.SQL("GRANT {}, {} TO {}").format(
                    sql.Identifier(names["nologin"]), sql.Identifier(names["team"]), sql.Identifier(names["alice"])))
                admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                    sql.Identifier(dbname), sql.Identifier(names["pgsched_scheduler"])))
                superuser = str(scalar(admin, "SELECT current_user"))
            odb = OwnerDb(pg_server, dbname, names["pgsched_scheduler"], names["alice"], names["bob"],
                          names["nologin"], names["team"], names["dbowner"], superuser)
            with odb.connect(odb.scheduler) as sched:
                result = migrate.init(sched, plpython=True)
                assert result.plpython is False  # a non-superuser cannot create PL/Python functions
            with odb.connect() as admin:
                admin.execute(OWNER_SETUP_SQL)
                admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION public.job_secret(integer, jsonb) TO {}").format(
                    sql.Identifier(odb.bob)))
                admin.execute(sql.SQL("ALTER FUNCTION public.bob_definer() OWNER TO {}").format(
                    sql.Identifier(odb.bob)))
            yield odb
        finally:
            pg_server.drop_db(dbname)


@pytest.fixture(scope="module")
def odb(pg_server: PgServer) -> Iterator[OwnerDb]:
    with owner_database(pg_server) as found:
        yield found


@dataclass
class Sessions:
    odb: OwnerDb
    alice: Conn
    bob: Conn
    scheduler: Conn
    admin: Conn


@pytest.fixture
def s(odb: OwnerDb) -> Iterator[Sessions]:
    with odb.connect(odb.alice) as alice, odb.connect(odb.bob) as bob, \
            odb.connect(odb.scheduler) as scheduler, odb.connect() as admin:
        yield Sessions(odb, alice, bob, scheduler, admin)
        admin.execute("DELETE FROM pgsched.job")
        admin.execute("DELETE FROM public.ran")


def sqlstate_of(conn: Conn, query: str, params: tuple[object, ...] | None = None) -> str | None:
    """Run `query`; the SQLSTATE it failed with, or None if it succeeded."""
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def error_of(conn: Conn, query: str, params: tuple[object, ...] | None = None) -> psycopg.Error:
    try:
        conn.execute(query, params)
    except psycopg.Error as e:
        return e
    raise AssertionError(f"{query} succeeded")


def ids(conn: Conn, relation: str) -> set[int]:
    return {int(str(r[0])) for r in conn.execute(f"SELECT job_id FROM {relation}")}


def two_owners(s: Sessions) -> tuple[int, int, int]:
    """alice's proc job, bob's proc job (failed once, with a secret in its message) and bob's command job."""
    a = scalar(s.alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', job_name => 'mine')")
    b = scalar(s.bob, "SELECT pgsched.add_job('public.job_fail', '1 hour', job_name => 'his', "
                      "config => '{\"secret\": \"bob-secret-42\"}')")
    c = scalar(s.bob, "SELECT pgsched.schedule('his-command', '1 day', 'SELECT 1')")
    with pytest.raises(psycopg.Error, match="bob-secret-42"):
        s.bob.execute("CALL pgsched.run_job(%s)", (b,))
    return int(a), int(b), int(c)


# -- seeing --------------------------------------------------------------------------


def test_a_role_sees_only_its_own_jobs_stats_and_history(s: Sessions) -> None:
    a, b, c = two_owners(s)
    s.alice.execute("CALL pgsched.run_job(%s)", (a,))
    for relation in ("pgsched.jobs", "pgsched.job_stats", "pgsched.job_history", "pgsched.job",
                     "pgsched.job_stat", "pgsched.job_run", "public.jobs", "public.job_stats", "public.job_history"):
        assert ids(s.alice, relation) == {a}, relation
        assert ids(s.bob, relation) >= {b}, relation
        assert a not in ids(s.bob, relation), relation
    assert ids(s.bob, "pgsched.jobs") == {b, c}
    # bob's error message (with its secret) is in his history and nowhere alice can read.
    assert [r["message"] for r in rows(s.bob, "SELECT message FROM pgsched.job_history")] == ["bob-secret-42"]
    for relation in ("pgsched.job_history", "public.job_history", "pgsched.job_run", "pgsched.jobs", "pgsched.job"):
        assert "bob-secret-42" not in str(s.alice.execute(f"SELECT * FROM {relation} t").fetchall()), relation


def test_the_scheduler_role_and_superusers_see_all(s: Sessions) -> None:
    a, b, c = two_owners(s)
    for relation in ("pgsched.jobs", "pgsched.job_stats", "pgsched.job"):
        assert ids(s.scheduler, relation) == ids(s.admin, relation) == {a, b, c}, relation
    assert scalar(s.scheduler, "SELECT message FROM pgsched.job_history WHERE job_id = %s", (b,)) == "bob-secret-42"


def test_the_database_owner_sees_all_but_changes_and_runs_only_its_own(s: Sessions) -> None:
    a, b, c = two_owners(s)
    odb = s.odb
    s.admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(odb.dbname),
                                                                   sql.Identifier(odb.dbowner)))
    try:
        with odb.connect(odb.dbowner) as owner:
            for relation in ("pgsched.jobs", "pgsched.job_stats", "public.jobs", "pgsched.job_stat"):
                assert ids(owner, relation) == {a, b, c}, relation
            assert scalar(owner, "SELECT message FROM pgsched.job_history WHERE job_id = %s", (b,)) == \
                "bob-secret-42"
            before = snapshot(s.admin)
            # Seeing is not changing: writing bob's job would let the owner run SQL as bob.
            for call in (f"SELECT pgsched.alter_job({b}, scheduled => false)", f"SELECT pgsched.delete_job({b})",
                         f"CALL pgsched.run_job({b})", f"SELECT pgsched.unschedule({c}::bigint)",
                         f"SELECT pgsched.alter_job({b}, next_start => now(), if_exists => true)"):
                e = error_of(owner, call)
                assert (e.sqlstate, "may see it but not change" in str(e) or "may not become" in str(e)) == \
                    ("42501", True), (call, str(e))
            assert owner.execute(f"UPDATE pgsched.job SET command = 'SELECT 2' WHERE job_id = {c}").rowcount == 0
            assert owner.execute(f"DELETE FROM pgsched.job WHERE job_id = {b}").rowcount == 0
            assert owner.execute(
                f"UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = {b}").rowcount == 0
            assert snapshot(s.admin) == before
    finally:
        s.admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(odb.dbname),
                                                                       sql.Identifier(odb.scheduler)))


# -- changing and running ----------------------------------------------------------------


def test_others_jobs_are_not_found_for_alter_delete_run(s: Sessions) -> None:
    _, b, c = two_owners(s)
    before = snapshot(s.admin)
    for call in (f"SELECT pgsched.alter_job({b}, scheduled => false)",
                 f"SELECT pgsched.alter_job({b}, config => '{{}}')",
                 f"SELECT pgsched.delete_job({b})",
                 f"CALL pgsched.run_job({b})",
                 f"CALL run_job({c})",
                 f"SELECT pgsched.unschedule({c}::bigint)",
                 "SELECT pgsched.unschedule('his-command')",
                 f"SELECT alter_job({c}, schedule => '1 minute')"):
        e = error_of(s.alice, call)
        # The same answer as for a job that does not exist: no existence leak.
        assert e.sqlstate == "42704", (call, str(e))
        assert "not found" in str(e), call
    # if_exists: skipped as if absent.
    assert s.alice.execute(f"SELECT * FROM pgsched.alter_job({b}, scheduled => false, if_exists => true)") \
        .fetchall() == []
    # alice's own schedule('his-command', ...) is a new job of hers, not an update of bob's.
    mine = scalar(s.alice, "SELECT pgsched.schedule('his-command', '1 hour', 'SELECT 3')")
    assert mine != c
    assert snapshot(s.admin)[0] == before[0] + [scalar(s.admin, "SELECT to_jsonb(j) FROM pgsched.job j "
                                                                "WHERE job_id = %s", (mine,))]


def test_the_whole_api_works_for_an_ordinary_login_role(s: Sessions) -> None:
    """Qualified and unqualified, through every entry point: the grants are enough."""
    al = s.alice
    a = scalar(al, "SELECT add_job('public.job_ok', '1 hour', config => '{\"k\": 1}', job_name => 'a1')")
    a2 = scalar(al, "SELECT pgsched.add_job('public.job_ok', interval '2 hours')")
    c = scalar(al, "SELECT schedule('c1', '*/5 * * * *', 'INSERT INTO public.ran VALUES (0, current_user, ''cmd'')')")
    c2 = scalar(al, "SELECT pgsched.schedule('1 day', 'SELECT 1')")
    assert scalar(al, "SELECT schedule('c1', '*/10 * * * *', 'SELECT 2')") == c
    assert al.execute("SELECT * FROM alter_job(%s, config_merge => '{\"j\": 2}', next_start => now())",
                      (a,)).fetchone() is not None
    assert al.execute(f"SELECT * FROM pgsched.alter_job({a2}, schedule => '3 hours', scheduled => false)") \
        .fetchone() is not None
    al.execute("CALL run_job(%s)", (a,))
    al.execute("CALL pgsched.run_job(%s)", (c2,))
    assert rows(al, "SELECT who, via FROM public.ran") == [{"who": s.odb.alice, "via": "job_ok"}]
    f = scalar(al, "SELECT add_job('public.job_fail', '1 hour')")
    assert sqlstate_of(al, "CALL run_job(%s)", (f,)) == "PS009"
    assert [(r["job_id"], r["outcome"]) for r in rows(al, "SELECT * FROM job_history ORDER BY run_id")] == \
        [(a, "success"), (c2, "success"), (f, "failure")]
    st = rows(al, "SELECT job_id, total_runs, total_failures, state FROM job_stats ORDER BY job_id")
    assert [(r["job_id"], r["total_runs"], r["state"]) for r in st] == \
        [(a, 1, "scheduled"), (a2, 0, "disabled"), (c, 0, "scheduled"), (c2, 1, "scheduled"), (f, 1, "scheduled")]
    assert scalar(al, "SELECT count(*) FROM pgsched.instance") == 0
    assert scalar(al, "SELECT pgsched.plpython_available()") is False
    assert scalar(al, "SELECT unschedule('c1')") is True
    assert scalar(al, "SELECT unschedule(%s::bigint)", (c2,)) is True
    al.execute("SELECT delete_job(%s)", (a2,))
    # Direct DML on one's own job is allowed (and kept consistent by the triggers).
    assert al.execute("UPDATE pgsched.job SET scheduled = false WHERE job_id = %s", (a,)).rowcount == 1
    assert scalar(al, "SELECT state FROM job_stats WHERE job_id = %s", (a,)) == "disabled"
    assert al.execute("UPDATE pgsched.job_stat SET next_start = '2030-01-01' WHERE job_id = %s", (a,)).rowcount == 1
    j = scalar(al, "INSERT INTO pgsched.job (job_name, kind, command, schedule) "
                   "VALUES ('direct', 'command', 'SELECT 1', '1 hour') RETURNING job_id")
    assert scalar(al, "SELECT (owner::text, state) FROM job_stats WHERE job_id = %s", (j,)) == \
        (s.odb.alice, "scheduled")
    assert al.execute("DELETE FROM pgsched.job WHERE job_id = %s", (j,)).rowcount == 1
    assert ids(al, "jobs") == {a, f}


def test_run_job_of_a_role_one_is_member_of_runs_as_that_role(s: Sessions) -> None:
    odb = s.odb
    s.alice.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(odb.team)))
    t = scalar(s.alice, "SELECT pgsched.add_job('public.job_ok', '1 hour')")
    s.alice.execute("RESET ROLE")
    assert scalar(s.alice, "SELECT owner::text FROM pgsched.jobs WHERE job_id = %s", (t,)) == odb.team
    s.alice.execute("CALL pgsched.run_job(%s)", (t,))
    assert rows(s.alice, "SELECT who FROM public.ran") == [{"who": odb.team}]
    assert scalar(s.alice, "SELECT current_user") == odb.alice
    assert scalar(s.alice, "SELECT outcome FROM pgsched.job_history WHERE job_id = %s", (t,)) == "success"
    # bob is no member of team: not found.
    assert sqlstate_of(s.bob, "CALL pgsched.run_job(%s)", (t,)) == "42704"


# -- direct writes -------------------------------------------------------------------------


def test_direct_writes_to_others_rows_are_refused_or_touch_nothing(s: Sessions) -> None:
    a, b, c = two_owners(s)
    al = s.alice
    before = snapshot(s.admin)
    run_b = scalar(s.admin, "SELECT run_id FROM pgsched.job_run WHERE job_id = %s", (b,))
    bob = s.odb.bob
    touch_nothing = [
        f"UPDATE pgsched.job SET command = 'DROP TABLE public.ran' WHERE job_id = {c}",
        f"UPDATE pgsched.job SET owner = '{s.odb.alice}' WHERE job_id = {b}",
        "UPDATE pgsched.job SET scheduled = false WHERE owner <> current_user::regrole",
        f"DELETE FROM pgsched.job WHERE job_id = {b}",
        "DELETE FROM pgsched.job WHERE owner <> current_user::regrole",
        f"UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = {b}",
    ]
    for stmt in touch_nothing:
        assert al.execute(stmt).rowcount == 0, stmt
    refused = [
        # a job owned by someone else: row-level security's WITH CHECK
        f"INSERT INTO pgsched.job (job_name, owner, kind, command, schedule) "
        f"VALUES ('evil', '{bob}', 'command', 'SELECT 1', '1 minute')",
        f"UPDATE pgsched.job SET owner = '{bob}' WHERE job_id = {a}",
        f"UPDATE pgsched.job SET owner = '{s.odb.scheduler}' WHERE job_id = {a}",
        # job_stat and job_run are not written directly (only next_start of one's own job)
        f"UPDATE pgsched.job_stat SET total_runs = 0 WHERE job_id = {b}",
        f"UPDATE pgsched.job_stat SET state = 'disabled' WHERE job_id = {a}",
        f"INSERT INTO pgsched.job_stat (job_id) VALUES ({b})",
        f"DELETE FROM pgsched.job_stat WHERE job_id = {b}",
        f"INSERT INTO pgsched.job_run (job_id, plan_time, backend_pid) VALUES ({a}, now(), 1)",
        f"UPDATE pgsched.job_run SET message = 'forged' WHERE run_id = {run_b}",
        f"DELETE FROM pgsched.job_run WHERE run_id = {run_b}",
        "TRUNCATE pgsched.job CASCADE",
        "TRUNCATE pgsched.job_run",
        "INSERT INTO pgsched.instance (host, pid, version, max_workers) VALUES ('x', 1, 'x', 1)",
        "UPDATE pgsched.instance SET stopped_at = now()",
        "DELETE FROM pgsched.migration",
        "UPDATE pgsched.api_state SET checksum = 'x'",
        "ALTER TABLE pgsched.job DISABLE ROW LEVEL SECURITY",
        "DROP POLICY job_read ON pgsched.job",
        "CREATE POLICY mine ON pgsched.job USING (true)",
        "CREATE OR REPLACE FUNCTION pgsched.add_job(proc regproc, schedule text) RETURNS integer "
        "LANGUAGE sql AS 'SELECT 1'",
        "CREATE FUNCTION pgsched.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "SELECT setval(pg_get_serial_sequence('pgsched.job', 'job_id'), 1)",
        "SELECT nextval('pgsched.lease_token_seq')",
    ]
    for stmt in refused:
        assert sqlstate_of(al, stmt) == "42501", stmt
    assert snapshot(s.admin) == before


def test_scheduler_functions_are_not_executable_by_other_roles(s: Sessions) -> None:
    a, _, _ = two_owners(s)
    found = rows(s.admin, """
        SELECT p.proname, p.oid::regprocedure::text AS sig,
               has_function_privilege(%s::name, p.oid, 'EXECUTE') AS alice_may,
               has_function_privilege(%s::name, p.oid, 'EXECUTE') AS scheduler_may
          FROM pg_proc p WHERE p.pronamespace = 'pgsched'::regnamespace""", (s.odb.alice, s.odb.scheduler))
    may = {r["proname"] for r in found if r["alice_may"]}
    assert all(r["scheduler_may"] for r in found)
    for private in ("_claim", "_claim_v2", "_take_over_v2", "_finish_runs", "_abandoned_runs", "_register_instance",
                    "_instance_heartbeat", "_instance_stop", "_mark_start", "_mark_end", "_disable_job",
                    "_disable_job_v2", "_next_due", "_set_terminating", "_missing_runs", "_record_skipped",
                    "_abandoned_runs_v2", "_register_instance_v2", "_instance_stop_v2", "_mark_end_v2",
                    "_next_due_v2", "_heartbeat", "_heartbeat_v2", "_catch_up", "_catch_up_v2",
                    "_start_request", "_requests", "_request_ttl", "_check_may_act", "_session_may_act", "_event",
                    "_end_run"):
        assert private not in may, private
    for api in ("add_job", "alter_job", "delete_job", "run_job", "schedule", "unschedule", "_run_job_start",
                "trigger_job", "cancel_job", "_api"):
        assert api in may, api
    # Calling any of them is refused before anything happens.
    calls = [str(r[0]) for r in s.admin.execute("""
        SELECT format(CASE WHEN p.prokind = 'p' THEN 'CALL %%s(%%s)' ELSE 'SELECT %%s(%%s)' END, p.oid::regproc,
                      (SELECT string_agg(format('NULL::%%s', format_type(t, NULL)), ', ' ORDER BY i)
                         FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, i)))
          FROM pg_proc p
         WHERE p.pronamespace = 'pgsched'::regnamespace AND p.prorettype <> 'trigger'::regtype
           AND NOT has_function_privilege(%s::name, p.oid, 'EXECUTE')""", (s.odb.alice,))]
    assert len(calls) >= 13
    before = snapshot(s.admin)
    for call in [*calls, f"SELECT pgsched._mark_start({a}, now(), 'manual')"]:
        assert sqlstate_of(s.alice, call) == "42501", call
    assert snapshot(s.admin) == before


def test_run_job_marks_only_touch_the_callers_own_manual_run(s: Sessions) -> None:
    a, b, _ = two_owners(s)
    before = snapshot(s.admin)
    # Starting a run of bob's job through the definer function: not found.
    assert sqlstate_of(s.alice, f"SELECT pgsched._run_job_start({b})") == "42704"
    # Closing bob's run (another backend's): nothing happens.
    run_b = scalar(s.admin, "SELECT max(run_id) FROM pgsched.job_run WHERE job_id = %s", (b,))
    assert scalar(s.alice, "SELECT pgsched._run_job_end(%s, NULL, 'forged')", (run_b,)) is False
    # A run bob's session has open is not closable from alice's either.
    s.admin.execute("UPDATE pgsched.job_run SET outcome = 'running' WHERE run_id = %s", (run_b,))
    assert scalar(s.alice, "SELECT pgsched._run_job_end(%s, NULL, 'forged')", (run_b,)) is False
    s.admin.execute("UPDATE pgsched.job_run SET outcome = 'failure' WHERE run_id = %s", (run_b,))
    assert snapshot(s.admin) == before
    # Her own job: allowed, and closable from her own backend only.
    rid = scalar(s.alice, "SELECT pgsched._run_job_start(%s)", (a,))
    assert scalar(s.bob, "SELECT pgsched._run_job_end(%s, NULL, NULL)", (rid,)) is False
    assert scalar(s.alice, "SELECT pgsched._run_job_end(%s, NULL, NULL)", (rid,)) is True
    assert scalar(s.alice, "SELECT outcome FROM pgsched.job_history WHERE run_id = %s", (rid,)) == "success"


# -- adding: EXECUTE and LOGIN -----------------------------------------------------------


def test_add_job_needs_execute_on_the_proc(s: Sessions) -> None:
    before = snapshot(s.admin)
    e = error_of(s.alice, "SELECT pgsched.add_job('public.job_secret', '1 hour')")
    assert e.sqlstate == "42501"
    assert s.odb.alice in str(e) and "job_secret" in str(e)
    assert e.diag.message_detail and "runs as its owner" in e.diag.message_detail
    assert e.diag.message_hint == f"GRANT EXECUTE ON FUNCTION public.job_secret(integer,jsonb) TO {s.odb.alice}"
    assert sqlstate_of(s.alice, "SELECT pgsched.add_job('public.job_secret', interval '1 hour')") == "42501"
    assert sqlstate_of(s.alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', "
                                "check_config => 'public.bob_definer')") == "42883"
    assert snapshot(s.admin) == before
    assert isinstance(scalar(s.bob, "SELECT pgsched.add_job('public.job_secret', '1 hour')"), int)


def test_a_role_without_login_cannot_own_a_job(s: Sessions) -> None:
    before = snapshot(s.admin)
    s.alice.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(s.odb.nologin)))
    for call in ("SELECT pgsched.add_job('public.job_ok', '1 hour')",
                 "SELECT pgsched.add_job('public.job_ok', interval '1 hour')",
                 "SELECT add_job('public.job_ok', '1 hour')",
                 "SELECT pgsched.schedule('n', '1 hour', 'SELECT 1')",
                 "SELECT pgsched.schedule('1 hour', 'SELECT 1')"):
        e = error_of(s.alice, call)
        assert e.sqlstate == "42501", call
        assert e.diag.message_primary == f"role {s.odb.nologin} cannot own a job: it has no LOGIN"
        assert e.diag.message_detail and "session opened as the job's owner" in e.diag.message_detail
    s.alice.execute("RESET ROLE")
    assert snapshot(s.admin) == before


# -- escapes: what a session of alice cannot become ---------------------------------------------

WHO = "SELECT current_user::text, session_user::text"


def escape_attempts(odb: OwnerDb) -> list[tuple[str, str | None]]:
    """(statement, expected SQLSTATE or None for "runs, and changes nothing")."""
    sch, bob = odb.scheduler, odb.bob
    return [
        ("RESET ROLE", None),
        (f"SET ROLE {sch}", "42501"),
        (f"SET ROLE {bob}", "42501"),
        (f"SET LOCAL ROLE {sch}", "42501"),
        (f"SET ROLE {odb.superuser}", "42501"),
        (f"SET SESSION AUTHORIZATION {sch}", "42501"),
        (f"SET SESSION AUTHORIZATION {bob}", "42501"),
        ("SET SESSION AUTHORIZATION DEFAULT", None),
        ("RESET SESSION AUTHORIZATION", None),
        (f"SELECT set_config('role', '{sch}', false)", "42501"),
        (f"SELECT set_config('role', '{bob}', true)", "42501"),
        (f"SELECT set_config('session_authorization', '{sch}', false)", "42501"),
        ("RESET ALL", None),
        ("DISCARD ALL", None),
        (f"DO $$ BEGIN EXECUTE 'SET ROLE {sch}'; END $$", "42501"),
        ("SELECT public.bob_definer()", "42501"),
        (f"GRANT {bob} TO {odb.alice}", "42501"),
        (f"ALTER ROLE {odb.alice} SUPERUSER", "42501"),
        (f"ALTER ROLE {odb.alice} BYPASSRLS", "42501"),
        ("ALTER TABLE pgsched.job NO FORCE ROW LEVEL SECURITY", "42501"),
        ("SET row_security = off; SELECT * FROM pgsched.job", "42501"),
        ("COPY (SELECT 1) TO PROGRAM 'true'", "42501"),
    ]


def test_a_session_of_alice_cannot_become_another_role(s: Sessions) -> None:
    two_owners(s)
    odb = s.odb
    results = []
    for stmt, _ in escape_attempts(odb):
        with odb.connect(odb.alice) as al:
            got = sqlstate_of(al, stmt)
            # Whatever happened, the session is still alice's and sees only alice's rows.
            who = al.execute(WHO).fetchone()
            visible = ids(al, "pgsched.job")
            results.append((stmt, got, who, visible))
    mine = ids(s.alice, "pgsched.job")
    assert [(stmt, got, who, visible == mine) for stmt, got, who, visible in results] == \
        [(stmt, expected, (odb.alice, odb.alice), True) for stmt, expected in escape_attempts(odb)]


def test_a_job_run_by_hand_cannot_become_another_role_either(s: Sessions) -> None:
    """The same attempts as a job's command, run with run_job in alice's session.
    (The lead reruns this list through jobs run by the scheduler.)"""
    odb = s.odb
    for stmt, expected in escape_attempts(odb):
        if stmt.startswith(("SET SESSION AUTHORIZATION DEFAULT", "RESET SESSION", "DISCARD", "SET LOCAL",
                            "SET row_security")):
            continue  # not allowed inside a function, or nothing to check there
        command = f"{stmt}; INSERT INTO public.ran VALUES (0, current_user, 'escape')"
        j = scalar(s.alice, "SELECT pgsched.schedule(%s, '1 hour', %s)", (stmt[:60], command))
        got = sqlstate_of(s.alice, "CALL pgsched.run_job(%s)", (j,))
        last = rows(s.alice, "SELECT outcome, sqlstate FROM pgsched.job_history WHERE job_id = %s", (j,))
        if expected is None:
            assert (got, last) == (None, [{"outcome": "success", "sqlstate": None}]), stmt
        else:
            assert (got, last) == (expected, [{"outcome": "failure", "sqlstate": expected}]), stmt
        assert s.alice.execute(WHO).fetchone() == (odb.alice, odb.alice), stmt
    assert {r["who"] for r in rows(s.admin, "SELECT who FROM public.ran")} <= {odb.alice}


# -- robustness ---------------------------------------------------------------------------


def test_a_dropped_owner_role_does_not_break_anyone_elses_view(s: Sessions) -> None:
    odb = s.odb
    carol = f"carol_{uuid.uuid4().hex[:8]}"
    s.admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(carol), sql.Literal(PASSWORD)))
    try:
        with odb.connect(carol) as c:
            cj = scalar(c, "SELECT pgsched.add_job('public.job_ok', '1 hour')")
        a = scalar(s.alice, "SELECT pgsched.add_job('public.job_ok', '1 hour')")
    finally:
        s.admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(carol)))
    for relation in ("pgsched.jobs", "pgsched.job_stats", "pgsched.job_history", "public.jobs"):
        assert ids(s.alice, relation) <= {a}, relation
    assert ids(s.scheduler, "pgsched.jobs") == {a, cj}
    assert sqlstate_of(s.alice, f"CALL pgsched.run_job({cj})") == "42704"
    assert sqlstate_of(s.alice, f"SELECT pgsched.delete_job({cj})") == "42704"
    s.admin.execute(f"SELECT pgsched.delete_job({cj})")


def test_a_superuser_install_is_as_usable_by_an_ordinary_role(pg_server: PgServer, db: str, odb: OwnerDb) -> None:
    """The usual install (a superuser runs init, with PL/Python where available)."""
    with psycopg.connect(db, autocommit=True) as admin:
        admin.execute("CREATE FUNCTION public.job_ok(job_id integer, config jsonb) RETURNS void "
                      "LANGUAGE sql AS 'SELECT'")
        admin.execute("CREATE FUNCTION public.secret_fn() RETURNS void LANGUAGE sql AS 'SELECT'")
        admin.execute("SELECT pgsched.add_job('public.job_ok', '1 hour')")
    with psycopg.connect(dsn_as(db, odb.alice), autocommit=True) as al:
        j = scalar(al, "SELECT add_job('public.job_ok', '0 9 * * MON-FRI', timezone => 'Europe/Berlin')")
        assert ids(al, "jobs") == {j}
        if pg_server.plpython:
            assert scalar(al, "SELECT next_start IS NOT NULL FROM job_stats WHERE job_id = %s", (j,)) is True
            assert len(al.execute("SELECT * FROM next_runs('*/5 * * * *', 3)").fetchall()) == 3
            assert sqlstate_of(al, "SELECT add_job('public.job_ok', '0 0 31 2 *')") == "22023"
        al.execute("CALL run_job(%s)", (j,))
        assert scalar(al, "SELECT count(*) FROM job_history") == 1


def test_only_the_catalogs_administrators_set_concurrency_limits_and_a_shared_key_waits_across_owners(
        s: Sessions) -> None:
    """A key is shared by every owner's jobs, so its limit is the database's setting; a job waits for
    another owner's run of its key and says so, without showing that run."""
    before = rows(s.admin, "SELECT * FROM pgsched.concurrency_limit")
    e = error_of(s.alice, "SELECT pgsched.set_concurrency_limit('shared', 5)")
    assert e.sqlstate == "42501" and "concurrency limit of 'shared'" in str(e), str(e)
    assert rows(s.admin, "SELECT * FROM pgsched.concurrency_limit") == before
    try:
        s.scheduler.execute("SELECT pgsched.set_concurrency_limit('shared', 1)")
        b = scalar(s.bob, "SELECT pgsched.add_job('public.job_ok', '1 hour', concurrency_key => 'shared')")
        a = scalar(s.alice, "SELECT pgsched.add_job('public.job_ok', '1 hour', concurrency_key => 'shared')")
        s.admin.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' "
                        "WHERE job_id IN (%s, %s)", (a, b))
        me = scalar(s.scheduler, "SELECT instance_id FROM pgsched._register_instance_v2('h', 1, 'test', 4)")
        [run] = rows(s.scheduler, "SELECT job_id FROM pgsched._claim_v2(%s, '{1,2}', '{0,0}')", (me,))
        assert run["job_id"] == b  # the older job first; alice's waits
        assert rows(s.alice, "SELECT job_id, waiting_for FROM pgsched.job_stats") == [
            {"job_id": a, "waiting_for": "concurrency limit of 'shared': 1 of 1 running"}]
        assert rows(s.alice, "SELECT concurrency_key, running, jobs, waiting FROM pgsched.concurrency_limits") == [
            {"concurrency_key": "shared", "running": 1, "jobs": 1, "waiting": 1}]
        assert ids(s.alice, "pgsched.job_history") == set()  # bob's run is counted, not shown
    finally:
        s.scheduler.execute("SELECT pgsched.set_concurrency_limit('shared', NULL)")


# -- acting as an owner: SET ROLE, not mere membership -------------------------------------------
# Since PostgreSQL 16 a grant says separately whether the member inherits the role's rights and
# whether it may SET ROLE to it, and pg_has_role(..., 'MEMBER') is true for a grant WITH INHERIT
# FALSE, SET FALSE, which gives neither. A job runs as its owner, so writing or running one is
# acting as the owner: pgsched asks for SET (pgsched._may_act_as, migration 0017).


def server_major(conn: Conn) -> int:
    return int(str(scalar(conn, "SHOW server_version_num"))) // 10000


def grant(admin: Conn, role: str, member: str, options: str = "") -> None:
    """GRANT role TO member <options> (options: this module's own constant text)."""
    admin.execute(sql.SQL("GRANT {} TO {} {}").format(sql.Identifier(role), sql.Identifier(member),
                                                       sql.SQL(options)))


def test_may_act_as_is_what_set_role_allows(s: Sessions) -> None:
    """The one rule, against PostgreSQL's own: pgsched._may_act_as(member, owner) is true exactly
    when the member's session may SET ROLE to the owner, for every kind of grant the server has."""
    odb = s.odb
    if server_major(s.admin) >= 16:
        grants = ["", "WITH SET FALSE", "WITH INHERIT FALSE", "WITH INHERIT FALSE, SET FALSE",
                  "WITH INHERIT FALSE, SET TRUE", "WITH ADMIN TRUE, INHERIT FALSE, SET FALSE", None]
    else:
        grants = ["", None]  # PostgreSQL 15: every member may SET ROLE
    with cluster_roles(odb.server, ("carol", "mid")) as names:
        carol, mid = names["carol"], names["mid"]
        for options in grants:
            for chained in (False, True):
                if options is None and chained:
                    continue
                if options is not None:
                    # carol -> bob, or carol -> mid (plainly) -> bob with the options.
                    grant(s.admin, odb.bob, mid if chained else carol, options)
                    if chained:
                        grant(s.admin, mid, carol)
                with odb.connect(carol) as c:
                    may = scalar(c, "SELECT pgsched._may_act_as(current_user, %s::regrole)", (odb.bob,))
                    can = sqlstate_of(c, sql.SQL("SET ROLE {}").format(sql.Identifier(odb.bob)).as_string(c)) is None
                    member = scalar(c, "SELECT pg_has_role(current_user, %s::regrole, 'MEMBER')", (odb.bob,))
                    assert (may, member) == (can, options is not None), (options, chained)
                    # Oneself, always.
                    assert scalar(c, "SELECT pgsched._may_act_as(current_user, current_user::regrole)") is True
                for role in (carol, mid):
                    s.admin.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(odb.bob), sql.Identifier(role)))
                s.admin.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(mid), sql.Identifier(carol)))
    # alice was granted `nologin` plainly (owner_database); an oid no role has: false, not an error.
    assert scalar(s.alice, "SELECT pgsched._may_act_as(current_user, %s::regrole)", (odb.nologin,)) is True
    assert scalar(s.alice, "SELECT pgsched._may_act_as(current_user, 999999999)") is False


def test_a_member_who_may_not_set_role_to_the_owner_cannot_write_or_run_its_jobs(s: Sessions) -> None:
    """GRANT bob TO carol WITH INHERIT FALSE, SET FALSE: carol is a member of bob that may neither
    use bob's rights (read his tables) nor become him. Writing one of bob's jobs, which the
    scheduler runs as bob, would be both: refused, as for anyone else."""
    if server_major(s.admin) < 16:
        pytest.skip("GRANT ... WITH SET FALSE is new in PostgreSQL 16; on 15 every member may SET ROLE "
                    "(test_a_member_who_may_set_role_to_the_owner_writes_and_runs_its_jobs)")
    odb = s.odb
    _, b, c = two_owners(s)
    with cluster_roles(odb.server, ("carol",)) as names, odb.connect(names["carol"]) as carol:
        grant(s.admin, odb.bob, names["carol"], "WITH INHERIT FALSE, SET FALSE")
        # What the grant is, in PostgreSQL's words: a member, without SET and without bob's rights.
        assert tuple(carol.execute("SELECT pg_has_role(current_user, %(r)s::regrole, 'MEMBER'), "
                                   "pg_has_role(current_user, %(r)s::regrole, 'SET'), "
                                   "pg_has_role(current_user, %(r)s::regrole, 'USAGE')",
                                   {"r": odb.bob}).fetchone() or ()) == (True, False, False)
        assert sqlstate_of(carol, sql.SQL("SET ROLE {}").format(sql.Identifier(odb.bob)).as_string(carol)) == "42501"
        mine = scalar(carol, "SELECT pgsched.schedule('carols', '1 hour', 'SELECT 1')")
        before = snapshot(s.admin)
        touch_nothing = [
            f"UPDATE pgsched.job SET command = 'SELECT 2' WHERE job_id = {c}",
            f"UPDATE pgsched.job SET scheduled = false WHERE job_id = {b}",
            f"DELETE FROM pgsched.job WHERE job_id = {b}",
            f"UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = {b}",
        ]
        for stmt in touch_nothing:
            assert carol.execute(stmt).rowcount == 0, stmt
        refused = {
            # row-level security's WITH CHECK: a job that would run as bob
            f"INSERT INTO pgsched.job (job_name, owner, kind, command, schedule) "
            f"VALUES ('evil', '{odb.bob}', 'command', 'SELECT 1', '1 minute')": "42501",
            f"UPDATE pgsched.job SET owner = '{odb.bob}' WHERE job_id = {mine}": "42501",
            # the API: she may not see bob's jobs either (pgsched._may_see_as, migration 0018), so
            # every call answers as for a job that does not exist
            f"SELECT pgsched.alter_job({c}, schedule => '1 minute')": "42704",
            f"SELECT pgsched.delete_job({b})": "42704",
            f"SELECT pgsched.unschedule({c}::bigint)": "42704",
            f"CALL pgsched.run_job({c})": "42704",
            f"SELECT pgsched.trigger_job({c})": "42704",
            f"SELECT * FROM pgsched.cancel_job({c})": "42704",
            f"SELECT pgsched._run_job_start({c})": "42704",
        }
        for stmt, state in refused.items():
            assert sqlstate_of(carol, stmt) == state, stmt
        assert snapshot(s.admin) == before
        s.admin.execute("DELETE FROM pgsched.job WHERE job_id = %s", (mine,))


def test_may_see_as_is_what_reading_the_owners_objects_allows(s: Sessions) -> None:
    """The read rule, against PostgreSQL's own: pgsched._may_see_as(member, owner) is true exactly
    when the member's session may read a table only the owner may (it has the owner's rights) or
    may SET ROLE to the owner, for every kind of grant the server has."""
    odb = s.odb
    if server_major(s.admin) >= 16:
        grants = ["", "WITH SET FALSE", "WITH INHERIT FALSE", "WITH INHERIT FALSE, SET FALSE",
                  "WITH INHERIT FALSE, SET TRUE", "WITH ADMIN TRUE, INHERIT FALSE, SET FALSE", None]
    else:
        grants = ["", None]
    s.admin.execute("CREATE TABLE public.bobs_own (x int)")
    s.admin.execute(sql.SQL("ALTER TABLE public.bobs_own OWNER TO {}").format(sql.Identifier(odb.bob)))
    try:
        with cluster_roles(odb.server, ("carol",)) as names, odb.connect(names["carol"]) as carol:
            for options in grants:
                if options is not None:
                    grant(s.admin, odb.bob, names["carol"], options)
                may = scalar(carol, "SELECT pgsched._may_see_as(current_user, %s::regrole)", (odb.bob,))
                reads = sqlstate_of(carol, "SELECT * FROM public.bobs_own") is None
                becomes = sqlstate_of(carol, sql.SQL("SET ROLE {}").format(sql.Identifier(odb.bob)).as_string(carol)) \
                    is None
                carol.execute("RESET ROLE")
                assert may == (reads or becomes), options
                s.admin.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(odb.bob),
                                                                    sql.Identifier(names["carol"])))
    finally:
        s.admin.execute("DROP TABLE public.bobs_own")


@pytest.mark.parametrize(("options", "sees"), [("WITH INHERIT FALSE, SET FALSE", False),
                                                ("WITH INHERIT TRUE, SET FALSE", True),
                                                ("WITH INHERIT FALSE, SET TRUE", True)])
def test_a_member_sees_the_owners_jobs_only_with_its_rights_or_its_identity(s: Sessions, options: str,
                                                                             sees: bool) -> None:
    """GRANT bob TO carol WITH INHERIT FALSE, SET FALSE gives carol neither bob's rights nor his
    identity: she sees none of his jobs, their stats or their runs (their configs and errors),
    and her jobs may not name his as upstreams. With either, she sees them as before."""
    if server_major(s.admin) < 16:
        pytest.skip("GRANT ... WITH INHERIT/SET is new in PostgreSQL 16; on 15 a member has both")
    odb = s.odb
    _, b, c = two_owners(s)
    with cluster_roles(odb.server, ("carol",)) as names, odb.connect(names["carol"]) as carol:
        grant(s.admin, odb.bob, names["carol"], options)
        mine = scalar(carol, "SELECT pgsched.schedule('carols', '1 hour', 'SELECT 1')")
        theirs = {b, c} if sees else set()
        for relation in ("pgsched.jobs", "pgsched.job_stats", "pgsched.job", "pgsched.job_stat"):
            assert ids(carol, relation) == theirs | {mine}, relation
        assert ids(carol, "pgsched.job_history") == ({b} if sees else set())
        secret = scalar(carol, "SELECT count(*) FROM pgsched.job_history WHERE message LIKE '%%bob-secret-42%%'")
        assert secret == (1 if sees else 0)
        # An upstream is named as the job's owner may see it (pgsched._may_see).
        state = sqlstate_of(carol, f"SELECT * FROM pgsched.alter_job({mine}, depends_on => ARRAY['{b}'])")
        assert state == (None if sees else "22023"), state  # "no job ... that role ... may see"
        s.admin.execute("DELETE FROM pgsched.job WHERE job_id = %s", (mine,))


@pytest.mark.parametrize("options", ["", "WITH INHERIT FALSE, SET TRUE"])
def test_a_member_who_may_set_role_to_the_owner_writes_and_runs_its_jobs(s: Sessions, options: str) -> None:
    """A plain member (and on PostgreSQL 16+ one granted SET without INHERIT) acts for the owner:
    the behaviour before PostgreSQL 16's finer grants, unchanged."""
    if options and server_major(s.admin) < 16:
        pytest.skip("GRANT ... WITH INHERIT/SET is new in PostgreSQL 16")
    odb = s.odb
    a, b, c = two_owners(s)
    with cluster_roles(odb.server, ("dave",)) as names, odb.connect(names["dave"]) as dave:
        grant(s.admin, odb.bob, names["dave"], options)
        j = scalar(dave, f"INSERT INTO pgsched.job (job_name, owner, kind, command, schedule) "
                         f"VALUES ('for-bob', '{odb.bob}', 'command', "
                         f"'INSERT INTO public.ran VALUES (0, current_user, ''cmd'')', '1 hour') RETURNING job_id")
        assert scalar(s.admin, "SELECT owner::text FROM pgsched.job WHERE job_id = %s", (j,)) == odb.bob
        assert dave.execute(f"UPDATE pgsched.job SET command = 'SELECT 2' WHERE job_id = {c}").rowcount == 1
        assert dave.execute(f"UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = {b}").rowcount == 1
        dave.execute(f"SELECT pgsched.alter_job({b}, scheduled => false)")
        dave.execute(f"CALL pgsched.run_job({j})")
        assert rows(s.admin, "SELECT who FROM public.ran") == [{"who": odb.bob}]
        assert scalar(dave, f"SELECT pgsched.trigger_job({j}) IS NOT NULL") is True
        assert dave.execute(f"SELECT * FROM pgsched.cancel_job({j})").fetchall() == []
        assert dave.execute(f"DELETE FROM pgsched.job WHERE job_id = {j}").rowcount == 1
        dave.execute(f"SELECT pgsched.delete_job({b})")
        assert ids(s.admin, "pgsched.job") == {a, c}


def test_python_jobs_need_set_role_to_the_catalogs_owner(s: Sessions) -> None:
    """Python jobs, like concurrency limits, are for the catalog's administrators: the roles that may
    SET ROLE to its owner and have its rights (pgsched._catalog_admin), not any member of it. One
    that may only SET ROLE (INHERIT FALSE) is refused by the API with 42501, not halfway through by
    a table it cannot write."""
    if server_major(s.admin) < 16:
        pytest.skip("GRANT ... WITH SET FALSE is new in PostgreSQL 16")
    odb = s.odb
    python_job = ("INSERT INTO pgsched.job (job_name, kind, code_module, code_function, schedule) "
                  "VALUES ('py', 'python', 'myapp.jobs', 'nightly', '1 hour')")
    with cluster_roles(odb.server, ("carol", "dave", "erin")) as names, \
            odb.connect(names["carol"]) as carol, odb.connect(names["dave"]) as dave, \
            odb.connect(names["erin"]) as erin:
        grant(s.admin, odb.scheduler, names["carol"], "WITH INHERIT FALSE, SET FALSE")
        grant(s.admin, odb.scheduler, names["dave"], "WITH INHERIT TRUE, SET TRUE")
        grant(s.admin, odb.scheduler, names["erin"], "WITH INHERIT FALSE, SET TRUE")
        before = snapshot(s.admin)
        for refused in (carol, erin):
            assert sqlstate_of(refused, python_job) == "42501"
            e = error_of(refused, "SELECT pgsched.set_concurrency_limit('shared', 5)")
            assert e.sqlstate == "42501" and "concurrency limit of 'shared'" in str(e), str(e)
        assert snapshot(s.admin) == before
        dave.execute("SELECT pgsched.set_concurrency_limit('shared', 5)")
        dave.execute("SELECT pgsched.set_concurrency_limit('shared', NULL)")
        dave.execute(python_job)
        assert scalar(s.admin, "SELECT owner::text FROM pgsched.job WHERE job_name = 'py'") == names["dave"]
        s.admin.execute("DELETE FROM pgsched.job WHERE job_name = 'py'")
