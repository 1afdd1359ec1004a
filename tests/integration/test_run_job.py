"""run_job: a manual run in the calling session, recorded in job_history and job_stats."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
import pytest

from tests.integration.helpers import Conn, add_job, history, rows, scalar, snapshot, stats


@dataclass(frozen=True)
class Target:
    id: str
    add: str  # SQL expression creating the job
    sqlstate: str | None  # None: the run succeeds
    message: str | None
    via: str | None  # what the job wrote to public.ran before succeeding or failing


TARGETS = [
    Target("function ok", "pgsched.add_job('ok_fn', '1 hour', config => '{\"x\": 1}')", None, None, "function"),
    Target("procedure ok", "pgsched.add_job('ok_proc', '1 hour', config => '{\"x\": 1}')", None, None,
           "procedure"),
    Target("command ok", "pgsched.schedule('cmd', '1 hour', "
           "'INSERT INTO public.ran VALUES (0, NULL, ''command'')')", None, None, "command"),
    Target("function failing", "pgsched.add_job('bad_fn', '1 hour')", "22012", "division by zero", None),
    Target("procedure failing", "pgsched.add_job('bad_proc', '1 hour')", "PS001", "procedure failed on purpose",
           None),
    Target("command failing", "pgsched.schedule('cmd', '1 hour', 'SELECT 1/0')", "22012", "division by zero",
           None),
    Target("command unknown table", "pgsched.schedule('cmd', '1 hour', 'SELECT * FROM no_such_table')",
           "42P01", "no_such_table", None),
]


def run(conn: Conn, job_id: int, qualified: bool = True) -> None:
    conn.execute(f"CALL {'pgsched.' if qualified else ''}run_job(%s)", (job_id,))


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_run_job_records_the_run(api: Conn, target: Target) -> None:
    job_id = scalar(api, f"SELECT {target.add}")
    next_before = stats(api, job_id)["next_start"]
    error_message: str | None = None
    if target.sqlstate is None:
        run(api, job_id)
    else:
        with pytest.raises(psycopg.Error) as e:
            run(api, job_id)
        assert e.value.sqlstate == target.sqlstate
        error_message = e.value.diag.message_primary
        assert target.message and error_message and target.message in error_message
        assert (e.value.diag.message_detail, e.value.diag.message_hint) == (None, None)

    # what the job itself did (a failed job's writes are rolled back)
    ran = rows(api, "SELECT job_id, config, via FROM public.ran")
    if target.via == "command":
        assert ran == [{"job_id": 0, "config": None, "via": "command"}]
    elif target.via:
        assert ran == [{"job_id": job_id, "config": {"x": 1}, "via": target.via}]
    else:
        assert ran == []

    [h] = history(api, job_id)
    ok = target.sqlstate is None
    assert {k: h[k] for k in ("job_id", "trigger", "outcome", "succeeded", "sqlstate", "worker_pid",
                              "backend_pid", "attempt")} == {
        "job_id": job_id, "trigger": "manual", "outcome": "success" if ok else "failure", "succeeded": ok,
        "sqlstate": target.sqlstate, "worker_pid": None, "backend_pid": api.info.backend_pid, "attempt": 1}
    assert h["message"] == error_message
    assert isinstance(h["started_at"], datetime) and isinstance(h["finished_at"], datetime)
    assert h["plan_time"] <= h["started_at"] <= h["finished_at"]
    assert h["duration"] == h["finished_at"] - h["started_at"]

    s = stats(api, job_id)
    assert {k: s[k] for k in ("state", "total_runs", "total_successes", "total_failures", "total_crashes",
                              "consecutive_failures", "consecutive_crashes", "last_run_success",
                              "current_run_id", "next_start")} == {
        "state": "scheduled", "total_runs": 1, "total_successes": int(ok), "total_failures": int(not ok),
        "total_crashes": 0, "consecutive_failures": int(not ok), "consecutive_crashes": 0,
        "last_run_success": ok, "current_run_id": None, "next_start": next_before}
    assert (s["last_start"], s["last_finish"]) == (h["started_at"], h["finished_at"])
    assert s["last_successful_finish"] == (h["finished_at"] if ok else None)
    assert s["last_run_duration"] == h["duration"]


def test_counters_over_several_runs(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', job_name => 'flaky'")
    outcomes = []
    for fail in (True, True, False, True):
        api.execute("CREATE OR REPLACE FUNCTION public.ok_fn(job_id integer, config jsonb) RETURNS void "
                    f"LANGUAGE sql AS 'SELECT {'1/0' if fail else '1'}'")
        try:
            run(api, job_id, qualified=False)
            outcomes.append("success")
        except psycopg.errors.DivisionByZero:
            outcomes.append("failure")
    assert [h["outcome"] for h in history(api, job_id)] == outcomes == ["failure", "failure", "success", "failure"]
    s = stats(api, job_id)
    assert (s["total_runs"], s["total_successes"], s["total_failures"], s["total_crashes"],
            s["consecutive_failures"], s["consecutive_crashes"], s["last_run_success"]) == (4, 1, 3, 0, 1, 0, False)
    assert s["last_successful_finish"] == history(api, job_id)[2]["finished_at"]


def test_run_job_refused_while_a_run_is_in_progress(api: Conn, db: str) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    with psycopg.connect(db) as scheduler:  # not autocommit: commit explicitly like a scheduler does
        run_id = scalar(scheduler, "SELECT pgsched._mark_start(%s, now(), 'schedule')", (job_id,))
        scheduler.commit()
    assert stats(api, job_id)["state"] == "starting"
    before = snapshot(api)
    with pytest.raises(psycopg.errors.ObjectInUse) as e:
        run(api, job_id)
    assert e.value.sqlstate == "55006"
    assert f"job {job_id} is already running" in str(e.value)
    assert str(run_id) in str(e.value)
    assert snapshot(api) == before
    assert scalar(api, "SELECT count(*) FROM public.ran") == 0


def test_run_job_of_a_disabled_job_stays_disabled(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', scheduled => false")
    run(api, job_id)
    s = stats(api, job_id)
    assert (s["state"], s["total_runs"], s["total_successes"]) == ("disabled", 1, 1)


def test_run_job_inside_a_transaction_block_is_refused_without_writes(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidTransactionTermination), api.transaction():
        run(api, job_id)
    assert snapshot(api) == before


def test_run_job_keeps_the_job_error_details(api: Conn) -> None:
    api.execute("""CREATE FUNCTION public.detailed(job_id integer, config jsonb) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION USING ERRCODE = 'PD001', MESSAGE = 'broken', DETAIL = 'the detail',
                                   HINT = 'the hint'; END $$""")
    job_id = add_job(api, "'detailed', '1 hour'")
    with pytest.raises(psycopg.Error) as e:
        run(api, job_id)
    d = e.value.diag
    assert (e.value.sqlstate, d.message_primary, d.message_detail, d.message_hint) == \
        ("PD001", "broken", "the detail", "the hint")
    assert [(h["sqlstate"], h["message"]) for h in history(api, job_id)] == [("PD001", "broken")]


def test_run_job_tells_the_job_its_run_and_plan_time(api: Conn) -> None:
    api.execute("CREATE TABLE seen (run_id text, plan_time timestamptz, scope text)")
    job = api.execute("SELECT pgsched.schedule('seen', '1 hour', $$INSERT INTO seen VALUES "
                      "(current_setting('pgsched.run_id'), current_setting('pgsched.plan_time')::timestamptz, "
                      "current_setting('pgsched.scope'))$$)").fetchone()
    assert job is not None
    api.execute("CALL pgsched.run_job(%s)", (job[0],))
    row = api.execute("SELECT s.run_id::bigint = r.run_id, s.plan_time = r.plan_time, s.scope FROM seen s "
                      "JOIN pgsched.job_run r ON r.job_id = %s AND r.trigger = 'manual'", (job[0],)).fetchone()
    assert row == (True, True, "")
