"""The per-job settings of migration 0004 through the SQL API: catch_up_window, max_plans_per_tick,
schedule_delay, allow_stale_reentry (add_job, alter_job, schedule, the views), schedule_delay's
effect on next_start (the time a plan becomes eligible), and the upgrade of the API's signatures.

Bad input for these settings is in test_api_bad_input.py, with every other argument's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgsched import migrate
from tests.conftest import PgServer
from tests.integration.helpers import SETUP_SQL, Conn, add_job, job, one, rows, scalar, stats
from tests.integration.test_security import owner_database

FUTURE = "2100-01-01 00:00:00+00"
FUTURE_DT = datetime(2100, 1, 1, tzinfo=UTC)
NEW = ("catch_up_window", "max_plans_per_tick", "schedule_delay", "allow_stale_reentry")
DEFAULTS = {"catch_up_window": None, "max_plans_per_tick": 100, "schedule_delay": "00:00:00",
            "allow_stale_reentry": False}


def settings(conn: Conn, job_id: int) -> dict[str, Any]:
    j = job(conn, job_id)
    return {k: j[k] for k in NEW}


def next_start(conn: Conn, job_id: int) -> datetime | None:
    value = stats(conn, job_id)["next_start"]
    assert value is None or isinstance(value, datetime)
    return value


# --- defaults ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    "SELECT add_job('ok_fn', '5 minutes')",
    "SELECT add_job('ok_fn', interval '5 minutes')",
    "SELECT add_job('ok_fn', schedule_interval => '5 minutes', job_name => 'tsdb')",
    # TimescaleDB-style positional calls of every old argument still resolve to add_job
    "SELECT add_job('ok_fn', '5 minutes', NULL, NULL, true, NULL, true, NULL, 'positional', NULL, -1, "
    "'5 minutes', 'latest', false)",
    "SELECT schedule('named', '5 minutes', 'SELECT 1')",
    "SELECT schedule('5 minutes', 'SELECT 1')",
])
def test_defaults(api: Conn, call: str) -> None:
    job_id = scalar(api, call)
    assert settings(api, job_id) == DEFAULTS
    assert stats(api, job_id)["total_missed"] == 0
    assert scalar(api, "SELECT (catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry) "
                       "IS NOT DISTINCT FROM (NULL::interval, 100, interval '0', false) FROM pgsched.job "
                       "WHERE job_id = %s", (job_id,)) is True


# --- add_job ----------------------------------------------------------------------------------------

SET_BY_ADD_JOB: list[tuple[str, dict[str, Any]]] = [
    ("catch_up_window => '15 minutes'", {"catch_up_window": "00:15:00"}),
    ("catch_up_window => '2 days'", {"catch_up_window": "2 days"}),
    ("max_plans_per_tick => 1", {"max_plans_per_tick": 1}),
    ("max_plans_per_tick => 2147483647", {"max_plans_per_tick": 2147483647}),
    ("schedule_delay => '90 seconds'", {"schedule_delay": "00:01:30"}),
    ("schedule_delay => '365 days'", {"schedule_delay": "365 days"}),
    ("schedule_delay => '0'", {}),
    ("allow_stale_reentry => true", {"allow_stale_reentry": True}),
    ("catch_up_window => '1 hour', schedule_delay => '59 minutes 59 seconds'",
     {"catch_up_window": "01:00:00", "schedule_delay": "00:59:59"}),
]


@pytest.mark.parametrize("schedule", ["'1 hour'", "interval '1 hour'"], ids=["text", "interval"])
@pytest.mark.parametrize(("argument", "changes"), SET_BY_ADD_JOB, ids=[a for a, _ in SET_BY_ADD_JOB])
def test_add_job_sets_each_setting(api: Conn, schedule: str, argument: str, changes: dict[str, Any]) -> None:
    job_id = add_job(api, f"'ok_fn', {schedule}, {argument}")
    assert settings(api, job_id) == {**DEFAULTS, **changes}


def test_add_job_unqualified_and_qualified_agree(api: Conn) -> None:
    args = ("'ok_fn', '1 hour', catch_up_window => '1 hour', max_plans_per_tick => 3, "
            "schedule_delay => '1 minute', allow_stale_reentry => true")
    a = scalar(api, f"SELECT add_job({args}, job_name => 'a')")
    b = scalar(api, f"SELECT pgsched.add_job({args}, job_name => 'b')")
    assert settings(api, a) == settings(api, b) == {
        "catch_up_window": "01:00:00", "max_plans_per_tick": 3, "schedule_delay": "00:01:00",
        "allow_stale_reentry": True}


# --- alter_job ----------------------------------------------------------------------------------------

BASE = f"""'ok_fn', '1 hour', initial_start => '{FUTURE}', job_name => 'base', catch_up_window => '3 hours',
    max_plans_per_tick => 10, schedule_delay => '5 minutes', allow_stale_reentry => false"""


@pytest.fixture
def base(api: Conn) -> int:
    job_id = add_job(api, BASE)
    assert next_start(api, job_id) == FUTURE_DT + timedelta(minutes=5)
    return job_id


ALTERATIONS: list[tuple[str, dict[str, Any]]] = [
    ("catch_up_window => '30 minutes'", {"catch_up_window": "00:30:00"}),
    ("max_plans_per_tick => 1", {"max_plans_per_tick": 1}),
    ("max_plans_per_tick => 500", {"max_plans_per_tick": 500}),
    ("allow_stale_reentry => true", {"allow_stale_reentry": True}),
    # a new delay moves the stored next_start by (new - old): same plan, another eligible time
    ("schedule_delay => '20 minutes'", {"schedule_delay": "00:20:00", "next_start": "2100-01-01T00:20:00+00:00"}),
    ("schedule_delay => '0'", {"schedule_delay": "00:00:00", "next_start": "2100-01-01T00:00:00+00:00"}),
    ("schedule_delay => '2 hours', catch_up_window => '1 day'",
     {"schedule_delay": "02:00:00", "catch_up_window": "1 day", "next_start": "2100-01-01T02:00:00+00:00"}),
]


@pytest.mark.parametrize(("argument", "changes"), ALTERATIONS, ids=[a for a, _ in ALTERATIONS])
def test_alter_job_changes_exactly_that_setting(api: Conn, base: int, argument: str,
                                                changes: dict[str, Any]) -> None:
    before = job(api, base)
    api.execute(f"SELECT * FROM alter_job(%s, {argument})", (base,))
    after = job(api, base)
    assert {k: v for k, v in after.items() if before[k] != v} == changes


def test_alter_job_null_leaves_the_settings_unchanged(api: Conn, base: int) -> None:
    before, stat_before = job(api, base), stats(api, base)
    api.execute("SELECT * FROM pgsched.alter_job(%s, catch_up_window => NULL, max_plans_per_tick => NULL, "
                "schedule_delay => NULL, allow_stale_reentry => NULL)", (base,))
    api.execute("SELECT * FROM pgsched.alter_job(%s, max_retries => 4)", (base,))
    after = job(api, base)
    assert {k: v for k, v in after.items() if before[k] != v} == {"max_retries": 4}
    assert stats(api, base) == stat_before


def test_alter_job_result_keeps_timescaledb_columns(api: Conn, base: int) -> None:
    result = one(api, "SELECT * FROM alter_job(%s, schedule_delay => '10 minutes')", (base,))
    assert list(result) == ["job_id", "schedule", "schedule_interval", "max_runtime", "max_retries",
                            "retry_period", "scheduled", "config", "next_start", "check_config",
                            "fixed_schedule", "initial_start", "timezone"]
    assert result["next_start"] == FUTURE_DT + timedelta(minutes=10)


def test_a_window_shorter_than_the_delay_is_accepted(api: Conn, base: int) -> None:
    # The scheduler counts catch_up_window from the time a plan becomes eligible (its time +
    # schedule_delay), so a short window on a long delay is a valid setting, not a dead job.
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '3 hours', catch_up_window => '1 minute')", (base,))
    assert settings(api, base) == {"catch_up_window": "00:01:00", "max_plans_per_tick": 10,
                                   "schedule_delay": "03:00:00", "allow_stale_reentry": False}
    assert next_start(api, base) == FUTURE_DT + timedelta(hours=3)


# --- views ----------------------------------------------------------------------------------------------

def test_views_show_the_settings_and_total_missed(api: Conn, base: int) -> None:
    for view in ("pgsched.jobs", "public.jobs"):
        assert one(api, f"SELECT catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry "
                        f"FROM {view} WHERE job_id = %s", (base,)) == {
            "catch_up_window": timedelta(hours=3), "max_plans_per_tick": 10,
            "schedule_delay": timedelta(minutes=5), "allow_stale_reentry": False}
    api.execute("UPDATE pgsched.job_stat SET total_missed = 7, total_skipped = 2 WHERE job_id = %s", (base,))
    for view in ("pgsched.job_stats", "public.job_stats"):
        assert one(api, f"SELECT total_skipped, total_missed FROM {view} WHERE job_id = %s", (base,)) == {
            "total_skipped": 2, "total_missed": 7}


def test_views_stay_security_invoker(api: Conn) -> None:
    for view in ("pgsched.jobs", "pgsched.job_stats", "public.jobs", "public.job_stats"):
        assert scalar(api, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (view,)) == \
            ["security_invoker=true"]


def test_an_ordinary_role_sets_and_sees_only_its_own_settings(pg_server: PgServer) -> None:
    """Roles as deployed (test_security.py): the scheduler's role installed pgsched, alice and bob use it."""
    with owner_database(pg_server) as odb, odb.connect(odb.alice) as alice, odb.connect(odb.bob) as bob:
        mine = scalar(alice, "SELECT add_job('public.job_ok', '1 hour', initial_start => %s, "
                             "max_plans_per_tick => 2, schedule_delay => '2 minutes', catch_up_window => '1 hour', "
                             "allow_stale_reentry => true)", (FUTURE,))
        other = scalar(bob, "SELECT pgsched.add_job('public.job_ok', interval '1 hour', schedule_delay => '1 minute')")
        assert rows(alice, "SELECT job_id, catch_up_window, max_plans_per_tick, schedule_delay, allow_stale_reentry, "
                           "next_start FROM jobs") == [
            {"job_id": mine, "catch_up_window": timedelta(hours=1), "max_plans_per_tick": 2,
             "schedule_delay": timedelta(minutes=2), "allow_stale_reentry": True,
             "next_start": FUTURE_DT + timedelta(minutes=2)}]
        assert rows(alice, "SELECT job_id, total_missed FROM job_stats") == [{"job_id": mine, "total_missed": 0}]
        alice.execute("SELECT * FROM alter_job(%s, schedule_delay => '3 minutes', max_plans_per_tick => 4)", (mine,))
        assert one(alice, "SELECT max_plans_per_tick, next_start FROM pgsched.jobs") == \
            {"max_plans_per_tick": 4, "next_start": FUTURE_DT + timedelta(minutes=3)}
        assert scalar(alice, "SELECT schedule('c', '1 day', 'SELECT 1')") > mine
        with pytest.raises(psycopg.errors.UndefinedObject):  # bob's job is not hers to change
            alice.execute("SELECT * FROM alter_job(%s, allow_stale_reentry => true)", (other,))
        assert scalar(bob, "SELECT allow_stale_reentry FROM jobs") is False


