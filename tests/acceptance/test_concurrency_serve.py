"""Concurrency limits with real `pgsched serve` instances (issue 14): jobs sharing a key never run
more than its limit at once, across two instances, and the ones held back run later (delayed, not
lost); `pgsched limits` and `pgsched jobs` show the key and the wait."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import datetime

from tests.acceptance.conftest import ServeFactory, query, wait_for
from tests.acceptance.test_ops_cli import cli, execute, ok_json
from tests.acceptance.test_serve import FAST, SETUP_SQL, add_job, running_run, wait_outcome
from tests.integration.test_concurrency import overlap


def test_a_key_limits_runs_across_two_instances_and_held_runs_still_run(db: str, serve: ServeFactory) -> None:
    execute(db, SETUP_SQL)
    execute(db, "SELECT pgsched.set_concurrency_limit('heavy', 1)")
    # Four jobs of 0.3 s every second, on two instances of 2 workers each: each instance alone
    # would start two at once (one per worker); the key holds them to one over both.
    heavy = [add_job(db, "'sleeper', '1 second', config => '{\"s\": 0.3}', concurrency_key => 'heavy'")
             for _ in range(4)]
    free = add_job(db, "'tick', '1 second'")
    for _ in range(2):
        serve(db, *FAST, "--max-workers", "2").wait_log("ready:", 15)

    def enough() -> list[dict[str, object]] | None:
        found = query(db, "SELECT job_id, instance_id, started_at, finished_at FROM pgsched.job_history "
                          "WHERE job_id = ANY(%s) AND outcome = 'success'", (heavy,))
        done = Counter(r["job_id"] for r in found)
        return found if all(done[j] >= 2 for j in heavy) else None

    runs = wait_for(enough, 40, "every heavy job run twice")
    spans = [(r["started_at"], r["finished_at"]) for r in runs]
    assert isinstance(spans[0][0], datetime)
    assert overlap(spans) == 1, sorted(spans)  # type: ignore[arg-type]
    # nothing failed or crashed; the job without a key was never held back (about one run a second)
    assert query(db, "SELECT count(*) AS n FROM pgsched.job_run WHERE outcome NOT IN ('success', 'running', "
                     "'skipped', 'missed')")[0]["n"] == 0
    assert query(db, "SELECT count(*) AS n FROM pgsched.job_run WHERE job_id = %s AND outcome = 'success'",
                 (free,))[0]["n"] >= 3
    # the operator's view: the key, its limit, who waits
    [limit] = ok_json("limits", "--dsn", db)
    assert (limit["concurrency_key"], limit["max_running"], limit["jobs"]) == ("heavy", 1, 4)
    jobs = {j["job_id"]: j for j in ok_json("jobs", "--dsn", db)}
    assert {jobs[j]["concurrency_key"] for j in heavy} == {"heavy"}
    table = cli("limits", "--dsn", db)
    assert table.returncode == 0 and "heavy" in table.stdout, table.stdout + table.stderr


def test_a_key_held_by_a_killed_scheduler_is_freed_when_its_run_is_found_crashed(
        db: str, serve: ServeFactory) -> None:
    """kill -9 of the instance whose run holds the key: the key stays held (the run may still be
    running, for all anyone knows) until the next instance finds the run crashed; then the job
    that waited for the key runs."""
    execute(db, SETUP_SQL)
    holder = add_job(db, "'sleeper', '1 hour', config => '{\"s\": 30}', concurrency_key => 'solo'")
    first = serve(db, "--crash-wait", "60", "--shutdown-timeout", "1")
    run = running_run(db, holder)
    waiter = add_job(db, "'tick', '1 hour', concurrency_key => 'solo'")
    wait_for(lambda: query(db, "SELECT waiting_for FROM pgsched.job_stats WHERE job_id = %s", (waiter,))[0]
             ["waiting_for"] == "concurrency limit of 'solo': 1 of 1 running", 5, "the waiter to wait for the key")
    first.signal(signal.SIGKILL)
    first.wait_exit(5)
    serve(db, "--crash-wait", "60", "--shutdown-timeout", "1")
    assert wait_outcome(db, run["run_id"], 10)["outcome"] == "crash"
    wait_for(lambda: query(db, "SELECT count(*) AS n FROM public.ran WHERE job_id = %s", (waiter,))[0]["n"] == 1,
             10, "the waiter to run once the key is free")
    # the crashed holder waits out --crash-wait; nothing else holds the key once the waiter's run is
    # closed (its effect commits in the job, before the scheduler's close of the run)
    wait_for(lambda: query(db, "SELECT running FROM pgsched.concurrency_limits")[0]["running"] == 0, 5,
             "the waiter's run to be closed")
    assert query(db, "SELECT outcome FROM pgsched.job_run WHERE job_id = %s", (holder,)) == [{"outcome": "crash"}]
