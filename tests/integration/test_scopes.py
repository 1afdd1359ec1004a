"""Scoped (sharded) jobs: each (job, scope, plan_time) is its own run, history row and lease.

The jobs get their scope_query through the API (add_job, @pgsched.job); how the API checks
it is in test_job_settings.py and test_api_bad_input.py.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgsched import app
from pgsched.clock import DbClock
from pgsched.store import Abandoned, Store
from tests.integration.test_scheduler import Conn, one, serve


@pytest.fixture
def shards(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE shards (k text)")
    conn.execute("INSERT INTO shards VALUES ('eu'), ('us'), ('ap'), (NULL), ('eu')")
    conn.execute("CREATE TABLE effects (job_id int, scope text, setting text, plan_time timestamptz)")
    conn.execute("""CREATE PROCEDURE public.per_shard(job_id int, config jsonb) LANGUAGE sql AS $$
                    INSERT INTO effects VALUES (job_id, config->>'scope', current_setting('pgsched.scope'),
                                                current_setting('pgsched.plan_time')::timestamptz) $$""")
    return conn


def scoped_job(conn: Conn, query: str, schedule: str = "2 seconds", config: str = "'{\"batch\": 10}'") -> int:
    return int(one(conn, f"SELECT add_job('per_shard', '{schedule}', config => {config}, scope_query => %s)", query))


def history(conn: Conn, job: int) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT scope, plan_time, outcome, result, message FROM pgsched.job_history "
                        "WHERE job_id = %s ORDER BY plan_time, scope", (job,)).fetchall()


def test_each_scope_of_each_plan_runs_once_with_its_key(db: str, shards: Conn) -> None:
    job = scoped_job(shards, "SELECT k FROM shards")

    def two_plans_done() -> bool:
        rows = history(shards, job)
        plans = {p for s, p, o, *_ in rows if s == "" and o == "success"}
        done = Counter(p for s, p, o, *_ in rows if s and o == "success")
        return sum(1 for p in plans if done[p] == 3) >= 2

    serve(db, two_plans_done, timeout=20)
    rows = history(shards, job)
    plans = sorted({p for s, p, *_ in rows if s == ""})
    for plan in plans[:2]:
        mine = [(s, o, r) for s, p, o, r, _ in rows if p == plan]
        # The plan run found three distinct keys (NULL and the duplicate are dropped) and queued one run each.
        assert mine[0] == ("", "success", {"scopes": 3}), mine
        assert sorted((s, o) for s, o, _ in mine[1:]) == [("ap", "success"), ("eu", "success"), ("us", "success")]
    effects = shards.execute("SELECT scope, setting, plan_time, count(*) FROM effects GROUP BY 1, 2, 3").fetchall()
    assert all(n == 1 for *_, n in effects), effects  # no (scope, plan) ran twice
    assert all(scope == setting for scope, setting, _, _ in effects)  # config and pgsched.scope agree
    done = {(s, p) for s, p, o, *_ in rows if s and o == "success"}
    assert done <= {(s, p) for s, _, p, _ in effects}
    # The job's totals count plan runs and scope runs; nothing is left running or queued once it stops.
    st = shards.execute("SELECT total_runs, total_successes, total_crashes, state FROM pgsched.job_stats "
                        "WHERE job_id = %s", (job,)).fetchone()
    finished = [o for _, _, o, *_ in history(shards, job) if o not in ("queued", "running")]
    assert st is not None and st[0] == st[1] == len(finished) and st[2] == 0, (st, finished)


def test_the_scope_key_is_merged_into_the_config(db: str, shards: Conn) -> None:
    shards.execute("CREATE TABLE configs (c jsonb)")
    shards.execute("""CREATE PROCEDURE public.keep_config(job_id int, config jsonb) LANGUAGE sql
                      AS $$ INSERT INTO configs VALUES (config) $$""")
    one(shards, "SELECT add_job('keep_config', '1 hour', config => '{\"batch\": 10}', "
                "scope_query => 'VALUES (''x'')')")
    serve(db, lambda: one(shards, "SELECT count(*) FROM configs") >= 1, timeout=10)
    assert one(shards, "SELECT c FROM configs") == {"batch": 10, "scope": "x"}


@pytest.mark.parametrize(("query", "sqlstate", "text"), [
    ("SELECT nope FROM shards", "42703", "nope"),
    # Two statements cannot hide in the subquery the scheduler wraps the query in.
    ("SELECT k FROM shards; DELETE FROM shards", "42601", "syntax"),
    # ... nor can a query that closes the parenthesis itself and commits the read-only transaction.
    ("SELECT k FROM shards) AS s; COMMIT; DELETE FROM shards; SELECT * FROM (SELECT 1", "42601", "multiple commands"),
    # The query runs read-only: a function with side effects cannot write.
    ("SELECT k FROM shards, LATERAL (SELECT pg_catalog.nextval('effects_seq')) AS x", "25006", "read-only"),
    # A query of no column has no key (add_job refuses it; a row written by hand may hold one).
    ("SELECT FROM shards", "42P10", "no column"),
])
def test_a_bad_scope_query_fails_the_plan_and_writes_nothing(db: str, shards: Conn, query: str, sqlstate: str,
                                                              text: str) -> None:
    shards.execute("CREATE SEQUENCE effects_seq")
    try:
        job = scoped_job(shards, query, schedule="1 hour")
    except psycopg.errors.InvalidParameterValue as e:
        # add_job plans the query and refuses what cannot plan; such a query still reaches the
        # scheduler by direct DML on pgsched.job, or when what it names changes after add_job.
        assert (e.diag.message_primary or "").startswith("invalid scope_query: ") and sqlstate != "25006"
        job = scoped_job(shards, "SELECT k FROM shards", schedule="1 hour")
        shards.execute("UPDATE pgsched.job SET scope_query = %s WHERE job_id = %s", (query, job))
    else:
        assert sqlstate == "25006"  # plans (nextval is not run when planning), fails when run
    serve(db, lambda: any(o == "failure" for _, _, o, *_ in history(shards, job)), timeout=10)
    rows = history(shards, job)
    assert [(s, o) for s, _, o, *_ in rows] == [("", "failure")], rows
    assert text in rows[0][4] and rows[0][4].startswith("scope_query: "), rows
    assert one(shards, "SELECT sqlstate FROM pgsched.job_history WHERE job_id = %s", job) == sqlstate
    assert one(shards, "SELECT count(*) FROM shards") == 5
    assert one(shards, "SELECT count(*) FROM effects") == 0


# -- a Python job -------------------------------------------------------------------------------------

PY_SCOPED = """import pgsched


