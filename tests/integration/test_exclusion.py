"""Exclusion windows (issue 14) in SQL: the setting through add_job/alter_job and the views, bad
input refused with nothing written, and the close of a plan the window skipped (explicit time)."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest

from pgsched import exclusion
from pgsched.schedule import parse_cron
from tests.integration.helpers import Conn, rows, scalar, snapshot
from tests.integration.test_core_sql_time import S, T, add_job, claim, register


def test_add_and_alter_job_keep_the_window_and_the_views_show_it(api: Conn) -> None:
    job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '5 minutes', exclude => ' * 2  * * * ')"))
    assert scalar(api, "SELECT exclude FROM pgsched.jobs WHERE job_id = %s", (job,)) == " * 2  * * * "
    api.execute("SELECT pgsched.alter_job(%s, max_retries => 1)", (job,))  # NULL keeps it
    assert scalar(api, "SELECT exclude FROM pgsched.jobs WHERE job_id = %s", (job,)) == " * 2  * * * "
    api.execute("SELECT pgsched.alter_job(%s, exclude => '* * 25 12 *')", (job,))
    assert scalar(api, "SELECT exclude FROM pgsched.job WHERE job_id = %s", (job,)) == "* * 25 12 *"
    api.execute("SELECT pgsched.alter_job(%s, exclude => '')", (job,))  # '' removes it
    assert scalar(api, "SELECT exclude FROM pgsched.job WHERE job_id = %s", (job,)) is None


def test_a_changed_window_replans_the_job(api: Conn) -> None:
    job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '5 minutes', exclude => '* 2 * * *')"))
    api.execute("UPDATE pgsched.job_stat SET next_start = now() + interval '3 hours' WHERE job_id = %s", (job,))
    api.execute("SELECT pgsched.alter_job(%s, exclude => '')", (job,))
    # The next start is the schedule's first again, not the one past the old window.
    assert scalar(api, "SELECT next_start <= now() + interval '5 minutes' FROM pgsched.job_stat "
                       "WHERE job_id = %s", (job,)) is True


@pytest.mark.parametrize(("value", "says"), [
    ("* 2 * *", "is not a cron expression of 5 fields"),
    ("0 * 2 * * *", "is not a cron expression of 5 fields"),
    ("@daily", "is not a cron expression of 5 fields"),
    ("   ", "is not a cron expression of 5 fields"),
    ("* 25 * * *", "hour"),
    ("0 0 31 2 *", "can never fire"),
    ("* * * * *", "excludes every minute"),
    ("* * 1-31 * *", "excludes every minute"),
    ("* * * * 0-6", "excludes every minute"),
    ("* * 1-30,L * *", "excludes every minute"),
])
def test_a_bad_window_is_refused_naming_exclude_and_nothing_is_written(api: Conn, value: str, says: str) -> None:
    job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '5 minutes')"))
    before = snapshot(api)
    for call in ("SELECT pgsched.add_job('ok_fn', '1 minute', exclude => %s)",
                 f"SELECT pgsched.alter_job({job}, exclude => %s)"):
        with pytest.raises(psycopg.Error) as e:
            api.execute(call, (value,))
        assert e.value.sqlstate == "22023"
        assert str(e.value).startswith("invalid exclude:") and says in str(e.value), str(e.value)
        diag = e.value.diag.message_hint or ""
        assert "a cron expression of 5 fields (min hour dom month dow)" in diag
        assert snapshot(api) == before


def test_the_close_of_an_excluded_plan_is_a_skip_not_a_run(api: Conn) -> None:
    job = add_job(api, T, exclude="* 12 * * *")
    me = register(api, T)
    [run] = claim(api, me, T)
    assert run["exclude"] == "* 12 * * *"  # the launch row carries it
    end = {"run_id": run["run_id"], "outcome": "skipped", "finished_at": (T + S).isoformat(),
           "message": "plan in an excluded minute (exclude '* 12 * * *'); the 59 later plan(s) up to ... too",
           "next_start": (T + timedelta(hours=1)).isoformat(), "lease_token": run["lease_token"], "excluded": 59,
           "schedule_delay_s": 0}
    assert [r["_finish_runs"] for r in rows(api, "SELECT * FROM pgsched._finish_runs(%s)",
                                            (json.dumps([end]),))] == [run["run_id"]]
    assert rows(api, "SELECT outcome, plan_time, message FROM pgsched.job_history WHERE job_id = %s", (job,)) == [
        {"outcome": "skipped", "plan_time": T, "message": end["message"]}]
    st = rows(api, "SELECT state, next_start, total_runs, total_skipped, total_crashes, consecutive_crashes, "
                   "last_run_success, last_finish FROM pgsched.job_stat WHERE job_id = %s", (job,))
    assert st == [{"state": "scheduled", "next_start": T + timedelta(hours=1), "total_runs": 0, "total_skipped": 60,
                   "total_crashes": 0, "consecutive_crashes": 0, "last_run_success": None, "last_finish": None}]


@pytest.mark.parametrize("value", ["* * * * SAT,SUN", "* * * * 1-5", "* * 25 * *", "* * 1-15 * *", "* * L * *",
                                   "* * 1-15 * SAT"])
def test_a_window_of_some_days_is_taken(api: Conn, value: str) -> None:
    # The old rule took a day field of 31 days or 7 weekdays for every day, though a restricted
    # one decides alone (Vixie cron's rule): '* * * * SAT,SUN' was "every minute".
    job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '* * * * *', exclude => %s)", (value,)))
    assert scalar(api, "SELECT exclude FROM pgsched.job WHERE job_id = %s", (job,)) == value


# Schedules every minute of whose the window takes: the scheduler would search for a start.
NO_START = [("30 10 * * *", "* 10 * * *"), ("* 0-29 * * * *", "0-29 * * * *"), ("0 3 * * *", "* 3 * * *"),
            ("0 0 * * *", "0 * * * *"), ("0 10 * * 1-5", "* 10 * * MON-FRI"), ("0 10 1 * *", "* * 1-7 * 1-5")]


@pytest.mark.parametrize(("sched", "value"), NO_START)
def test_a_window_that_leaves_the_schedule_no_start_is_refused(api: Conn, sched: str, value: str) -> None:
    job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', %s)", (sched,)))
    other = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '5 minutes', exclude => %s)", (value,)))
    before = snapshot(api)
    for call, args in (("SELECT pgsched.add_job('ok_fn', %s, exclude => %s)", (sched, value)),
                       ("SELECT pgsched.alter_job(%s, exclude => %s)", (job, value)),
                       ("SELECT pgsched.alter_job(%s, schedule => %s)", (other, sched))):
        with pytest.raises(psycopg.Error) as e:
            api.execute(call, args)
        assert e.value.sqlstate == "22023"
        assert e.value.diag.message_primary == (f"invalid exclude: '{value}' leaves schedule '{sched}' no start: "
                                                "every minute in which it fires is excluded"), str(e.value)
        assert "a cron expression of 5 fields (min hour dom month dow)" in (e.value.diag.message_hint or "")
        assert snapshot(api) == before


def test_the_sql_rule_is_the_python_one(api: Conn) -> None:
    """pgsched._exclude_leaves_no_start against pgsched.exclusion.leaves_no_start, pair by pair."""
    from tests.unit.test_exclusion import PAIRS

    windows = ["* * * * *", "* * * * SAT,SUN", "* * 1-15 * *", "* * 1-30,L * *", "* * 1-31 * 1", "* * L * *",
               "0-29 * * * *", "* 10 * 1-11 *", "* * * 2 1-6", "* * 29 * *", "* * * 1 1-5"]
    pairs = [(p[0], p[1]) for p in PAIRS] + [(s, w) for s in ("* * * * *", "0 0 29 2 *", "0 12 * * 0#5", "0 0 L * *",
                                                               "0 0 0 1 1 * 2030")
                                              for w in windows]
    for sched, window in pairs:
        want = exclusion.leaves_no_start(parse_cron(sched), parse_cron(window))
        assert scalar(api, "SELECT pgsched._exclude_leaves_no_start(%s, %s)", (sched, window)) is want, (sched, window)
