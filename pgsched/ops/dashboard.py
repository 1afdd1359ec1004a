"""What the web dashboard (pgsched/web) reads beyond the operator commands' queries in
`query`: a page of the jobs list (search, sort, paging, the last outcomes as a strip), one
job with its counters, runs per minute, the runs of a time window (or their buckets), and a
fingerprint that changes when anything visible changes (the live refresh polls it).

Like `query`, only through the public views (security_invoker: row-level security decides
for the signed-in role); every value is a bound parameter, and the ORDER BY comes from a
fixed table of SQL fragments, never from the request's text."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg import sql

from pgsched.ops.query import _LAST_RUN, Conn, JobNotFound, Row

# Sort keys a request may name, and the SQL each stands for (anything else: the default).
SORTS: dict[str, sql.Composable] = {
    "id": sql.SQL("s.job_id"),
    "name": sql.SQL("s.job_name"),
    "owner": sql.SQL("s.owner::text"),
    "state": sql.SQL("s.state"),
    "next_start": sql.SQL("s.next_start"),
    "last_outcome": sql.SQL("lr.last_outcome"),
}
STRIP = 20


def _like(text: str) -> str:
    """`text` as an ILIKE pattern that matches it anywhere, its wildcards taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


@dataclass(frozen=True)
class JobsPage:
    rows: list[Row]
    total: int


def jobs_page(conn: Conn, *, search: str = "", sort: str = "id", descending: bool = False,
              limit: int = 50, offset: int = 0) -> JobsPage:
    """One page of the visible jobs whose name, owner or schedule contains `search`."""
    order = SORTS.get(sort, SORTS["id"])
    direction = sql.SQL("DESC NULLS LAST" if descending else "ASC NULLS LAST")
    where = ("(%(q)s = '' OR s.job_name ILIKE %(pat)s OR s.owner::text ILIKE %(pat)s "
             "OR j.schedule ILIKE %(pat)s)")
    params = {"q": search, "pat": _like(search), "limit": limit, "offset": offset}
    total = conn.execute(
        "SELECT count(*) AS n FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id WHERE " + where,
        params).fetchone()
    assert total is not None
    # The page first (sorted, limited), then the strip for its jobs only.
    rows = conn.execute(sql.SQL(
        "SELECT p.*, st.strip FROM ("
        "  SELECT s.job_id, s.job_name, s.owner::text AS owner, j.kind, j.schedule, j.timezone, j.scheduled, "
        "         s.state, s.next_start, lr.last_outcome, lr.last_outcome_at, s.consecutive_failures, "
        "         s.disabled_reason, row_number() OVER (ORDER BY {order} {direction}, s.job_id) AS pos "
        "    FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id" + _LAST_RUN +
        "   WHERE " + where +
        "   ORDER BY {order} {direction}, s.job_id LIMIT %(limit)s OFFSET %(offset)s) p "
        "LEFT JOIN LATERAL ("
        "  SELECT array_agg(x.outcome ORDER BY x.run_id) AS strip FROM ("
        "    SELECT h.outcome, h.run_id FROM pgsched.job_history h "
        "     WHERE h.job_id = p.job_id AND h.outcome NOT IN ('running', 'queued') "
        "     ORDER BY h.run_id DESC LIMIT " + str(STRIP) + ") x) st ON true "
        "ORDER BY p.pos").format(order=order, direction=direction), params).fetchall()
    return JobsPage(rows, int(total["n"]))


