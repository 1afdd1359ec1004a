"""Python handlers for the soak (bench/soak.py): every 2 s each, most succeed, some fail.

Each writes an effect row naming its plan in its own transaction (committed with the run), so the
soak can check that no plan ran twice. One in ten raises after its insert (rolled back: a failure).
"""

from __future__ import annotations

import pgsched


def work(run: pgsched.Run) -> None:
    run.connection.execute(
        "INSERT INTO soak.effect (job_id, plan_time, run_id) VALUES (%s, %s, %s)",
        (run.job_id, run.plan_time, run.run_id))
    if run.job_id % 10 == 0:
        raise RuntimeError("a failing Python job (by design: one in ten)")


for _i in range(40):
    pgsched.job(every="2 seconds", name=f"soak py {_i}")(work)