@pgsched.job(every="1 hour", name="py.scoped", scope_query="SELECT k FROM shards", config={"batch": 10})
def per_shard(run: pgsched.Run) -> None:
    run.connection.execute(
        "INSERT INTO effects VALUES (%s, %s, current_setting('pgsched.scope'), %s)",
        (run.job_id, run.scope, run.plan_time))
"""


@pytest.fixture
def py_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module declaring a scoped Python job, importable here and in the workers."""
    name = f"pgsched_test_scoped_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(PY_SCOPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path), prepend=os.pathsep)
    try:
        importlib.import_module(name)  # the scheduler deploys what the imported modules declare
        yield name
    finally:
        app.forget(name)
        sys.modules.pop(name, None)


def test_a_python_handler_gets_its_scope_as_run_scope(db: str, shards: Conn, py_app: str) -> None:
    def scopes_done() -> bool:
        return int(one(shards, "SELECT count(*) FROM pgsched.job_history WHERE job_name = 'py.scoped' "
                               "AND scope <> '' AND outcome = 'success'")) >= 3

    serve(db, scopes_done, timeout=20, apps=(py_app,))
    assert one(shards, "SELECT scope_query FROM pgsched.jobs WHERE job_name = 'py.scoped'") == "SELECT k FROM shards"
    plan = one(shards, "SELECT min(plan_time) FROM pgsched.job_history WHERE job_name = 'py.scoped'")
    effects = shards.execute("SELECT scope, setting FROM effects WHERE plan_time = %s ORDER BY scope",
                             (plan,)).fetchall()
    assert effects == [("ap", "ap"), ("eu", "eu"), ("us", "us")]  # run.scope and pgsched.scope agree


def test_keys_are_read_as_postgresql_prints_them(db: str, shards: Conn) -> None:
    """Any key type works (an enum, a boolean), '%' in the query is not a placeholder, and an empty
    key is dropped like NULL (it would collide with the plan run's own scope '')."""
    shards.execute("CREATE TYPE region AS ENUM ('eu', 'us')")
    job = scoped_job(shards, "SELECT r FROM unnest('{eu,us}'::region[]) AS r UNION ALL "
                             "SELECT k::region FROM shards WHERE k LIKE 'e%' UNION ALL SELECT NULL UNION ALL "
                             "SELECT true::text::region FROM shards WHERE false UNION ALL "
                             "SELECT r FROM unnest('{}'::region[]) r", schedule="1 hour")
    other = scoped_job(shards, "SELECT b FROM (VALUES (true), (false)) v(b) UNION ALL SELECT NULL", schedule="1 hour")
    empty = scoped_job(shards, "VALUES (''), ('x')", schedule="1 hour")

    def done(j: int, n: int) -> bool:
        return sum(1 for s, _, o, *_ in history(shards, j) if s and o == "success") >= n

    serve(db, lambda: done(job, 2) and done(other, 2) and done(empty, 1), timeout=10)
    assert sorted(s for s, *_ in history(shards, job) if s) == ["eu", "us"]
    assert sorted(s for s, *_ in history(shards, other) if s) == ["f", "t"]
    assert [(s, r) for s, _, _, r, _ in history(shards, empty)] == [("", {"scopes": 1}), ("x", None)]


