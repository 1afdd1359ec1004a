"""Dependencies with real `pgsched serve` instances (issue 14): on two instances, every success of an
upstream gives each of its dependents exactly one run with the upstream's plan time (fan-out and a
chain), fan-in waits for all of its upstreams, a scheduled dependent skips the plans its upstream
has not succeeded for; Python jobs declared with @pgsched.job(after=...) run in order."""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

from tests.acceptance.conftest import ServeFactory, query, wait_for
from tests.acceptance.test_ops_cli import execute, ok_json
from tests.acceptance.test_serve import FAST, SETUP_SQL, add_job, running_run, wait_outcome


def runs(db: str, job_id: int, outcome: str | None = None) -> list[dict[str, Any]]:
    return query(db, "SELECT plan_time, outcome, trigger, message FROM pgsched.job_history WHERE job_id = %s"
                     " AND (%s::text IS NULL OR outcome = %s) ORDER BY plan_time", (job_id, outcome, outcome))


def test_each_upstream_success_runs_each_dependent_once_across_two_instances(db: str, serve: ServeFactory) -> None:
    execute(db, SETUP_SQL)
    a = add_job(db, "'tick', '1 second', job_name => 'a'")
    b = add_job(db, "'tick', '2 seconds', job_name => 'b'")
    c = add_job(db, "'tick', NULL, depends_on => '{a}'")
    d = add_job(db, "'tick', NULL, depends_on => '{a}'")
    e = add_job(db, "'tick', NULL, depends_on => %s", ([str(c), str(d)],))
    f = add_job(db, "'tick', NULL, depends_on => '{a,b}'")
    g = add_job(db, "'tick', '1 second', depends_on => '{b}'")
    instances = [serve(db, *FAST, "--max-workers", "2") for _ in range(2)]
    for s in instances:
        s.wait_log("ready:", 15)
    wait_for(lambda: (len(runs(db, a, "success")) >= 6 and len(runs(db, e, "success")) >= 3) or None, 40,
             "six runs of a and three of the chain's end")
    for s in instances:
        s.signal(signal.SIGTERM)
    for s in instances:
        s.wait_exit(10)
    a_ok = {r["plan_time"] for r in runs(db, a, "success")}
    b_ok = {r["plan_time"] for r in runs(db, b, "success")}
    # fan-out: each success of a gave c and d one run each, with a's plan time (a plan given and not
    # yet started when the instances stopped counts: it is there, once)
    for dep in (c, d):
        given = [r["plan_time"] for r in query(db, "SELECT plan_time FROM pgsched._upstream_plans WHERE job_id = %s",
                                               (dep,))]
        assert len(given) <= 2, (dep, given)  # the plans drain: at most one pending and one behind it
        planned = [r["plan_time"] for r in runs(db, dep)] + given
        assert Counter(planned) == Counter(a_ok), dep
        assert {r["trigger"] for r in runs(db, dep)} == {"upstream"}
    # nothing failed or crashed
    assert query(db, "SELECT count(*) AS n FROM pgsched.job_run WHERE outcome IN ('failure', 'crash', 'timeout')"
                     )[0]["n"] == 0
    # the chain's end sees its upstreams' plan times, each at most once, no more often than both ran
    e_plans = [r["plan_time"] for r in runs(db, e)]
    c_ok = {r["plan_time"] for r in runs(db, c, "success")}
    d_ok = {r["plan_time"] for r in runs(db, d, "success")}
    assert len(e_plans) == len(set(e_plans)) and set(e_plans) <= a_ok
    assert len(e_plans) <= min(len(c_ok), len(d_ok))
    # fan-in: after a and b both succeeded; never more often than the slower one
    f_plans = [r["plan_time"] for r in runs(db, f)]
    assert 1 <= len(f_plans) <= len(b_ok) and set(f_plans) <= a_ok | b_ok
    # a scheduled dependent: a plan runs only when b succeeded since the previous one, others are skipped
    g_runs = runs(db, g)
    g_ok = [r for r in g_runs if r["outcome"] == "success"]
    skipped = [r for r in g_runs if r["outcome"] == "skipped"]
    assert 1 <= len(g_ok) <= len(b_ok)
    # (a run that outlasted g's next slot on a loaded machine records that slot as skipped too)
    assert skipped and all("upstream job(s) not succeeded" in r["message"] or "was still in progress" in r["message"]
                           for r in skipped)
    assert any("upstream job(s) not succeeded" in r["message"] for r in skipped)
    # the operator's view
    jobs = {j["job_id"]: j for j in ok_json("jobs", "--dsn", db)}
    assert (jobs[e]["schedule"], jobs[e]["depends_on"]) == ("@after", sorted([c, d]))
    assert jobs[a]["depends_on"] is None