# --- schedule_delay and next_start -------------------------------------------------------------------

@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("schedule", ["'1 hour'", "interval '1 hour'"], ids=["text", "interval"])
def test_delay_is_added_to_a_future_initial_start(api: Conn, schedule: str, fixed: bool) -> None:
    job_id = add_job(api, f"'ok_fn', {schedule}, initial_start => %s, fixed_schedule => %s, "
                          "schedule_delay => '7 minutes'", (FUTURE, fixed))
    assert next_start(api, job_id) == FUTURE_DT + timedelta(minutes=7)


def test_delay_is_added_to_now_without_initial_start(api: Conn) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', '5 minutes', schedule_delay => '10 minutes'")
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (job_id,)) == \
            timedelta(minutes=10)


def test_delay_is_added_to_the_next_slot_of_a_past_origin(api: Conn) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', '1 hour', initial_start => now() - interval '90 minutes', "
                              "schedule_delay => '2 minutes'")
        # the next slot is in 30 minutes; it becomes eligible 2 minutes after that
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (job_id,)) == \
            timedelta(minutes=32)


def test_delay_is_elapsed_time_whatever_the_session_time_zone(api: Conn) -> None:
    # Europe/Berlin moves its clocks forward on 2100-03-28: timestamptz + '1 day' in that
    # zone would be 23 hours; the scheduler subtracts the delay as 24 hours.
    api.execute("SET TimeZone = 'Europe/Berlin'")
    origin = datetime(2100, 3, 27, 12, tzinfo=UTC)
    job_id = add_job(api, "'ok_fn', '1 hour', initial_start => %s, schedule_delay => '1 day'", (origin,))
    assert next_start(api, job_id) == origin + timedelta(hours=24)
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '2 days')", (job_id,))
    assert next_start(api, job_id) == origin + timedelta(hours=48)
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '0')", (job_id,))
    assert next_start(api, job_id) == origin