def test_queued_scope_runs_get_half_the_workers_while_due_jobs_are_many(api: Conn) -> None:
    """Neither starves the other when the workers are short: while scope runs are queued, due jobs
    take at most half of a claim's workers (the rest, and whatever the queue leaves, goes to the
    queue). Explicit time, no scheduler: the scope runs are queued as a plan run's close queues them."""
    from tests.integration.helpers import rows
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    sharded = add_job(api, T + 3600 * S, scope_query="SELECT 1")
    for key in ("a", "b", "c"):
        api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                    "VALUES (%s, %s, %s, 'schedule', 'queued')", (sharded, key, T))
    busy = [add_job(api, T) for _ in range(10)]
    me = register(api, T - S)
    got = claim(api, me, T + S, workers=4)
    assert sorted((r["job_id"], r["scope"]) for r in got) == sorted(
        [(busy[0], ""), (busy[1], ""), (sharded, "a"), (sharded, "b")])
    # with one queued run left, due jobs take the rest
    got = claim(api, me, T + 2 * S, workers=4)
    assert sorted((r["job_id"], r["scope"]) for r in got) == sorted(
        [(busy[2], ""), (busy[3], ""), (busy[4], ""), (sharded, "c")])
    assert rows(api, "SELECT count(*) AS n FROM pgsched.job_run WHERE outcome = 'queued'") == [{"n": 0}]


def test_a_failed_scope_run_is_queued_again_for_its_retry_time_and_no_sooner(api: Conn) -> None:
    """The close queues a scope's retry (pgsched._close_batch) for the time the scheduler gives
    (state.scope_retry_at): the next attempt, a run of its own due then, claimed no sooner, and a
    wake-up for the schedulers meanwhile. Explicit time, no scheduler."""
    import json

    from tests.integration.helpers import rows, scalar
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    def close(run: dict[str, Any], outcome: str, retry_at: Any) -> None:
        end = {"run_id": run["run_id"], "outcome": outcome, "sqlstate": None if outcome == "success" else "P0001",
               "message": "boom", "next_start": None, "finished_at": (run["started_at"] + S).isoformat(),
               "lease_token": run["lease_token"], "scopes": None,
               "retry_at": None if retry_at is None else retry_at.isoformat()}
        assert len(rows(api, "SELECT * FROM pgsched._close_runs(%s)", (json.dumps([end]),))) == 1

    def queued() -> list[dict[str, Any]]:
        return rows(api, "SELECT scope, plan_time, attempt, trigger FROM pgsched.job_run "
                         "WHERE job_id = %s AND outcome = 'queued' ORDER BY scope", (sharded,))

    sharded = add_job(api, T + 3600 * S, scope_query="SELECT 1")
    for key in ("a", "b"):
        api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                    "VALUES (%s, %s, %s, 'schedule', 'queued')", (sharded, key, T))
    me = register(api, T - S)
    a, b = sorted(claim(api, me, T + S, workers=2), key=lambda r: r["scope"])
    close(a, "failure", T + 10 * S)
    assert queued() == [{"scope": "a", "plan_time": T + 10 * S, "attempt": 2, "trigger": "retry"}]
    # Not claimable before its time; the schedulers wake for it.
    assert claim(api, me, T + 5 * S, workers=2) == []
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + 5 * S,)) == T + 10 * S
    [again] = claim(api, me, T + 10 * S, workers=2)
    assert (again["scope"], again["attempt"], again["plan_time"]) == ("a", 2, T + 10 * S)
    # A retry at or after the job's next plan is not queued: the plan runs the scope anyway.
    close(again, "failure", T + 3600 * S)
    assert queued() == []
    # A success asks for none (whatever it is sent), nor does a run of a paused job.
    close(b, "success", T + 20 * S)
    assert queued() == []
    api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                "VALUES (%s, 'c', %s, 'schedule', 'queued'), (%s, 'd', %s, 'schedule', 'queued')",
                (sharded, T, sharded, T))
    c, d = sorted(claim(api, me, T + 30 * S, workers=2), key=lambda r: r["scope"])
    # A scope a later plan queued meanwhile is not queued twice.
    api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                "VALUES (%s, 'c', %s, 'schedule', 'queued')", (sharded, T + 31 * S))
    close(c, "timeout", T + 40 * S)
    assert queued() == [{"scope": "c", "plan_time": T + 31 * S, "attempt": 1, "trigger": "schedule"}]
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (sharded,))
    close(d, "crash", T + 40 * S)
    assert queued() == [{"scope": "c", "plan_time": T + 31 * S, "attempt": 1, "trigger": "schedule"}]
    st = rows(api, "SELECT total_runs, total_failures, total_crashes, total_successes FROM pgsched.job_stat "
                   "WHERE job_id = %s", (sharded,))
    assert st == [{"total_runs": 5, "total_failures": 3, "total_crashes": 1, "total_successes": 1}]


