"""How fast a burst could go with no worker processes (issue 13: a bound for a redesign, not pgsched).

    ./dev bench direct_sessions [--sessions 24] [--rounds 1] [--closes-apart]

The burst of `./dev bench scheduler burst` (1,000 function jobs due at one instant, each inserting
a row) on a fresh cluster, but run by this one process instead of `pgsched serve`: it claims and
closes through pgsched's own Store (the same `_claim_v2` and `_close_runs`, their batches shared
as the scheduler shares them) and runs each claimed job itself, on one of --sessions connections,
each run its set-up and call, a Sync, `DISCARD ALL` and a Sync in one pipeline, as a worker sends
it (pgsched/oneround.py), with the sessions kept in pipeline mode and read as they answer. No
worker process, no pipe, no log records, no timeouts, cancels, crash handling or bookkeeping of
the job's state: what is left is the database's share of a run and the least Python that drives
it, so the figure is a floor for a scheduler that drove SQL jobs' sessions itself. One JSON object
a round: the last start after the due time and the CPU of each part (bench/common.py's
cpu_by_part: this process counts as the scheduler, the sessions as workers' backends).
--closes-apart: the closes go on a second connection, from a thread, instead of in the claim's
round trip, so that the claims' chain no longer carries the closes' database work.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
from common import cluster, cpu_by_part, cpu_spent, sleep_until
from psycopg import pq
from scheduler import add_jobs

from pgsched import oneround, worker
from pgsched.clock import DbClock
from pgsched.store import Claimed, Finish, Store

JOBS = 1000


class Session:
    """One job session, in pipeline mode for good: a run is sent, then read as its answers come."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pgsched worker idle")
        self.pg = self.conn.pgconn
        self.backend_pid = self.pg.backend_pid
        self.pg.nonblocking = 1
        self.pg.enter_pipeline_mode()
        self.run: Claimed | None = None
        self.syncs = 0

    def send(self, claimed: Claimed) -> None:
        assert claimed.run is not None
        run, job = claimed.run, claimed.run.job
        assert job.proc_schema is not None and job.proc_name is not None
        # The worker's own statement for a function job: its set-up and the call in one.
        call = worker._call(job.proc_schema, job.proc_name, False, self.conn.info.encoding)
        params = [run.app_name.encode(), str(run.run_id).encode(), run.plan_time.isoformat().encode(), b"",
                  str(job.job_id).encode(), None]
        self.pg.send_query_params(call, params)
        self.pg.pipeline_sync()
        self.pg.send_query_params(oneround.RESET, None)
        self.pg.pipeline_sync()
        while self.pg.flush():
            select.select([], [self.pg.socket], [])
        self.run, self.syncs = claimed, 0

    def read(self) -> bool:
        """Take what the server sent; True once the run's two Syncs are in."""
        self.pg.consume_input()
        nones = 0
        # libpq answers None once after each statement's results; more in a row: nothing else is in yet
        while not self.pg.is_busy() and nones < 3:
            res = self.pg.get_result()
            if res is None:
                nones += 1
                continue
            nones = 0
            if res.status == pq.ExecStatus.PIPELINE_SYNC:
                self.syncs += 1
                if self.syncs == 2:
                    return True
            elif res.status == pq.ExecStatus.FATAL_ERROR:
                raise RuntimeError((res.error_message or b"").decode())
        return False


def one_round(sessions: int, closes_apart: bool) -> dict[str, Any]:
    with cluster() as (c, dsn):
        add_jobs(dsn, JOBS, "mark", "1 hour", fixed=True, delay_s=3)
        postmaster = c.postmaster_pid()
        store = Store(dsn, DbClock())
        instance = store.register_instance(socket.gethostname(), os.getpid(), "bench", sessions)
        pool = [Session(dsn) for _ in range(sessions)]
        # Opened before the CPU is first read, closed after the last: its backend is counted.
        closer = Store(dsn, DbClock()) if closes_apart else None
        by_fd = {s.pg.socket: s for s in pool}
        with psycopg.connect(dsn, autocommit=True) as conn:
            due = conn.execute("SELECT min(initial_start) FROM pgsched.job").fetchone()
            assert due is not None and postmaster is not None
            sleep_until(conn, due[0], early_s=0.2)
            cpu_before = cpu_by_part(conn, os.getpid(), postmaster)
            sleep_until(conn, due[0])
            started = drive(store, instance, pool, by_fd, closer)
            cpu_after = cpu_by_part(conn, os.getpid(), postmaster)
            row = conn.execute("SELECT count(DISTINCT job_id), extract(epoch FROM max(at) - %s) FROM bench_start",
                               (due[0],)).fetchone()
            assert row is not None
        for s in pool:
            s.conn.close()
        store.close()
        if closer is not None:
            closer.close()
    return {"bench": "direct_sessions", "sessions": sessions, "closes_apart": closes_apart, "runs": started,
            "started": row[0],
            "last_start_after_s": round(float(row[1]), 3),
            **cpu_spent(cpu_before, cpu_after, runs=JOBS),
            "compare": "./dev bench scheduler burst (the same jobs through pgsched serve and its workers)"}


def drive(store: Store, instance: int, pool: list[Session], by_fd: dict[int, Session], closer: Store | None) -> int:
    """Claim for the idle sessions, closing what ended in the same round trip (or on `closer`'s
    connection, from a thread), until every job has run once and been closed; how many runs were
    claimed."""
    idle = list(pool)
    finishing: list[Finish] = []
    closing = ThreadPoolExecutor(1)
    closes: list[Future[Any]] = []
    claimed_all = 0
    ended = True  # a claim is worth asking for: at the start, and whenever a run ended since the last
    while True:
        if idle and claimed_all < JOBS and ended:
            if closer is not None and finishing:
                closes.append(closing.submit(closer.close_runs, finishing))
                finishing = []
            claims, _, _ = store.claim(instance, [(os.getpid(), s.backend_pid) for s in idle], finishing=finishing)
            finishing, ended = [], False
            for claimed, s in zip(claims, idle, strict=False):
                s.send(claimed)
            idle = idle[len(claims):]
            claimed_all += len(claims)
        busy = [s.pg.socket for s in pool if s.run is not None]
        if not busy:
            if claimed_all >= JOBS:
                store.close_runs(finishing)
                for f in closes:
                    f.result()
                closing.shutdown()
                return claimed_all
            time.sleep(0.001)  # nothing was due yet
            ended = True
            continue
        ready, _, _ = select.select(busy, [], [], 1.0)
        now = store.clock.now()
        for fd in ready:
            s = by_fd[fd]
            if s.read():
                assert s.run is not None and s.run.run is not None
                run = s.run.run
                finishing.append(Finish(run.run_id, "success", None, None,
                                        next_start=run.plan_time + timedelta(hours=1), finished_at=now,
                                        worker_pid=os.getpid(), backend_pid=s.backend_pid,
                                        schedule_delay=0.0, lease_token=run.lease_token))
                s.run = None
                idle.append(s)
                ended = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=24,
                    help="job sessions (serve's default workers on a bench cluster: 24)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--closes-apart", action="store_true",
                    help="close on a second connection, from a thread, not in the claim's round trip")
    args = ap.parse_args()
    for _ in range(args.rounds):
        print(json.dumps(one_round(args.sessions, args.closes_apart)), flush=True)


if __name__ == "__main__":
    main()