def test_alter_job_delay_shifts_next_start_back_and_forth(api: Conn, base: int) -> None:
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '65 minutes')", (base,))
    assert next_start(api, base) == FUTURE_DT + timedelta(minutes=65)
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '1 minute')", (base,))
    assert next_start(api, base) == FUTURE_DT + timedelta(minutes=1)
    # the same delay again, or written another way, does not move it
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '60 seconds')", (base,))
    assert next_start(api, base) == FUTURE_DT + timedelta(minutes=1)


def test_alter_job_delay_shifts_a_next_start_set_by_hand(api: Conn, base: int) -> None:
    when = datetime(2099, 5, 5, 5, 5, tzinfo=UTC)
    api.execute("SELECT * FROM alter_job(%s, next_start => %s)", (base, when))
    assert next_start(api, base) == when  # given as the eligible time: taken as it is
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '15 minutes')", (base,))
    assert next_start(api, base) == when + timedelta(minutes=10)


def test_alter_job_next_start_with_a_new_delay_is_taken_as_given(api: Conn, base: int) -> None:
    when = datetime(2099, 5, 5, 5, 5, tzinfo=UTC)
    api.execute("SELECT * FROM alter_job(%s, next_start => %s, schedule_delay => '1 hour')", (base, when))
    assert next_start(api, base) == when
    assert settings(api, base)["schedule_delay"] == "01:00:00"