def test_a_failed_scope_is_retried_on_its_own_with_backoff_up_to_max_retries(db: str, shards: Conn) -> None:
    """One scope fails once and then succeeds, another always fails: each is retried on its own,
    backing off on its attempt, the second max_retries (2) times, and the job stays scheduled."""
    shards.execute("CREATE SEQUENCE eu_tries")
    shards.execute("""CREATE PROCEDURE public.flaky_shard(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                      BEGIN
                          IF config->>'scope' = 'us' OR (config->>'scope' = 'eu' AND nextval('eu_tries') = 1) THEN
                              RAISE EXCEPTION 'shard % is down', config->>'scope';
                          END IF;
                          INSERT INTO effects VALUES (job_id, config->>'scope',
                                  (SELECT h.attempt::text FROM pgsched.job_history h
                                    WHERE h.run_id = current_setting('pgsched.run_id')::bigint),
                                                      current_setting('pgsched.plan_time')::timestamptz);
                      END $$""")
    job = int(one(shards, "SELECT add_job('flaky_shard', '1 hour', max_retries => 2, retry_period => '1 second', "
                          "scope_query => 'SELECT k FROM shards')"))

    def us_runs() -> list[tuple[Any, ...]]:
        return shards.execute("SELECT attempt, trigger, outcome, started_at, finished_at FROM pgsched.job_run "
                              "WHERE job_id = %s AND scope = 'us' ORDER BY run_id", (job,)).fetchall()

    serve(db, lambda: len([r for r in us_runs() if r[2] == "failure"]) >= 3, timeout=30)
    serve(db, lambda: False, timeout=5)  # long enough for a fourth attempt (about 4 s after the third)
    us = us_runs()
    assert [(a, t, o) for a, t, o, *_ in us] == [(1, "schedule", "failure"), (2, "retry", "failure"),
                                                (3, "retry", "failure")], us
    # Backed off on the attempt: about 1 s, then about 2 s (±10 %), after the previous end.
    gaps = [(us[n + 1][3] - us[n][4]).total_seconds() for n in range(2)]
    assert 0.85 <= gaps[0] <= 1.6 and 1.75 <= gaps[1] <= 2.7, gaps
    eu = shards.execute("SELECT attempt, trigger, outcome FROM pgsched.job_run "
                        "WHERE job_id = %s AND scope = 'eu' ORDER BY run_id", (job,)).fetchall()
    assert eu == [(1, "schedule", "failure"), (2, "retry", "success")]
    # Each scope's work done once, the retry knowing it is one.
    assert sorted(shards.execute("SELECT scope, setting FROM effects").fetchall()) == [("ap", "1"), ("eu", "2")]
    st = shards.execute("SELECT state, total_runs, total_successes, total_failures, total_crashes, "
                        "consecutive_failures FROM pgsched.job_stats WHERE job_id = %s", (job,)).fetchone()
    # The plan run, ap, eu twice and us three times; the scopes' failures leave the job scheduled.
    assert st == ("scheduled", 7, 3, 4, 0, 0), st


def test_a_scope_run_whose_worker_is_killed_is_retried_and_counted_once_as_a_crash(db: str, shards: Conn) -> None:
    import signal

    shards.execute("""CREATE PROCEDURE public.stuck_shard(job_id int, config jsonb) LANGUAGE plpgsql AS $$
                      DECLARE attempt int := (SELECT h.attempt FROM pgsched.job_history h
                                               WHERE h.run_id = current_setting('pgsched.run_id')::bigint);
                      BEGIN
                          IF config->>'scope' = 'us' AND attempt = 1 THEN
                              PERFORM pg_sleep(60);
                          END IF;
                          INSERT INTO effects VALUES (job_id, config->>'scope', attempt::text, now());
                      END $$""")
    job = int(one(shards, "SELECT add_job('stuck_shard', '1 hour', retry_period => '1 second', "
                          "scope_query => 'SELECT k FROM shards')"))
    killed: list[int] = []

    def kill_then_wait() -> bool:
        if not killed:
            row = shards.execute("SELECT worker_pid FROM pgsched.job_run WHERE job_id = %s AND scope = 'us' "
                                 "AND outcome = 'running' AND worker_pid IS NOT NULL", (job,)).fetchone()
            if row is not None:
                os.kill(row[0], signal.SIGKILL)
                killed.append(row[0])
        return int(one(shards, "SELECT count(*) FROM effects WHERE scope = 'us'")) >= 1

    serve(db, kill_then_wait, timeout=30, max_workers=1)  # one worker: the run row names it
    assert killed
    us = shards.execute("SELECT attempt, trigger, outcome FROM pgsched.job_run "
                        "WHERE job_id = %s AND scope = 'us' ORDER BY run_id", (job,)).fetchall()
    assert us == [(1, "schedule", "crash"), (2, "retry", "success")], us
    assert sorted(shards.execute("SELECT scope, setting FROM effects").fetchall()) == [
        ("ap", "1"), ("eu", "1"), ("us", "2")]
    st = shards.execute("SELECT state, total_runs, total_successes, total_crashes FROM pgsched.job_stats "
                        "WHERE job_id = %s", (job,)).fetchone()
    assert st == ("scheduled", 5, 4, 1), st


