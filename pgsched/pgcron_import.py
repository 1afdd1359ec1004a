"""`pgsched import pg-cron`: move the jobs of a running pg_cron into pgsched.

Owns the translation of pg_cron's catalog (cron.job, and with history cron.job_run_details)
into pgsched jobs, and the switch-over: the pgsched jobs are written, and with
`disable_source` the pg_cron jobs set inactive, in ONE transaction, so at no instant do both
schedulers (or neither) have a job. That needs pgsched's catalog in the database that holds
cron.job (pg_cron's cron.database_name): one connection, one transaction. Into another
database the import works without `disable_source` (the switch is then the operator's).

Each imported job keeps pg_cron's name, owner (the job is created as that role), schedule,
command, database (pgsched's `database` setting when it is not the one imported into) and active
flag; its config records where it came from ({"pg_cron": {"jobid": N,
"source": "<database>"}}), which is how a second import finds it: it changes nothing that is
already as the source says (idempotent), and a job this import made inactive in pg_cron keeps
its pgsched active flag. What cannot be translated is listed with the reason and left alone
(its pg_cron job stays active): an owner role that does not exist here or cannot log in, a
database that role may not connect to, a schedule pgsched refuses, a name already used by a
pgsched job of that role that was not imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgsched.config import redact, scrub
from pgsched.errors import PgschedError, first_line


class ImportRefused(PgschedError):
    """The import cannot run as asked (no pg_cron, no pgsched, a switch-over across databases)."""


@dataclass
class ImportReport:
    created: list[tuple[int, int]] = field(default_factory=list)  # (pg_cron jobid, pgsched job_id)
    updated: list[tuple[int, int]] = field(default_factory=list)
    unchanged: list[tuple[int, int]] = field(default_factory=list)
    skipped: list[tuple[int, str | None, str]] = field(default_factory=list)  # (jobid, jobname, why)
    disabled_in_source: list[int] = field(default_factory=list)
    history_rows: int = 0

    def lines(self) -> list[str]:
        out = [f"pg_cron jobs: {len(self.created)} created, {len(self.updated)} updated, "
               f"{len(self.unchanged)} unchanged, {len(self.skipped)} not imported"]
        out += [f"  pg_cron job {src} -> pgsched job {dst} (new)" for src, dst in self.created]
        out += [f"  pg_cron job {src} -> pgsched job {dst} (updated)" for src, dst in self.updated]
        if self.disabled_in_source:
            out.append(f"set inactive in pg_cron: {', '.join(map(str, self.disabled_in_source))}")
        if self.history_rows:
            out.append(f"history: {self.history_rows} run(s) copied")
        out += [f"  NOT imported: pg_cron job {src}{f' ({name!r})' if name else ''}: {why}"
                for src, name, why in self.skipped]
        return out


def _read_source(conn: psycopg.Connection[Any]) -> tuple[str, list[dict[str, Any]]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'")
        if cur.fetchone() is None:
            raise ImportRefused("the source database has no pg_cron extension (it lives in the database named "
                                "by pg_cron's cron.database_name)")
        # Where pg_cron runs a job: in a background worker of this server (cron.use_background_workers),
        # whatever its nodename says; else over a connection to nodename:nodeport, which is this
        # server for its cron.host ('localhost' by default), '' (the Unix socket), a loopback address,
        # at the server's port. A job of another is not this server's to run.
        cur.execute("SELECT current_database() AS db, current_setting('port')::int AS port, "
                    "coalesce(current_setting('cron.host', true), 'localhost') AS host, "
                    "coalesce(current_setting('cron.use_background_workers', true), 'off') = 'on' AS workers")
        row = cur.fetchone()
        assert row is not None
        cur.execute("SELECT jobid, schedule, command, nodename, nodeport, database, username, active, jobname, "
                    "       %s OR (coalesce(nodename, '') IN ('', 'localhost', '127.0.0.1', '::1', %s) "
                    "              AND nodeport = %s) AS here "
                    "FROM cron.job ORDER BY jobid FOR UPDATE", (row["workers"], row["host"], row["port"]))
        return str(row["db"]), list(cur.fetchall())


def _read_history(conn: psycopg.Connection[Any], jobids: list[int]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute("SELECT jobid, runid, job_pid, status, return_message, start_time, end_time "
                    "FROM cron.job_run_details WHERE jobid = ANY (%s) AND start_time IS NOT NULL "
                    "AND status IN ('succeeded', 'failed') ORDER BY runid", (jobids,))
        return list(cur.fetchall())


def _find_imported(cur: psycopg.Cursor[Any], source: str, jobid: int) -> dict[str, Any] | None:
    cur.execute("SELECT job_id, job_name, owner::text AS owner, schedule, command, scheduled, config, database "
                "FROM pgsched.job WHERE config @> %s", (Jsonb({"pg_cron": {"jobid": jobid, "source": source}}),))
    return cur.fetchone()


def _translate(cur: psycopg.Cursor[Any], here: str, source: str, job: dict[str, Any],
               disable_source: bool, report: ImportReport) -> int | None:
    """Create or update the pgsched job of one pg_cron job; its id, or None (listed in report.skipped)."""
    jobid, name = int(job["jobid"]), job["jobname"]
    if not job["here"]:
        report.skipped.append((jobid, name, f"it runs on another server ({job['nodename']}:{job['nodeport']}); "
                                            "pgsched runs a job on the server of its own database"))
        return None
    # A job in another database keeps it (pgsched's `database` setting: its runs' sessions open there).
    db = job["database"] or source
    database = None if db == here else db
    cur.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (job["username"],))
    role = cur.fetchone()
    if role is None or not role["rolcanlogin"]:
        report.skipped.append((jobid, name, f"its user {job['username']} does not exist here or cannot log in"))
        return None
    provenance = {"pg_cron": {"jobid": jobid, "source": source, "disabled_source": disable_source}}
    existing = _find_imported(cur, source, jobid)
    # An inactive source job that a switch-over made inactive keeps the pgsched job's flag.
    active = bool(job["active"])
    if existing is not None and not active and existing["config"]["pg_cron"].get("disabled_source"):
        active = bool(existing["scheduled"])
        provenance["pg_cron"]["disabled_source"] = True
    cur.execute("SAVEPOINT pg_cron_job")
    try:
        # As the job's owner, as pg_cron runs it: pgsched's own checks see the real owner.
        cur.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(job["username"])))
        if existing is None:
            if name:
                cur.execute("SELECT 1 FROM pgsched.job WHERE owner = current_user::regrole AND job_name = %s",
                            (name,))
                if cur.fetchone() is not None:
                    raise _Skip(f"role {job['username']} already has a pgsched job named {name!r} that was not "
                                "imported from pg_cron")
                cur.execute("SELECT pgsched.schedule(%s, %s, %s) AS id", (name, job["schedule"], job["command"]))
            else:
                cur.execute("SELECT pgsched.schedule(%s, %s) AS id", (job["schedule"], job["command"]))
            row = cur.fetchone()
            assert row is not None
            job_id = int(row["id"])
            cur.execute("SELECT * FROM pgsched.alter_job(%s, config => %s, scheduled => %s, database => %s)",
                        (job_id, Jsonb(provenance), active, database))
            report.created.append((jobid, job_id))
        else:
            job_id = int(existing["job_id"])
            same = (existing["schedule"], existing["command"], existing["owner"], existing["scheduled"],
                    existing["database"]) == (job["schedule"].strip(), job["command"], job["username"], active,
                                              database)
            if same and (not name or existing["job_name"] == name):
                report.unchanged.append((jobid, job_id))
            else:
                if existing["owner"] != job["username"]:
                    raise _Skip(f"it was imported as pgsched job {job_id} of role {existing['owner']}, and its user "
                                f"is now {job['username']}: unschedule that job and import again")
                # database '' is the scheduler's own again.
                cur.execute("SELECT * FROM pgsched.alter_job(%s, schedule => %s, scheduled => %s, job_name => %s, "
                            "config => %s, database => %s)",
                            (job_id, job["schedule"], active, name, Jsonb(provenance), database or ""))
                cur.execute("UPDATE pgsched.job SET command = %s WHERE job_id = %s", (job["command"], job_id))
                report.updated.append((jobid, job_id))
        cur.execute("RESET ROLE")
        cur.execute("RELEASE SAVEPOINT pg_cron_job")
        return job_id
    except (_Skip, psycopg.Error) as e:
        if isinstance(e, psycopg.Error) and (e.sqlstate or "")[:2] not in _REFUSED:
            raise
        cur.execute("ROLLBACK TO SAVEPOINT pg_cron_job")
        cur.execute("RESET ROLE")
        why = str(e) if isinstance(e, _Skip) else (e.diag.message_primary or str(e))
        report.skipped.append((jobid, name, why))
        return None


def _connect(dsn: str, which: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection to `which` database; an error names it and its DSN, without the password."""
    try:
        return psycopg.connect(dsn)
    except psycopg.Error as e:
        raise ImportRefused(f"cannot connect to {which} {redact(dsn)}: {scrub(first_line(e), dsn)}") from None