def test_alter_job_new_schedule_adds_the_delay(api: Conn, base: int) -> None:
    api.execute("SELECT * FROM alter_job(%s, initial_start => '2100-02-01 00:00:00+00')", (base,))
    assert next_start(api, base) == datetime(2100, 2, 1, 0, 5, tzinfo=UTC)
    # schedule and delay together: the new first start plus the new delay, not shifted twice
    api.execute("SELECT * FROM alter_job(%s, initial_start => '2100-03-01 00:00:00+00', "
                "schedule_delay => '30 minutes')", (base,))
    assert next_start(api, base) == datetime(2100, 3, 1, 0, 30, tzinfo=UTC)


def test_alter_job_new_interval_adds_the_delay(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', schedule_delay => '3 minutes'")
    with api.transaction():
        api.execute("SELECT * FROM alter_job(%s, schedule => '2 hours')", (job_id,))
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (job_id,)) == \
            timedelta(minutes=3)


def test_alter_job_delay_of_a_job_without_next_start(api: Conn, base: int) -> None:
    api.execute("UPDATE pgsched.job_stat SET next_start = NULL WHERE job_id = %s", (base,))
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '1 hour')", (base,))
    assert next_start(api, base) is None  # left for the scheduler, which adds the delay itself
    assert settings(api, base)["schedule_delay"] == "01:00:00"


def test_resuming_a_paused_job_keeps_its_next_start(api: Conn, base: int) -> None:
    api.execute("SELECT * FROM alter_job(%s, scheduled => false)", (base,))
    api.execute("SELECT * FROM alter_job(%s, scheduled => true)", (base,))
    assert next_start(api, base) == FUTURE_DT + timedelta(minutes=5)


def test_schedule_again_keeps_the_settings_and_adds_the_delay(api: Conn) -> None:
    job_id = scalar(api, "SELECT schedule('cleanup', '0 3 * * *', 'SELECT 1')")
    api.execute("SELECT * FROM alter_job(%s, schedule_delay => '4 minutes', max_plans_per_tick => 9, "
                "catch_up_window => '1 hour', allow_stale_reentry => true)", (job_id,))
    with api.transaction():
        assert scalar(api, "SELECT schedule('cleanup', '10 minutes', 'SELECT 2')") == job_id
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (job_id,)) == \
            timedelta(minutes=4)
    assert settings(api, job_id) == {"catch_up_window": "01:00:00", "max_plans_per_tick": 9,
                                     "schedule_delay": "00:04:00", "allow_stale_reentry": True}