def test_a_scope_retry_is_claimed_ahead_and_is_a_wake_up_only_for_a_scheduled_job(api: Conn) -> None:
    """Claimed `ahead` like a due job (its worker waits for started_at); the claim's next_due and
    _next_due name it while it waits, not once it is claimed, nor while its job is paused. A retry
    is queued only before the job's next plan time (next_start less the schedule_delay)."""
    from tests.integration.helpers import rows, scalar
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    sharded = add_job(api, T + 3600 * S, scope_query="SELECT 1", schedule_delay=timedelta(seconds=600))
    add_job(api, T + 1800 * S)  # another job: the next due when the retry is not
    api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, attempt, trigger, outcome) "
                "VALUES (%s, 'a', %s, 2, 'retry', 'queued')", (sharded, T + 10 * S))
    me = register(api, T - S)

    def next_due(at: Any) -> Any:
        return scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (at,))

    assert next_due(T) == T + 10 * S
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (sharded,))
    assert next_due(T) == T + 1800 * S  # a paused job's retry wakes nobody
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (sharded,))
    assert claim(api, me, T + 9 * S, workers=2, ahead=timedelta(milliseconds=500)) == []
    [run] = claim(api, me, T + 9.6 * S, workers=2, ahead=S)
    assert (run["scope"], run["attempt"], run["plan_time"], run["started_at"]) == ("a", 2, T + 10 * S, T + 10 * S)
    assert run["next_due"] == T + 1800 * S  # not the retry it took
    assert next_due(T + 9.7 * S) == T + 1800 * S
    # The next plan's time is 12:50 (next_start 13:00 less 10 minutes): a retry due then or later is
    # not queued, one due before it is.
    import json
    for retry_at, queued in ((T + 3000 * S, 0), (T + 2999 * S, 1)):
        api.execute("DELETE FROM pgsched.job_run WHERE job_id = %s AND outcome = 'queued'", (sharded,))
        end = {"run_id": run["run_id"], "outcome": "failure", "sqlstate": "P0001", "message": "x",
               "finished_at": (T + 11 * S).isoformat(), "retry_at": retry_at.isoformat()}
        with api.transaction(force_rollback=True):
            rows(api, "SELECT * FROM pgsched._close_runs(%s)", (json.dumps([end]),))
            assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND outcome = 'queued'",
                          (sharded,)) == queued


@pytest.mark.parametrize("run_by_run", [False, True])
def test_a_scope_the_next_plan_queues_in_the_same_close_is_not_also_retried(api: Conn, run_by_run: bool) -> None:
    """A batch that closes a scope run's failure and the next plan's run, which queues that scope:
    the scope runs with the plan, not after the retry's backoff (the plans' scopes are queued first).
    Also when the batch fails and _close_runs closes its runs one by one, in the batch's order: the
    scope's close then finds the job's next start still at the open plan, before its retry."""
    import json

    from tests.integration.helpers import rows
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    if run_by_run:
        # A close of more than one run fails: _close_runs falls back to closing them one at a time.
        api.execute("""CREATE FUNCTION public.one_run_a_close() RETURNS trigger LANGUAGE plpgsql AS $$
                       BEGIN
                           IF (SELECT count(*) FROM closed_rows) > 1 THEN
                               RAISE EXCEPTION 'one run a close';
                           END IF;
                           RETURN NULL;
                       END $$""")
        api.execute("CREATE TRIGGER one_run_a_close AFTER UPDATE ON pgsched.job_run "
                    "REFERENCING NEW TABLE AS closed_rows FOR EACH STATEMENT EXECUTE FUNCTION public.one_run_a_close()")
    sharded = add_job(api, T + 100 * S, scope_query="SELECT 1")
    api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                "VALUES (%s, 'a', %s, 'schedule', 'queued')", (sharded, T))
    me = register(api, T - S)
    [scope_run] = claim(api, me, T + S, workers=2)
    [plan_run] = claim(api, me, T + 100 * S, workers=2)
    assert (scope_run["scope"], plan_run["scope"]) == ("a", "")
    ends = [{"run_id": scope_run["run_id"], "outcome": "failure", "sqlstate": "P0001", "message": "x",
             "finished_at": (T + 101 * S).isoformat(), "lease_token": scope_run["lease_token"],
             "retry_at": (T + 110 * S).isoformat()},
            {"run_id": plan_run["run_id"], "outcome": "success", "finished_at": (T + 101 * S).isoformat(),
             "next_start": (T + 160 * S).isoformat(), "schedule_delay_s": 0.0,
             "lease_token": plan_run["lease_token"], "scopes": ["a", "b"]}]
    rows(api, "SELECT * FROM pgsched._close_runs(%s)", (json.dumps(ends),))
    assert rows(api, "SELECT scope, plan_time, attempt, trigger FROM pgsched.job_run "
                     "WHERE job_id = %s AND outcome = 'queued' ORDER BY scope", (sharded,)) == [
        {"scope": "a", "plan_time": T + 100 * S, "attempt": 1, "trigger": "schedule"},
        {"scope": "b", "plan_time": T + 100 * S, "attempt": 1, "trigger": "schedule"}]


