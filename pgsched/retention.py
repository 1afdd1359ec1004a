"""The history purge each scheduler instance takes its turn at (README "History and retention").

Every `purge_interval` seconds an instance asks the database whether it is its turn
(pgsched._purge_turn: the first to ask once the interval has passed since the last turn, over
every instance), and if so takes the steps that keep job_run's time partitions in step with the
policy (pgsched._history_steps: drop the ones past, make the ones ahead; a transaction each, none
waiting long for its lock), then deletes the rows left in job_run_live that are past their
retention with pgsched.purge_history in batches of `BATCH` runs, one transaction each, until a
batch comes back short. Steps left because a lock was busy are tried again after `BUSY_RETRY`
seconds, doubled each time, up to the interval. It does so on a thread and a
connection of its own: the scheduler's loop, its claims and its closes never wait for a purge.
The database's clock judges the rows' age (purge_history's default `now`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from pgsched.config import pin_search_path, redact
from pgsched.errors import first_line

log = logging.getLogger("pgsched.retention")

# Runs deleted by one transaction: small enough that a batch holds its row locks under 50 ms (5,000
# took 87 ms, bench/upgrade_lock.py), large enough that a day's history at full speed goes in minutes.
BATCH = 2000
IDLE_LOOK = 5.0
# A partition step whose lock was busy is tried again this long after (doubled each time, up to the
# purge interval), not only at the next turn: until the partitions ahead are made, closed runs stay
# in job_run_live for the batches. A scheduler's start, its first claims and closes all at once,
# kept the lock busy on a slow host.
BUSY_RETRY = 1.0


class Purger:
    """One instance's share of the purge: start() after the instance registered, stop() at exit."""

    def __init__(self, dsn: str, every: float, *, batch: int = BATCH, busy_retry: float = BUSY_RETRY) -> None:
        self.dsn = dsn
        self.every = every
        self.batch = batch
        self.busy_retry = busy_retry
        self.deferred = False  # partition steps were left because a lock was busy (tried again soon)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self.turns = 0  # purges this instance ran (tests, the stats line)
        self.runs_purged = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="pgsched-purge", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to stop after its batch, and wait a moment for it. The connection is the
        thread's own: it closes it on its way out (a daemon thread, should a batch outlive us)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        else:
            self._close()  # purge_if_turn called directly (tests): no thread holds the connection

    def _loop(self) -> None:
        # The first look at once: a database whose last purge is older than the interval (or that
        # never had one) gets it from the first instance that starts. (Delayed by a second, it fell
        # into the burst that `bench/scheduler.py burst` starts 3 s after the start: its last run
        # started 8 % later in one sitting, level again without the delay in the next.)
        # purge_interval 0 (the retention applied by hand, pgsched.purge_history): the thread only
        # looks every IDLE_LOOK seconds whether a reload (SIGHUP) turned it on.
        retry = self.busy_retry
        try:
            while not self._stop.is_set():
                every = self.every
                if every > 0:
                    try:
                        if self.deferred:
                            self.retry_partition_steps()
                        else:
                            self.purge_if_turn()
                    except Exception as e:  # whatever it was, the purge must not end the thread
                        log.warning("history purge failed (retried in %ss): %s", every, first_line(e))
                        self.deferred = False
                        self._close()
                if self.deferred and every > 0:
                    self._stop.wait(min(retry, every))
                    retry *= 2
                else:
                    retry = self.busy_retry
                    self._stop.wait(every if every > 0 else IDLE_LOOK)
        finally:
            self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.dsn, autocommit=True, application_name="pgsched purge")
            except psycopg.Error as e:
                raise psycopg.OperationalError(f"cannot connect to {redact(self.dsn)}: {first_line(e)}") from None
            # A batch waits for no lock long: the rows it deletes are ended runs nobody writes, and
            # the instance rows it removes belong to stopped instances.
            self._conn.execute("SET lock_timeout = '1s'")
            pin_search_path(self._conn)
        return self._conn

    def purge_if_turn(self) -> bool:
        """Purge if it is this instance's turn; whether it was."""
        conn = self._connection()
        row = conn.execute("SELECT pgsched._purge_turn(make_interval(secs => %s))", (self.every,)).fetchone()
        if not (row and row[0]):
            return False
        made, dropped, deferred, longest_step = self.take_partition_steps(conn)
        self.deferred = deferred
        runs = instances = batches = 0
        longest = 0.0  # a batch's row locks are held until its commit: the longest is what it held them
        while not self._stop.is_set():
            began = time.monotonic()
            got = conn.execute("SELECT runs, instances FROM pgsched.purge_history(max_rows => %s, "
                               "with_partitions => false)", (self.batch,)).fetchone()
            longest = max(longest, time.monotonic() - began)
            assert got is not None
            runs += got[0]
            instances += got[1]
            batches += 1
            if got[0] < self.batch:
                break
        self.turns += 1
        self.runs_purged += runs
        log.info("history purged: %d partition(s) dropped and %d made%s, %d run(s) and %d stopped instance(s) "
                 "past their retention deleted in %d batch(es), the longest %.1f ms", dropped, made,
                 " (the rest left to a retry: a lock was busy)" if deferred else "", runs, instances,
                 batches, 1000 * longest,
                 extra={"partitions_dropped": dropped, "partitions_made": made,
                        "longest_step_ms": round(1000 * longest_step, 1), "runs": runs,
                        "instances": instances, "batches": batches, "longest_batch_ms": round(1000 * longest, 1)})
        return True

    def retry_partition_steps(self) -> None:
        """Take the partition steps a busy lock left, outside the turn (two sessions taking the same
        step at once is safe: pgsched._history_step)."""
        made, dropped, self.deferred, longest = self.take_partition_steps(self._connection())
        if made or dropped or not self.deferred:
            log.info("history partitions: %d dropped and %d made on a retry%s", dropped, made,
                     " (the rest left to the next retry: a lock was busy)" if self.deferred else "",
                     extra={"partitions_dropped": dropped, "partitions_made": made,
                            "longest_step_ms": round(1000 * longest, 1)})

    def take_partition_steps(self, conn: psycopg.Connection[Any]) -> tuple[int, int, bool, float]:
        """Take the partition steps due now, a transaction each (`conn` in autocommit): (made,
        dropped, whether some were left for a retry because a lock was busy, the longest
        attach or drop in seconds: about what it held job_run_live's lock). A validation comes
        alone (the steps after it are known once it is done), hence the second look."""
        made = dropped = 0
        longest = 0.0
        for _ in range(2):
            steps = conn.execute("SELECT step, name, lower, upper FROM pgsched._history_steps(now())").fetchall()
            for step, name, lower, upper in steps:
                if self._stop.is_set():
                    return made, dropped, True, longest
                began = time.monotonic()
                row = conn.execute("SELECT pgsched._history_step(%s, %s, %s, %s)",
                                   (step, name, lower, upper)).fetchone()
                if step != "validate":
                    longest = max(longest, time.monotonic() - began)
                if not (row and row[0]):
                    return made, dropped, True, longest
                made += step == "create"
                dropped += step == "drop"
            if not any(step == "validate" for step, *_ in steps):
                break
        return made, dropped, False, longest
