"""The per-job settings of migrations 0004 and 0005 through the SQL API: catch_up_window,
max_plans_per_tick, schedule_delay, allow_stale_reentry and scope_query (add_job, alter_job,
schedule, the views), schedule_delay's effect on next_start (the time a plan becomes eligible),
how a scope_query is checked (planned as the caller, never run), and the upgrade of the API's
signatures. What the scheduler does with a scope_query is in test_scopes.py.

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

DEFAULT_CALLS = [
    "SELECT add_job('ok_fn', '5 minutes')",
    "SELECT add_job('ok_fn', interval '5 minutes')",
    "SELECT add_job('ok_fn', schedule_interval => '5 minutes', job_name => 'tsdb')",
    # TimescaleDB-style positional calls of every old argument still resolve to add_job
    "SELECT add_job('ok_fn', '5 minutes', NULL, NULL, true, NULL, true, NULL, 'positional', NULL, -1, "
    "'5 minutes', 'latest', false)",
    "SELECT schedule('named', '5 minutes', 'SELECT 1')",
    "SELECT schedule('5 minutes', 'SELECT 1')",
]


@pytest.mark.parametrize("call", DEFAULT_CALLS)
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
    # the same with or without PL/Python (sql/api/05_cron.sql computes it without)
    assert next_start(api, job_id) == datetime(2100, 1, 1, 1, 1, 30, tzinfo=UTC)


# --- scope_query (migration 0005) ------------------------------------------------------------------

REGIONS_SQL = """
CREATE TABLE public.regions (name text);
INSERT INTO public.regions VALUES ('eu'), ('us');
"""
WHOLE_QUERY = "SELECT name FROM regions"


def scope_query(conn: Conn, job_id: int) -> Any:
    return job(conn, job_id)["scope_query"]


@pytest.fixture
def regions(api: Conn) -> Conn:
    api.execute(REGIONS_SQL)
    return api


@pytest.mark.parametrize("call", DEFAULT_CALLS)
def test_scope_query_defaults_to_null(api: Conn, call: str) -> None:
    job_id = scalar(api, call)
    assert scope_query(api, job_id) is None
    assert scalar(api, "SELECT scope_query FROM pgsched.job WHERE job_id = %s", (job_id,)) is None


SCOPE_QUERIES = [
    WHOLE_QUERY,
    "SELECT name FROM public.regions WHERE name <> 'eu'",
    "VALUES ('a'), ('b')",
    "TABLE regions",
    "SELECT g::text, 'second column' FROM generate_series(1, 3) AS g",
    "-- a comment first\nSELECT name\n  FROM regions\n ORDER BY 1",
    "SELECT name FROM regions WHERE name > current_setting('pgsched.plan_time')",  # the run's settings are set
    "SELECT '" + "x" * 9991 + "'",  # 10000 characters: the limit
]


@pytest.mark.parametrize("schedule", ["'1 hour'", "interval '1 hour'"], ids=["text", "interval"])
@pytest.mark.parametrize("query", SCOPE_QUERIES, ids=range(len(SCOPE_QUERIES)))
def test_add_job_sets_scope_query(regions: Conn, schedule: str, query: str) -> None:
    job_id = add_job(regions, f"'ok_fn', {schedule}, scope_query => %s", (query,))
    assert scope_query(regions, job_id) == query
    assert settings(regions, job_id) == DEFAULTS  # nothing else moves
    assert len(query) <= 10_000


def test_add_job_scope_query_unqualified_and_qualified_agree(regions: Conn) -> None:
    a = scalar(regions, "SELECT add_job('ok_fn', '1 hour', job_name => 'a', scope_query => %s)", (WHOLE_QUERY,))
    b = scalar(regions, "SELECT pgsched.add_job('ok_fn', interval '1 hour', job_name => 'b', scope_query => %s)",
               (WHOLE_QUERY,))
    assert scope_query(regions, a) == scope_query(regions, b) == WHOLE_QUERY


def test_alter_job_sets_changes_keeps_and_clears_scope_query(regions: Conn, base: int) -> None:
    def alter(argument: str, *params: Any) -> dict[str, Any]:
        before, stat_before = job(regions, base), stats(regions, base)
        regions.execute(f"SELECT * FROM alter_job(%s{argument})", (base, *params))
        after = job(regions, base)
        assert stats(regions, base) == stat_before  # next_start and the rest stay
        return {k: v for k, v in after.items() if before[k] != v}

    assert alter(", scope_query => %s", WHOLE_QUERY) == {"scope_query": WHOLE_QUERY}
    assert alter(", scope_query => 'VALUES (''x'')'") == {"scope_query": "VALUES ('x')"}
    # NULL or left out: unchanged
    assert alter(", scope_query => NULL") == {}
    assert alter(", max_retries => 2") == {"max_retries": 2}
    # '' removes the scoping; again on a job that is not scoped changes nothing
    assert alter(", scope_query => ''") == {"scope_query": None}
    assert alter(", scope_query => ''") == {}
    assert scalar(regions, "SELECT scope_query FROM pgsched.job WHERE job_id = %s", (base,)) is None


def test_alter_job_does_not_recheck_a_stored_scope_query(regions: Conn, base: int) -> None:
    # Only a query given to alter_job is planned: a job whose query broke since can still be
    # paused or fixed (its plan runs fail with the reason, test_scopes.py).
    regions.execute("SELECT * FROM alter_job(%s, scope_query => %s)", (base, WHOLE_QUERY))
    regions.execute("DROP TABLE regions")
    regions.execute("SELECT * FROM alter_job(%s, scheduled => false, max_retries => 3)", (base,))
    assert (job(regions, base)["scheduled"], scope_query(regions, base)) == (False, WHOLE_QUERY)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        regions.execute("SELECT * FROM alter_job(%s, scope_query => %s)", (base, WHOLE_QUERY))
    regions.execute("SELECT * FROM alter_job(%s, scope_query => 'VALUES (''eu'')')", (base,))
    assert scope_query(regions, base) == "VALUES ('eu')"


def test_schedule_makes_unscoped_jobs_and_keeps_a_scope_query(regions: Conn) -> None:
    job_id = scalar(regions, "SELECT schedule('cleanup', '0 3 * * *', 'SELECT 1')")
    assert scope_query(regions, job_id) is None
    regions.execute("SELECT * FROM alter_job(%s, scope_query => %s)", (job_id, WHOLE_QUERY))
    regions.execute("DROP TABLE regions")  # stored, not re-checked by schedule() either
    assert scalar(regions, "SELECT schedule('cleanup', '10 minutes', 'SELECT 2')") == job_id
    assert (job(regions, job_id)["command"], scope_query(regions, job_id)) == ("SELECT 2", WHOLE_QUERY)


def test_views_show_scope_query_after_the_columns_before_it(regions: Conn) -> None:
    job_id = add_job(regions, "'ok_fn', '1 hour', scope_query => %s", (WHOLE_QUERY,))
    for view in ("pgsched.jobs", "public.jobs"):
        assert scalar(regions, f"SELECT scope_query FROM {view} WHERE job_id = %s", (job_id,)) == WHOLE_QUERY
        # appended: a view's existing columns cannot move on upgrade; database, priority, exclude, jitter,
        # concurrency_key, depends_on, history and the retentions came after it
        assert [r["attname"] for r in rows(
            regions, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                     "ORDER BY attnum DESC LIMIT 10", (view,))] == [
            "failure_retention", "success_retention", "history", "depends_on", "concurrency_key", "jitter",
            "exclude", "priority", "database", "scope_query"]


@pytest.mark.parametrize("query", [
    "SELECT 1; DROP TABLE victim",
    "SELECT 1 AS k; DROP TABLE victim; SELECT 1",
    # a query that closes the parenthesis it is wrapped in, to append statements of its own
    "SELECT 1) AS s; DROP TABLE victim; SELECT * FROM (SELECT 1",
    "SELECT 1) AS s; COMMIT; DROP TABLE victim; SELECT * FROM (SELECT 1",
    "DROP TABLE victim",
    "WITH gone AS (DELETE FROM victim RETURNING k) SELECT k FROM gone",
    "SELECT k FROM victim FOR UPDATE) AS s; TRUNCATE victim; SELECT * FROM (SELECT 1",
])
def test_a_scope_query_is_planned_never_run(api: Conn, query: str) -> None:
    api.execute("CREATE TABLE victim (k text); INSERT INTO victim VALUES ('kept')")
    with pytest.raises(psycopg.Error) as e:
        add_job(api, "'ok_fn', '1 hour', scope_query => %s", (query,))
    assert e.value.sqlstate == "22023"
    assert (e.value.diag.message_primary or "").startswith("invalid scope_query: ")
    assert scalar(api, "SELECT string_agg(k, ',') FROM victim") == "kept"  # still there, untouched
    assert scalar(api, "SELECT count(*) FROM pgsched.job") == 0


def test_planning_a_scope_query_is_read_only_and_rolled_back(api: Conn) -> None:
    # Planning folds immutable functions, and an (ill-declared) immutable function may call one
    # that writes: the check is read-only, as the scheduler's run is.
    api.execute("""CREATE TABLE written (n int);
        CREATE FUNCTION public.writes() RETURNS text LANGUAGE sql VOLATILE
            AS $$ INSERT INTO written VALUES (1) RETURNING 'w' $$;
        CREATE FUNCTION public.folded() RETURNS text LANGUAGE plpgsql IMMUTABLE
            AS $$ BEGIN RETURN public.writes(); END $$""")
    with pytest.raises(psycopg.Error) as e:
        add_job(api, "'ok_fn', '1 hour', scope_query => 'SELECT public.folded()'")
    assert (e.value.sqlstate, "read-only" in (e.value.diag.message_primary or "")) == ("22023", True)
    # a volatile function is not evaluated by the planner: accepted, and nothing ran
    job_id = add_job(api, "'ok_fn', '1 hour', scope_query => 'SELECT public.writes()'")
    assert scope_query(api, job_id) == "SELECT public.writes()"
    assert scalar(api, "SELECT count(*) FROM written") == 0
    # the session is as it was: read-write, its own search_path, no settings left behind
    assert scalar(api, "SHOW transaction_read_only") == "off"
    api.execute("INSERT INTO written VALUES (2)")


@pytest.mark.parametrize(("query", "planner_says"), [
    ("SELEKT name FROM regions", "syntax error at or near"),
    ("SELECT name FROM regions;", 'syntax error at or near ";"'),
    ("SELECT name FROM regions -- the end", "syntax error"),  # the comment hides the closing parenthesis
    ("SELECT name FROM no_such_table", 'relation "no_such_table" does not exist'),
    ("SELECT no_such_column FROM regions", 'column "no_such_column" does not exist'),
    ("SELECT no_such_function(name) FROM regions", "function no_such_function(text) does not exist"),
    ("SELECT $1", "there is no parameter $1"),
    ("SELECT 1 / 0", "division by zero"),
])
def test_a_scope_query_that_does_not_plan_is_refused_with_the_planners_reason(
        regions: Conn, base: int, query: str, planner_says: str) -> None:
    for call, args in [("SELECT add_job('ok_fn', '1 hour', scope_query => %s)", (query,)),
                       ("SELECT * FROM alter_job(%s, scope_query => %s)", (base, query))]:
        before = job(regions, base)
        with pytest.raises(psycopg.Error) as e:
            regions.execute(call, args)
        message = e.value.diag.message_primary or ""
        assert (e.value.sqlstate, message.startswith("invalid scope_query: "), planner_says in message) == \
            ("22023", True, True), message
        assert "scope_query must be one query" in (e.value.diag.message_hint or "")
        assert job(regions, base) == before
        assert scalar(regions, "SELECT count(*) FROM pgsched.job") == 1


def test_a_scope_query_resolves_names_as_the_scheduler_will(regions: Conn) -> None:
    # The scheduler runs it in a new session of the owner's, with the default search_path,
    # not the one this session set for itself.
    regions.execute("CREATE SCHEMA elsewhere; CREATE TABLE elsewhere.only_here (k text)")
    regions.execute("SET search_path = elsewhere, public")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
        add_job(regions, "'ok_fn', '1 hour', scope_query => 'SELECT k FROM only_here'")
    assert 'relation "only_here" does not exist' in (e.value.diag.message_primary or "")
    assert add_job(regions, "'ok_fn', '1 hour', scope_query => 'SELECT k FROM elsewhere.only_here'") > 0
    regions.execute("SET search_path = pg_catalog")
    assert add_job(regions, "'public.ok_fn', '1 hour', scope_query => 'SELECT name FROM regions'") > 0
    assert scalar(regions, "SHOW search_path") == "pg_catalog"


CHECKING_FUNCTIONS = ("_check_settings", "_insert_job", "add_job", "_alter_job", "alter_job", "schedule",
                      "_deploy_code_jobs")


def test_the_scope_query_is_planned_with_the_callers_rights(pg_server: PgServer) -> None:
    """Roles as deployed (test_security.py): a table the scheduler's role (which owns the
    functions) may read but alice may not is refused to alice."""
    with owner_database(pg_server) as odb, odb.connect() as admin, odb.connect(odb.alice) as alice:
        assert scalar(admin, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgsched'::regnamespace "
                             "AND proname = ANY (%s) AND prosecdef", (list(CHECKING_FUNCTIONS),)) == 0
        admin.execute("CREATE TABLE public.secret_keys (k text); CREATE TABLE public.open_keys (k text)")
        admin.execute(f'GRANT SELECT ON public.secret_keys TO "{odb.scheduler}"')
        admin.execute("GRANT SELECT ON public.open_keys TO PUBLIC")
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            alice.execute("SELECT add_job('public.job_ok', '1 hour', scope_query => 'SELECT k FROM secret_keys')")
        assert "permission denied for table secret_keys" in (e.value.diag.message_primary or "")
        mine = scalar(alice, "SELECT add_job('public.job_ok', '1 hour', scope_query => 'SELECT k FROM open_keys')")
        assert rows(alice, "SELECT job_id, scope_query FROM jobs") == [
            {"job_id": mine, "scope_query": "SELECT k FROM open_keys"}]
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            alice.execute("SELECT * FROM alter_job(%s, scope_query => 'SELECT k FROM secret_keys')", (mine,))
        alice.execute("SELECT * FROM alter_job(%s, scope_query => '')", (mine,))
        assert scalar(alice, "SELECT scope_query FROM jobs") is None


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
# Commit 8b9e5d9's signatures: with migration 0004's settings, without scope_query. Never
# released, but a database initialised from that commit has them.
UNRELEASED_SETTINGS = ("catch_up_window interval DEFAULT NULL, max_plans_per_tick integer DEFAULT 100, "
                       "schedule_delay interval DEFAULT interval '0', allow_stale_reentry boolean DEFAULT false")
UNRELEASED_ALTER = ("catch_up_window interval DEFAULT NULL, max_plans_per_tick integer DEFAULT NULL, "
                    "schedule_delay interval DEFAULT NULL, allow_stale_reentry boolean DEFAULT NULL")
UNRELEASED_API = (
    PREVIOUS_API
    .replace("catch_up text, job_name text)",
             "catch_up text, job_name text, catch_up_window interval, max_plans_per_tick integer, "
             "schedule_delay interval, allow_stale_reentry boolean)")
    .replace("catch_up text,\n    if_not_exists boolean)",
             "catch_up text,\n    if_not_exists boolean, catch_up_window interval, max_plans_per_tick integer, "
             "schedule_delay interval, allow_stale_reentry boolean)")
    .replace("if_not_exists boolean DEFAULT false)", f"if_not_exists boolean DEFAULT false, {UNRELEASED_SETTINGS})")
    .replace("config_merge jsonb DEFAULT NULL)", f"config_merge jsonb DEFAULT NULL, {UNRELEASED_ALTER})")
)
assert UNRELEASED_API.count("allow_stale_reentry") == 6
CHANGED = ("_check_settings", "_insert_job", "add_job", "_alter_job", "alter_job")
PUBLIC_SQL = Path(migrate.__file__).resolve().parent.parent / "sql" / "api" / "90_public.sql"


def overloads(conn: Conn, schema: str) -> dict[str, int]:
    return {r["proname"]: r["n"] for r in rows(
        conn, "SELECT proname, count(*)::int AS n FROM pg_proc WHERE pronamespace = %s::regnamespace "
              "AND proname = ANY (%s) GROUP BY proname", (schema, list(CHANGED)))}


@pytest.mark.parametrize("previous", [PREVIOUS_API, UNRELEASED_API], ids=["last-release", "unreleased-8b9e5d9"])
def test_upgrade_replaces_the_previous_signatures(empty_db: str, previous: str) -> None:
    with psycopg.connect(empty_db, autocommit=True) as c:
        migrate.init(c)
        # Put the database back in the state the previous API left: its signatures, not ours.
        with c.transaction():
            for name in CHANGED:
                for (sig,) in c.execute("SELECT oid::regprocedure::text FROM pg_proc "
                                        "WHERE pronamespace = 'pgsched'::regnamespace AND proname = %s", (name,)):
                    c.execute(f"DROP FUNCTION {sig}")
            c.execute(previous)
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
        assert scalar(c, "SELECT pronargs FROM pg_proc WHERE oid = 'pgsched.alter_job'::regproc") == 31
        # unqualified and qualified calls resolve to the new functions, old-style calls included
        a = scalar(c, "SELECT add_job('ok_fn', '5 minutes')")
        b = scalar(c, "SELECT add_job('ok_fn', interval '1 hour', schedule_delay => '1 minute', "
                      "scope_query => 'SELECT job_id FROM ran')")
        d = scalar(c, "SELECT pgsched.add_job('ok_fn', '1 hour', NULL, NULL, true, NULL, true, NULL, 'pos')")
        assert (a, b, d) == (1000, 1001, 1002)
        c.execute("SELECT * FROM alter_job(%s, max_plans_per_tick => 5, max_retries => 1)", (a,))
        assert (job(c, a)["max_plans_per_tick"], job(c, a)["max_retries"]) == (5, 1)
        assert (job(c, b)["schedule_delay"], job(c, b)["scope_query"]) == ("00:01:00", "SELECT job_id FROM ran")
        c.execute("SELECT * FROM alter_job(%s, scope_query => '')", (b,))
        assert job(c, b)["scope_query"] is None
        # and the grants follow the new signatures (a role that is not the owner may call them)
        assert scalar(c, "SELECT bool_and(has_function_privilege('public', oid, 'EXECUTE')) FROM pg_proc "
                         "WHERE pronamespace = 'pgsched'::regnamespace AND proname = ANY (%s)",
                      (list(CHANGED),)) is True
        # a second init has nothing to do
        assert migrate.init(c).api_reapplied is False