@pytest.mark.parametrize("queues", ["a retry", "a plan's scopes"])
def test_a_close_that_queues_scope_runs_while_their_job_is_deleted_does_not_deadlock(api: Conn, db: str,
                                                                                      queues: str) -> None:
    """A session holds a sharded job's job_stat row; meanwhile a close queues runs of the job (a failed
    scope's retry, or a plan run's scopes) and the job is deleted. The close takes the job's row before
    its run and its job_stat row, as delete_job does, so when the session lets go both finish (before,
    the queued runs' foreign key took the job's row last, the deletion first: 40P01). The job and
    every run of it are gone."""
    import json

    from tests.integration.helpers import in_thread, scalar, wait_for_a_lock_wait
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    sharded = add_job(api, T + 100 * S, scope_query="SELECT 1")
    me = register(api, T - S)
    end: dict[str, Any]
    if queues == "a retry":
        api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                    "VALUES (%s, 'a', %s, 'schedule', 'queued')", (sharded, T))
        [run] = claim(api, me, T + S)
        end = {"outcome": "failure", "sqlstate": "P0001", "message": "x", "retry_at": (T + 10 * S).isoformat()}
    else:
        [run] = claim(api, me, T + 100 * S)
        end = {"outcome": "success", "next_start": (T + 160 * S).isoformat(), "schedule_delay_s": 0.0,
               "scopes": ["a", "b"]}
    end |= {"run_id": run["run_id"], "finished_at": (T + 101 * S).isoformat(), "lease_token": run["lease_token"]}
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM pgsched.job_stat WHERE job_id = %s FOR UPDATE", (sharded,))
        close, close_errors = in_thread(db, "SELECT * FROM pgsched._close_runs(%s) /* closing */", (json.dumps([end]),))
        wait_for_a_lock_wait(api, "closing")
        delete, delete_errors = in_thread(db, "SELECT pgsched.delete_job(%s) /* deleting */", (sharded,))
        wait_for_a_lock_wait(api, "deleting")
        holder.execute("COMMIT")
        close.join(10)
        delete.join(10)
    assert close_errors == [] and delete_errors == [], (close_errors, delete_errors)
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s", (sharded,)) == 0
    assert scalar(api, "SELECT count(*) FROM pgsched.job WHERE job_id = %s", (sharded,)) == 0


def test_a_close_that_queues_scope_runs_takes_its_job_s_row_no_stronger_than_their_foreign_key(api: Conn,
                                                                                                db: str) -> None:
    """The close that queues a plan's scopes locks the job's row first (no deadlock with a deletion),
    with the lock the queued runs' foreign key takes anyway (KEY SHARE): it does not wait for a
    transaction holding the row FOR NO KEY UPDATE (as pausing and disabling take it), which the
    disabling close's stronger lock would."""
    import json

    from tests.integration.helpers import rows, scalar
    from tests.integration.test_core_sql_time import S, T, add_job, claim, register

    sharded = add_job(api, T, scope_query="SELECT 1")
    me = register(api, T - S)
    [run] = claim(api, me, T)
    end = {"run_id": run["run_id"], "outcome": "success", "next_start": (T + 60 * S).isoformat(),
           "schedule_delay_s": 0.0, "scopes": ["a", "b"], "finished_at": (T + S).isoformat(),
           "lease_token": run["lease_token"]}
    with psycopg.connect(db, autocommit=True) as holder, psycopg.connect(db, autocommit=True) as closer:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM pgsched.job WHERE job_id = %s FOR NO KEY UPDATE", (sharded,))
        closer.execute("SET lock_timeout = '2s'")
        assert len(rows(closer, "SELECT * FROM pgsched._close_runs(%s)", (json.dumps([end]),))) == 1
        holder.execute("COMMIT")
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND outcome = 'queued'",
                  (sharded,)) == 2


