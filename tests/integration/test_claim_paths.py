"""The claim's two statements (pgsched._claim_v2): the usual one, taken when no keyed job is due
and no scope run is queued, and the full one, must claim the same runs and write the same rows.

Each state is built in a transaction (hypothesis draws the jobs: due or not, priorities, jitter,
counters, retries, Python jobs of a module the claim may or may not take, paused jobs, @after jobs
with a backlog, keyed jobs not yet due, a plan that already ran). The claim runs on it twice, each
time rolled back: as it is (the usual statement) and with one queued scope run of a paused job
added, which no claim takes and which makes the claim take its full statement. What each returned
and every job_stat and job_run_live row must agree (a run's id and lease token by what they point
at). Which statement ran is told by its DEBUG line, so a state that sends both calls down one path
fails the test; other tests check which states take which statement, and what the usual statement
says of queued runs committed after it looked for them (a race with another instance's close).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.helpers import Conn, notices, rows, scalar

T = datetime(2030, 6, 1, 12, 0, 0, tzinfo=UTC)
USUAL = "pgsched claim: no keyed job due, no scope run queued"
# db_now is the clock; ids and tokens move on through a rollback (compared by what they point at)
IDS = {"run_id", "lease_token", "current_run_id", "db_now"}

FUZZ = os.environ.get("PGSCHED_FUZZ") == "1"

job_strategy = st.fixed_dictionaries({
    # seconds from T to next_start (most often a time: due or not); None: unplanned; "inf": never
    "next": st.one_of(st.integers(-30, 30), st.integers(-30, 30), st.integers(-30, 30), st.none(), st.just("inf")),
    "priority": st.sampled_from([-5, 0, 5]),
    "jitter_s": st.sampled_from([0, 10]),
    "failures": st.sampled_from([0, 1, 2]),
    # the counters and last start the claim adds to (crashes: total and consecutive)
    "crashes": st.sampled_from([0, 3]),
    "last_start_s": st.sampled_from([None, -60, 3600]),
    "kind": st.sampled_from(["proc", "proc", "python m1", "python m2"]),
    "paused": st.sampled_from([False, False, False, True]),
    # an @after job with that many plans waiting (0: a job with a schedule)
    "backlog": st.sampled_from([0, 0, 1, 3]),
    "ran_already": st.sampled_from([False, False, False, True]),
    "delay_s": st.sampled_from([0, 0, 3]),
    # keyed jobs are drawn due only past the largest `ahead`: a due one takes the full statement
    "keyed": st.sampled_from([False, False, False, True]),
})


def build(conn: Conn, jobs: list[dict[str, Any]]) -> int:
    """The jobs of one example, and the instance that claims; returns the instance's id."""
    for n, j in enumerate(jobs):
        python = j["kind"].startswith("python")
        after = j["backlog"] > 0
        job_id = int(scalar(conn, """
            INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, code_module, code_function,
                                     schedule, schedule_interval, priority, jitter, schedule_delay, scheduled,
                                     concurrency_key)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, make_interval(secs => %s), make_interval(secs => %s), %s,
                    %s)
            RETURNING job_id""",
            (f"claim paths {n}", "python" if python else "proc", None if python else "public",
             None if python else "ok_fn", j["kind"].split()[1] if python else None, "handler" if python else None,
             "@after" if after else "1 minute", None if after else "1 minute",
             j["priority"], j["jitter_s"], j["delay_s"], not j["paused"], "k1" if j["keyed"] else None)))
        offset = j["next"]
        if j["keyed"] and isinstance(offset, int):
            offset = abs(offset) + 10
        nxt = (None if offset is None else "infinity" if offset == "inf"
               else (T + timedelta(seconds=offset)).isoformat())
        backlog = [(T + timedelta(minutes=k + 1)).isoformat() for k in range(j["backlog"])] \
            if after and isinstance(offset, int) else None
        conn.execute("""UPDATE pgsched.job_stat
                           SET next_start = %s::timestamptz, consecutive_failures = %s, upstream_backlog = %s,
                               total_runs = 5, total_crashes = %s, consecutive_crashes = %s,
                               last_start = %s::timestamptz + make_interval(secs => %s)
                         WHERE job_id = %s""",
                     (nxt, j["failures"], backlog, j["crashes"], j["crashes"], T, j["last_start_s"], job_id))
        if j["ran_already"] and isinstance(offset, int):
            # the plan that next_start stands for has its run already (closed): the claim's conflict
            conn.execute("""INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, started_at, finished_at,
                                                         outcome)
                            VALUES (%s, pgsched._delayed(%s::timestamptz, -make_interval(secs => %s)),
                                    'schedule', %s, %s, 'success')""",
                         (job_id, nxt, j["delay_s"], T, T))
    return int(scalar(conn, "SELECT instance_id FROM pgsched._register_instance_v2('paths', 1, 'test', 8, now => %s)",
                      (T,)))


