"""`pgsched import pg-cron` against a real pg_cron 1.4 (Debian postgresql-15-cron) in a cluster
of its own (shared_preload_libraries = 'pg_cron'): named, unnamed, inactive, other-owner and
other-database jobs are imported with --disable-source in one transaction; then pgsched runs
every imported active job on its schedule and pg_cron runs none; a second import changes
nothing. Skipped, with the reason, where the pg_cron package is not installed (./dev tries)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgsched.embedded import Cluster, find_bindir
from tests.acceptance.conftest import PGSCHED, ServeFactory, query, wait_for

SOURCE_DB = "cronsrc"


def _pg_cron_installed() -> bool:
    try:
        return (find_bindir().parent / "lib" / "pg_cron.so").exists()
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _pg_cron_installed(),
                                reason="pg_cron is not installed (Debian package postgresql-15-cron; ./dev installs it "
                                       "where it may)")


@pytest.fixture(scope="module")
def cron_cluster() -> Iterator[Cluster]:
    tmp = tempfile.mkdtemp(prefix="pgsched-pgcron-")
    Path(tmp).chmod(0o755)
    cluster = Cluster(datadir=Path(tmp) / "data", settings={
        "shared_preload_libraries": "'pg_cron'", "cron.database_name": f"'{SOURCE_DB}'",
        "cron.use_background_workers": "on", "max_worker_processes": "32", "fsync": "off",
    })
    try:
        cluster.initdb()
        cluster.start()
        cluster.wait_ready()
        with psycopg.connect(cluster.dsn(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {SOURCE_DB}")
            c.execute("CREATE DATABASE otherdb")
        cluster.restart()  # pg_cron's launcher connects to cron.database_name at start
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(tmp, ignore_errors=True)


def import_cli(dsn: str, *args: str) -> str:
    out = subprocess.run([str(PGSCHED), "import", "pg-cron", "--dsn", dsn, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def cron_jobs(dsn: str) -> list[dict[str, Any]]:
    return query(dsn, "SELECT jobid, jobname, username, database, active FROM cron.job ORDER BY jobid")


def pgsched_jobs(dsn: str) -> list[dict[str, Any]]:
    return query(dsn, "SELECT job_id, job_name, owner::text AS owner, schedule, command, scheduled, config, "
                      "database FROM pgsched.jobs ORDER BY job_id")


def test_import_switches_over_and_is_idempotent(cron_cluster: Cluster, serve: ServeFactory) -> None:
    from pgsched import migrate

    dsn = cron_cluster.dsn(SOURCE_DB)
    with psycopg.connect(cron_cluster.dsn("otherdb"), autocommit=True) as c:
        c.execute("CREATE TABLE public.ticks (job text, via text DEFAULT current_user, "
                  "at timestamptz DEFAULT clock_timestamp())")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION pg_cron")
        migrate.init(c)
        c.execute("CREATE ROLE alice LOGIN")
        # A pgsched job of the same role and name that was not imported: pg_cron's 'kept' is not imported
        # over it, and stays with pg_cron (whose runs of it show that pg_cron is alive).
        c.execute("SELECT pgsched.alter_job(pgsched.schedule('kept', '1 hour', 'SELECT 1')::integer, "
                  "scheduled => false)")
        c.execute("CREATE TABLE public.ticks (job text, via text DEFAULT current_user, "
                  "at timestamptz DEFAULT clock_timestamp())")
        c.execute("GRANT INSERT ON public.ticks TO alice")
        tick = "INSERT INTO public.ticks (job) VALUES ('{}')"
        ids = {
            "unnamed": c.execute("SELECT cron.schedule('* * * * *', %s)", (tick.format("unnamed"),)).fetchone(),
            "named": c.execute("SELECT cron.schedule('named', '* * * * *', %s)", (tick.format("named"),)).fetchone(),
            "inactive": c.execute("SELECT cron.schedule('inactive', '* * * * *', %s)",
                                  (tick.format("inactive"),)).fetchone(),
            "alices": c.execute("SELECT cron.schedule_in_database('alices', '* * * * *', %s, %s, 'alice')",
                                (tick.format("alices"), SOURCE_DB)).fetchone(),
            "elsewhere": c.execute("SELECT cron.schedule_in_database('elsewhere', '* * * * *', %s, 'otherdb')",
                                   (tick.format("elsewhere"),)).fetchone(),
            "kept": c.execute("SELECT cron.schedule('kept', '* * * * *', 'SELECT 1')").fetchone(),
        }
        jobid = {k: int(v[0]) for k, v in ids.items() if v}
        c.execute("SELECT cron.alter_job(%s, active := false)", (jobid["inactive"],))
        # One finished run in pg_cron's history, for --history.
        c.execute("""INSERT INTO cron.job_run_details (jobid, job_pid, database, username, command, status,
                                                       return_message, start_time, end_time)
                     VALUES (%s, 4242, %s, 'postgres', 'x', 'succeeded', 'INSERT 0 1',
                             '2026-01-01 00:00:00+00', '2026-01-01 00:00:01+00')""", (jobid["named"], SOURCE_DB))

    out = import_cli(dsn, "--history", "--disable-source")
    switched = datetime.now(UTC)
    assert "5 created, 0 updated, 0 unchanged, 1 not imported" in out, out
    assert f"NOT imported: pg_cron job {jobid['kept']} ('kept'): role postgres already has a pgsched job named " \
           "'kept' that was not imported" in out, out
    assert "history: 1 run(s) copied" in out, out
    assert {r["jobname"] or "unnamed": r["active"] for r in cron_jobs(dsn)} == {
        "unnamed": False, "named": False, "inactive": False, "alices": False, "elsewhere": False, "kept": True}
    jobs = {r["config"]["pg_cron"]["jobid"]: r for r in pgsched_jobs(dsn) if "pg_cron" in (r["config"] or {})}
    assert sorted(jobs) == sorted(v for k, v in jobid.items() if k != "kept")
    assert {k: (jobs[jobid[k]]["owner"], jobs[jobid[k]]["scheduled"], jobs[jobid[k]]["schedule"],
                jobs[jobid[k]]["database"]) for k in ("unnamed", "named", "inactive", "alices", "elsewhere")} == {
        "unnamed": ("postgres", True, "* * * * *", None), "named": ("postgres", True, "* * * * *", None),
        "inactive": ("postgres", False, "* * * * *", None), "alices": ("alice", True, "* * * * *", None),
        "elsewhere": ("postgres", True, "* * * * *", "otherdb")}
    assert jobs[jobid["named"]]["job_name"] == "named"
    hist = query(dsn, "SELECT outcome, message, started_at FROM pgsched.job_history WHERE job_id = %s",
                 (jobs[jobid["named"]]["job_id"],))
    assert [(h["outcome"], h["message"]) for h in hist] == [("success", "INSERT 0 1")]

    # A second import (the source's jobs are inactive now) changes nothing on either side.
    before = (pgsched_jobs(dsn), cron_jobs(dsn))
    again = import_cli(dsn, "--history", "--disable-source")
    assert "0 created, 0 updated, 5 unchanged, 1 not imported" in again, again
    assert "history" not in again
    assert (pgsched_jobs(dsn), cron_jobs(dsn)) == before

    # pgsched runs each imported active job at the next minute; pg_cron runs none of them.
    s = serve(dsn, "--shutdown-timeout", "1")
    minute = switched.replace(second=0, microsecond=0) + timedelta(minutes=1)

    other = cron_cluster.dsn("otherdb")

    def ticks(at: str) -> list[dict[str, Any]]:
        return query(at, "SELECT job, via, current_database() AS db FROM public.ticks WHERE at >= %s ORDER BY job",
                     (minute,))

    def ran() -> bool:
        return {t["job"] for t in ticks(dsn) + ticks(other)} >= {"unnamed", "named", "alices", "elsewhere"}

    wait_for(ran, 90, "a run of each imported active job")
    got = ticks(dsn) + ticks(other)
    assert sorted((t["job"], t["via"], t["db"]) for t in got) == [
        ("alices", "alice", SOURCE_DB), ("elsewhere", "postgres", "otherdb"), ("named", "postgres", SOURCE_DB),
        ("unnamed", "postgres", SOURCE_DB)]
    assert len(got) == 4, got  # one run each: pg_cron ran none of them
    # pg_cron is alive (it runs the job it kept at the same minute) and ran none of the others.
    wait_for(lambda: query(dsn, "SELECT 1 FROM cron.job_run_details WHERE jobid = %s AND start_time >= %s",
                           (jobid["kept"], minute)) or None, 30, "pg_cron's run of the job it kept")
    assert query(dsn, "SELECT count(*) AS n FROM cron.job_run_details WHERE start_time >= %s AND jobid <> %s",
                 (switched, jobid["kept"]))[0]["n"] == 0
    assert s.proc.poll() is None, s.log()


def test_import_refuses_a_switch_over_across_databases(cron_cluster: Cluster) -> None:
    out = subprocess.run([str(PGSCHED), "import", "pg-cron", "--dsn", cron_cluster.dsn(SOURCE_DB), "--target",
                          cron_cluster.dsn("otherdb"), "--disable-source"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--disable-source switches over in one transaction" in out.stderr, out


def test_compat_schema_is_refused_beside_pg_cron(cron_cluster: Cluster) -> None:
    from pgsched import migrate
    from pgsched.errors import PgCronConflict

    with psycopg.connect(cron_cluster.dsn(SOURCE_DB), autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        with pytest.raises(PgCronConflict, match=r"the pg_cron extension \(version [0-9.-]+\) is installed"):
            migrate.init(c, pg_cron_compat=True)


@pytest.mark.parametrize("background_workers", [True, False])
def test_a_job_pgsched_cannot_take_is_listed_and_the_others_are_imported(cron_cluster: Cluster,
                                                                         background_workers: bool) -> None:
    """pg_cron jobs pgsched refuses (an '@reboot' schedule: 22023; a database that is not there:
    3D000) are listed with the reason and stay with pg_cron, and the jobs beside them are imported.
    A job whose nodename is another server's stays too, unless pg_cron runs its jobs in background
    workers (then it ignores nodename, and runs that job here); nodename '' (the Unix socket) and
    '127.0.0.1' at the server's port are this server. (Before, a refusal of another SQLSTATE than
    the few caught stopped the whole import, and a job of another server was imported.)"""
    from pgsched import migrate

    dsn = cron_cluster.dsn(SOURCE_DB)
    if not background_workers:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER SYSTEM SET cron.use_background_workers = off")
        cron_cluster.restart()
        cron_cluster.wait_ready()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        migrate.init(c)
        jobid: dict[str, int] = {}
        for name, schedule in (("at_boot", "@reboot"), ("elsewhere_node", "0 3 * * *"), ("taken", "0 4 * * *"),
                               ("no_such_db", "0 5 * * *"), ("socket", "0 6 * * *"), ("loopback", "0 7 * * *")):
            row = c.execute("SELECT cron.schedule(%s, %s, 'SELECT 1')", (name, schedule)).fetchone()
            assert row is not None
            jobid[name] = int(row[0])
        c.execute("UPDATE cron.job SET nodename = 'db2.example.internal' WHERE jobid = %s", (jobid["elsewhere_node"],))
        c.execute("UPDATE cron.job SET database = 'no_such_db' WHERE jobid = %s", (jobid["no_such_db"],))
        c.execute("UPDATE cron.job SET nodename = '' WHERE jobid = %s", (jobid["socket"],))
        c.execute("UPDATE cron.job SET nodename = '127.0.0.1' WHERE jobid = %s", (jobid["loopback"],))
    try:
        out = import_cli(dsn)
        assert f"NOT imported: pg_cron job {jobid['at_boot']} ('at_boot'): invalid schedule: '@reboot'" in out, out
        assert f"NOT imported: pg_cron job {jobid['no_such_db']} ('no_such_db'): database \"no_such_db\" does not " \
               "exist" in out, out
        elsewhere = (f"NOT imported: pg_cron job {jobid['elsewhere_node']} ('elsewhere_node'): it runs on another "
                     f"server (db2.example.internal:")
        assert (elsewhere in out) is not background_workers, out
        names = {r["job_name"]: r for r in pgsched_jobs(dsn)}
        assert {"taken", "socket", "loopback"} <= set(names) and names["taken"]["schedule"] == "0 4 * * *"
        assert "at_boot" not in names and "no_such_db" not in names
        assert ("elsewhere_node" in names) is background_workers
        assert all(r["active"] for r in cron_jobs(dsn) if r["jobname"] in jobid)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            for j in jobid.values():
                c.execute("SELECT cron.unschedule(%s)", (j,))
            c.execute("DELETE FROM pgsched.job WHERE job_name = ANY (%s)", (list(jobid),))
            if not background_workers:
                c.execute("ALTER SYSTEM RESET cron.use_background_workers")
        if not background_workers:
            cron_cluster.restart()
            cron_cluster.wait_ready()
