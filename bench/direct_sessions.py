"""How fast a burst could go with no worker processes (issue 13: a bound for a redesign, not pgsched).

    ./dev bench direct_sessions [--sessions 24] [--rounds 1] [--closes-apart] [--minimal]

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
--minimal: the claims and closes are `./dev bench claim_close --against minimal`'s MINIMAL
statements instead of pgsched's: each run's row inserted at its start and updated at its end, its
job's state and counters, on the same tables with their indexes, triggers and foreign keys, and
nothing else (no launch row, no next due time, no bookkeeping). With it, the figure is a floor for
any scheduler that commits a start and an end row a run in pgsched's catalog and drives the
sessions from Python: what is left is the database's writes, the job, its reset, and the least
Python between them.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from claim_close import MINIMAL, SCHEDULER_SESSION
from common import cluster, cpu_by_part, cpu_spent, sleep_until
from psycopg import pq
from psycopg.types.json import Jsonb
from scheduler import add_jobs

from pgsched import oneround, worker
from pgsched.clock import DbClock
from pgsched.protocol import run_app_name
from pgsched.store import Claimed, Finish, Store

JOBS = 1000


@dataclass(frozen=True)
class MinimalRun:
    """A run claimed by MINIMAL's claim: what its job's statement and its close need."""

    run_id: int
    job_id: int
    lease_token: int
    plan_time: datetime
    proc_schema: str
    proc_name: str


class MinimalStore:
    """MINIMAL's claim and close on one connection, in the shape drive() takes from Store: a close
    goes in the claim's round trip (a pipeline of the two) unless it is sent alone."""

    def __init__(self, dsn: str, instance: int) -> None:
        # Named as the scheduler's session is, so that cpu_by_part counts it as the scheduler's backend.
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pgsched scheduler")
        for setting in SCHEDULER_SESSION:
            self.conn.execute(setting)
        self.instance = instance
        self.clock = DbClock()

    def claim(self, _instance: int, workers: list[tuple[int, int]],
              finishing: list[Any]) -> tuple[list[MinimalRun], None, None]:
        # One round trip and one transaction, as Store.claim closes and claims.
        with self.conn.pipeline(), self.conn.transaction():
            if finishing:
                self.conn.execute(MINIMAL[1], (Jsonb(finishing),))
            cur = self.conn.execute(MINIMAL[0], {"w": [w for w, _ in workers], "b": [b for _, b in workers],
                                                 "i": self.instance})
        rows = cur.fetchall()
        # MINIMAL's claim returns run_id, started_at, lease_token, job_id, kind, proc_schema, proc_name
        return [MinimalRun(r[0], r[3], r[2], r[1], r[5], r[6]) for r in rows], None, None

    def close_runs(self, finishing: list[Any]) -> None:
        if finishing:
            self.conn.execute(MINIMAL[1], (Jsonb(finishing),))

    def close(self) -> None:
        self.conn.close()


class Session:
    """One job session, in pipeline mode for good: a run is sent, then read as its answers come."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True, application_name="pgsched worker idle")
        self.pg = self.conn.pgconn
        self.backend_pid = self.pg.backend_pid
        self.pg.nonblocking = 1
        self.pg.enter_pipeline_mode()
        self.run: Claimed | MinimalRun | None = None
        self.syncs = 0

    def send(self, claimed: Claimed | MinimalRun) -> None:
        if isinstance(claimed, MinimalRun):
            schema, name, job_id, run_id = claimed.proc_schema, claimed.proc_name, claimed.job_id, claimed.run_id
            app, plan_time = run_app_name(job_id, run_id, claimed.lease_token), claimed.plan_time
        else:
            assert claimed.run is not None
            run, job = claimed.run, claimed.run.job
            assert job.proc_schema is not None and job.proc_name is not None
            schema, name, job_id, run_id, app, plan_time = (job.proc_schema, job.proc_name, job.job_id, run.run_id,
                                                            run.app_name, run.plan_time)
        # The worker's own statement for a function job: its set-up and the call in one.
        call = worker._call(schema, name, False, self.conn.info.encoding)
        params = [app.encode(), str(run_id).encode(), plan_time.isoformat().encode(), b"",
                  str(job_id).encode(), None]
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


def one_round(sessions: int, closes_apart: bool, minimal: bool) -> dict[str, Any]:
    with cluster() as (c, dsn):
        add_jobs(dsn, JOBS, "mark", "1 hour", fixed=True, delay_s=3)
        postmaster = c.postmaster_pid()
        pgsched_store = Store(dsn, DbClock())
        instance = pgsched_store.register_instance(socket.gethostname(), os.getpid(), "bench", sessions)
        store: Store | MinimalStore = pgsched_store
        if minimal:
            pgsched_store.close()
            store = MinimalStore(dsn, instance)
        pool = [Session(dsn) for _ in range(sessions)]
        # Opened before the CPU is first read, closed after the last: its backend is counted.
        closer: Store | MinimalStore | None = None
        if closes_apart:
            closer = MinimalStore(dsn, instance) if minimal else Store(dsn, DbClock())
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
    return {"bench": "direct_sessions", "sessions": sessions, "closes_apart": closes_apart, "minimal": minimal,
            "runs": started,
            "started": row[0],
            "last_start_after_s": round(float(row[1]), 3),
            **cpu_spent(cpu_before, cpu_after, runs=JOBS),
            "compare": "./dev bench scheduler burst (the same jobs through pgsched serve and its workers)"}


def drive(store: Store | MinimalStore, instance: int, pool: list[Session], by_fd: dict[int, Session],
          closer: Store | MinimalStore | None) -> int:
    """Claim for the idle sessions, closing what ended in the same round trip (or on `closer`'s
    connection, from a thread), until every job has run once and been closed; how many runs were
    claimed."""
    idle = list(pool)
    finishing: list[Any] = []  # Finish, or MINIMAL's close rows
    closing = ThreadPoolExecutor(1)
    closes: list[Future[Any]] = []
    claimed_all = 0
    ended = True  # a claim is worth asking for: at the start, and whenever a run ended since the last
    while True:
        if idle and claimed_all < JOBS and ended:
            if closer is not None and finishing:
                closes.append(closing.submit(closer.close_runs, finishing))
                finishing = []
            claims: Sequence[Claimed | MinimalRun] = store.claim(
                instance, [(os.getpid(), s.backend_pid) for s in idle], finishing=finishing)[0]
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
                assert s.run is not None
                if isinstance(s.run, MinimalRun):
                    finishing.append({"run_id": s.run.run_id, "finished_at": now.isoformat(),
                                      "next_start": (s.run.plan_time + timedelta(hours=1)).isoformat()})
                else:
                    assert s.run.run is not None
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
    ap.add_argument("--minimal", action="store_true",
                    help="claim and close with claim_close's MINIMAL statements (the same row writes, nothing else)")
    args = ap.parse_args()
    for _ in range(args.rounds):
        print(json.dumps(one_round(args.sessions, args.closes_apart, args.minimal)), flush=True)


if __name__ == "__main__":
    main()
