"""The scheduler's in-memory state, shared by its parts (pgsched.dispatch, pgsched.recovery, pgsched.scheduler).

Only runs in hand are held here (running, or ended with the end not yet written); the
catalog stays the source of truth. Losing the database connection is handled here too,
because every part may find it lost.
"""

from __future__ import annotations

import contextlib
import logging
import random
import selectors
import socket
import time
from collections.abc import Callable
from datetime import datetime

from pgsched.clock import Clock, DbClock
from pgsched.errors import first_line
from pgsched.launcher import Worker
from pgsched.logs import HeldRecords
from pgsched.metrics import LoopMetrics
from pgsched.model import Run
from pgsched.retention import Purger
from pgsched.sdnotify import Notifier
from pgsched.settings import Settings
from pgsched.store import Finish, Store

log = logging.getLogger("pgsched.scheduler")


class LoopState:
    """What the scheduler holds between rounds; every part of it reads and writes this."""

    def __init__(self, settings: Settings, *, clock: Clock | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.clock = clock or DbClock()
        self.rng = rng or random.Random()
        self.store: Store | None = None
        self.instance_id: int | None = None
        self._purger = Purger(settings.dsn, settings.purge_interval)
        self.workers: dict[int, Worker] = {}
        self.runs: dict[int, Run] = {}
        self.pending: list[Finish] = []  # runs that ended, to close (dispatch: _flush)
        self._pending_since: float | None = None  # when the oldest of them was first held back
        self.next_due: datetime | None = None
        self.dirty = True
        self.stopping = False
        self._peers_woken = False  # told the other instances that this one is stopping
        self.stop_deadline: float | None = None
        self.reload_requested = False
        self.reloader: Callable[[], Settings] | None = None
        self.standby = False
        self.started_mono = time.monotonic()
        self.runs_started = 0
        self.metrics: LoopMetrics | None = None  # serve --http only (pgsched/metrics.py)
        self.held_records = HeldRecords(log)  # run start and end records (dispatch), written when it waits
        self.sd = Notifier.from_env()  # under systemd Type=notify only (pgsched/sdnotify.py)
        self._announced_ready = False
        self.runs_ended = 0
        self._statements_done = 0  # by connections already closed
        # trigger_job requests not started yet (pgsched.requests): request_id -> (job_id, plan_time,
        # give up at (monotonic))
        self._triggers: dict[int, tuple[int, datetime, float]] = {}
        self._orphans: list[str] = []  # application_names of runs whose backends are still to terminate
        self._hold_claims_until = 0.0
        self._flush_at = 0.0  # after a close the database refused: when to try again
        self._spawn_failures = 0
        self._spawn_at = 0.0
        self._safety_at = 0.0
        self._catch_up_due = True
        self._heartbeat_at = 0.0
        self._reconnect_at = 0.0
        self._reconnect_delay = 0.2
        self._selector = selectors.DefaultSelector()
        self._db_fd = -1  # the store's socket as registered in the selector
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def _lost_connection(self, e: Exception) -> None:
        log.warning("lost the database connection: %s", first_line(e))
        if self.store is not None:
            self._statements_done += self.store.statements
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self._db_fd)
            self._db_fd = -1
            with contextlib.suppress(Exception):
                self.store.close()
        self.store = None
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        delay = self._reconnect_delay * self.rng.uniform(0.8, 1.2)
        self._reconnect_at = time.monotonic() + delay
        self._reconnect_delay = min(self._reconnect_delay * 2, self.settings.reconnect_max)
