"""What the operator commands read and do in the database: only through the public views
(pgsched.jobs, job_stats, job_history, instances: security_invoker, so row-level security
applies to whoever runs the command) and the public API functions (alter_job, trigger_job,
cancel_job). Every statement has its parameters bound; nothing is built from user input."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader

from pgsched import migrate
from pgsched.config import redact, scrub
from pgsched.errors import PgschedError, first_line

Conn = psycopg.Connection[dict[str, Any]]
Row = dict[str, Any]


class Unreachable(PgschedError):
    """The database cannot be reached (its message names the DSN without its password)."""


class JobNotFound(PgschedError):
    """No job visible to this role has that id or name."""


class AmbiguousJob(PgschedError):
    """Several visible jobs have that name (of different owners)."""


class _EdgeTimestamptzLoader(TimestamptzLoader):
    """timestamptz as datetime, with 'infinity' and times beyond datetime's years (rows written
    by hand: alter_job refuses them, and the scheduler disables such a job) read as datetime's
    first or last instant instead of an error that fails the whole listing."""

    def load(self, data: Any) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data)
            early = text.startswith(b"-") or text.endswith(b" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


def tolerate_edge_times(conn: Conn) -> None:
    """Read any timestamptz on `conn` (an operator's: the CLI's, the dashboard's) without failing."""
    conn.adapters.register_loader("timestamptz", _EdgeTimestamptzLoader)


@contextmanager
def connect(dsn: str) -> Iterator[Conn]:
    """A connection for one command, after checking that the schema serves this pgsched."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row, application_name="pgsched cli",
                               connect_timeout=10)
    except psycopg.Error as e:
        raise Unreachable(scrub(f"cannot connect to {redact(dsn) or 'the default database'}: {first_line(e)}",
                                dsn)) from None
    tolerate_edge_times(conn)
    with conn:
        migrate.check_version(conn)
        yield conn


@dataclass(frozen=True)
class JobRef:
    job_id: int
    job_name: str


def resolve_job(conn: Conn, ref: str) -> JobRef:
    """A job by id (digits) or by name, among the jobs this role may see."""
    if ref.isascii() and ref.isdigit():  # not '²' or other digits int() refuses
        rows = conn.execute("SELECT job_id, job_name FROM pgsched.jobs WHERE job_id = %s", (int(ref),)).fetchall()
    else:
        rows = conn.execute("SELECT job_id, job_name, owner::text AS owner FROM pgsched.jobs WHERE job_name = %s "
                            "ORDER BY job_id", (ref,)).fetchall()
    if not rows:
        raise JobNotFound(f"job {ref!r} not found: JOB is a job id or the name of a job you may see "
                          "(see `pgsched jobs`)")
    if len(rows) > 1:
        which = ", ".join(f"{r['job_id']} (owner {r['owner']})" for r in rows)
        raise AmbiguousJob(f"job name {ref!r} is ambiguous: jobs {which}; give the job id instead")
    return JobRef(rows[0]["job_id"], rows[0]["job_name"])


# The last run that ended, per job: what `jobs` and `status` show as "last outcome".
_LAST_RUN = """
    LEFT JOIN LATERAL (
        SELECT h.outcome AS last_outcome, h.finished_at AS last_outcome_at
          FROM pgsched.job_history h
         WHERE h.job_id = s.job_id AND h.outcome NOT IN ('running', 'queued')
         ORDER BY h.run_id DESC LIMIT 1) lr ON true"""


# The one rule of a failing job (`pgsched jobs --failing`, the dashboard's problems), from the
# per-job counters of job_stats `s` alone, so no history is read: its plan runs fail or crash in
# a row. A run in progress is already counted in consecutive_crashes (crash accounting counts a
# crash at the start and takes it back at the end), so that one is not held against the job.
FAILING = ("(s.consecutive_failures > 0 "
           " OR s.consecutive_crashes > CASE WHEN s.current_run_id IS NULL THEN 0 ELSE 1 END)")


def jobs(conn: Conn, *, state: str | None = None, failing: bool = False, owner: str | None = None) -> list[Row]:
    return conn.execute(
        "SELECT s.job_id, s.job_name, s.owner::text AS owner, j.kind, j.schedule, j.priority, s.state, s.next_start, "
        "       lr.last_outcome, lr.last_outcome_at, s.consecutive_failures, s.consecutive_crashes, "
        "       s.disabled_reason, j.concurrency_key, j.depends_on, s.waiting_for "
        "  FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id" + _LAST_RUN +
        " WHERE (%(state)s::text IS NULL OR s.state = %(state)s) "
        "   AND (%(owner)s::text IS NULL OR s.owner::text = %(owner)s) "
        "   AND (NOT %(failing)s OR " + FAILING + ") "
        " ORDER BY s.job_id",
        {"state": state, "owner": owner, "failing": failing}).fetchall()


def concurrency_limits(conn: Conn) -> list[Row]:
    """pgsched.concurrency_limits: every key in use or with a limit (the jobs counted are those you may see)."""
    return conn.execute(
        "SELECT concurrency_key, max_running, is_default, running, jobs, waiting "
        "  FROM pgsched.concurrency_limits ORDER BY concurrency_key").fetchall()


def history(conn: Conn, *, job_id: int | None = None, outcome: str | None = None,
            since: timedelta | None = None, limit: int = 20) -> list[Row]:
    return conn.execute(
        "SELECT run_id, job_id, job_name, scope, trigger, attempt, plan_time, started_at, finished_at, outcome, "
        "       extract(epoch FROM duration)::float8 AS duration_s, "
        "       extract(epoch FROM started_at - plan_time)::float8 AS lag_s, sqlstate, "
        "       split_part(message, E'\\n', 1) AS message "
        "  FROM pgsched.job_history "
        " WHERE (%(job)s::integer IS NULL OR job_id = %(job)s) "
        "   AND (%(outcome)s::text IS NULL OR outcome = %(outcome)s) "
        "   AND (%(since)s::interval IS NULL OR coalesce(finished_at, started_at) >= now() - %(since)s) "
        " ORDER BY run_id DESC LIMIT %(limit)s",
        {"job": job_id, "outcome": outcome, "since": since, "limit": limit}).fetchall()


def job_schedule(conn: Conn, job_id: int) -> Row:
    """What pgsched.schedule needs to compute a job's next starts (as store.schedule_from_row reads it)."""
    row = conn.execute(
        "SELECT j.schedule, j.fixed_schedule, j.initial_start, j.timezone, j.next_start, j.schedule_delay, j.exclude, "
        "       pgsched._iv_months(j.schedule_interval) AS months, pgsched._iv_days(j.schedule_interval) AS days, "
        "       pgsched._iv_micros(j.schedule_interval) AS micros "
        "  FROM pgsched.jobs j WHERE j.job_id = %s", (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    return row


def instances(conn: Conn, *, all_: bool = False) -> list[Row]:
    """Instances (the stopped ones too with all_), with workers busy out of total."""
    return conn.execute(
        "SELECT instance_id, host, pid, version, max_workers, runs_in_progress, started_at, heartbeat_at, "
        "       stopped_at, alive, extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s "
        "  FROM pgsched.instances "
        " WHERE %s OR stopped_at IS NULL ORDER BY instance_id", (all_,)).fetchall()


def run_counts(conn: Conn) -> list[Row]:
    """Runs that ended in the last 5 and 60 minutes, by outcome (per minute is the caller's arithmetic)."""
    return conn.execute(
        "SELECT outcome, count(*) FILTER (WHERE finished_at >= now() - interval '5 minutes') AS last_5m, "
        "       count(*) AS last_60m "
        "  FROM pgsched.job_history "
        " WHERE finished_at >= now() - interval '60 minutes' AND outcome NOT IN ('running', 'queued') "
        " GROUP BY outcome ORDER BY outcome").fetchall()


def last_errors(conn: Conn, limit: int = 5) -> list[Row]:
    return conn.execute(
        "SELECT run_id, job_id, job_name, outcome, finished_at, sqlstate, split_part(message, E'\\n', 1) AS message "
        "  FROM pgsched.job_history WHERE outcome IN ('failure', 'timeout', 'crash') "
        " ORDER BY run_id DESC LIMIT %s", (limit,)).fetchall()


def db_now(conn: Conn) -> datetime:
    row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]  # type: ignore[no-any-return]


def set_scheduled(conn: Conn, job_id: int, scheduled: bool) -> None:
    """Pause (False) or resume (True) through alter_job: its checks and rights apply."""
    conn.execute("SELECT pgsched.alter_job(%s, scheduled => %s)", (job_id, scheduled))


def trigger(conn: Conn, job_id: int) -> datetime:
    """Ask the schedulers to run the job now (trigger_job): the manual run's plan_time."""
    row = conn.execute("SELECT pgsched.trigger_job(%s) AS plan_time", (job_id,)).fetchone()
    assert row is not None
    return row["plan_time"]  # type: ignore[no-any-return]


def manual_run(conn: Conn, job_id: int, plan_time: datetime) -> Row | None:
    """The run a trigger started, once a scheduler started it."""
    return conn.execute(
        "SELECT run_id, outcome, started_at, finished_at, sqlstate, split_part(message, E'\\n', 1) AS message "
        "  FROM pgsched.job_history WHERE job_id = %s AND trigger = 'manual' AND plan_time = %s AND scope = ''",
        (job_id, plan_time)).fetchone()


def cancel(conn: Conn, job_id: int) -> list[int]:
    """Ask the scheduler holding the job's runs in progress to cancel them (cancel_job)."""
    return [r["r"] for r in conn.execute("SELECT r FROM pgsched.cancel_job(%s) AS r", (job_id,))]


def session_runs(conn: Conn, job_id: int) -> list[Row]:
    """Runs of the job in progress in somebody's session (run_job), which cancel_job does not reach."""
    return conn.execute(
        "SELECT run_id, backend_pid FROM pgsched.job_history "
        " WHERE job_id = %s AND outcome = 'running' AND instance_id IS NULL", (job_id,)).fetchall()


def run_outcomes(conn: Conn, run_ids: list[int]) -> dict[int, str]:
    return {r["run_id"]: r["outcome"] for r in conn.execute(
        "SELECT run_id, outcome FROM pgsched.job_history WHERE run_id = ANY(%s)", (run_ids,))}


def event_details(conn: Conn, run_id: int | None, job_id: int) -> Row | None:
    """What an event's ids stand for, as far as this role may see (None: not visible): the job's
    name and state, and the run's outcome, attempt, plan time and error."""
    if run_id is not None:
        return conn.execute(
            "SELECT h.job_id, h.job_name, h.outcome, h.attempt, h.plan_time, h.sqlstate, "
            "       split_part(h.message, E'\\n', 1) AS message, s.state, s.disabled_reason, "
            "       extract(epoch FROM now() - h.finished_at)::float8 AS ended_ago_s "
            "  FROM pgsched.job_history h JOIN pgsched.job_stats s ON s.job_id = h.job_id WHERE h.run_id = %s",
            (run_id,)).fetchone()
    return conn.execute("SELECT job_id, job_name, NULL AS outcome, NULL AS attempt, NULL AS plan_time, "
                        "       NULL AS sqlstate, NULL AS message, state, disabled_reason, NULL AS ended_ago_s "
                        "  FROM pgsched.job_stats WHERE job_id = %s", (job_id,)).fetchone()


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


# The longest duration a window may be: a century reaches back past any history kept, and its
# start stays within what PostgreSQL's timestamps and Python's timedelta can hold.
MAX_DURATION_DAYS = 36_525


def parse_duration(text: str, argument: str) -> timedelta:
    """'90s', '15m', '1h', '2d', '1w', or combinations ('1h30m'), up to MAX_DURATION_DAYS;
    ValueError naming the argument."""
    pos, total = 0, 0.0
    text = text.strip()
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(f"{argument}: {text!r} is not a duration; use a number and a unit s, m, h, d or w "
                         "(e.g. 90s, 15m, 1h30m, 2d)")
    if not total <= MAX_DURATION_DAYS * 86400:  # (an overflow to infinity included)
        raise ValueError(f"{argument}: {text!r} is longer than a duration may be; give at most "
                         f"{MAX_DURATION_DAYS}d")
    return timedelta(seconds=total)