def job(conn: Conn, job_id: int) -> Row:
    """A visible job's settings (pgsched.jobs) and counters (pgsched.job_stats)."""
    row = conn.execute(
        "SELECT j.*, j.owner::text AS owner, s.state, s.last_start, s.last_finish, s.last_successful_finish, "
        "       s.total_runs, s.total_successes, s.total_failures, s.total_crashes, s.total_skipped, "
        "       s.total_missed, s.consecutive_failures, s.consecutive_crashes, s.disabled_reason, "
        "       s.last_run_duration "
        "  FROM pgsched.jobs j JOIN pgsched.job_stats s ON s.job_id = j.job_id WHERE j.job_id = %s",
        (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found (or not yours to see)")
    return row


def runs_per_minute(conn: Conn, minutes: int = 60) -> tuple[datetime, list[Row]]:
    """Runs that ended in each of the last `minutes` minutes, by outcome; and the database's now."""
    rows = conn.execute(
        "SELECT date_trunc('minute', finished_at) AS minute, outcome, count(*) AS n "
        "  FROM pgsched.job_history "
        " WHERE finished_at >= date_trunc('minute', now()) - make_interval(mins => %s - 1) "
        "   AND outcome NOT IN ('running', 'queued') "
        " GROUP BY 1, 2 ORDER BY 1, 2", (minutes,)).fetchall()
    now = conn.execute("SELECT now() AS now").fetchone()
    assert now is not None
    return now["now"], rows


# A run's place on a timeline: from its start (a skipped or missed plan never started: its
# plan time) to its end (a run in progress: now).
_RUN_FROM = "coalesce(h.started_at, h.plan_time)"
_RUN_TO = "coalesce(h.finished_at, greatest(now(), coalesce(h.started_at, h.plan_time)))"


def timeline_count(conn: Conn, start: datetime, end: datetime, job_id: int | None = None) -> Row:
    """How many runs and jobs a window holds (so the caller decides whether to bucket)."""
    row = conn.execute(
        f"SELECT count(*) AS runs, count(DISTINCT h.job_id) AS jobs FROM pgsched.job_history h "
        f" WHERE {_RUN_FROM} < %(end)s AND {_RUN_TO} >= %(start)s "
        f"   AND (%(job)s::integer IS NULL OR h.job_id = %(job)s) AND h.outcome <> 'queued'",
        {"start": start, "end": end, "job": job_id}).fetchone()
    assert row is not None
    return row


def timeline_jobs(conn: Conn, start: datetime, end: datetime, limit: int,
                  job_id: int | None = None) -> list[Row]:
    """The jobs with runs in the window (most runs first), at most `limit` of them."""
    return conn.execute(
        f"SELECT h.job_id, min(h.job_name) AS job_name, count(*) AS runs FROM pgsched.job_history h "
        f" WHERE {_RUN_FROM} < %(end)s AND {_RUN_TO} >= %(start)s "
        f"   AND (%(job)s::integer IS NULL OR h.job_id = %(job)s) AND h.outcome <> 'queued' "
        f" GROUP BY h.job_id ORDER BY count(*) DESC, h.job_id LIMIT %(limit)s",
        {"start": start, "end": end, "job": job_id, "limit": limit}).fetchall()


def timeline_runs(conn: Conn, start: datetime, end: datetime, job_ids: list[int]) -> list[Row]:
    """Every run of these jobs in the window, one row each."""
    return conn.execute(
        f"SELECT h.run_id, h.job_id, h.outcome, h.trigger, h.plan_time, {_RUN_FROM} AS run_from, "
        f"       {_RUN_TO} AS run_to, h.sqlstate, split_part(h.message, E'\\n', 1) AS message "
        f"  FROM pgsched.job_history h "
        f" WHERE {_RUN_FROM} < %(end)s AND {_RUN_TO} >= %(start)s AND h.job_id = ANY(%(jobs)s) "
        f"   AND h.outcome <> 'queued' ORDER BY h.job_id, h.run_id",
        {"start": start, "end": end, "jobs": job_ids}).fetchall()


def timeline_buckets(conn: Conn, start: datetime, end: datetime, job_ids: list[int],
                     bucket: timedelta) -> list[Row]:
    """The window's runs counted per job, per `bucket` of time (by start) and per outcome."""
    return conn.execute(
        f"SELECT h.job_id, date_bin(%(bucket)s, greatest({_RUN_FROM}, %(start)s), %(start)s) AS bucket_start, "
        f"       h.outcome, count(*) AS n "
        f"  FROM pgsched.job_history h "
        f" WHERE {_RUN_FROM} < %(end)s AND {_RUN_TO} >= %(start)s AND h.job_id = ANY(%(jobs)s) "
        f"   AND h.outcome <> 'queued' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        {"start": start, "end": end, "jobs": job_ids, "bucket": bucket}).fetchall()


def fingerprint(conn: Conn) -> str:
    """Changes whenever a run starts or ends, or a visible job is changed, added or removed."""
    row = conn.execute(
        "SELECT concat_ws(':', (SELECT max(run_id) FROM pgsched.job_history), "
        "         (SELECT count(*) FROM pgsched.job_history WHERE outcome = 'running'), "
        "         x.n, x.runs, x.disabled, x.paused, x.changed) AS v "
        "  FROM (SELECT count(*) AS n, sum(s.total_runs) AS runs, "
        "               count(*) FILTER (WHERE s.state = 'disabled') AS disabled, "
        "               count(*) FILTER (WHERE NOT j.scheduled) AS paused, "
        "               max(j.updated_at) AS changed "
        "          FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id) x").fetchone()
    assert row is not None
    return str(row["v"])
