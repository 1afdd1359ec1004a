"""Python jobs that run after one another (README "Dependencies"): extract every second, then load
after it (named by its handler), then report after load (named by its job name)."""

from __future__ import annotations

import pgsched


def _hit(run: pgsched.Run) -> None:
    run.connection.execute("INSERT INTO chain_hits VALUES (%s, %s)", (run.job_name, run.plan_time))


@pgsched.job(every="1 second", name="chain.extract")
def extract(run: pgsched.Run) -> None:
    _hit(run)


@pgsched.job(after=["chain.load"], name="chain.report")
def report(run: pgsched.Run) -> None:
    _hit(run)


@pgsched.job(after=[extract], name="chain.load")
def load(run: pgsched.Run) -> None:
    _hit(run)
