"""The one rule of a failing job (pgsched/ops/query.py FAILING): `pgsched jobs --failing` and the
dashboard's problems list the same jobs, and a job is not failing just because a run is in progress
(crash accounting counts that run as a crash from its start until it ends)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from pgsched.ops import dashboard, query
from tests.integration.helpers import Conn, add_job, scalar


def start(api: Conn, job_id: int) -> int:
    return int(scalar(api, "SELECT pgsched._mark_start(%s, now(), 'schedule')", (job_id,)))


def test_failing_jobs_by_one_rule_and_not_a_run_in_progress(api: Conn, db: str) -> None:
    ok, bad, running, crashed, running_after_crash, paused = (add_job(api, f"'{fn}', '1 hour'") for fn in (
        "ok_fn", "bad_fn", "ok_fn", "ok_fn", "ok_fn", "ok_fn"))
    api.execute("CALL pgsched.run_job(%s)", (ok,))
    with pytest.raises(psycopg.errors.DivisionByZero):  # run_job records the failure, then raises it
        api.execute("CALL pgsched.run_job(%s)", (bad,))
    api.execute("SET pgsched.internal = on")
    start(api, running)
    for job in (crashed, running_after_crash):
        # What the abandoned-run check writes for a run whose scheduler died.
        api.execute("SELECT pgsched._mark_end_v2(%s, 'crash', NULL, 'scheduler died', NULL)", (start(api, job),))
    start(api, running_after_crash)
    api.execute("RESET pgsched.internal")
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (paused,))
    counters = {r[0]: r[1:] for r in api.execute(
        "SELECT job_id, consecutive_failures, consecutive_crashes, current_run_id IS NOT NULL FROM pgsched.job_stats")}
    assert counters[bad][0] == 1
    assert counters[running] == (0, 1, True)
    assert counters[crashed] == (0, 1, False)
    assert counters[running_after_crash] == (0, 2, True)

    with psycopg.connect(db, autocommit=True, row_factory=dict_row) as reader:
        assert [r["job_id"] for r in query.jobs(reader, failing=True)] == [bad, crashed, running_after_crash]
        assert {r["job_id"] for r in dashboard.problems(reader)} == {bad, crashed, running_after_crash, paused}


def test_a_next_start_written_by_hand_beyond_any_date_does_not_fail_the_listings(api: Conn, db: str) -> None:
    """alter_job refuses 'infinity' and years past 9999, but a superuser's UPDATE can still write them
    (the scheduler then disables that job): `pgsched jobs`, `next` and `status` still read the rest."""
    from click.testing import CliRunner

    from pgsched.commands import main

    jobs = [add_job(api, "'ok_fn', '1 hour'") for _ in range(3)]
    api.execute("SET pgsched.internal = on")
    for job, when in zip(jobs, ("infinity", "-infinity", "294276-12-31 00:00+00"), strict=True):
        api.execute("UPDATE pgsched.job_stat SET next_start = %s::timestamptz WHERE job_id = %s", (when, job))
    api.execute("RESET pgsched.internal")
    with query.connect(db) as conn:
        listed = {r["job_id"]: r["next_start"] for r in query.jobs(conn)}
    assert {listed[j].year for j in jobs} == {9999, 1}
    runner = CliRunner()
    for args in (["jobs"], ["jobs", "--json"]):
        result = runner.invoke(main, [*args, "--dsn", db])
        assert result.exit_code == 0 and "Error" not in result.output, (args, result.output)
    # That job's own next starts cannot be computed: said, about JOB
    result = runner.invoke(main, ["next", str(jobs[0]), "--dsn", db])
    assert result.exit_code == 2 and "Invalid value for JOB" in result.output, result.output
    # No scheduler runs here (exit 2 for that), but the database was read, not "unreachable"
    status = runner.invoke(main, ["status", "--dsn", db])
    assert "out of range" not in status.output and "too large" not in status.output, status.output
    assert "no live scheduler instance" in status.output and "failing jobs" in status.output, status.output
