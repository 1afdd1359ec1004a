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

from pgsched.ops.query import _LAST_RUN, FAILING, Conn, JobNotFound, Row

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
    # The page first (sorted, limited), then the last outcome and the strip for its jobs only;
    # the last outcome of every job is read only to sort by it.
    by_outcome = sort == "last_outcome"
    rows = conn.execute(sql.SQL(
        "SELECT s.*, lr.last_outcome, lr.last_outcome_at, st.strip FROM ("
        "  SELECT s.job_id, s.job_name, s.owner::text AS owner, j.kind, j.schedule, j.timezone, j.scheduled, "
        "         s.state, s.next_start, s.consecutive_failures, s.disabled_reason, "
        "         row_number() OVER (ORDER BY {order} {direction}, s.job_id) AS pos "
        "    FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id {last_run} "
        "   WHERE " + where +
        "   ORDER BY {order} {direction}, s.job_id LIMIT %(limit)s OFFSET %(offset)s) s" + _LAST_RUN +
        " LEFT JOIN LATERAL ("
        "  SELECT array_agg(x.outcome ORDER BY x.run_id) AS strip FROM ("
        "    SELECT h.outcome, h.run_id FROM pgsched.job_history h "
        "     WHERE h.job_id = s.job_id AND h.outcome NOT IN ('running', 'queued') "
        "     ORDER BY h.run_id DESC LIMIT " + str(STRIP) + ") x) st ON true "
        "ORDER BY s.pos").format(order=order, direction=direction,
                                  last_run=sql.SQL(_LAST_RUN if by_outcome else "")), params).fetchall()
    return JobsPage(rows, int(total["n"]))


def job(conn: Conn, job_id: int) -> Row:
    """A visible job's settings (pgsched.jobs) and counters (pgsched.job_stats)."""
    row = conn.execute(
        "SELECT j.*, j.owner::text AS owner, s.state, s.last_start, s.last_finish, s.last_successful_finish, "
        "       s.total_runs, s.total_successes, s.total_failures, s.total_crashes, s.total_skipped, "
        "       s.total_missed, s.consecutive_failures, s.consecutive_crashes, s.disabled_reason, "
        "       s.last_run_duration, s.next_due, s.waiting_for "
        "  FROM pgsched.jobs j JOIN pgsched.job_stats s ON s.job_id = j.job_id WHERE j.job_id = %s",
        (job_id,)).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found (or not yours to see)")
    return row


def problems(conn: Conn, limit: int = 100) -> list[Row]:
    """Jobs failing (FAILING) or disabled, with their reason: the overview's list (the
    first `limit`, disabled first). The history is read only for the jobs listed."""
    return conn.execute(
        "SELECT s.*, lr.last_outcome, lr.last_outcome_at FROM ("
        "  SELECT s.job_id, s.job_name, s.owner::text AS owner, s.state, s.consecutive_failures, "
        "         s.consecutive_crashes, s.disabled_reason "
        "    FROM pgsched.job_stats s "
        "   WHERE s.state = 'disabled' OR " + FAILING + " "
        "   ORDER BY s.state = 'disabled' DESC, s.consecutive_failures + s.consecutive_crashes DESC, s.job_id "
        "   LIMIT %s) s" + _LAST_RUN + " ORDER BY s.state = 'disabled' DESC, "
        "  s.consecutive_failures + s.consecutive_crashes DESC, s.job_id", (limit,)).fetchall()


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
# plan time) to its end (a run in progress: now). A run is in a window when it began before
# the window's end and ended after its start, or has not ended: written so that the index on
# job_run (finished_at) serves it as one range plus its NULLs (bench/web.py --no-window-index
# shows the pages without it).
_RUN_FROM = "coalesce(h.started_at, h.plan_time)"
_RUN_TO = "coalesce(h.finished_at, greatest(now(), coalesce(h.started_at, h.plan_time)))"
_IN_WINDOW = (f"{_RUN_FROM} < %(end)s AND (h.finished_at >= %(start)s OR h.finished_at IS NULL) "
              "AND h.outcome <> 'queued'")


def timeline_jobs(conn: Conn, limit: int, offset: int = 0) -> tuple[list[Row], int]:
    """One page of the visible jobs (by id): a timeline's rows, and how many jobs there are.
    A timeline pages through jobs rather than choosing the busiest: choosing would read every
    run of the window first."""
    rows = conn.execute("SELECT s.job_id, s.job_name FROM pgsched.job_stats s ORDER BY s.job_id "
                        "LIMIT %s OFFSET %s", (limit, offset)).fetchall()
    total = conn.execute("SELECT count(*) AS n FROM pgsched.job_stats").fetchone()
    assert total is not None
    return rows, int(total["n"])


def timeline_runs(conn: Conn, start: datetime, end: datetime, job_ids: list[int]) -> list[Row]:
    """Every run of these jobs in the window, one row each."""
    return conn.execute(
        f"SELECT h.run_id, h.job_id, h.outcome, h.trigger, h.plan_time, {_RUN_FROM} AS run_from, "
        f"       {_RUN_TO} AS run_to, h.sqlstate, split_part(h.message, E'\\n', 1) AS message "
        f"  FROM pgsched.job_history h "
        f" WHERE {_IN_WINDOW} AND h.job_id = ANY(%(jobs)s) ORDER BY h.job_id, h.run_id",
        {"start": start, "end": end, "jobs": job_ids}).fetchall()


def timeline_buckets(conn: Conn, start: datetime, end: datetime, job_ids: list[int],
                     bucket: timedelta) -> list[Row]:
    """The window's runs counted per job, per `bucket` of time (by start) and per outcome."""
    return conn.execute(
        f"SELECT h.job_id, date_bin(%(bucket)s, greatest({_RUN_FROM}, %(start)s), %(start)s) AS bucket_start, "
        f"       h.outcome, count(*) AS n "
        f"  FROM pgsched.job_history h "
        f" WHERE {_IN_WINDOW} AND h.job_id = ANY(%(jobs)s) GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        {"start": start, "end": end, "jobs": job_ids, "bucket": bucket}).fetchall()


def fingerprint(conn: Conn) -> str:
    """Changes whenever a visible job's run starts or ends (its last_start, last_finish and
    counters move), or a visible job is changed, paused, disabled, added or removed. From
    the one-row-per-job views only: never a scan of the history."""
    row = conn.execute(
        "SELECT concat_ws(':', count(*), sum(s.total_runs), sum(s.total_skipped + s.total_missed), "
        "                 max(s.last_start), max(s.last_finish), "
        "                 count(*) FILTER (WHERE s.state <> 'scheduled'), count(*) FILTER (WHERE NOT j.scheduled), "
        "                 max(j.updated_at)) AS v "
        "  FROM pgsched.job_stats s JOIN pgsched.jobs j ON j.job_id = s.job_id").fetchone()
    assert row is not None
    return str(row["v"])
