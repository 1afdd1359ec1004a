"""An app module that declares no job and makes each process that imports it 1.5 s slow to exit:
a scheduler started with `--app tests.apps.slow_exit` takes that long to reap its idle workers when
it stops (the graceful hand-over test in tests/acceptance/test_failover_speed.py)."""

from __future__ import annotations

import atexit
import time

EXIT_DELAY_S = 1.5

atexit.register(time.sleep, EXIT_DELAY_S)