def test_cron_first_start_plus_delay(api: Conn, pg_server: PgServer) -> None:
    job_id = add_job(api, "'ok_fn', '0 * * * *', initial_start => '2100-01-01 00:20:00+00', "
                          "schedule_delay => '90 seconds'")
    if pg_server.plpython:
        assert next_start(api, job_id) == datetime(2100, 1, 1, 1, 1, 30, tzinfo=UTC)
    else:  # the scheduler fills it in (and adds the delay)
        assert next_start(api, job_id) is None


# --- upgrade from the API before these settings ------------------------------------------------------

# The previous API's signatures (before migration 0004's settings), with their defaults, as a
# database that ran it has them; bodies do not matter. 90_public.sql then wraps them in public.
PREVIOUS_API = """
CREATE FUNCTION pgsched._check_settings(schedule text, fixed_schedule boolean, timezone text,
    max_runtime interval, max_retries integer, retry_period interval, catch_up text, job_name text)
RETURNS interval LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';
CREATE FUNCTION pgsched._insert_job(kind text, proc regproc, command text, schedule text, config jsonb,
    initial_start timestamptz, scheduled boolean, check_config regproc, fixed_schedule boolean, timezone text,
    job_name text, max_runtime interval, max_retries integer, retry_period interval, catch_up text,
    if_not_exists boolean)
RETURNS integer LANGUAGE plpgsql AS 'BEGIN RETURN -1; END';
CREATE FUNCTION pgsched.add_job(proc regproc, schedule text, config jsonb DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL, scheduled boolean DEFAULT true, check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT true, timezone text DEFAULT NULL, job_name text DEFAULT NULL,
    max_runtime interval DEFAULT NULL, max_retries integer DEFAULT -1,
    retry_period interval DEFAULT interval '5 minutes', catch_up text DEFAULT 'latest',
    if_not_exists boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql AS 'BEGIN RETURN -1; END';
CREATE FUNCTION pgsched.add_job(proc regproc, schedule_interval interval, config jsonb DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL, scheduled boolean DEFAULT true, check_config regproc DEFAULT NULL,
    fixed_schedule boolean DEFAULT true, timezone text DEFAULT NULL, job_name text DEFAULT NULL,
    max_runtime interval DEFAULT NULL, max_retries integer DEFAULT -1,
    retry_period interval DEFAULT interval '5 minutes', catch_up text DEFAULT 'latest',
    if_not_exists boolean DEFAULT false)
RETURNS integer LANGUAGE plpgsql AS 'BEGIN RETURN -1; END';
CREATE FUNCTION pgsched._alter_job(job_id integer, schedule_interval interval DEFAULT NULL,
    max_runtime interval DEFAULT NULL, max_retries integer DEFAULT NULL, retry_period interval DEFAULT NULL,
    scheduled boolean DEFAULT NULL, config jsonb DEFAULT NULL, next_start timestamptz DEFAULT NULL,
    if_exists boolean DEFAULT false, check_config regproc DEFAULT NULL, fixed_schedule boolean DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL, timezone text DEFAULT NULL, job_name text DEFAULT NULL,
    schedule text DEFAULT NULL, catch_up text DEFAULT NULL, config_merge jsonb DEFAULT NULL)
RETURNS TABLE (r_job_id integer, r_schedule text, r_schedule_interval interval, r_max_runtime interval,
               r_max_retries integer, r_retry_period interval, r_scheduled boolean, r_config jsonb,
               r_next_start timestamptz, r_check_config text, r_fixed_schedule boolean,
               r_initial_start timestamptz, r_timezone text)
LANGUAGE sql AS $$ SELECT NULL::integer, NULL::text, NULL::interval, NULL::interval, NULL::integer,
    NULL::interval, NULL::boolean, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::boolean, NULL::timestamptz,
    NULL::text WHERE false $$;
CREATE FUNCTION pgsched.alter_job(job_id integer, schedule_interval interval DEFAULT NULL,
    max_runtime interval DEFAULT NULL, max_retries integer DEFAULT NULL, retry_period interval DEFAULT NULL,
    scheduled boolean DEFAULT NULL, config jsonb DEFAULT NULL, next_start timestamptz DEFAULT NULL,
    if_exists boolean DEFAULT false, check_config regproc DEFAULT NULL, fixed_schedule boolean DEFAULT NULL,
    initial_start timestamptz DEFAULT NULL, timezone text DEFAULT NULL, job_name text DEFAULT NULL,
    schedule text DEFAULT NULL, catch_up text DEFAULT NULL, config_merge jsonb DEFAULT NULL)
RETURNS TABLE (job_id integer, schedule text, schedule_interval interval, max_runtime interval,
               max_retries integer, retry_period interval, scheduled boolean, config jsonb,
               next_start timestamptz, check_config text, fixed_schedule boolean, initial_start timestamptz,
               timezone text)
LANGUAGE sql AS $$ SELECT NULL::integer, NULL::text, NULL::interval, NULL::interval, NULL::integer,
    NULL::interval, NULL::boolean, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::boolean, NULL::timestamptz,
    NULL::text WHERE false $$;
"""
CHANGED = ("_check_settings", "_insert_job", "add_job", "_alter_job", "alter_job")
PUBLIC_SQL = Path(migrate.__file__).resolve().parent.parent / "sql" / "api" / "90_public.sql"