# `attempt_shard` writes its scope and attempt as the effect's setting.
ATTEMPT_SHARD = """CREATE PROCEDURE public.attempt_shard(job_id int, config jsonb) LANGUAGE sql AS $$
                   INSERT INTO effects SELECT job_id, config->>'scope', h.attempt::text, now()
                     FROM pgsched.job_history h WHERE h.run_id = current_setting('pgsched.run_id')::bigint $$"""


def _scope_run_held_by_a_stopped_scheduler(conn: Conn, job: int, scope: str) -> int:
    """A run of `scope` started by a scheduler that then stopped without closing it (its row says
    'stopped': the cause pgsched._abandoned_runs_v2 gives first): its run_id."""
    conn.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                 "VALUES (%s, %s, now() - interval '1 second', 'schedule', 'queued')", (job, scope))
    gone = int(one(conn, "SELECT instance_id FROM pgsched._register_instance_v2('gone', 1, 'test', 1)"))
    [run] = conn.execute("SELECT run_id FROM pgsched._claim_v2(%s, ARRAY[100], ARRAY[0], interval '0', '{}')",
                         (gone,)).fetchall()
    conn.execute("SELECT pgsched._instance_stop_v2(%s)", (gone,))
    return int(run[0])


def _the_one_abandoned_run(db: str) -> Abandoned:
    """What a new scheduler's heartbeat reads of the one run it finds abandoned."""
    store = Store(db, DbClock())
    try:
        me = store.register_instance("me", 1, "test", 1)
        [found] = store.heartbeat(me, 1, timedelta(seconds=10), timedelta(0), []).abandoned
    finally:
        store.close()
    return found


def _write_by_hand(conn: Conn, statement: str, *args: Any) -> None:
    """A write to pgsched.job past its triggers' checks, as an absurd value written by hand would be."""
    conn.execute("ALTER TABLE pgsched.job DISABLE TRIGGER USER")
    try:
        conn.execute(statement, args)
    finally:
        conn.execute("ALTER TABLE pgsched.job ENABLE TRIGGER USER")


def test_a_scope_run_another_scheduler_closes_as_a_crash_is_retried(db: str, shards: Conn) -> None:
    """The scheduler that finds a scope run abandoned (its own scheduler stopped or died) closes it
    as a crash and asks for its retry as that scheduler would have: attempt 2, trigger retry. Found
    at its start with nobody seen dying (a restart), the retry waits crash_wait, as a plan run does."""
    shards.execute(ATTEMPT_SHARD)
    job = int(one(shards, "SELECT add_job('attempt_shard', '1 hour', retry_period => '1 second', "
                          "scope_query => 'SELECT k FROM shards')"))
    shards.execute("UPDATE pgsched.job_stat SET next_start = now() + interval '1 hour' WHERE job_id = %s", (job,))
    crashed = _scope_run_held_by_a_stopped_scheduler(shards, job, "us")

    def retried() -> bool:
        return int(one(shards, "SELECT count(*) FROM effects WHERE scope = 'us'")) >= 1

    serve(db, retried, timeout=20, crash_wait=3.0)
    us = shards.execute("SELECT run_id, attempt, trigger, outcome, plan_time, finished_at FROM pgsched.job_run "
                        "WHERE job_id = %s AND scope = 'us' ORDER BY run_id", (job,)).fetchall()
    assert [r[1:4] for r in us] == [(1, "schedule", "crash"), (2, "retry", "success")], us
    assert us[0][0] == crashed
    # A restart: crash_wait (3 s), not the backoff (1 s), from the crash's close to the retry's plan.
    assert timedelta(seconds=2.99) <= us[1][4] - us[0][5] <= timedelta(seconds=3.5), us
    assert shards.execute("SELECT scope, setting FROM effects").fetchall() == [("us", "2")]
    st = shards.execute("SELECT state, total_runs, total_successes, total_crashes FROM pgsched.job_stats "
                        "WHERE job_id = %s", (job,)).fetchone()
    assert st == ("scheduled", 2, 1, 1), st


