"""pgsched_runs_total counts every close this scheduler writes, as job_history records it: also a
claimed run of a job that cannot run at all (its proc dropped: a failure, the job disabled), which
no worker ran (review of 2026-11-29: it counted none of those)."""

from __future__ import annotations

from pgsched.scheduler import Scheduler
from tests.integration.test_http import serving, wait
from tests.integration.test_scheduler import Conn, one


def test_a_run_of_a_job_that_cannot_run_is_counted_as_job_history_records_it(db: str, jobs: Conn) -> None:
    jobs.execute("CREATE FUNCTION public.gone(job_id int, config jsonb) RETURNS void LANGUAGE sql AS 'SELECT'")
    job = one(jobs, "SELECT add_job('public.gone', '1 hour', initial_start => now() + interval '1 second')")
    jobs.execute("DROP FUNCTION public.gone(int, jsonb)")
    for served in serving(db):
        sched: Scheduler = served.sched

        def closed(sched: Scheduler = sched) -> bool:
            return one(jobs, "SELECT state FROM job_stats WHERE job_id = %s", job) == "disabled" and not sched.pending

        wait(closed)
        recorded = one(jobs, "SELECT count(*) FROM job_history WHERE job_id = %s AND outcome = 'failure'", job)
        s = served.samples()
        assert recorded == 1
        assert s[("pgsched_runs_total", (("outcome", "failure"),))] == recorded
        assert s[("pgsched_runs_total", (("outcome", "skipped"),))] == 0  # exported before the first
        assert s[("pgsched_run_duration_seconds_count", ())] == 0  # it did not run