def overloads(conn: Conn, schema: str) -> dict[str, int]:
    return {r["proname"]: r["n"] for r in rows(
        conn, "SELECT proname, count(*)::int AS n FROM pg_proc WHERE pronamespace = %s::regnamespace "
              "AND proname = ANY (%s) GROUP BY proname", (schema, list(CHANGED)))}


def test_upgrade_replaces_the_previous_signatures(empty_db: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as c:
        migrate.init(c)
        # Put the database back in the state the previous API left: its signatures, not ours.
        with c.transaction():
            for name in CHANGED:
                for (sig,) in c.execute("SELECT oid::regprocedure::text FROM pg_proc "
                                        "WHERE pronamespace = 'pgsched'::regnamespace AND proname = %s", (name,)):
                    c.execute(f"DROP FUNCTION {sig}")
            c.execute(PREVIOUS_API)
            c.execute(PUBLIC_SQL.read_text())
        c.execute(SETUP_SQL)
        assert overloads(c, "pgsched") == {"_check_settings": 1, "_insert_job": 1, "add_job": 2, "_alter_job": 1,
                                           "alter_job": 1}
        assert scalar(c, "SELECT add_job('ok_fn', '5 minutes')") == -1  # the old one answers

        # What `pgsched init` of this version does: the API is re-applied over the old one.
        c.execute("UPDATE pgsched.api_state SET checksum = 'previous version'")
        assert migrate.init(c).api_reapplied is True

        assert overloads(c, "pgsched") == {"_check_settings": 1, "_insert_job": 1, "add_job": 2, "_alter_job": 1,
                                           "alter_job": 1}
        assert overloads(c, "public") == {"add_job": 2, "alter_job": 1}
        assert scalar(c, "SELECT pronargs FROM pg_proc WHERE oid = 'pgsched.alter_job'::regproc") == 21
        # unqualified and qualified calls resolve to the new functions, old-style calls included
        a = scalar(c, "SELECT add_job('ok_fn', '5 minutes')")
        b = scalar(c, "SELECT add_job('ok_fn', interval '1 hour', schedule_delay => '1 minute')")
        d = scalar(c, "SELECT pgsched.add_job('ok_fn', '1 hour', NULL, NULL, true, NULL, true, NULL, 'pos')")
        assert (a, b, d) == (1000, 1001, 1002)
        c.execute("SELECT * FROM alter_job(%s, max_plans_per_tick => 5, max_retries => 1)", (a,))
        assert (job(c, a)["max_plans_per_tick"], job(c, a)["max_retries"]) == (5, 1)
        assert job(c, b)["schedule_delay"] == "00:01:00"
        # and the grants follow the new signatures (a role that is not the owner may call them)
        assert scalar(c, "SELECT bool_and(has_function_privilege('public', oid, 'EXECUTE')) FROM pg_proc "
                         "WHERE pronamespace = 'pgsched'::regnamespace AND proname = ANY (%s)",
                      (list(CHANGED),)) is True
        # a second init has nothing to do
        assert migrate.init(c).api_reapplied is False
