"""Python handlers for the mixed benchmark: 200 trivial jobs, always due (drifting, 1 ms)."""

from __future__ import annotations

import pgsched


def noop(run: pgsched.Run) -> None:
    run.connection.execute("SELECT 1")


for _i in range(200):
    pgsched.job(every="1 millisecond", fixed_schedule=False, name=f"py noop {_i}")(noop)
