"""Chaos test of several `pgsched serve` instances sharing one database (not part of the test suite).

    ./dev bench chaos [--minutes 10] [--jobs 200] [--instances 3] [--seed N]
                      [--max-workers 6] [--max-sleep 0.4] [--crash-wait SECONDS] [--dependents N]
                      [--history-failures]

A throwaway embedded cluster gets `--jobs` command jobs on fixed interval schedules of 1 to 5 s (random per job,
from the seed; each with an explicit initial_start, so its plan times are the grid initial_start + k * interval).
Each run inserts one row into chaos.effect naming its plan (current_setting('pgsched.plan_time') and
'pgsched.run_id', set by the worker) and sleeps 0 to --max-sleep s (skewed short), in one statement, so a run
killed mid-way leaves no row. `--instances` `pgsched serve` processes run the jobs. For `--minutes`, at random
intervals, the script kills -9 a random worker process or a random instance (a replacement starts a few seconds
later), and once, half way, restarts PostgreSQL (fast mode). Each action is printed with a timestamp. Actions stop
20 s before the end, so that every crash they cause is closed by then. Then the instances get SIGTERM and the
script checks:

* duplicates: (job_id, plan_time) with more than one effect row. Must be 0.
* missed outside the catch-up policy: grid slots between a job's first run and the end of the chaos - 15 s with
  neither a job_run row of that plan_time (any outcome) nor a 'skipped'/'missed' row whose result
  {"first", "last", "count"} covers them. Must be 0. Each gap is printed with the run before it, and for runs
  closed as abandoned, the instance that closed them.
* with --dependents N: N more jobs with no schedule of their own, each run after one of the jobs above (chosen
  at random: some upstreams get several, a fan-out), its effect row naming the plan time its upstream passed on.
  Every success of an upstream must give each of its dependents exactly one run of that plan time (a plan given
  and not started at the end counts), and no other: dependent runs missing and extra must both be 0 (README
  "Dependencies").
* with --history-failures, every other job has history => 'failures' (README "History and retention"):
  the rows of its successful, skipped and missed runs go at their close, so its checks read what retention
  does not remove. Duplicates come from chaos.effect as for all jobs; a slot is covered by an effect row (a
  success) or a kept row (a failure, timeout, crash or cancel), and the slots covered by neither must number
  no more than the job's skip and miss counters in job_stat (total_skipped + total_missed), which the closes
  that dropped those rows incremented.
* success runs without an effect row (should be 0); effect rows of runs that did not end in success (possible: the
  job committed, its close was lost, e.g. an orphan backend of a killed instance finishing its statement).
* crashes caused (workers killed mid-run, runs in progress on killed instances and at the PostgreSQL restart,
  as seen right before each action) against crash rows recorded; runs by outcome; runs per second.

Prints a summary and one JSON line; exit status 1 if duplicates or missed slots were found. Instance logs, the
server log and CSV dumps of pgsched.job_run and chaos.effect are kept in bench/results/chaos-<time>/.
`--crash-wait` is passed to `serve` when given (its default, 300 s, applies only after a restart: runs a starting
instance finds crashed while no other instance was alive).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from common import children, cluster, parent_pid, spawn_serve, stop_serve, wait_for_log
from psycopg import sql

from pgsched.embedded import Cluster

RESULTS = Path(__file__).resolve().parent / "results"
# No actions this long before the end: a killed instance's runs are closed by a peer's next heartbeat (5 s), and
# the slots before the analysis window's end should all have had their chance to run.
QUIET_TAIL = 20.0
# The analysis window ends this long before the end of the chaos: later slots may still be in progress.
SETTLE = 15.0
# Between the job set-up and the first slot: time for the instances to start and connect their workers.
LEAD_IN = 10.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICRO = timedelta(microseconds=1)
Query = str | sql.SQL | sql.Composed
# The log line of an instance closing another's run (two wordings, before and after leases).
# The messages such a run is closed with.
ABANDONED_MESSAGES = ("ended before the run did", "before the run ended", "stale lease", "lost track of the run")
EXCEPTION = re.compile(r"^\w*(?:Error|Exception|Interrupt)\b.*")


def micros(t: datetime) -> int:
    return (t - EPOCH) // MICRO


def from_micros(us: int) -> datetime:
    return EPOCH + us * MICRO


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Db:
    """An autocommit connection that reconnects, since the chaos restarts PostgreSQL under it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def rows(self, query: Query, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        for attempt in range(100):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3,
                                                application_name="chaos observer")
                return self.conn.execute(query, params).fetchall()
            except psycopg.OperationalError:
                if self.conn is not None:
                    self.conn.close()
                if attempt == 99:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def value(self, query: Query, params: Sequence[Any] | None = None) -> Any:
        rows = self.rows(query, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def effect_command(job_id: int, max_sleep: float) -> sql.Composed:
    # One statement, hence one transaction: a run killed during its sleep leaves no effect row behind.
    # random()^2 keeps most sleeps short, so the load stays within the workers of a 2-core machine.
    return sql.SQL(
        "INSERT INTO chaos.effect (job_id, plan_time, run_id) "
        "SELECT {}, current_setting('pgsched.plan_time')::timestamptz, current_setting('pgsched.run_id')::bigint "
        "FROM pg_sleep({} * random() ^ 2)"
    ).format(sql.Literal(job_id), sql.Literal(max_sleep))


def create_jobs(dsn: str, n: int, rng: random.Random, max_sleep: float, dependents: int = 0,
                history_failures: bool = False) -> tuple[datetime, float]:
    """Create chaos.effect and n jobs through the pg_cron-style API (with history_failures, every other one
    keeping only its failures' rows), and `dependents` jobs each run after one of them; (first slot time,
    expected runs/s)."""
    rate = 0.0
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE SCHEMA chaos")
        conn.execute("CREATE TABLE chaos.effect (job_id int NOT NULL, plan_time timestamptz NOT NULL, "
                     "run_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())")
        row = conn.execute("SELECT now() + make_interval(secs => %s)", (LEAD_IN,)).fetchone()
        assert row is not None
        base: datetime = row[0]
        for i in range(n):
            interval_s = rng.randint(1, 5)
            rate += 1 / interval_s
            # Spread the origins over the interval so the runs do not all come due at once.
            origin = base + timedelta(milliseconds=rng.randrange(interval_s * 1000))
            name, every = f"chaos {i:04d}", f"{interval_s} seconds"
            # The command names its job id, which exists only once the job does: create, then set the command
            # (schedule() with the same name updates it), then the origin of the grid.
            created = conn.execute("SELECT pgsched.schedule(%s, %s, 'SELECT 1')", (name, every)).fetchone()
            assert created is not None
            job_id = int(created[0])
            command = effect_command(job_id, max_sleep).as_string(conn)
            conn.execute("SELECT pgsched.schedule(%s, %s, %s)", (name, every, command))
            conn.execute("SELECT FROM pgsched.alter_job(%s, initial_start => %s, history => %s)",
                         (job_id, origin, "failures" if history_failures and i % 2 else None))
        upstreams = [int(r[0]) for r in conn.execute("SELECT job_id FROM pgsched.job ORDER BY job_id").fetchall()]
        for i in range(dependents):
            upstream = rng.choice(upstreams)
            created = conn.execute("SELECT pgsched.schedule(%s, '1 hour', 'SELECT 1')", (f"dep {i:04d}",)).fetchone()
            assert created is not None
            job_id = int(created[0])
            rate += 1 / int(conn.execute("SELECT extract(epoch FROM schedule_interval) FROM pgsched.job "
                                         "WHERE job_id = %s", (upstream,)).fetchone()[0])  # type: ignore[index]
            conn.execute("UPDATE pgsched.job SET command = %s WHERE job_id = %s",
                         (effect_command(job_id, max_sleep).as_string(conn), job_id))
            conn.execute("SELECT FROM pgsched.alter_job(%s, schedule => '@after', depends_on => %s)",
                         (job_id, [str(upstream)]))
    return base, rate


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    instance_id: int | None = None
    killed: bool = False
    exited: bool = False  # ended on its own (not by us): a finding

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def live(self) -> bool:
        return not self.killed and not self.exited and self.proc.poll() is None


@dataclass
class Caused:
    worker_kills: int = 0
    worker_kills_mid_run: int = 0
    instance_kills: int = 0
    instance_kill_runs: int = 0
    restart_runs: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    killed_at: dict[int, datetime] = field(default_factory=dict)  # instance_id -> when we killed it

    @property
    def crashes(self) -> int:
        return self.worker_kills_mid_run + self.instance_kill_runs + self.restart_runs


class Chaos:
    def __init__(self, c: Cluster, dsn: str, args: argparse.Namespace, rng: random.Random, outdir: Path) -> None:
        self.cluster = c
        self.dsn = dsn
        self.args = args
        self.rng = rng
        self.outdir = outdir
        self.db = Db(dsn)
        self.instances: list[Instance] = []
        self.replacements: list[float] = []  # monotonic times at which to start one
        self.caused = Caused()
        self.t0 = time.monotonic()
        self.host = socket.gethostname()

    def say(self, what: str) -> None:
        print(f"{stamp()} +{time.monotonic() - self.t0:7.1f}s  {what}", flush=True)

    # -- instances ------------------------------------------------------------------------
    def start_instance(self) -> Instance:
        name = f"i{len(self.instances) + 1}"
        log = self.outdir / f"{name}.log"
        extra = ["--crash-wait", str(self.args.crash_wait)] if self.args.crash_wait is not None else []
        proc = spawn_serve(self.dsn, log, "--max-workers", str(self.args.max_workers), *extra)
        inst = Instance(name, proc, log)
        self.instances.append(inst)
        self.say(f"started instance {name} (pid {proc.pid}, log {log.name})")
        return inst

    def live(self) -> list[Instance]:
        return [i for i in self.instances if i.live]

    def instance_id(self, inst: Instance) -> int | None:
        if inst.instance_id is None:
            inst.instance_id = self.db.value(
                "SELECT max(instance_id) FROM pgsched.instance WHERE pid = %s AND host = %s", (inst.pid, self.host))
        return inst.instance_id

    def check_exits(self) -> None:
        for inst in self.instances:
            if not inst.killed and not inst.exited and inst.proc.poll() is not None:
                inst.exited = True
                what = f"instance {inst.name} (pid {inst.pid}) exited on its own with status {inst.proc.returncode}"
                self.caused.unexpected_exits.append(what)
                self.say(f"UNEXPECTED: {what}; starting a replacement")
                self.start_instance()

    def start_replacements(self) -> None:
        now = time.monotonic()
        for t in [t for t in self.replacements if t <= now]:
            self.replacements.remove(t)
            self.start_instance()

    # -- actions ------------------------------------------------------------------------------
    def kill_worker(self) -> None:
        candidates = [(inst, pid) for inst in self.live() for pid in children(inst.pid)]
        if not candidates:
            self.say("kill worker: no worker process found")
            return
        inst, pid = self.rng.choice(candidates)
        running = self.db.rows("SELECT run_id, job_id FROM pgsched.job_run WHERE worker_pid = %s "
                               "AND outcome = 'running' AND instance_id IS NOT DISTINCT FROM %s",
                               (pid, self.instance_id(inst)))
        # The pid must still be a child of our instance: never signal a pid that was reused meanwhile.
        if parent_pid(pid) != inst.pid:
            self.say(f"kill worker: worker {pid} of {inst.name} is already gone")
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self.say(f"kill worker: worker {pid} of {inst.name} is already gone")
            return
        self.caused.worker_kills += 1
        self.caused.worker_kills_mid_run += len(running)
        what = ", ".join(f"run {r} of job {j}" for r, j in running) or "idle"
        self.say(f"kill -9 worker {pid} of instance {inst.name}: {what}")

    def kill_instance(self) -> None:
        live = self.live()
        if len(live) < 2:
            self.say("kill instance: skipped, it is the only live instance")
            return
        inst = self.rng.choice(live)
        iid = self.instance_id(inst)
        running = int(self.db.value("SELECT count(*) FROM pgsched.job_run WHERE instance_id = %s "
                                    "AND outcome = 'running'", (iid,)) or 0)
        if inst.proc.poll() is not None:
            return  # check_exits reports it
        os.kill(inst.pid, signal.SIGKILL)
        inst.proc.wait()
        inst.killed = True
        if iid is not None:
            self.caused.killed_at[iid] = datetime.now(UTC)
        self.caused.instance_kills += 1
        self.caused.instance_kill_runs += running
        delay = self.rng.uniform(2, 5)
        self.replacements.append(time.monotonic() + delay)
        self.say(f"kill -9 instance {inst.name} (pid {inst.pid}, instance_id {iid}): {running} run(s) in progress; "
                 f"replacement in {delay:.1f}s")

    def restart_postgres(self) -> None:
        running = int(self.db.value("SELECT count(*) FROM pgsched.job_run WHERE outcome = 'running'") or 0)
        self.db.close()
        self.say(f"restarting PostgreSQL (fast): {running} run(s) in progress")
        t = time.monotonic()
        self.cluster.restart("fast")
        self.caused.restart_runs += running
        self.say(f"PostgreSQL is back after {time.monotonic() - t:.2f}s")

    # -- the whole run ---------------------------------------------------------------------------
    def run(self, base: datetime) -> tuple[datetime, datetime]:
        """Start the instances, cause chaos until base + minutes, stop them; (chaos start, chaos end) in DB time."""
        for _ in range(self.args.instances):
            self.start_instance()
        for inst in self.instances:
            wait_for_log(inst.log, "ready:", 60)
        wait = (base - self.db.value("SELECT now()")).total_seconds()
        if wait > 0:
            time.sleep(wait)
        self.t0 = time.monotonic()
        self.say(f"chaos starts: {len(self.live())} instances ready, first slots due now")
        end = self.t0 + self.args.minutes * 60
        quiet_from = end - QUIET_TAIL
        restart_at = self.t0 + (end - self.t0) / 2
        next_action = self.t0 + self.rng.uniform(1, 4)
        restarted = False
        while (now := time.monotonic()) < end:
            self.check_exits()
            self.start_replacements()
            if not restarted and now >= restart_at:
                self.restart_postgres()
                restarted = True
            elif now >= next_action and now < quiet_from:
                if self.rng.random() < 0.7:
                    self.kill_worker()
                else:
                    self.kill_instance()
                next_action = time.monotonic() + self.rng.uniform(2, 6)
            time.sleep(0.05)
        chaos_end: datetime = self.db.value("SELECT now()")
        self.say(f"chaos ends; stopping {len(self.live())} instance(s) with SIGTERM")
        self.stop_all()
        return base, chaos_end

    def stop_all(self) -> None:
        live = self.live()
        for inst in live:
            inst.proc.send_signal(signal.SIGTERM)
        for inst in live:
            stop_serve(inst.proc, timeout=60)
            if inst.proc.returncode not in (0, -signal.SIGTERM):
                self.say(f"instance {inst.name} stopped with status {inst.proc.returncode}")

    def kill_everything(self) -> None:
        """On an error or ^C: our instances must not outlive the cluster."""
        for inst in self.instances:
            if inst.proc.poll() is None:
                inst.proc.kill()
                inst.proc.wait()


# -- analysis -----------------------------------------------------------------------------------------
@dataclass
class RunRow:
    run_id: int
    job_id: int
    plan_time: datetime
    outcome: str
    result: Any
    message: str | None
    instance_id: int | None
    started_at: datetime | None
    finished_at: datetime | None


@dataclass
class Gap:
    job_id: int
    interval_s: int
    slots: list[int]  # micros
    before: RunRow | None
    after: RunRow | None


def find_gaps(jobs: list[tuple[int, int, datetime]], runs: list[RunRow], until: datetime) -> tuple[list[Gap], int]:
    """Grid slots accounted for by nothing, grouped into gaps of consecutive slots; and the off-grid runs."""
    by_job: dict[int, list[RunRow]] = {}
    for r in runs:
        by_job.setdefault(r.job_id, []).append(r)
    limit = micros(until)
    gaps: list[Gap] = []
    off_grid = 0
    for job_id, interval_s, origin in jobs:
        rows = sorted(by_job.get(job_id, []), key=lambda r: r.plan_time)
        step, o = interval_s * 1_000_000, micros(origin)
        plans = {micros(r.plan_time) for r in rows}
        covered: list[tuple[int, int]] = []
        for r in rows:
            if r.outcome in ("skipped", "missed") and isinstance(r.result, dict) and "first" in r.result:
                covered.append((micros(datetime.fromisoformat(r.result["first"])),
                                micros(datetime.fromisoformat(r.result["last"]))))
        started = [r for r in rows if r.outcome not in ("skipped", "missed")]
        off_grid += sum(1 for r in started if (micros(r.plan_time) - o) % step)
        start = micros(started[0].plan_time) if started else o
        current: list[int] = []
        for k in range(max(0, math.ceil((start - o) / step)), (limit - o) // step + 1):
            slot = o + k * step
            if slot in plans or any(lo <= slot <= hi for lo, hi in covered):
                if current:
                    gaps.append(_gap(job_id, interval_s, current, rows))
                    current = []
                continue
            current.append(slot)
        if current:
            gaps.append(_gap(job_id, interval_s, current, rows))
    return gaps, off_grid


def _gap(job_id: int, interval_s: int, slots: list[int], rows: list[RunRow]) -> Gap:
    # The runs that started around the gap tell its cause; skipped/missed records do not.
    started = [r for r in rows if r.outcome not in ("skipped", "missed")]
    before = [r for r in started if micros(r.plan_time) < slots[0]]
    after = [r for r in started if micros(r.plan_time) > slots[-1]]
    return Gap(job_id, interval_s, slots, before[-1] if before else None, after[0] if after else None)


@dataclass(frozen=True)
class Closer:
    """Who closed a run as abandoned (from the instances' logs)."""

    instance: str
    at: datetime
    instance_started: datetime

    def __str__(self) -> str:
        return (f"closed as abandoned by {self.instance} at {self.at.isoformat()} "
                f"({(self.at - self.instance_started).total_seconds():.1f}s after that instance started)")


def closers(logs: Sequence[Path]) -> dict[int, Closer]:
    """run_id -> who closed it, for every run an instance closed as abandoned."""
    out: dict[int, Closer] = {}
    for log in logs:
        started: datetime | None = None
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                ts = datetime.fromisoformat(rec["ts"])
            except (ValueError, KeyError, TypeError):
                continue
            started = started or ts
            # The record of a run closed as abandoned carries its run_id and the cause as keys (pgsched/recovery.py).
            if rec.get("abandoned") and rec.get("run_id") is not None:
                out[int(rec["run_id"])] = Closer(log.stem, ts, started)
    return out


def cause(g: Gap, closed_by: dict[int, Closer], killed_at: dict[int, datetime],
          next_start: datetime | None) -> str:
    """The likely cause of a gap, from the runs around it."""
    b = g.before
    if b is None:
        return "no run before the gap"
    msg = b.message or ""
    if b.outcome == "crash" and (b.run_id in closed_by or any(m in msg for m in ABANDONED_MESSAGES)):
        # Crash backoff is capped at 5 periods of the schedule; a longer pause is the --crash-wait a scheduler
        # applies to the crashed runs it finds as it starts.
        resume = g.after.started_at if g.after is not None else next_start
        paused = (resume - b.finished_at).total_seconds() if resume and b.finished_at else 0.0
        if paused > 5 * g.interval_s + 1:
            return "after a run closed as abandoned, then held back past the crash backoff (crash-wait)"
        killed = killed_at.get(b.instance_id) if b.instance_id is not None else None
        if killed is None or (b.finished_at is not None and killed > b.finished_at):
            return "after a run of a live instance closed as abandoned by a peer"
        return "after a run of a killed instance closed as abandoned"
    if b.outcome == "crash" and msg.startswith("worker process"):
        return "after a worker killed mid-run"
    if b.outcome == "crash" and msg.startswith("database connection lost"):
        return "after a run that lost its connection (PostgreSQL restart)"
    return f"after a run with outcome {b.outcome}"


def log_problems(logs: Sequence[Path]) -> dict[str, Any]:
    """Error lines, and non-JSON lines (tracebacks of the instances or of their workers) in the instance logs."""
    errors: Counter[str] = Counter()
    exceptions: Counter[str] = Counter()
    raw = 0
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                raw += 1
                m = EXCEPTION.match(line)
                if m:
                    exceptions[f"{log.stem}: {m.group(0)[:200]}"] += 1
                continue
            if rec.get("level") in ("error", "critical"):
                # Numbers vary between occurrences of the same problem.
                errors[f"{log.stem}: " + re.sub(r"\d+", "N", str(rec.get("msg", "")))[:200]] += 1
    return {"error_lines": sum(errors.values()), "non_json_lines": raw, "errors": errors.most_common(10),
            "exceptions": exceptions.most_common(10)}


def fmt_run(r: RunRow | None) -> str:
    if r is None:
        return "none"
    return (f"run {r.run_id} plan {r.plan_time.isoformat()} {r.outcome} instance {r.instance_id} "
            f"started {r.started_at.isoformat() if r.started_at else '-'} "
            f"finished {r.finished_at.isoformat() if r.finished_at else '-'}"
            + (f" message {r.message!r}" if r.message else ""))


def analyse(db: Db, chaos: Chaos, start: datetime, end: datetime) -> dict[str, Any]:
    until = end - timedelta(seconds=SETTLE)
    jobs = [(int(j), int(iv), origin) for j, iv, origin in db.rows(
        "SELECT job_id, extract(epoch FROM schedule_interval)::int, initial_start FROM pgsched.job "
        "WHERE job_name LIKE 'chaos %' ORDER BY job_id")]
    runs = [RunRow(*r) for r in db.rows(
        "SELECT run_id, job_id, plan_time, outcome, result, message, instance_id, started_at, finished_at "
        "FROM pgsched.job_run ORDER BY run_id")]
    # Jobs whose successes keep no row: their successes are their effect rows (one per success, or a
    # duplicate, counted as such below), and their skips and misses only the job_stat counters.
    quiet = {int(j) for (j,) in db.rows("SELECT job_id FROM pgsched.job WHERE history <> 'all'")}
    runs += [RunRow(int(rid), int(j), p, "success", None, "(effect row; the run's row is not kept)", None, at, at)
             for rid, j, p, at in db.rows("SELECT run_id, job_id, plan_time, at FROM chaos.effect "
                                         "WHERE job_id = ANY (%s) ORDER BY run_id", (list(quiet),))]
    counted = {int(j): int(n) for j, n in db.rows("SELECT job_id, total_skipped + total_missed FROM pgsched.job_stat "
                                                  "WHERE job_id = ANY (%s)", (list(quiet),))}
    duplicates = db.rows("SELECT job_id, plan_time, count(*), array_agg(run_id ORDER BY run_id) FROM chaos.effect "
                         "GROUP BY 1, 2 HAVING count(*) > 1 ORDER BY 1, 2")
    success_no_effect = db.rows(
        "SELECT r.run_id, r.job_id, r.plan_time FROM pgsched.job_run r WHERE r.outcome = 'success' "
        "AND NOT EXISTS (SELECT 1 FROM chaos.effect e WHERE e.run_id = r.run_id) ORDER BY r.run_id")
    effect_not_success = db.rows(
        "SELECT coalesce(r.outcome, '(no run row)'), count(*) FROM chaos.effect e "
        "LEFT JOIN pgsched.job_run r ON r.run_id = e.run_id WHERE r.outcome IS DISTINCT FROM 'success' "
        "AND NOT (e.job_id = ANY (%s) AND r.run_id IS NULL) GROUP BY 1", (list(quiet),))
    mismatched = int(db.value(
        "SELECT count(*) FROM chaos.effect e JOIN pgsched.job_run r ON r.run_id = e.run_id "
        "WHERE r.job_id <> e.job_id OR r.plan_time <> e.plan_time") or 0)
    stats = {int(j): (str(st), ns) for j, st, ns in db.rows("SELECT job_id, state, next_start FROM pgsched.job_stat")}
    skipped_total = int(db.value("SELECT coalesce(sum(total_skipped), 0) FROM pgsched.job_stat") or 0)

    gaps, off_grid = find_gaps(jobs, runs, until)
    # A quiet job's uncovered slots are accounted for by its counters, up to their count.
    quiet_uncovered = Counter[int]()
    for g in gaps:
        if g.job_id in quiet:
            quiet_uncovered[g.job_id] += len(g.slots)
    quiet_excess = {j: n - counted.get(j, 0) for j, n in quiet_uncovered.items() if n > counted.get(j, 0)}
    gaps = [g for g in gaps if g.job_id not in quiet or g.job_id in quiet_excess]
    dep_missing, dep_extra, dep_runs, dep_stuck = dependent_runs(db, until)
    missed = sum(len(g.slots) for g in gaps)
    outcomes = Counter(r.outcome for r in runs)
    started_runs = sum(n for o, n in outcomes.items() if o not in ("skipped", "missed"))
    seconds = (end - start).total_seconds()
    logs = [i.log for i in chaos.instances]
    closed_by = closers(logs)

    print()
    print(f"chaos window {start.isoformat()} .. {end.isoformat()} ({seconds:.0f}s); "
          f"slots checked up to {until.isoformat()}")
    print(f"runs by outcome: {dict(sorted(outcomes.items()))}; total_skipped slots: {skipped_total}; "
          f"{started_runs / seconds:.1f} runs/s, {outcomes['success'] / seconds:.1f} successes/s")
    c = chaos.caused
    print(f"crashes caused: {c.crashes} (workers killed mid-run {c.worker_kills_mid_run} of {c.worker_kills} "
          f"killed; runs in progress on {c.instance_kills} killed instances {c.instance_kill_runs}; "
          f"at the PostgreSQL restart {c.restart_runs}); crash rows recorded: {outcomes['crash']}")
    print(f"duplicates: {len(duplicates)}")
    if dep_runs or dep_missing or dep_extra:
        print(f"dependent runs: {dep_runs}; missing (an upstream success without its run): {len(dep_missing)}; "
              f"extra (a run no upstream success asked for): {len(dep_extra)}; stuck (given over a minute "
              f"before the end, not started): {len(dep_stuck)}")
        for what in (dep_missing + dep_extra + dep_stuck)[:20]:
            print(f"  {what}")
    for d in duplicates[:10]:
        print(f"  job {d[0]} plan {d[1].isoformat()}: {d[2]} effect rows, runs {d[3]}")
    if quiet:
        print(f"jobs with history 'failures': {len(quiet)}; their slots covered by no effect or kept row: "
              f"{sum(quiet_uncovered.values())}, against their skip and miss counters {sum(counted.values())}; "
              f"jobs with more uncovered slots than counted: {len(quiet_excess)}")
    print(f"missed slots outside the catch-up policy: {missed} in {len(gaps)} gap(s)")
    causes = [(g, cause(g, closed_by, c.killed_at, stats[g.job_id][1] if g.job_id in stats else None))
              for g in sorted(gaps, key=lambda g: g.slots[0])]
    by_cause: Counter[str] = Counter()
    for g, why in causes:
        by_cause[why] += len(g.slots)
    for why, n in by_cause.most_common():
        print(f"  {n} slot(s) {why}")
    if any("crash-wait" in why for why in by_cause) and chaos.args.crash_wait is None:
        print("  (serve's --crash-wait, 300 s by default, was in effect: --crash-wait 0 shows what else is missed)")
    for g, why in causes[:15]:
        print(f"  job {g.job_id} (every {g.interval_s}s): {len(g.slots)} slot(s) "
              f"{from_micros(g.slots[0]).isoformat()} .. {from_micros(g.slots[-1]).isoformat()}")
        print(f"    cause:  {why}")
        print(f"    before: {fmt_run(g.before)}")
        if g.before is not None and g.before.run_id in closed_by:
            print(f"            {closed_by[g.before.run_id]}")
        print(f"    after:  {fmt_run(g.after)}")
        if g.after is None and g.job_id in stats:
            state, next_start = stats[g.job_id]
            print(f"            job {g.job_id} is {state}, next_start {next_start.isoformat() if next_start else None}")
    print(f"runs at off-grid plan times (retries): {off_grid}")
    print(f"success runs without an effect row: {len(success_no_effect)}"
          + (f" (e.g. runs {[r[0] for r in success_no_effect[:10]]})" if success_no_effect else ""))
    print(f"effect rows of runs not in success: {dict(effect_not_success) or 0}; "
          f"effect rows naming another job or plan than their run: {mismatched}")
    problems = log_problems(logs)
    print(f"instance logs: {problems['error_lines']} error line(s), {problems['non_json_lines']} non-JSON line(s)")
    for msg, n in problems["errors"]:
        print(f"  {n} x {msg}")
    for msg, n in problems["exceptions"]:
        print(f"  {n} x {msg}")
    for what in c.unexpected_exits:
        print(f"  {what}")

    return {
        "seconds": round(seconds, 1), "jobs": len(jobs), "instances": chaos.args.instances,
        "max_workers": chaos.args.max_workers, "seed": chaos.args.seed,
        "duplicates": len(duplicates), "missed_outside_policy": missed, "missed_gaps": len(gaps),
        "history_failures_jobs": len(quiet), "history_failures_uncovered": sum(quiet_uncovered.values()),
        "history_failures_counted": sum(counted.values()), "history_failures_excess": len(quiet_excess),
        "dependents": chaos.args.dependents, "dependent_runs": dep_runs,
        "dependent_missing": len(dep_missing), "dependent_extra": len(dep_extra),
        "dependent_stuck": len(dep_stuck),
        "missed_by_cause": dict(by_cause),
        "success_without_effect": len(success_no_effect),
        "effect_without_success": {str(k): int(v) for k, v in effect_not_success},
        "effect_mismatched": mismatched,
        "crashes_caused": c.crashes, "crashes_recorded": outcomes["crash"],
        "worker_kills": c.worker_kills, "worker_kills_mid_run": c.worker_kills_mid_run,
        "instance_kills": c.instance_kills, "instance_kill_runs": c.instance_kill_runs,
        "restart_runs": c.restart_runs, "unexpected_exits": len(c.unexpected_exits),
        "outcomes": dict(outcomes), "total_skipped": skipped_total, "off_grid_runs": off_grid,
        "runs_per_s": round(started_runs / seconds, 1), "log_error_lines": problems["error_lines"],
        "logs": str(chaos.outdir),
    }


def dependent_runs(db: Db, until: datetime) -> tuple[list[str], list[str], int, list[str]]:
    """Each dependent's runs against its upstream's successes: (missing, extra, runs of dependents, stuck).

    Missing: an upstream success that closed before `until` (one whose row its history level dropped:
    its job's insert before `until`) whose plan time the dependent has no run of
    (any outcome; a plan given and not yet started at the end counts: pgsched._upstream_plans). Extra: a
    dependent run or plan whose plan time is no success of its upstream, or a plan time it ran or was
    given twice (the unique key forbids running it twice; checked anyway). Stuck: a plan given more than
    a minute before `until` and still not started (a backlog that does not drain would pass the rest)."""
    missing: list[str] = []
    extra: list[str] = []
    total = 0
    for dep, up in db.rows("SELECT job_id, depends_on[1] FROM pgsched.job WHERE job_name LIKE 'dep %' "
                           "ORDER BY job_id"):
        # An upstream of history 'failures' keeps no row of its successes: theirs are its effect rows
        # whose run's row went at its close (a run with an effect and a kept row ended otherwise: a
        # crash after its job committed, or is still running).
        ok = {(p, f) for p, f in db.rows(
            "SELECT plan_time, finished_at FROM pgsched.job_run WHERE job_id = %s AND outcome = 'success' "
            "UNION ALL SELECT e.plan_time, e.at FROM chaos.effect e WHERE e.job_id = %s "
            "AND NOT EXISTS (SELECT 1 FROM pgsched.job_run r WHERE r.run_id = e.run_id)", (up, up))}
        planned = Counter(p for (p,) in db.rows("SELECT plan_time FROM pgsched.job_run WHERE job_id = %s "
                                                "UNION ALL SELECT plan_time FROM pgsched._upstream_plans "
                                                "WHERE job_id = %s", (dep, dep)))
        total += sum(planned.values())
        ok_plans = {p for p, _ in ok}
        missing += [f"job {dep}: no run for plan {p.isoformat()} of upstream {up}"
                    for p, f in sorted(ok) if f <= until and p not in planned]
        extra += [f"job {dep}: {n} run(s) of plan {p.isoformat()}, upstream {up} succeeded for it "
                  f"{int(p in ok_plans)} time(s)" for p, n in sorted(planned.items()) if n > 1 or p not in ok_plans]
    stuck = [f"job {j}: plan {p.isoformat()} given and not started" for j, p in db.rows(
        "SELECT job_id, plan_time FROM pgsched._upstream_plans WHERE plan_time < %s - interval '1 minute' "
        "ORDER BY job_id, plan_time", (until,))]
    return missing, extra, total, stuck


def dump(c: Cluster, dsn: str, outdir: Path) -> None:
    """Keep what a post-mortem needs: the server log and the run and effect tables as CSV."""
    if c.logfile.exists():
        shutil.copyfile(c.logfile, outdir / "postgresql.log")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, query in (("job_run.csv", "COPY (SELECT * FROM pgsched.job_run ORDER BY run_id) TO STDOUT "
                                             "WITH (FORMAT csv, HEADER)"),
                            ("effect.csv", "COPY (SELECT * FROM chaos.effect ORDER BY run_id) TO STDOUT "
                                           "WITH (FORMAT csv, HEADER)")):
            with open(outdir / name, "wb") as f, conn.cursor().copy(query) as copy:
                for chunk in copy:
                    f.write(chunk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the chaos (default 10; fractions allowed)")
    ap.add_argument("--jobs", type=int, default=200, help="command jobs, every 1 to 5 s (default 200)")
    ap.add_argument("--instances", type=int, default=3, help="pgsched serve instances (default 3)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    ap.add_argument("--max-workers", type=int, default=6, help="--max-workers of each instance (default 6)")
    ap.add_argument("--max-sleep", type=float, default=0.4, help="longest sleep of a run, seconds (default 0.4)")
    ap.add_argument("--crash-wait", type=float, default=None, help="passed to serve (default: serve's own)")
    ap.add_argument("--dependents", type=int, default=0,
                    help="jobs without a schedule, each run after one of the others (default 0)")
    ap.add_argument("--history-failures", action="store_true",
                    help="every other job keeps only its failures' rows (history => 'failures')")
    args = ap.parse_args()
    if args.minutes * 60 < 2 * QUIET_TAIL:
        ap.error(f"--minutes must be at least {2 * QUIET_TAIL / 60:.2f}")
    if args.instances < 2:
        ap.error("--instances must be at least 2 (one is killed at a time, another must live)")
    if args.seed is None:
        args.seed = int(time.time()) % 100_000
    rng = random.Random(args.seed)
    outdir = RESULTS / f"chaos-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    outdir.mkdir(parents=True)

    with cluster() as (c, dsn):
        base, rate = create_jobs(dsn, args.jobs, rng, args.max_sleep, args.dependents, args.history_failures)
        busy = rate * (args.max_sleep / 3 + 0.005)
        print(f"{stamp()} seed {args.seed}: {args.jobs} jobs, about {rate:.0f} runs/s needing {busy:.1f} busy "
              f"workers of {args.instances * args.max_workers}; logs in {outdir}", flush=True)
        chaos = Chaos(c, dsn, args, rng, outdir)
        try:
            start, end = chaos.run(base)
        finally:
            chaos.kill_everything()
        db = Db(dsn)
        result = analyse(db, chaos, start, end)
        db.close()
        chaos.db.close()
        dump(c, dsn, outdir)
    print(json.dumps(result), flush=True)
    if result["duplicates"] or result["missed_outside_policy"] or result["dependent_missing"] \
            or result["dependent_extra"] or result["dependent_stuck"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
