"""The operator commands as a person runs them (`python -m pgsched ...` as a subprocess), against
a real database and a real `pgsched serve`: jobs, history, next, pause, resume, trigger, cancel,
instances, status (its exit codes), watch; options from PGSCHED_<OPTION>; bad input gives one
line and a non-zero exit, with the DSN's password redacted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgsched.settings import default_max_workers
from pgsched.store import CONNECTION_BUDGET
from tests.acceptance.conftest import ServeFactory, query, wait_for
from tests.acceptance.test_serve import FAST, SETUP_SQL, add_job, history, stats

FAIL_SQL = """CREATE FUNCTION public.fail(job_id int, config jsonb) RETURNS void LANGUAGE plpgsql
              AS $$ BEGIN RAISE EXCEPTION 'boom %', job_id USING ERRCODE = '22012'; END $$"""


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("PGSCHED_") or k == "PGSCHED_PG_BINDIR"}
    return subprocess.run([sys.executable, "-m", "pgsched", *args], capture_output=True, text=True,
                          env={**merged, "COLUMNS": "200", **(env or {})}, timeout=timeout, check=False)


def ok_json(*args: str, env: dict[str, str] | None = None) -> Any:
    r = cli(*args, "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@contextlib.contextmanager
def watching(*args: str) -> Iterator[subprocess.Popen[str]]:
    """`pgsched watch ARGS`, once it says it listens (no event sent after can be missed); killed at
    the end if it still runs."""
    w = subprocess.Popen([sys.executable, "-m", "pgsched", "watch", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert w.stderr is not None
        assert "watching" in w.stderr.readline()
        yield w
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def execute(dsn: str, statement: str | sql.Composed, params: tuple[Any, ...] | None = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(statement, params)


@pytest.fixture
def dsn(db: str) -> str:
    """A database with the job targets of test_serve and `fail` (raises 22012 'boom <job_id>')."""
    execute(db, SETUP_SQL)
    execute(db, FAIL_SQL)
    return db


def test_jobs_history_next_pause_resume(dsn: str, serve: ServeFactory) -> None:
    bad = add_job(dsn, "'fail', '1 hour', retry_period => '100 ms', max_retries => 1, job_name => 'bad'")
    good = add_job(dsn, "'tick', '300 ms', job_name => 'good'")
    later = add_job(dsn, "'tick', '1 hour', job_name => 'later', initial_start => '2100-01-01 00:00+00'")
    s = serve(dsn, *FAST)
    wait_for(lambda: stats(dsn, bad)["state"] == "disabled" and stats(dsn, good)["total_successes"] >= 2, 10,
             "the failing job disabled and the good one run")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(5) == 0

    rows = ok_json("jobs", "--dsn", dsn)
    assert [(r["job_id"], r["job_name"], r["state"]) for r in rows] == [
        (bad, "bad", "disabled"), (good, "good", "scheduled"), (later, "later", "scheduled")]
    assert rows[0]["last_outcome"] == "failure" and rows[0]["consecutive_failures"] == 2
    assert [r["job_id"] for r in ok_json("jobs", "--dsn", dsn, "--failing")] == [bad]
    assert [r["job_id"] for r in ok_json("jobs", "--dsn", dsn, "--state", "disabled")] == [bad]
    table = cli("jobs", "--dsn", dsn)
    assert table.returncode == 0 and "good" in table.stdout and "disabled" in table.stdout

    runs = ok_json("history", "bad", "--dsn", dsn)
    assert [r["run_id"] for r in runs] == sorted((h["run_id"] for h in history(dsn, bad)), reverse=True)
    assert all(r["outcome"] == "failure" and r["sqlstate"] == "22012" for r in runs)
    assert runs[0]["message"].startswith(f"boom {bad} [disabled after 2 consecutive failures")
    assert runs[1]["message"] == f"boom {bad}"
    assert all(r["lag_s"] >= 0 and r["duration_s"] >= 0 for r in runs)
    assert len(ok_json("history", "--dsn", dsn, "--limit", "1")) == 1
    assert {r["outcome"] for r in ok_json("history", "--dsn", dsn, "--outcome", "success", "--since", "1h")} == {
        "success"}
    bad_since = cli("history", "--dsn", dsn, "--since", "yesterday")
    assert bad_since.returncode == 2 and "--since" in bad_since.stderr and "90s, 15m" in bad_since.stderr

    starts = ok_json("next", "later", "--dsn", dsn, "-n", "3")
    assert starts == ["2100-01-01T00:00:00+00:00", "2100-01-01T01:00:00+00:00", "2100-01-01T02:00:00+00:00"]
    cron = ok_json("next", "--schedule", "0 12 * * *", "--timezone", "Europe/Berlin", "-n", "2")
    assert [c[11:] for c in cron] in (["12:00:00+01:00"] * 2, ["11:00:00+00:00"] * 2, ["10:00:00+00:00"] * 2)
    assert cli("next").returncode == 2 and cli("next", "--schedule", "* * *").returncode == 2

    r = cli("pause", "good", str(later), "--dsn", dsn)
    assert r.returncode == 0, r.stderr
    assert [stats(dsn, j)["state"] for j in (good, later)] == ["disabled", "disabled"]
    r = cli("resume", "good", "nosuchjob", "--dsn", dsn)
    assert r.returncode == 1 and "'nosuchjob' not found" in r.stderr
    assert stats(dsn, good)["state"] == "disabled"  # every JOB is checked before anything is written
    assert cli("resume", "good", "--dsn", dsn).returncode == 0 and stats(dsn, good)["state"] == "scheduled"


def test_ambiguous_name_unknown_job_unreachable_database(dsn: str) -> None:
    role = f"other_{uuid.uuid4().hex[:8]}"
    execute(dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        a = add_job(dsn, "'tick', '1 hour', job_name => 'dup'")
        b = add_job(dsn, "'tick', '1 hour', job_name => 'dup2'")
        execute(dsn, "UPDATE pgsched.job SET owner = %s::regrole, job_name = 'dup' WHERE job_id = %s", (role, b))
        r = cli("history", "dup", "--dsn", dsn)
        assert r.returncode == 1 and "ambiguous" in r.stderr and f"{a} (owner" in r.stderr and str(b) in r.stderr
        assert r.stderr.count("\n") == 1
        r = cli("trigger", "424242", "--dsn", dsn)
        assert r.returncode == 1 and "'424242' not found" in r.stderr
        execute(dsn, "DELETE FROM pgsched.job WHERE job_id = %s", (b,))
    finally:
        execute(dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    secret = "s3cr3t-pw"
    for args in (["jobs"], ["status"], ["watch"], ["pause", "x"]):
        r = cli(*args, "--dsn", f"host=127.0.0.1 port=1 user=nobody password={secret} connect_timeout=2")
        assert r.returncode == (2 if args == ["status"] else 1), (args, r.stderr)
        assert secret not in r.stderr + r.stdout and "password=***" in r.stderr and "cannot connect" in r.stderr
        assert r.stderr.count("\n") == 1


def test_a_triggered_run_keeps_its_row_even_when_its_job_keeps_no_history(dsn: str, serve: ServeFactory) -> None:
    # The row is what tells every scheduler that heard the request that the run happened (README
    # "History and retention"): it stays, and goes by the retention.
    quiet = add_job(dsn, "'tick', '1 hour', job_name => 'quiet', history => 'none', "
                         "initial_start => '2100-01-01 00:00+00'")
    serve(dsn, *FAST)
    r = cli("trigger", "quiet", "--dsn", dsn, "--wait", "10")
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout
    wait_for(lambda: stats(dsn, quiet)["total_successes"] == 1 or None, 5, "the triggered run")
    assert [(h["trigger"], h["outcome"]) for h in history(dsn, quiet)] == [("manual", "success")]


def test_trigger_cancel_status_instances_and_environment(dsn: str, serve: ServeFactory) -> None:
    idle = add_job(dsn, "'tick', '1 hour', job_name => 'idle', initial_start => '2100-01-01 00:00+00'")
    slow = add_job(dsn, "'sleeper', '1 hour', job_name => 'slow', config => '{\"s\": 60}', "
                        "initial_start => '2100-01-01 00:00+00'")
    down = cli("status", "--dsn", dsn)
    assert down.returncode == 2 and "no live scheduler instance" in down.stdout
    s = serve(dsn, *FAST)

    r = cli("trigger", "idle", "--dsn", dsn)
    assert r.returncode == 0, r.stderr
    assert "started" in r.stdout
    wait_for(lambda: stats(dsn, idle)["total_successes"] == 1 or None, 5, "the triggered run")
    assert [(h["trigger"], h["outcome"]) for h in history(dsn, idle)] == [("manual", "success")]
    assert stats(dsn, idle)["next_start"].year == 2100

    assert cli("trigger", "slow", "--dsn", dsn).returncode == 0
    r = cli("cancel", "slow", "--dsn", dsn)
    assert r.returncode == 0, r.stderr
    assert "cancelled" in r.stdout
    h = history(dsn, slow)
    assert [(x["trigger"], x["outcome"]) for x in h] == [("manual", "cancelled")]
    r = cli("cancel", "slow", "--dsn", dsn)
    assert r.returncode == 1 and "no run in progress" in r.stderr

    inst = ok_json("instances", "--dsn", dsn)
    assert len(inst) == 1 and inst[0]["alive"] and inst[0]["pid"] == s.pid
    # serve's default: the machine's, within a quarter of the server's connections
    budget = query(dsn, f"SELECT {CONNECTION_BUDGET} AS n")[0]["n"]
    assert inst[0]["max_workers"] == default_max_workers(connections=budget)
    st = cli("status", "--dsn", dsn, "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    body = json.loads(st.stdout)
    assert body["status"] == "healthy" and body["instances_alive"] == 1
    assert {r["outcome"]: r["last_60m"] for r in body["runs"]} == {"success": 1, "cancelled": 1}

    # A job disabled by failures: degraded. Options from the environment: PGSCHED_<OPTION>.
    execute(dsn, FAIL_SQL.replace("public.fail", "public.fail2"))
    bad = add_job(dsn, "'fail2', '1 hour', max_retries => 0, job_name => 'bad'")
    wait_for(lambda: stats(dsn, bad)["state"] == "disabled" or None, 5, "the job disabled")
    env = {"PGSCHED_DSN": dsn, "PGSCHED_JSON": "1"}
    st = cli("status", env=env)
    assert st.returncode == 1 and json.loads(st.stdout)["status"] == "degraded"
    assert any(f"job {bad} (bad) disabled" in x for x in json.loads(st.stdout)["reasons"])
    text = cli("status", env={"PGSCHED_DSN": dsn})
    assert text.returncode == 1 and text.stdout.startswith("DEGRADED") and "boom" in text.stdout
    assert len(json.loads(cli("history", env={**env, "PGSCHED_LIMIT": "2"}).stdout)) == 2
    s.signal(signal.SIGTERM)
    assert s.wait_exit(5) == 0


def test_watch_prints_failures_and_disables_as_they_happen(dsn: str, serve: ServeFactory) -> None:
    # Listening before the job exists: no event can be missed.
    with watching("--dsn", dsn, "--json", "--count", "3", "--timeout", "20") as w:
        bad = add_job(dsn, "'fail', '1 hour', retry_period => '100 ms', max_retries => 1, job_name => 'bad'")
        add_job(dsn, "'tick', '200 ms', job_name => 'good'")
        s = serve(dsn, *FAST)
        out, _ = w.communicate(timeout=20)
        s.signal(signal.SIGTERM)
        s.wait_exit(5)
    assert w.returncode == 0
    events = [json.loads(x) for x in out.splitlines()]
    assert [(e["event"], e["job_id"], e["outcome"], e["job_name"], e["sqlstate"]) for e in events] == [
        ("run_end", bad, "failure", "bad", "22012"), ("run_end", bad, "failure", "bad", "22012"),
        ("job_disabled", bad, "failure", "bad", "22012")]
    assert "max_retries = 1" in events[2]["disabled_reason"]
    assert events[0]["message"] == f"boom {bad}"


def test_python_m_and_help_show_the_environment_variables() -> None:
    r = cli("serve", "--help")
    assert r.returncode == 0 and "PGSCHED_MAX_WORKERS" in r.stdout and "PGSCHED_CONFIG" in r.stdout
    r = cli("--version")
    assert r.returncode == 0 and "version" in r.stdout


def test_a_role_sees_and_acts_on_its_own_jobs_only(dsn: str) -> None:
    role = f"alice_{uuid.uuid4().hex[:8]}"
    execute(dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        mine = add_job(dsn, "'tick', '1 hour', job_name => 'mine', initial_start => '2100-01-01 00:00+00'")
        theirs = add_job(dsn, "'tick', '1 hour', job_name => 'theirs', initial_start => '2100-01-01 00:00+00'")
        execute(dsn, "UPDATE pgsched.job SET owner = %s::regrole WHERE job_id = %s", (role, mine))
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        as_alice = psycopg.conninfo.make_conninfo(**{**{k: str(v) for k, v in params.items()}, "user": role})
        assert [r["job_id"] for r in ok_json("jobs", "--dsn", as_alice)] == [mine]
        r = cli("pause", str(theirs), "--dsn", as_alice)
        assert r.returncode == 1 and f"'{theirs}' not found" in r.stderr
        assert stats(dsn, theirs)["state"] == "scheduled"
        assert cli("pause", "mine", "--dsn", as_alice).returncode == 0
        assert stats(dsn, mine)["state"] == "disabled"
        assert [r["job_id"] for r in ok_json("jobs", "--dsn", dsn)] == [mine, theirs]
    finally:
        execute(dsn, "DELETE FROM pgsched.job")
        execute(dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_database_without_pgsched_is_one_line(empty_db: str) -> None:
    for args, code in ((["jobs"], 1), (["status"], 2)):
        r = cli(*args, "--dsn", empty_db)
        assert r.returncode == code and "run `pgsched init` first" in r.stderr and r.stderr.count("\n") == 1


def test_watch_reconnects_after_losing_its_connection(dsn: str, serve: ServeFactory) -> None:
    with watching("--dsn", dsn, "--json", "--count", "1", "--timeout", "30") as w:
        assert w.stderr is not None
        # Its session is ended (as by a server restart or a failover): it says so and listens again.
        with psycopg.connect(dsn, autocommit=True) as c:
            ended = c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE query LIKE 'LISTEN pgsched_events%' AND pid <> pg_backend_pid()").fetchall()
        assert ended == [(True,)]
        assert "connection lost" in w.stderr.readline()
        assert "watching" in w.stderr.readline()
        bad = add_job(dsn, "'fail', '1 hour', job_name => 'bad'")
        s = serve(dsn, *FAST)
        out, _ = w.communicate(timeout=30)
        s.signal(signal.SIGTERM)
        s.wait_exit(5)
    assert w.returncode == 0
    [event] = [json.loads(x) for x in out.splitlines()]
    assert (event["event"], event["job_id"], event["outcome"]) == ("run_end", bad, "failure")


def test_a_schema_of_another_release_is_one_line_naming_both_versions(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        # What a later release's init would leave: an API that no longer serves this one.
        c.execute("CREATE OR REPLACE FUNCTION pgsched._api(OUT api_version integer, OUT oldest_api_served integer, "
                  "OUT release text) LANGUAGE sql AS $$ SELECT 9, 9, '9.0.0' $$")
    for args in (("jobs",), ("status",)):
        r = cli(*args, "--dsn", dsn)
        assert r.returncode in (1, 2), (args, r.stdout, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1, r.stderr
        assert "API is 9 (release 9.0.0" in lines[0] and "speaks API 2" in lines[0], lines[0]


def test_shell_completion_script_is_generated() -> None:
    r = subprocess.run([sys.executable, "-m", "pgsched"], capture_output=True, text=True, timeout=30, check=False,
                       env={**os.environ, "_PGSCHED_COMPLETE": "bash_source"})
    assert r.returncode == 0, r.stderr
    assert "complete -o nosort -F _pgsched_completion pgsched" in r.stdout
