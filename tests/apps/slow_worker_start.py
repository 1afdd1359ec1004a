"""An app module that declares no job and makes each worker 1 s slow to start: a worker imports
the app modules after it connects and before it says it is ready, so a scheduler started with
`--app tests.apps.slow_worker_start` has no idle worker for its first second (the catch-up test in
tests/acceptance/test_catch_up_start.py). The scheduler, which imports it too, is not slowed."""

from __future__ import annotations

import os
import time

START_DELAY_S = 1.0

if os.environ.get("PGSCHED_WORKER_DSN"):
    time.sleep(START_DELAY_S)
