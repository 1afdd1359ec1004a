"""add_job, alter_job, delete_job, schedule/unschedule and the views, against a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from tests.integration.helpers import SETUP_SQL, Conn, add_job, job, notices, one, rows, scalar, stats

FUTURE = "2100-01-01 00:00:00+00"


# --- add_job -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("schedule", "stored", "interval_text"),
    [
        ("5 minutes", "5 minutes", "00:05:00"),
        ("1 month", "1 month", "1 mon"),
        ("  2 days  ", "2 days", "2 days"),
        ("*/5 * * * *", "*/5 * * * *", None),
        ("30 */5 * * * *", "30 */5 * * * *", None),
        ("0 0 12 * * * 2099", "0 0 12 * * * 2099", None),
        ("@hourly", "@hourly", None),
    ],
)
def test_add_job_text_schedule(api: Conn, schedule: str, stored: str, interval_text: str | None) -> None:
    job_id = add_job(api, "'ok_fn', %s", (schedule,))
    assert job_id == 1000
    j = job(api, job_id)
    assert j["schedule"] == stored
    assert scalar(api, "SELECT schedule_interval::text FROM pgsched.job WHERE job_id = %s",
                  (job_id,)) == interval_text
    assert j["kind"] == "proc"
    assert (j["proc_schema"], j["proc_name"]) == ("public", "ok_fn")


@pytest.mark.parametrize(
    "call",
    [
        "'ok_fn', interval '1 hour'",
        "'ok_fn', schedule_interval => '1 hour'",
        "proc => 'ok_fn', schedule_interval => interval '1 hour'",
        "'ok_fn', '1 hour'::interval, '{\"a\": 1}'",
    ],
)
def test_add_job_timescaledb_interval_forms(api: Conn, call: str) -> None:
    job_id = add_job(api, call)
    assert scalar(api, "SELECT schedule_interval FROM pgsched.job WHERE job_id = %s", (job_id,)) \
        == scalar(api, "SELECT interval '1 hour'")
    assert job(api, job_id)["schedule"] == "01:00:00"


def test_add_job_interval_text_does_not_depend_on_intervalstyle(api: Conn) -> None:
    api.execute("SET intervalstyle = 'iso_8601'")
    job_id = add_job(api, "'ok_fn', interval '90 minutes'")
    assert job(api, job_id)["schedule"] == "01:30:00"


def test_add_job_all_named_arguments(api: Conn) -> None:
    job_id = add_job(api, """proc => 'ok_proc', schedule => '1 hour', config => '{"k": [1, 2]}',
        initial_start => %s, scheduled => false, check_config => 'check_ok', fixed_schedule => false,
        timezone => 'Europe/Berlin', job_name => 'all named', max_runtime => '10 minutes', max_retries => 3,
        retry_period => '1 minute', catch_up => 'all', if_not_exists => false, catch_up_window => '2 hours',
        max_plans_per_tick => 7, schedule_delay => '90 seconds', allow_stale_reentry => true,
        scope_query => 'SELECT job_id::text FROM ran'""", (FUTURE,))
    j = job(api, job_id)
    created = j.pop("created_at")
    assert created is not None
    owner = scalar(api, "SELECT current_user")
    assert j == {
        "job_id": job_id, "job_name": "all named", "owner": owner, "kind": "proc",
        "proc_schema": "public", "proc_name": "ok_proc", "command": None, "code_module": None,
        "code_function": None, "schedule": "1 hour", "schedule_interval": "01:00:00", "fixed_schedule": False,
        "initial_start": "2100-01-01T00:00:00+00:00", "timezone": "Europe/Berlin", "config": {"k": [1, 2]},
        "check_schema": "public", "check_name": "check_ok", "scheduled": False,
        "max_runtime": "00:10:00", "max_retries": 3, "retry_period": "00:01:00", "catch_up": "all",
        "next_start": "2100-01-01T00:01:30+00:00", "catch_up_window": "02:00:00", "max_plans_per_tick": 7,
        "schedule_delay": "00:01:30", "allow_stale_reentry": True, "scope_query": "SELECT job_id::text FROM ran",
        "database": None, "priority": 0, "exclude": None,
        "jitter": "00:00:00", "concurrency_key": None, "depends_on": None,
        "history": "all", "success_retention": None, "failure_retention": None,
    }
    s = stats(api, job_id)
    assert s["state"] == "disabled"
    assert s["next_start"] == datetime(2100, 1, 1, 0, 1, 30, tzinfo=UTC)  # initial_start + schedule_delay


def test_add_job_defaults(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '5 minutes'")
    j = job(api, job_id)
    assert {k: j[k] for k in ("job_name", "config", "initial_start", "scheduled", "check_name",
                              "fixed_schedule", "timezone", "max_runtime", "max_retries", "retry_period",
                              "catch_up", "scope_query")} == {
        "job_name": f"ok_fn [{job_id}]", "config": None, "initial_start": None, "scheduled": True,
        "check_name": None, "fixed_schedule": True, "timezone": None, "max_runtime": None, "max_retries": -1,
        "retry_period": "00:05:00", "catch_up": "latest", "scope_query": None}
    s = stats(api, job_id)
    assert (s["state"], s["total_runs"], s["last_start"], s["current_run_id"]) == ("scheduled", 0, None, None)


@pytest.mark.parametrize(("proc", "kind"), [("ok_fn", "f"), ("ok_proc", "p"), ("public.ok_proc", "p")])
def test_add_job_accepts_functions_and_procedures(api: Conn, proc: str, kind: str) -> None:
    job_id = add_job(api, "%s, '1 day'", (proc,))
    assert job(api, job_id)["proc_name"] == proc.removeprefix("public.")
    assert scalar(api, "SELECT prokind FROM pg_proc WHERE proname = %s", (proc.removeprefix("public."),)) == kind


def test_add_job_check_config_procedure_runs(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 day', config => '{}', check_config => 'check_proc'")
    assert job(api, job_id)["check_name"] == "check_proc"
    with pytest.raises(psycopg.Error) as e:
        add_job(api, "'ok_fn', '1 day', config => '{\"bad\": 1}', check_config => 'check_proc'")
    assert e.value.sqlstate == "PC002"


def test_unqualified_api_in_a_new_session(api: Conn, db: str) -> None:
    with psycopg.connect(db, autocommit=True) as fresh:
        job_id = scalar(fresh, "SELECT add_job('ok_fn', '5 minutes')")
        stat_rows = rows(fresh, "SELECT * FROM job_stats")
        assert [(r["job_id"], r["state"]) for r in stat_rows] == [(job_id, "scheduled")]
        assert [r["job_id"] for r in rows(fresh, "SELECT * FROM jobs")] == [job_id]
        assert rows(fresh, "SELECT * FROM job_history") == []
        timescale_id = scalar(fresh, "SELECT add_job('ok_fn', interval '1 hour')")
        named_id = scalar(fresh, "SELECT add_job('ok_proc', schedule_interval => '1 hour', job_name => 'n')")
        alter = one(fresh, "SELECT * FROM alter_job(%s, max_retries => 7)", (named_id,))
        assert (alter["job_id"], alter["max_retries"]) == (named_id, 7)
        cmd_id = scalar(fresh, "SELECT schedule('c', '1 day', 'SELECT 1')")
        fresh.execute("CALL run_job(%s)", (job_id,))
        assert scalar(fresh, "SELECT count(*) FROM job_history WHERE job_id = %s", (job_id,)) == 1
        assert scalar(fresh, "SELECT unschedule('c')") is True
        fresh.execute("SELECT delete_job(%s)", (timescale_id,))
        assert [r["job_id"] for r in rows(fresh, "SELECT job_id FROM job_stats ORDER BY 1")] == [job_id, named_id]
        assert cmd_id not in [r["job_id"] for r in rows(fresh, "SELECT job_id FROM pgsched.jobs")]


def test_qualified_api_works_without_public_in_search_path(api: Conn) -> None:
    api.execute("SET search_path = pg_catalog")
    job_id = scalar(api, "SELECT pgsched.add_job('public.ok_fn', '5 minutes')")
    assert [r["job_id"] for r in rows(api, "SELECT * FROM pgsched.job_stats")] == [job_id]
    assert [r["job_id"] for r in rows(api, "SELECT * FROM pgsched.jobs")] == [job_id]
    api.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert [r["outcome"] for r in rows(api, "SELECT * FROM pgsched.job_history")] == ["success"]


def test_job_stats_and_history_columns(api: Conn) -> None:
    def columns(view: str) -> set[str]:
        return {r["attname"] for r in rows(
            api, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0", (view,))}
    assert columns("pgsched.job_stats") >= {
        "job_id", "state", "next_start", "last_start", "last_finish", "last_successful_finish",
        "last_run_success", "last_run_duration", "total_runs", "total_successes", "total_failures",
        "total_crashes", "consecutive_failures", "consecutive_crashes"}
    assert columns("pgsched.job_history") >= {
        "run_id", "job_id", "plan_time", "started_at", "finished_at", "outcome", "sqlstate", "message",
        "worker_pid", "backend_pid"}
    assert columns("pgsched.jobs") >= {
        "job_id", "job_name", "owner", "schedule", "config", "initial_start", "scheduled", "check_name",
        "fixed_schedule", "timezone", "max_runtime", "max_retries", "retry_period", "catch_up", "next_start"}
    assert columns("public.job_stats") == columns("pgsched.job_stats")


def test_next_start_is_now_without_initial_start(api: Conn) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', '5 minutes'")
        assert scalar(api, "SELECT next_start = now() FROM job_stats WHERE job_id = %s", (job_id,)) is True


@pytest.mark.parametrize("fixed", [True, False])
def test_next_start_is_a_future_initial_start(api: Conn, fixed: bool) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', initial_start => %s, fixed_schedule => %s", (FUTURE, fixed))
    assert stats(api, job_id)["next_start"] == datetime(2100, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("every", "ago", "until_next"),
    [("1 hour", "90 minutes", "30 minutes"), ("1 day", "36 hours", "12 hours"),
     ("15 minutes", "30 minutes", "0"), ("7 seconds", "1 second", "6 seconds")],
)
def test_next_start_fixed_past_initial_start_is_the_next_slot(api: Conn, every: str, ago: str,
                                                              until_next: str) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', %s, initial_start => now() - %s::interval", (every, ago))
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (job_id,)) \
            == scalar(api, "SELECT %s::interval", (until_next,))


def test_next_start_drifting_past_initial_start_is_now(api: Conn) -> None:
    with api.transaction():
        job_id = add_job(api, "'ok_fn', '1 hour', initial_start => now() - interval '90 minutes', "
                              "fixed_schedule => false")
        assert scalar(api, "SELECT next_start = now() FROM job_stats WHERE job_id = %s", (job_id,)) is True


def test_mixed_month_day_interval_accepted_when_drifting(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 month 2 days', fixed_schedule => false")
    assert job(api, job_id)["schedule_interval"] == "1 mon 2 days"
    other = add_job(api, "'ok_fn', interval '1 month 2 hours', fixed_schedule => false")
    assert job(api, other)["schedule_interval"] == "1 mon 02:00:00"


def test_add_job_if_not_exists_returns_existing_id(api: Conn) -> None:
    first = add_job(api, "'ok_fn', '5 minutes', job_name => 'nightly'")
    before = job(api, first)
    with notices(api) as seen:
        again = add_job(api, "'ok_proc', '1 day', job_name => 'nightly', if_not_exists => true")
    assert again == first
    assert job(api, first) == before
    assert scalar(api, "SELECT count(*) FROM pgsched.job") == 1
    assert any("nightly" in n and "already exists" in n for n in seen), seen


def test_add_job_duplicate_name_without_if_not_exists(api: Conn) -> None:
    add_job(api, "'ok_fn', '5 minutes', job_name => 'nightly'")
    with pytest.raises(psycopg.errors.DuplicateObject) as e:
        add_job(api, "'ok_fn', '5 minutes', job_name => 'nightly'")
    assert "job_name" in str(e.value)


def test_direct_insert_creates_job_stat(api: Conn) -> None:
    api.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule) "
                "VALUES ('dml', 'command', 'SELECT 1', '5 minutes')")
    api.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule, scheduled) "
                "VALUES ('dml off', 'command', 'SELECT 1', '5 minutes', false)")
    got = rows(api, "SELECT j.job_name, s.state, s.total_runs, s.total_crashes, s.consecutive_failures "
                    "FROM pgsched.job j JOIN pgsched.job_stat s USING (job_id) ORDER BY j.job_id")
    assert got == [
        {"job_name": "dml", "state": "scheduled", "total_runs": 0, "total_crashes": 0, "consecutive_failures": 0},
        {"job_name": "dml off", "state": "disabled", "total_runs": 0, "total_crashes": 0,
         "consecutive_failures": 0},
    ]


# --- alter_job -----------------------------------------------------------------------------------

BASE_JOB = """'ok_fn', '1 hour', config => '{"a": 1, "b": 2}', initial_start => '2099-06-01 00:00:00+00',
    check_config => 'check_ok', timezone => 'Europe/Berlin', job_name => 'base', max_runtime => '5 minutes',
    max_retries => 2, retry_period => '2 minutes', catch_up => 'none'"""


@pytest.fixture
def base(api: Conn) -> int:
    return add_job(api, BASE_JOB)


# (alter_job argument, {column of pgsched.jobs: expected JSON value})
ALTERATIONS: list[tuple[str, dict[str, Any]]] = [
    ("schedule_interval => interval '10 minutes'", {"schedule": "00:10:00", "schedule_interval": "00:10:00"}),
    ("schedule => '2 hours'", {"schedule": "2 hours", "schedule_interval": "02:00:00"}),
    ("schedule => '*/10 * * * *'", {"schedule": "*/10 * * * *", "schedule_interval": None}),
    ("max_runtime => '1 hour'", {"max_runtime": "01:00:00"}),
    ("max_retries => 9", {"max_retries": 9}),
    ("max_retries => -1", {"max_retries": -1}),
    ("retry_period => '30 seconds'", {"retry_period": "00:00:30"}),
    ("scheduled => false", {"scheduled": False}),
    ("config => '{\"z\": true}'", {"config": {"z": True}}),
    ("config_merge => '{\"b\": 3, \"c\": 4}'", {"config": {"a": 1, "b": 3, "c": 4}}),
    ("check_config => 'check_proc'", {"check_name": "check_proc"}),
    ("fixed_schedule => false", {"fixed_schedule": False}),
    ("initial_start => '2098-01-01 00:00:00+00'", {"initial_start": "2098-01-01T00:00:00+00:00"}),
    ("timezone => 'America/New_York'", {"timezone": "America/New_York"}),
    ("job_name => 'renamed'", {"job_name": "renamed"}),
    ("catch_up => 'all'", {"catch_up": "all"}),
    ("next_start => '2097-01-01 00:00:00+00'", {"next_start": "2097-01-01T00:00:00+00:00"}),
]


@pytest.mark.parametrize(("argument", "changes"), ALTERATIONS, ids=[a for a, _ in ALTERATIONS])
def test_alter_job_changes_exactly_one_setting(api: Conn, base: int, argument: str,
                                               changes: dict[str, Any]) -> None:
    before = job(api, base)
    api.execute(f"SELECT * FROM pgsched.alter_job(%s, {argument})", (base,))
    after = job(api, base)
    rescheduling = any(k in changes for k in ("schedule", "fixed_schedule", "initial_start", "timezone"))
    if rescheduling:
        after.pop("next_start")
        before.pop("next_start")
    assert {k: v for k, v in after.items() if before[k] != v} == changes


def test_alter_job_with_every_argument_null_changes_nothing(api: Conn, base: int) -> None:
    before = job(api, base)
    stat_before = stats(api, base)
    result = one(api, """SELECT * FROM pgsched.alter_job(%s, schedule_interval => NULL, max_runtime => NULL,
        max_retries => NULL, retry_period => NULL, scheduled => NULL, config => NULL, next_start => NULL,
        if_exists => NULL, check_config => NULL, fixed_schedule => NULL, initial_start => NULL,
        timezone => NULL, job_name => NULL, schedule => NULL, catch_up => NULL, config_merge => NULL)""",
                 (base,))
    assert job(api, base) == before
    assert stats(api, base) == stat_before
    assert result["timezone"] == "Europe/Berlin"
    api.execute("SELECT pgsched.alter_job(%s)", (base,))
    assert job(api, base) == before


def test_alter_job_removes_a_catch_up_window_with_zero(api: Conn, base: int) -> None:
    """NULL keeps a catch_up_window; '0' (refused before, as no window is not positive) removes
    it, as '' removes a text setting; a negative one is still refused, and add_job still refuses '0'."""
    api.execute("SELECT pgsched.alter_job(%s, catch_up_window => '1 hour')", (base,))
    api.execute("SELECT pgsched.alter_job(%s, catch_up_window => NULL, max_retries => 3)", (base,))
    assert job(api, base)["catch_up_window"] == "01:00:00"
    api.execute("SELECT pgsched.alter_job(%s, catch_up_window => '0')", (base,))
    assert job(api, base)["catch_up_window"] is None
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid catch_up_window") as e:
        api.execute("SELECT pgsched.alter_job(%s, catch_up_window => '-1 hour')", (base,))
    assert "'0' removes it" in str(e.value.diag.message_hint)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid catch_up_window"):
        api.execute("SELECT pgsched.add_job('ok_fn', '1 hour', catch_up_window => '0')")
    # only zero itself: an interval equal to it by PostgreSQL's comparison is not positive, as ever
    api.execute("SELECT pgsched.alter_job(%s, catch_up_window => '1 hour')", (base,))
    for zero in ("1 day -24 hours", "1 month -30 days"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid catch_up_window"):
            api.execute("SELECT pgsched.alter_job(%s, catch_up_window => %s::interval)", (base, zero))
    assert job(api, base)["catch_up_window"] == "01:00:00"


def test_alter_job_keeps_timezone_when_changing_another_setting(api: Conn, base: int) -> None:
    api.execute("SELECT pgsched.alter_job(%s, schedule => '2 hours')", (base,))
    api.execute("SELECT pgsched.alter_job(%s, max_retries => 5)", (base,))
    j = job(api, base)
    assert (j["timezone"], j["max_retries"], j["schedule"]) == ("Europe/Berlin", 5, "2 hours")


def test_alter_job_returns_the_new_settings(api: Conn, base: int) -> None:
    result = one(api, "SELECT * FROM pgsched.alter_job(%s, max_retries => 4, config_merge => '{\"c\": 5}', "
                      "next_start => '2097-01-01 00:00:00+00')", (base,))
    assert {k: v for k, v in result.items()} == {
        "job_id": base, "schedule": "1 hour", "schedule_interval": scalar(api, "SELECT interval '1 hour'"),
        "max_runtime": scalar(api, "SELECT interval '5 minutes'"), "max_retries": 4,
        "retry_period": scalar(api, "SELECT interval '2 minutes'"), "scheduled": True,
        "config": {"a": 1, "b": 2, "c": 5}, "next_start": datetime(2097, 1, 1, tzinfo=UTC),
        "check_config": "public.check_ok", "fixed_schedule": True,
        "initial_start": datetime(2099, 6, 1, tzinfo=UTC), "timezone": "Europe/Berlin",
    }


def test_alter_job_timescaledb_positional_interval(api: Conn, base: int) -> None:
    result = one(api, "SELECT * FROM alter_job(%s, interval '10 min')", (base,))
    assert result["schedule_interval"] == scalar(api, "SELECT interval '10 minutes'")
    assert job(api, base)["schedule"] == "00:10:00"


def test_alter_job_new_schedule_recomputes_next_start(api: Conn, base: int) -> None:
    with api.transaction():
        api.execute("SELECT pgsched.alter_job(%s, initial_start => now() + interval '1 day')", (base,))
        assert scalar(api, "SELECT next_start - now() FROM job_stats WHERE job_id = %s", (base,)) \
            == scalar(api, "SELECT interval '1 day'")


def test_alter_job_disable_and_enable(api: Conn, base: int) -> None:
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (base,))
    assert stats(api, base)["state"] == "disabled"
    api.execute("UPDATE pgsched.job_stat SET consecutive_failures = 3 WHERE job_id = %s", (base,))
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (base,))
    s = stats(api, base)
    assert (s["state"], s["consecutive_failures"]) == ("scheduled", 0)
    assert job(api, base)["scheduled"] is True


def test_alter_job_if_exists_on_missing_job(api: Conn) -> None:
    with notices(api) as seen:
        result = rows(api, "SELECT * FROM pgsched.alter_job(4242, max_retries => 1, if_exists => true)")
    assert result == []
    assert any("4242" in n and "not found" in n for n in seen), seen


def test_alter_job_rename_to_a_taken_name(api: Conn, base: int) -> None:
    add_job(api, "'ok_fn', '1 day', job_name => 'taken'")
    with pytest.raises(psycopg.errors.DuplicateObject):
        api.execute("SELECT pgsched.alter_job(%s, job_name => 'taken')", (base,))
    assert job(api, base)["job_name"] == "base"


def test_alter_job_config_change_runs_check_config(api: Conn, base: int) -> None:
    with pytest.raises(psycopg.Error) as e:
        api.execute("SELECT pgsched.alter_job(%s, config => '{\"bad\": true}')", (base,))
    assert e.value.sqlstate == "PC001"
    assert job(api, base)["config"] == {"a": 1, "b": 2}


# --- delete_job, schedule, unschedule -------------------------------------------------------------

def test_delete_job_removes_job_stat_and_history(api: Conn, base: int) -> None:
    api.execute("CALL pgsched.run_job(%s)", (base,))
    api.execute("SELECT pgsched.delete_job(%s)", (base,))
    for table in ("job", "job_stat", "job_run"):
        assert scalar(api, f"SELECT count(*) FROM pgsched.{table}") == 0


def test_schedule_creates_a_command_job(api: Conn) -> None:
    job_id = scalar(api, "SELECT pgsched.schedule('cleanup', '0 3 * * *', 'DELETE FROM public.ran')")
    j = job(api, job_id)
    assert (j["job_name"], j["kind"], j["command"], j["schedule"], j["proc_name"]) == \
        ("cleanup", "command", "DELETE FROM public.ran", "0 3 * * *", None)
    assert j["owner"] == scalar(api, "SELECT current_user")
    assert stats(api, job_id)["state"] == "scheduled"


def test_schedule_same_name_updates_in_place(api: Conn) -> None:
    first = scalar(api, "SELECT schedule('cleanup', '0 3 * * *', 'SELECT 1')")
    with api.transaction():
        again = scalar(api, "SELECT schedule('cleanup', '10 minutes', 'SELECT 2')")
        assert scalar(api, "SELECT next_start = now() FROM job_stats WHERE job_id = %s", (first,)) is True
    assert again == first
    j = job(api, first)
    assert (j["schedule"], j["schedule_interval"], j["command"]) == ("10 minutes", "00:10:00", "SELECT 2")
    assert scalar(api, "SELECT count(*) FROM pgsched.job") == 1


def test_schedule_without_name(api: Conn) -> None:
    job_id = scalar(api, "SELECT schedule('*/5 * * * *', 'SELECT 1')")
    j = job(api, job_id)
    assert (j["job_name"], j["command"], j["schedule"]) == (f"command [{job_id}]", "SELECT 1", "*/5 * * * *")


@pytest.mark.parametrize("by", ["name", "id"])
def test_unschedule(api: Conn, by: str) -> None:
    job_id = scalar(api, "SELECT schedule('gone', '1 day', 'SELECT 1')")
    keep = scalar(api, "SELECT schedule('kept', '1 day', 'SELECT 1')")
    arg: object = "gone" if by == "name" else job_id
    assert scalar(api, "SELECT unschedule(%s)" if by == "id" else "SELECT unschedule(%s::text)", (arg,)) is True
    assert [r["job_id"] for r in rows(api, "SELECT job_id FROM pgsched.job")] == [keep]
    assert scalar(api, "SELECT count(*) FROM pgsched.job_stat") == 1


def test_unschedule_literal_forms(api: Conn) -> None:
    scalar(api, "SELECT schedule('lit', '1 day', 'SELECT 1')")
    second = scalar(api, "SELECT schedule('lit2', '1 day', 'SELECT 1')")
    assert scalar(api, "SELECT unschedule('lit')") is True
    assert scalar(api, f"SELECT unschedule({second})") is True
    assert scalar(api, "SELECT count(*) FROM pgsched.job") == 0


def test_setup_sql_is_idempotent_per_database(conn: Conn) -> None:
    # The fixture's job targets exist once per database: a second setup fails loudly.
    conn.execute(SETUP_SQL)
    with pytest.raises(psycopg.errors.DuplicateTable):
        conn.execute(SETUP_SQL)
