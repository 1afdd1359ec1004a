"""Exclusion windows with a real `pgsched serve` (issue 14): a plan in an excluded minute is not
run but recorded as skipped with the reason, the job is planned past the window in one step,
and removing the window lets it run again at once."""

from __future__ import annotations

import json
import math
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from tests.acceptance.conftest import PGSCHED, ServeFactory, query, wait_for

FAST = ("--shutdown-timeout", "1", "--crash-wait", "1")


def test_plans_in_the_window_are_skipped_with_the_reason_and_the_job_runs_after_it(
        db: str, serve: ServeFactory, tmp_path: Path) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("CREATE TABLE public.ran (at timestamptz DEFAULT clock_timestamp())")
        now = c.execute("SELECT now() AS t").fetchone()
        assert now is not None
        m = now[0].astimezone(UTC).minute
        # This minute and the two after it, in UTC: at least two minutes of window ahead.
        window = f"{m},{(m + 1) % 60},{(m + 2) % 60} * * * *"
        row = c.execute("SELECT pgsched.schedule('windowed', '1 second', 'INSERT INTO public.ran DEFAULT VALUES')"
                        ).fetchone()
        assert row is not None
        job = int(row[0])
        # Its first plan a few seconds ahead, once the instance is ready: on time, so no catch-up
        # decision (which counts plans missed while no scheduler ran) comes first.
        c.execute("SELECT pgsched.alter_job(%s, timezone => 'UTC', exclude => %s, "
                  "initial_start => now() + interval '4 seconds')", (job, window))
    # `pgsched next` leaves the window out, as the scheduler will.
    shown = subprocess.run([str(PGSCHED), "next", "windowed", "--dsn", db, "-n", "2", "--json"], capture_output=True,
                           text=True, timeout=30, check=True)
    first_shown = datetime.fromisoformat(json.loads(shown.stdout)[0])
    assert first_shown.astimezone(UTC).minute not in (m, (m + 1) % 60, (m + 2) % 60), first_shown

    # Only the alter's NOTIFY may wake the scheduler for the removed window in time (below): its
    # heartbeat, which reads the next due time too, and its safety re-read are 30 s apart.
    conf = tmp_path / "slow-heartbeat.toml"
    conf.write_text("heartbeat_interval = 30\ndead_after = 90\n")
    s = serve(db, "--config", str(conf), *FAST)
    s.wait_log("ready:", 15)

    skipped = wait_for(lambda: query(db, "SELECT * FROM pgsched.job_history WHERE job_id = %s "
                                         "AND outcome <> 'running'", (job,)) or None,
                       15, "the first plan's history row, closed")
    [row_] = skipped
    assert row_["outcome"] == "skipped", skipped
    assert f"plan in an excluded minute (exclude '{window}')" in row_["message"], row_["message"]
    assert "later plan(s) up to" in row_["message"], row_["message"]
    end_of_window = (row_["plan_time"].astimezone(UTC).replace(second=0, microsecond=0)
                     + timedelta(minutes=1))
    while end_of_window.minute in (m, (m + 1) % 60, (m + 2) % 60):
        end_of_window += timedelta(minutes=1)
    st = query(db, "SELECT state, next_start, total_runs, total_skipped, total_crashes FROM pgsched.job_stats "
                   "WHERE job_id = %s", (job,))[0]
    # One step to the first plan after the window (plans keep the job's grid of whole seconds from
    # its creation); every plan in between counted, none claimed.
    slots = math.ceil((end_of_window - row_["plan_time"]).total_seconds())
    assert st["next_start"] == row_["plan_time"] + timedelta(seconds=slots) == first_shown, (st, row_)
    assert (st["state"], st["total_runs"], st["total_crashes"], st["total_skipped"]) == \
        ("scheduled", 0, 0, slots), (st, row_)
    assert query(db, "SELECT count(*) AS n FROM public.ran")[0]["n"] == 0
    assert len(query(db, "SELECT 1 FROM pgsched.job_run WHERE job_id = %s", (job,))) == 1

    # Without the window it runs at once (the job is replanned).
    query(db, "SELECT job_id FROM pgsched.alter_job(%s, exclude => '')", (job,))
    altered = query(db, "SELECT clock_timestamp() AS t")[0]["t"]  # after the alter's commit
    wait_for(lambda: query(db, "SELECT count(*) AS n FROM public.ran")[0]["n"] >= 2 or None, 10,
             "runs once the window is removed")
    runs = query(db, "SELECT outcome, plan_time, started_at FROM pgsched.job_run WHERE job_id = %s", (job,))
    assert {r["outcome"] for r in runs} <= {"skipped", "success", "running"}, runs
    # At once: the next plan on its 1 s grid, woken by the NOTIFY (the heartbeat would be 30 s late).
    first = min(r["started_at"] for r in runs if r["outcome"] != "skipped")
    assert first - altered < timedelta(seconds=1.5), (altered, runs)
    # Replanned: it ran in what was the window, not from its end on.
    assert min(r["plan_time"] for r in runs if r["outcome"] == "success") < end_of_window, runs