def add_queued(conn: Conn, name: str, *, scheduled: bool, plan_time: datetime) -> None:
    """A job with one queued scope run of `plan_time` (a claimable one, or a retry for later)."""
    job_id = int(scalar(conn, "INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule, "
                              "schedule_interval, scheduled) VALUES (%s, 'proc', 'public', 'ok_fn', '1 hour', "
                              "'1 hour', %s) RETURNING job_id", (name, scheduled)))
    conn.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + timedelta(hours=1), job_id))
    conn.execute("INSERT INTO pgsched.job_run_live (job_id, scope, plan_time, trigger, outcome) "
                 "VALUES (%s, 'tenant 1', %s, 'schedule', 'queued')", (job_id, plan_time))


def claim(conn: Conn, instance: int, workers: int, ahead_ms: int, modules: list[str],
          function: str = "_claim_v2") -> tuple[bool, list[dict[str, Any]]]:
    """One claim (not rolled back): whether the usual statement ran, and its rows as jsonb."""
    conn.execute("SET LOCAL client_min_messages = debug1")
    with notices(conn) as seen:
        claimed = [r["r"] for r in rows(
            conn, f"SELECT to_jsonb(c) AS r FROM pgsched.{function}(%s, %s, %s, make_interval(secs => %s), %s, "
                  "now => %s) c",
            (instance, list(range(1, workers + 1)), list(range(101, 101 + workers)), ahead_ms / 1000, modules, T))]
    conn.execute("SET LOCAL client_min_messages = notice")
    return USUAL in seen, claimed


def claim_and_rows(conn: Conn, instance: int, workers: int, ahead_ms: int, modules: list[str],
                   inert_queue: bool) -> tuple[bool, Any]:
    """One claim, rolled back: whether the usual statement ran, what it returned and wrote."""
    with conn.transaction(force_rollback=True):
        if inert_queue:
            add_queued(conn, "claim paths paused", scheduled=False, plan_time=T - timedelta(seconds=5))
        usual, claimed = claim(conn, instance, workers, ahead_ms, modules)
        # as jsonb: an infinite next_start is no Python datetime
        stats = [r["r"] for r in rows(conn, """
            SELECT to_jsonb(s) || jsonb_build_object('current_run', (SELECT jsonb_build_array(r.job_id, r.plan_time)
                                                                       FROM pgsched.job_run_live r
                                                                      WHERE r.run_id = s.current_run_id)) AS r
              FROM pgsched.job_stat s JOIN pgsched.job j USING (job_id)
             WHERE j.job_name LIKE 'claim paths %' AND j.job_name <> 'claim paths paused'
             ORDER BY j.job_name""")]
        runs = [r["r"] for r in rows(conn, """
            SELECT to_jsonb(r) || jsonb_build_object('job_name', j.job_name) AS r
              FROM pgsched.job_run_live r JOIN pgsched.job j USING (job_id)
             WHERE j.job_name LIKE 'claim paths %' AND j.job_name <> 'claim paths paused'
             ORDER BY j.job_name, r.plan_time""")]
    # A claimed row's run id and lease token are those of the running row it wrote.
    by_id = {r["run_id"]: r for r in runs}
    for c in claimed:
        run = by_id[c["run_id"]]
        assert (run["job_id"], run["plan_time"], run["lease_token"], run["outcome"]) == \
            (c["job_id"], c["plan_time"], c["lease_token"], "running")
    tokens = [c["lease_token"] for c in claimed]
    assert all(t is not None and t > 0 for t in tokens) and len(set(tokens)) == len(tokens)

    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k not in IDS}
    return usual, ([strip(r) for r in claimed], [strip(r) for r in stats], [strip(r) for r in runs])


