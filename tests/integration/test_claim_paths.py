"""The claim's two statements (pgsched._claim_v2): the usual one, taken when no keyed job is due
and no scope run is queued, and the full one, must claim the same runs and write the same rows.

Each state is built in a transaction (hypothesis draws the jobs: due or not, priorities, jitter,
retries, Python jobs of a module the claim may or may not take, paused jobs, @after jobs with a
backlog, a plan that already ran). The claim runs on it twice, each time rolled back: as it is
(the usual statement) and with one queued scope run of a paused job added, which no claim takes
and which makes the claim take its full statement. What each returned (ids aside) and every
job_stat and job_run_live row (ids aside) must agree. Which statement ran is told by its DEBUG
line, so a state that sends both calls down one path fails the test.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.helpers import Conn, notices, rows, scalar

T = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)
USUAL = "pgsched claim: no keyed job due, no scope run queued"
# Columns that differ between two claims of one state by construction: sequences move on
# through a rollback, and db_now is the clock.
IDS = {"run_id", "lease_token", "current_run_id", "db_now"}

FUZZ = os.environ.get("PGSCHED_FUZZ") == "1"

job_strategy = st.fixed_dictionaries({
    # seconds from T to next_start; None: unplanned; "inf": infinity (never)
    "next": st.one_of(st.integers(-30, 30), st.none(), st.just("inf")),
    "priority": st.sampled_from([-5, 0, 5]),
    "jitter_s": st.sampled_from([0, 10]),
    "failures": st.sampled_from([0, 0, 2]),
    "kind": st.sampled_from(["proc", "proc", "python m1", "python m2"]),
    "paused": st.booleans(),
    "after": st.booleans(),
    "ran_already": st.booleans(),
    "delay_s": st.sampled_from([0, 0, 3]),
})


def build(conn: Conn, jobs: list[dict[str, Any]]) -> int:
    """The jobs of one example, and the instance that claims; returns the instance's id."""
    for n, j in enumerate(jobs):
        python = j["kind"].startswith("python")
        job_id = int(scalar(conn, """
            INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, code_module, code_function,
                                     schedule, schedule_interval, priority, jitter, schedule_delay, scheduled)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, make_interval(secs => %s), make_interval(secs => %s), %s)
            RETURNING job_id""",
            (f"claim paths {n}", "python" if python else "proc", None if python else "public",
             None if python else "ok_fn", j["kind"].split()[1] if python else None, "handler" if python else None,
             "@after" if j["after"] else "1 minute", None if j["after"] else "1 minute",
             j["priority"], j["jitter_s"], j["delay_s"], not j["paused"])))
        nxt = (None if j["next"] is None else "infinity" if j["next"] == "inf"
               else (T + timedelta(seconds=j["next"])).isoformat())
        conn.execute("""UPDATE pgsched.job_stat SET next_start = %s::timestamptz, consecutive_failures = %s,
                               upstream_backlog = CASE WHEN %s THEN ARRAY[%s::timestamptz + interval '1 minute'] END
                         WHERE job_id = %s""",
                     (nxt, j["failures"], j["after"] and j["next"] not in (None, "inf"), nxt, job_id))
        if j["ran_already"] and isinstance(j["next"], int):
            # the plan that next_start stands for has its run already (closed): the claim's conflict
            conn.execute("""INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, started_at, finished_at,
                                                         outcome)
                            VALUES (%s, pgsched._delayed(%s::timestamptz, -make_interval(secs => %s)),
                                    'schedule', %s, %s, 'success')""",
                         (job_id, nxt, j["delay_s"], T, T))
    return int(scalar(conn, "SELECT instance_id FROM pgsched._register_instance_v2('paths', 1, 'test', 8, now => %s)",
                      (T,)))


