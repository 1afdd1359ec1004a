"""The scheduler's settings (command line, settings file, SIGHUP reload): names, defaults and why."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pgsched.errors import ConfigError

# serve's default --max-workers: this many per CPU core of the scheduler's machine, at most
# MAX_DEFAULT_WORKERS, and at most a SERVER_SHARE-th of the connections the server has for
# ordinary sessions (max_connections less the reserved ones: a quarter of PostgreSQL's default
# 100 is 24). More idle workers make each claim larger, a claim costs the database and the
# scheduler nearly as much for 32 runs as for 16, and workers waiting on their job's commit
# leave the cores to the others (README "Performance", issue 13); each worker holds a
# connection, hence the server's share. (With jobs of several owners a worker also parks up to
# worker_sessions - 1 sessions, given back when the server refuses a connection: not counted.)
WORKERS_PER_CORE = 16
MAX_DEFAULT_WORKERS = 32
SERVER_SHARE = 4
# serve --worker-sessions: each is a connection a worker may hold.
MAX_WORKER_SESSIONS = 64


def default_max_workers(cores: int | None = None, connections: int | None = None) -> int:
    """The default max_workers for a machine with `cores` CPU cores (None: the cores this process
    may use) and a server with `connections` connections for ordinary sessions (None: not known
    yet; Store.connection_budget reads it)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(MAX_DEFAULT_WORKERS, WORKERS_PER_CORE * cores)
    if connections is not None:
        workers = min(workers, connections // SERVER_SHARE)
    return max(1, workers)


@dataclass(frozen=True)
class Settings:
    """How one `pgsched serve` behaves; all durations in seconds."""

    dsn: str
    max_workers: int = field(default_factory=default_max_workers)
    # Neither the command line nor the settings file set max_workers: the scheduler caps the
    # machine's default by the server's connections once it is connected (default_max_workers).
    max_workers_default: bool = False
    shutdown_timeout: float = 30.0
    crash_wait: float = 300.0  # after a scheduler start, a crashed job waits this long before running again
    safety_interval: float = 30.0  # re-read the catalog at least this often, NOTIFY or not
    # Every heartbeat_interval an instance renews its own heartbeat and its runs' leases, and
    # looks for runs of others that nobody will finish: a dead instance's runs are found
    # within about two intervals (its session is gone), a paused one's after dead_after
    # (its leases went stale).
    heartbeat_interval: float = 2.0
    dead_after: float = 10.0
    terminate_grace: float = 2.0  # between cancelling a run's query and killing it
    reconnect_max: float = 10.0
    standby_poll: float = 5.0
    # Runs due within this many seconds are claimed early and their worker waits for the
    # plan time, so the claim's latency does not become start lag.
    claim_ahead: float = 0.02
    # Modules with @pgsched.job handlers: imported by the workers; their jobs are claimed only here
    # and on other instances that loaded them.
    apps: tuple[str, ...] = ()
    # Every this many seconds an instance looks whether it is its turn to apply the history's
    # retention (pgsched/retention.py; one instance a turn over all of them); 0: never (the
    # retention is then applied by calling pgsched.purge_history).
    purge_interval: float = 900.0
    # Sessions each worker keeps, one per (owner, database) it ran jobs of lately: the one it is in
    # and up to worker_sessions - 1 parked, idle (pgsched/worker.py, Session). Each is a server
    # connection: an instance holds up to max_workers x worker_sessions of them when its jobs have
    # several owners; with one owner, max_workers.
    worker_sessions: int = 4
    # serve --http: above this many jobs, /metrics leaves out the per-job series (pgsched/httpd.py).
    metrics_max_jobs: int = 1000

    def __post_init__(self) -> None:
        # A lease renewed every heartbeat_interval must not be judged stale by dead_after in
        # between: keep room for a couple of missed beats (a slow round, a reconnect).
        if self.dead_after < 3 * self.heartbeat_interval:
            raise ConfigError(f"dead_after ({self.dead_after}s) must be at least 3 x heartbeat_interval "
                              f"({self.heartbeat_interval}s); every instance on a database should use the same two")
        if not 1 <= self.worker_sessions <= MAX_WORKER_SESSIONS:
            raise ConfigError(f"worker_sessions must be a whole number from 1 to {MAX_WORKER_SESSIONS}, "
                              f"not {self.worker_sessions}")