@settings(max_examples=400 if FUZZ else 60, deadline=None, derandomize=not FUZZ, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(jobs=st.lists(job_strategy, min_size=1, max_size=12),
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


def fixed_job(**more: Any) -> dict[str, Any]:
    return {"next": -10, "priority": 0, "jitter_s": 0, "failures": 0, "crashes": 0, "last_start_s": None,
            "kind": "proc", "paused": False, "backlog": 0, "ran_already": False, "delay_s": 0, "keyed": False,
            **more}


def test_a_state_with_claims_takes_the_same_runs_by_both(api_tx: Conn) -> None:
    """Not only empty claims agree: a fixed state where both statements take runs, a conflict
    among them, a retry, and the claim order decided by priority, against values written out."""
    jobs = [fixed_job(),
            fixed_job(next=-1, priority=5, failures=1, crashes=3, last_start_s=3600, delay_s=3),
            fixed_job(next=-5, ran_already=True),
            fixed_job(next=-20, kind="python m1"),
            fixed_job(next=-3, backlog=3),
            fixed_job(next=20, keyed=True)]
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, jobs)
        usual, lean = claim_and_rows(api_tx, instance, 4, 0, ["m1"], inert_queue=False)
        full_path, full = claim_and_rows(api_tx, instance, 4, 0, ["m1"], inert_queue=True)
    assert usual and not full_path
    assert lean == full
    claimed, stats, runs = lean
    # In claim order (due time less the priority in seconds): the Python job 20 s overdue, job 0 at
    # 10 s, job 1 (1 s, priority 5, and its 3 s delay: its plan is 4 s old) as if 6 s; job 2's plan
    # ran already (a conflict: taken by the fourth worker, no run, its next_start cleared); the @after
    # job, 3 s overdue, is left for the next claim.
    assert [r["job_name"] for r in claimed] == ["claim paths 3", "claim paths 0", "claim paths 1"]
    assert [r["trigger"] for r in runs if r["outcome"] == "running"] == ["schedule", "retry", "schedule"]
    one = stats[1]
    assert (one["state"], one["total_runs"], one["total_crashes"], one["consecutive_crashes"]) == \
        ("starting", 6, 4, 4)
    assert one["last_start"] == "2030-06-01T13:00:00+00:00"  # the later of the two
    assert (stats[2]["next_start"], stats[2]["state"]) == (None, "scheduled")
    # the next claim is due for the @after job left (the keyed job is due in 30 s)
    assert {r["next_due"] for r in claimed} == {"2030-06-01T11:59:57+00:00"}


def test_a_conflict_of_an_after_job_and_a_keyed_job_next(api_tx: Conn) -> None:
    """More fixed states: an @after job whose pending plan ran already takes the next plan of its
    backlog (delayed as its schedule says), and a keyed job not yet due is when the next claim is
    due, by both statements (a Python job of a module not served is not)."""
    jobs = [fixed_job(next=-8, backlog=3, ran_already=True, delay_s=3), fixed_job(next=-2),
            fixed_job(next=12, keyed=True), fixed_job(next=5, kind="python m2")]
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, jobs)
        usual, lean = claim_and_rows(api_tx, instance, 4, 0, [], inert_queue=False)
        full_path, full = claim_and_rows(api_tx, instance, 4, 0, [], inert_queue=True)
    assert usual and not full_path
    assert lean == full
    claimed, stats, _ = lean
    assert [r["job_name"] for r in claimed] == ["claim paths 1"]
    # the backlog's first plan (12:01), 3 s later as the job's delay says; the other two wait
    assert stats[0]["next_start"] == "2030-06-01T12:01:03+00:00"
    assert stats[0]["upstream_backlog"] == ["2030-06-01T12:02:00+00:00", "2030-06-01T12:03:00+00:00"]
    # the keyed job (12 s, drawn + 10 s); not the Python job at 5 s, whose module is not served here
    assert {r["next_due"] for r in claimed} == {"2030-06-01T12:00:22+00:00"}


@pytest.mark.parametrize(("state", "usual"), [
    ("nothing keyed or queued", True),
    ("a keyed job due later than ahead", True),
    ("a keyed job due within ahead", False),
    ("a claimable scope run", False),
    ("a scope run's retry for later", False),
    # a paused job's queued runs take the full statement too (README: the usual claim)
    ("a paused job's queued scope run", False),
])
def test_which_states_take_the_usual_statement(api_tx: Conn, state: str, usual: bool) -> None:
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, [fixed_job(next=-1)])
        if "keyed" in state:
            api_tx.execute("""INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule,
                                                       schedule_interval, concurrency_key)
                              VALUES ('keyed', 'proc', 'public', 'ok_fn', '1 hour', '1 hour', 'k1')""")
            api_tx.execute("UPDATE pgsched.job_stat s SET next_start = %s FROM pgsched.job j "
                           "WHERE j.job_id = s.job_id AND j.job_name = 'keyed'",
                           (T + timedelta(seconds=3 if "within" in state else 30),))
        if state == "a claimable scope run":
            add_queued(api_tx, "queued", scheduled=True, plan_time=T - timedelta(seconds=1))
        if state == "a scope run's retry for later":
            add_queued(api_tx, "queued", scheduled=True, plan_time=T + timedelta(seconds=7))
        if state == "a paused job's queued scope run":
            add_queued(api_tx, "queued", scheduled=False, plan_time=T - timedelta(seconds=1))
        took_usual, claimed = claim(api_tx, instance, 4, 5000, [])
    assert took_usual is usual
    assert [c["job_name"] for c in claimed][:1] == ["claim paths 0"]