def test_a_scope_run_found_at_a_start_while_a_peer_lives_is_retried_after_its_backoff(db: str, shards: Conn) -> None:
    """A failover, not a restart: another scheduler is alive when this one starts and finds the
    abandoned scope run, so its retry keeps the job's backoff (1 s), not crash_wait (30 s)."""
    shards.execute(ATTEMPT_SHARD)
    job = int(one(shards, "SELECT add_job('attempt_shard', '1 hour', retry_period => '1 second', "
                          "scope_query => 'SELECT k FROM shards')"))
    shards.execute("UPDATE pgsched.job_stat SET next_start = now() + interval '1 hour' WHERE job_id = %s", (job,))
    _scope_run_held_by_a_stopped_scheduler(shards, job, "us")
    with psycopg.connect(db, autocommit=True) as peer:  # registered, heartbeating now, its session open
        peer.execute("SELECT pgsched._register_instance_v2('peer', 1, 'test', 1)")
        serve(db, lambda: int(one(shards, "SELECT count(*) FROM effects WHERE scope = 'us'")) >= 1, timeout=8,
              crash_wait=30.0)
    us = shards.execute("SELECT attempt, trigger, outcome, plan_time, finished_at FROM pgsched.job_run "
                        "WHERE job_id = %s AND scope = 'us' ORDER BY run_id", (job,)).fetchall()
    assert [r[:3] for r in us] == [(1, "schedule", "crash"), (2, "retry", "success")], us
    assert timedelta(seconds=0.85) <= us[1][3] - us[0][4] <= timedelta(seconds=1.15), us
    assert us[0][2] == "crash"
    message = one(shards, "SELECT message FROM pgsched.job_run WHERE job_id = %s AND scope = 'us' AND attempt = 1",
                  job)
    assert message.endswith("stopped before the run ended; the scope is retried unless the job's next plan "
                            "comes first"), message


@pytest.mark.parametrize("case", ["max_retries", "unreadable exclude", "plan run"])
def test_an_abandoned_run_is_not_retried_past_max_retries_nor_without_its_facts(db: str, shards: Conn,
                                                                                 case: str) -> None:
    """What the heartbeat reads for an abandoned run's retry (pgsched._abandoned_scope_run): a scope
    run's attempt, max_retries and window. No retry past max_retries, nor for a job whose exclusion
    window was written by hand and cannot be read (the scheduler goes on), nor for a plan run."""
    shards.execute(ATTEMPT_SHARD)
    job = int(one(shards, "SELECT add_job('attempt_shard', '1 hour', retry_period => '1 second', "
                          "max_retries => %s, scope_query => 'SELECT k FROM shards')",
                  0 if case == "max_retries" else 3))
    shards.execute("UPDATE pgsched.job_stat SET next_start = now() + interval '1 hour' WHERE job_id = %s", (job,))
    if case == "unreadable exclude":
        _write_by_hand(shards, "UPDATE pgsched.job SET exclude = 'not a window' WHERE job_id = %s", job)
    crashed = _scope_run_held_by_a_stopped_scheduler(shards, job, "" if case == "plan run" else "us")
    found = _the_one_abandoned_run(db)
    assert found.run_id == crashed
    if case == "max_retries":
        assert (found.attempt, found.max_retries, found.exclude) == (1, 0, None)
    else:
        assert found.attempt is None  # and so no retry (recovery.Recovery._abandoned_finish)
    if case == "plan run":
        return  # its crash moves the job's next start, as before (test_scheduler.py)
    serve(db, lambda: False, timeout=3, crash_wait=0.0)
    runs = shards.execute("SELECT attempt, trigger, outcome FROM pgsched.job_run WHERE job_id = %s "
                          "ORDER BY run_id", (job,)).fetchall()
    assert runs == [(1, "schedule", "crash")], runs
    assert shards.execute("SELECT count(*) FROM effects").fetchone() == (0,)


def test_an_abandoned_run_of_a_job_with_an_absurd_retry_period_is_closed_and_the_scheduler_goes_on(
        db: str, shards: Conn) -> None:
    """A retry_period written by hand past what Python's timedelta holds (about 2.7 million years):
    the heartbeat reads the abandoned run as one whose schedule cannot be computed, the run is closed
    as a crash with its job disabled, and the scheduler runs the other jobs."""
    shards.execute(ATTEMPT_SHARD)
    job = int(one(shards, "SELECT add_job('attempt_shard', '1 hour', scope_query => 'SELECT k FROM shards')"))
    shards.execute("UPDATE pgsched.job_stat SET next_start = now() + interval '1 hour' WHERE job_id = %s", (job,))
    crashed = _scope_run_held_by_a_stopped_scheduler(shards, job, "")
    _write_by_hand(shards, "UPDATE pgsched.job SET retry_period = interval '3000000 years' WHERE job_id = %s", job)
    found = _the_one_abandoned_run(db)
    assert (found.run_id, found.schedule) == (crashed, None) and "invalid schedule" in (found.problem or "")
    other = int(one(shards, "SELECT add_job('attempt_shard', '1 hour', scope_query => $$SELECT 'other'$$)"))
    serve(db, lambda: int(one(shards, "SELECT count(*) FROM effects WHERE scope = 'other'")) >= 1, timeout=10)
    assert shards.execute("SELECT outcome FROM pgsched.job_run WHERE run_id = %s", (crashed,)).fetchone() == ("crash",)
    assert one(shards, "SELECT state FROM pgsched.job_stats WHERE job_id = %s", job) == "disabled"
    assert one(shards, "SELECT total_successes FROM pgsched.job_stats WHERE job_id = %s", other) == 2
