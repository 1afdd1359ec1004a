"""Named crash points for tests.

`crashpoint("after_mark_start")` does nothing unless the environment variable
PGSCHED_CRASHPOINT names that point, in which case the process kills itself with
SIGKILL right there, so a test can stop the scheduler at an exact line.
"""

from __future__ import annotations

import os
import signal


def crashpoint(name: str) -> None:
    if os.environ.get("PGSCHED_CRASHPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