def claim_and_rows(conn: Conn, instance: int, workers: int, ahead_ms: int, modules: list[str],
                   inert_queue: bool) -> tuple[bool, Any]:
    """One claim, rolled back: whether the usual statement ran, what it returned and wrote."""
    with conn.transaction(force_rollback=True):
        if inert_queue:
            paused = int(scalar(conn, "INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule, "
                                      "schedule_interval, scheduled) VALUES ('claim paths paused', 'proc', 'public', "
                                      "'ok_fn', '1 minute', '1 minute', false) RETURNING job_id"))
            conn.execute("INSERT INTO pgsched.job_run_live (job_id, scope, plan_time, trigger, outcome) "
                         "VALUES (%s, 'tenant 1', %s, 'schedule', 'queued')", (paused, T - timedelta(seconds=5)))
        conn.execute("SET LOCAL client_min_messages = debug1")
        with notices(conn) as seen:
            claimed = rows(conn, "SELECT to_jsonb(c) AS r FROM pgsched._claim_v2(%s, %s, %s, "
                                 "make_interval(secs => %s), %s, now => %s) c",
                           (instance, list(range(1, workers + 1)), list(range(101, 101 + workers)),
                            ahead_ms / 1000, modules, T))
        conn.execute("SET LOCAL client_min_messages = notice")
        stats = rows(conn, """SELECT to_jsonb(s) AS r FROM pgsched.job_stat s JOIN pgsched.job j USING (job_id)
                               WHERE j.job_name LIKE 'claim paths %' AND j.job_name <> 'claim paths paused'
                               ORDER BY j.job_name""")
        runs = rows(conn, """SELECT to_jsonb(r) || jsonb_build_object('job_name', j.job_name) AS r
                               FROM pgsched.job_run_live r JOIN pgsched.job j USING (job_id)
                              WHERE j.job_name LIKE 'claim paths %' AND j.job_name <> 'claim paths paused'
                              ORDER BY j.job_name, r.plan_time""")
    # as jsonb: an infinite next_start is no Python datetime
    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r["r"].items() if k not in IDS}
    return USUAL in seen, ([strip(r) for r in claimed], [strip(r) for r in stats], [strip(r) for r in runs])


@settings(max_examples=400 if FUZZ else 40, deadline=None, derandomize=not FUZZ, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(job_strategy, min_size=1, max_size=10),
       workers=st.integers(1, 8), ahead_ms=st.sampled_from([0, 20, 5000]),
       modules=st.sampled_from([[], ["m1"], ["m1", "m2"]]))
def test_the_usual_claim_does_what_the_full_one_does(api_tx: Conn, jobs: list[dict[str, Any]], workers: int,
                                                     ahead_ms: int, modules: list[str]) -> None:
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, jobs)
        usual, lean = claim_and_rows(api_tx, instance, workers, ahead_ms, modules, inert_queue=False)
        full_path, full = claim_and_rows(api_tx, instance, workers, ahead_ms, modules, inert_queue=True)
    assert usual and not full_path
    assert lean == full


def test_a_state_with_claims_takes_the_same_runs_by_both(api_tx: Conn) -> None:
    """Not only empty claims agree: a fixed state where both statements take runs, a conflict
    among them, and the claim order decided by priority."""
    jobs = [{"next": -10, "priority": 0, "jitter_s": 0, "failures": 0, "kind": "proc", "paused": False,
             "after": False, "ran_already": False, "delay_s": 0},
            {"next": -1, "priority": 5, "jitter_s": 0, "failures": 2, "kind": "proc", "paused": False,
             "after": False, "ran_already": False, "delay_s": 3},
            {"next": -5, "priority": 0, "jitter_s": 0, "failures": 0, "kind": "proc", "paused": False,
             "after": False, "ran_already": True, "delay_s": 0},
            {"next": -20, "priority": 0, "jitter_s": 0, "failures": 0, "kind": "python m1", "paused": False,
             "after": False, "ran_already": False, "delay_s": 0},
            {"next": -3, "priority": 0, "jitter_s": 0, "failures": 0, "kind": "proc", "paused": False,
             "after": True, "ran_already": False, "delay_s": 0}]
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, jobs)
        usual, lean = claim_and_rows(api_tx, instance, 3, 0, ["m1"], inert_queue=False)
        full_path, full = claim_and_rows(api_tx, instance, 3, 0, ["m1"], inert_queue=True)
    assert usual and not full_path
    # in claim order (due time less the priority in seconds): the Python job 20 s overdue, job 0 at
    # 10 s, job 1 (1 s, priority 5, and its 3 s delay: its plan is 4 s old) as if 6 s; job 2's plan
    # ran already (a conflict, its next_start cleared), and the workers are taken before the @after
    assert [r["job_name"] for r in lean[0]] == ["claim paths 3", "claim paths 0", "claim paths 1"]
    assert [r["trigger"] for r in lean[2] if r["outcome"] == "running"] == ["schedule", "retry", "schedule"]
    assert lean == full
