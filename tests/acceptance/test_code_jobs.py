"""Python jobs through the real CLI: serve --app, two instances with and without the module, pgsched run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.conftest import ServeFactory, query, wait_for

PGSCHED = Path(sys.executable).parent / "pgsched"
DEMO = "tests.apps.demo_jobs"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def py_db(db: str) -> str:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb)")
    return db


def job_id(dsn: str, name: str) -> int:
    return int(query(dsn, "SELECT job_id FROM pgsched.jobs WHERE job_name = %s", (name,))[0]["job_id"])


def test_only_the_instance_with_the_module_runs_its_jobs(py_db: str, serve: ServeFactory) -> None:
    dsn = py_db
    without = serve(dsn, "--crash-wait", "1")
    with_app = serve(dsn, "--app", DEMO, "--crash-wait", "1")
    ok = wait_for(lambda: query(dsn, "SELECT job_id FROM pgsched.jobs WHERE job_name = 'demo.ok'") or None, 10,
                  "the deploy")[0]["job_id"]
    def successes() -> int:
        return len(query(dsn, "SELECT 1 FROM pgsched.job_run WHERE job_id = %s AND outcome = 'success'", (ok,)))

    for n in range(1, 4):
        query(dsn, "SELECT alter_job(%s, next_start => now())", (ok,))

        def ran(n: int = n) -> bool | None:
            return successes() == n or None

        wait_for(ran, 10, f"run {n} of demo.ok")
    runs = query(dsn, "SELECT instance_id, outcome FROM pgsched.job_run WHERE job_id = %s", (ok,))
    assert {r["instance_id"] for r in runs} == {with_app.instance_id}
    assert {r["outcome"] for r in runs} == {"success"}
    assert without.instance_id not in {r["instance_id"] for r in query(dsn, "SELECT instance_id FROM pgsched.job_run")}
    # The instance without the module stays quiet: it neither fails the job nor spins on it.
    assert "demo" not in without.log()


def test_an_app_module_of_the_working_directory_runs_in_forked_workers(
        py_db: str, serve: ServeFactory, tmp_path: Path) -> None:
    """The fork server starts before `serve` reads --app (pgsched/cli.py), so the working directory
    reaches the workers it forks through PYTHONPATH. PYTHONSAFEPATH keeps the working directory off
    every interpreter's own path, so nothing else puts it there."""
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "here_jobs.py").write_text(
        "from datetime import UTC, datetime\n\nimport pgsched\n\n\n"
        "@pgsched.job(every='1 hour', initial_start=datetime(2100, 1, 1, tzinfo=UTC), name='here.ok')\n"
        "def ok(run: pgsched.Run) -> None:\n"
        "    run.connection.execute(\"INSERT INTO py_hits VALUES ('here.ok', now(), 1, NULL)\")\n")
    s = serve(py_db, "--app", "here_jobs", cwd=app_dir, env={"PYTHONSAFEPATH": "1", "PYTHONPATH": None})
    here = wait_for(lambda: query(py_db, "SELECT job_id FROM pgsched.jobs WHERE job_name = 'here.ok'") or None,
                    10, "the deploy")[0]["job_id"]
    query(py_db, "SELECT alter_job(%s, next_start => now())", (here,))
    wait_for(lambda: query(py_db, "SELECT 1 FROM pgsched.job_run WHERE job_id = %s AND outcome <> 'running'",
                           (here,)) or None, 10, "the run of here.ok")
    runs = query(py_db, "SELECT outcome FROM pgsched.job_run WHERE job_id = %s", (here,))
    assert [r["outcome"] for r in runs] == ["success"]
    assert query(py_db, "SELECT count(*) AS n FROM py_hits WHERE job = 'here.ok'") == [{"n": 1}]
    assert "cannot import" not in s.log()


def test_a_bad_declaration_stops_serve_before_anything_is_written(db: str, tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text(
        "import pgsched\n\n@pgsched.job(cron='0 0 31 2 *')\ndef never(run): pass\n")
    out = subprocess.run([str(PGSCHED), "serve", "--dsn", db, "--app", "broken_app"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "broken_app.never" in out.stderr and "never fire" in out.stderr and "Traceback" not in out.stderr
    assert query(db, "SELECT count(*) AS n FROM pgsched.job")[0]["n"] == 0
    assert query(db, "SELECT count(*) AS n FROM pgsched.instance")[0]["n"] == 0


def test_pgsched_run_runs_a_python_job_now(py_db: str, serve: ServeFactory) -> None:
    dsn = py_db
    s = serve(dsn, "--app", DEMO)
    wait_for(lambda: query(dsn, "SELECT 1 FROM pgsched.jobs WHERE job_name = 'demo.ok'") or None, 10, "the deploy")
    ok, boom = job_id(dsn, "demo.ok"), job_id(dsn, "demo.boom")
    done = subprocess.run([str(PGSCHED), "run", str(ok), "--dsn", dsn, "--app", DEMO], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"job {ok} succeeded" in done.stdout and "'hello': 'hi'" in done.stdout
    failed = subprocess.run([str(PGSCHED), "run", str(boom), "--dsn", dsn, "--app", DEMO], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "ValueError: nope" in failed.stderr
    rows = query(dsn, "SELECT job_id, trigger, outcome, result FROM job_history ORDER BY run_id")
    assert [(r["job_id"], r["trigger"], r["outcome"]) for r in rows] == [(ok, "manual", "success"),
                                                                        (boom, "manual", "failure")]
    assert rows[0]["result"]["hello"] == "hi"
    st = query(dsn, "SELECT total_runs, total_successes, total_crashes FROM job_stats WHERE job_id = %s", (ok,))
    assert st[0] == {"total_runs": 1, "total_successes": 1, "total_crashes": 0}
    del s
