"""Python jobs that misbehave at the edges of the run contract (tests/integration/test_code_job_edges.py).

Each records what it did in `py_hits` (job, plan_time, attempt, config) unless the test says otherwise,
so that a test can tell committed work from work rolled back. Their first start is far away: the
tests run them through a worker's run_one, through `pgsched run` (pyjob.run_now) or trigger them.
"""

from __future__ import annotations

import pgsched
from tests.apps.demo_jobs import FAR

MODULE = __name__


def _hit(run: pgsched.Run) -> None:
    run.connection.execute("INSERT INTO py_hits VALUES (%s, %s, %s, NULL)", (run.job_name, run.plan_time, run.attempt))


# -- an exception that cannot say what it is -------------------------------------------------------

class Unspeakable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception's __str__ raises")


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.unspeakable")
def unspeakable(run: pgsched.Run) -> None:
    _hit(run)
    raise Unspeakable()