def test_python_jobs_run_after_the_jobs_they_name(db: str, serve: ServeFactory) -> None:
    execute(db, "CREATE TABLE chain_hits (job_name text, plan_time timestamptz)")
    s = serve(db, *FAST, "--app", "tests.apps.chain_jobs")
    s.wait_log("ready:", 15)

    def hits() -> list[dict[str, Any]] | None:
        found = query(db, "SELECT job_name, plan_time FROM chain_hits ORDER BY plan_time, job_name")
        return found if sum(h["job_name"] == "chain.report" for h in found) >= 2 else None

    found = wait_for(hits, 30, "two runs of chain.report")
    by_plan: dict[Any, set[str]] = {}
    for h in found:
        by_plan.setdefault(h["plan_time"], set()).add(h["job_name"])
    reported = [p for p, names in by_plan.items() if "chain.report" in names]
    assert all(by_plan[p] == {"chain.extract", "chain.load", "chain.report"} for p in reported)
    jobs = {r["job_name"]: r for r in query(db, "SELECT job_name, schedule, depends_on FROM pgsched.jobs")}
    assert jobs["chain.load"]["schedule"] == "@after"
    assert query(db, "SELECT job_name FROM pgsched.jobs WHERE job_id = %s",
                 (jobs["chain.report"]["depends_on"][0],))[0]["job_name"] == "chain.load"


def test_a_dependent_run_killed_with_its_instance_is_a_crash_and_the_next_success_runs_it(
        db: str, serve: ServeFactory) -> None:
    """kill -9 of the instance running a dependent's run: the next instance records the crash (the
    run is not started again: an @after job does not retry), and the upstream's next success gives
    the dependent its next run, with that success's plan time."""
    execute(db, SETUP_SQL)
    up = add_job(db, "'tick', '1 hour', initial_start => '2100-01-01'")
    down = add_job(db, "'sleeper', NULL, config => '{\"s\": 30}', depends_on => %s", ([str(up)],))
    first = serve(db, *FAST)
    execute(db, f"SELECT FROM pgsched.alter_job({up}, next_start => now())")
    run = running_run(db, down)
    first.signal(signal.SIGKILL)
    first.wait_exit(5)
    serve(db, *FAST)
    assert wait_outcome(db, run["run_id"], 15)["outcome"] == "crash"
    execute(db, f"SELECT FROM pgsched.alter_job({down}, config => '{{\"s\": 0}}')")
    execute(db, f"SELECT FROM pgsched.alter_job({up}, next_start => now())")
    wait_for(lambda: len(runs(db, down, "success")) == 1 or None, 15, "the dependent's next run")
    ups = [r["plan_time"] for r in runs(db, up, "success")]
    assert [(r["plan_time"], r["outcome"]) for r in runs(db, down)] == [(ups[0], "crash"), (ups[1], "success")]


def test_a_scheduled_dependent_retries_the_plan_its_upstream_succeeded_for(db: str, serve: ServeFactory) -> None:
    """The gate is the plan's, not each attempt's: a retry of a plan that took its upstream's success
    runs (it is not skipped for want of a second success)."""
    execute(db, SETUP_SQL)
    # a sequence: a failed run's own writes are rolled back, nextval is not
    execute(db, """CREATE SEQUENCE public.tries;
                   CREATE PROCEDURE public.flaky(job_id integer, config jsonb) LANGUAGE plpgsql AS $$
                   BEGIN
                       IF nextval('public.tries') = 1 THEN
                           RAISE EXCEPTION 'first try fails';
                       END IF;
                   END $$""")
    up = add_job(db, "'tick', '1 hour', initial_start => '2100-01-01'")
    down = add_job(db, "'flaky', '1 hour', initial_start => '2100-01-01', retry_period => '1 second', "
                       "depends_on => %s", ([str(up)],))
    serve(db, *FAST)
    execute(db, f"SELECT FROM pgsched.alter_job({up}, next_start => now())")
    wait_for(lambda: len(runs(db, up, "success")) == 1 or None, 10, "the upstream's run")
    execute(db, f"SELECT FROM pgsched.alter_job({down}, next_start => now())")
    wait_for(lambda: len(runs(db, down, "success")) == 1 or None, 15, "the dependent's retry to succeed")
    history = query(db, "SELECT trigger, outcome FROM pgsched.job_history WHERE job_id = %s ORDER BY run_id", (down,))
    assert [(h["trigger"], h["outcome"]) for h in history] == [("schedule", "failure"), ("retry", "success")]