# What pgsched's API refuses a job with (by SQLSTATE class): bad data (22: a schedule it does not
# take, such as '@reboot'), bad names and rights (42), a database that is not there (3D). That job
# is listed and left with pg_cron; any other error stops the import, writing nothing.
_REFUSED = ("22", "42", "3D")


class _Skip(Exception):
    """One job cannot be imported (the reason is the message)."""


def import_pg_cron(source_dsn: str, target_dsn: str | None, *, history: bool, disable_source: bool) -> ImportReport:
    """Import pg_cron's jobs from `source_dsn` into pgsched at `target_dsn` (None: the same database)."""
    report = ImportReport()
    same = target_dsn is None
    if disable_source and not same:
        raise ImportRefused("--disable-source switches over in one transaction, which needs pgsched in the database "
                            "that holds cron.job: leave out --target (install pgsched there), or import without "
                            "--disable-source and set the pg_cron jobs inactive yourself")
    with _connect(source_dsn, "pg_cron's database (--dsn)") as src:
        tgt = src if same else _connect(target_dsn or "", "pgsched's database (--target)")
        try:
            source, jobs = _read_source(src)
            with tgt.cursor(row_factory=dict_row) as cur:
                cur.execute("SELECT to_regprocedure('pgsched.schedule(text, text, text)') IS NOT NULL AS ok, "
                            "current_database() AS here")
                row = cur.fetchone()
                assert row is not None
                if not row["ok"]:
                    raise ImportRefused("the target database has no pgsched schema: run `pgsched init` there first")
                here = str(row["here"])
                imported: dict[int, int] = {}
                for job in jobs:
                    job_id = _translate(cur, here, source, job, disable_source, report)
                    if job_id is not None:
                        imported[int(job["jobid"])] = job_id
                if history and imported:
                    for r in _read_history(src, list(imported)):
                        cur.execute(
                            "INSERT INTO pgsched.job_run_live (job_id, plan_time, trigger, started_at, finished_at, "
                            "outcome, message, backend_pid) VALUES (%s, %s, 'schedule', %s, %s, %s, %s, %s) "
                            "ON CONFLICT ON CONSTRAINT job_run_plan_key DO NOTHING RETURNING 1",
                            (imported[int(r["jobid"])], r["start_time"], r["start_time"], r["end_time"],
                             "success" if r["status"] == "succeeded" else "failure", r["return_message"],
                             r["job_pid"]))
                        report.history_rows += len(cur.fetchall())
                if disable_source and imported:
                    cur.execute("UPDATE cron.job SET active = false WHERE jobid = ANY (%s) AND active RETURNING jobid",
                                (list(imported),))
                    report.disabled_in_source = sorted(int(r["jobid"]) for r in cur.fetchall())
            tgt.commit()
        finally:
            if tgt is not src:
                tgt.close()
    return report