def claim_that_looked_too_early(api_tx: Conn, name: str, look: str, seen: str) -> None:
    """A copy of the claim, `name`, whose look `look` sees `seen`: as if what it looks for were
    committed by another instance between that look and the statement that follows it."""
    definition = str(scalar(api_tx, "SELECT pg_get_functiondef('pgsched._claim_v2(bigint, integer[], integer[], "
                                    "interval, text[], timestamptz)'::regprocedure)"))
    assert definition.count(look) == 1
    api_tx.execute(definition.replace("pgsched._claim_v2(", f"pgsched.{name}(", 1)
                   .replace(look, seen).replace("_claim_v2.", f"{name}."))


def test_queued_runs_committed_after_the_look_are_not_slept_past(api_tx: Conn) -> None:
    """The usual statement reads `queued` a statement before it runs: another instance's close may
    commit queued scope runs in between. Run as if it had (a copy of the claim that never sees a
    queued run first), the usual statement still says when they are due: now for a claimable one
    (the next claim takes the full statement), a retry's plan time for a later one."""
    claim_that_looked_too_early(
        api_tx, "_claim_late_queue",
        "queued := EXISTS (SELECT 1 FROM pgsched.job_run_live q WHERE q.outcome = 'queued');", "queued := false;")
    for plan, due in [(T - timedelta(seconds=1), T), (T + timedelta(seconds=7), T + timedelta(seconds=7))]:
        with api_tx.transaction(force_rollback=True):
            instance = build(api_tx, [fixed_job(next=-1)])
            add_queued(api_tx, "queued", scheduled=True, plan_time=plan)
            took_usual, claimed = claim(api_tx, instance, 4, 0, [], function="_claim_late_queue")
            assert took_usual
            assert [c["job_name"] for c in claimed] == ["claim paths 0"]
            assert claimed[0]["next_due"] == due.isoformat()[:19] + "+00:00"


def test_a_keyed_job_due_after_the_look_is_left_to_the_full_statement(api_tx: Conn) -> None:
    """A keyed job may fall due (or be made due by another session) between the look for keyed jobs
    and the usual statement: it is not claimed there, without the claims' lock and its key's count
    (25_concurrency.sql), but said due, so that the next claim, the full statement, takes it."""
    claim_that_looked_too_early(api_tx, "_claim_late_key", "keyed := EXISTS (", "keyed := false AND EXISTS (")
    with api_tx.transaction(force_rollback=True):
        instance = build(api_tx, [fixed_job(next=-1)])
        api_tx.execute("""INSERT INTO pgsched.job (job_name, kind, proc_schema, proc_name, schedule,
                                                   schedule_interval, concurrency_key)
                          VALUES ('keyed', 'proc', 'public', 'ok_fn', '1 hour', '1 hour', 'k1')""")
        api_tx.execute("UPDATE pgsched.job_stat s SET next_start = %s FROM pgsched.job j "
                       "WHERE j.job_id = s.job_id AND j.job_name = 'keyed'", (T - timedelta(seconds=5),))
        took_usual, claimed = claim(api_tx, instance, 4, 0, [], function="_claim_late_key")
        assert took_usual
        assert [c["job_name"] for c in claimed] == ["claim paths 0"]
        assert claimed[0]["next_due"] == "2030-06-01T11:59:55+00:00"
        took_usual, claimed = claim(api_tx, instance, 4, 0, [])
        assert not took_usual
        assert [c["job_name"] for c in claimed] == ["keyed"]


def test_the_claim_and_the_close_plan_their_statements_once(api_tx: Conn) -> None:
    """The claim and the close (and what the close calls, which inherits the setting) run on
    generic plans from their first call: left to choose, a session planned each statement five
    times first, on the chain of a new scheduler's first burst (README, "Generic plans from the
    first call")."""
    settings_of = {r["proname"]: r["proconfig"] for r in rows(
        api_tx, "SELECT p.proname, p.proconfig FROM pg_proc p WHERE p.pronamespace = 'pgsched'::regnamespace "
                "AND p.proname IN ('_claim_v2', '_close_runs')")}
    assert set(settings_of) == {"_claim_v2", "_close_runs"}
    for name, config in settings_of.items():
        assert "plan_cache_mode=force_generic_plan" in config, (name, config)
