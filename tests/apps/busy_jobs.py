"""A Python job that keeps its worker busy, for the saturated-peer failover test: only an instance
started with `--app tests.apps.busy_jobs` can run it, so the test decides which instance is saturated."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pgsched


@pgsched.job(every="1 hour", initial_start=datetime(2100, 1, 1, tzinfo=UTC), config={"s": 8}, name="busy.sleep")
def sleep(run: pgsched.Run) -> None:
    time.sleep(float(run.config["s"]))
