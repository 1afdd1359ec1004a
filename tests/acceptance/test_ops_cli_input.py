"""Bad input and hostile data through the command line (`python -m pgsched ...` as a subprocess):
each bad value is one line naming its argument, exit 2 for what click parses (1 for what only
the command can tell), nothing written and no password shown; text from the database is shown
as written (never read as markup); and `pgsched watch` believes only the views, not whoever
sent a notification on its channel."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.acceptance.test_ops_cli import cli, dsn, execute, watching  # noqa: F401 (dsn: the fixture)
from tests.acceptance.test_serve import add_job, stats

SECRET = "my%ZZsecret"


def _one_line(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    error = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
    assert len(error) == 1, r.stderr
    for n in needles:
        assert n in error[0], (n, error[0])


@pytest.mark.parametrize(("args", "needles"), [
    (["history", "\udcff"], ["JOB", "is not valid UTF-8 text"]),
    (["jobs", "--owner", "a\udcffb"], ["--owner", "is not valid UTF-8 text"]),
    (["jobs", "--dsn", f"host=127.0.0.1 port=1 password={SECRET}\udce9"], ["--dsn", "is not valid UTF-8 text"]),
    (["pause", "x", "\udcff"], ["JOB", "not valid UTF-8"]),
    (["trigger", "x", "--wait", "nan"], ["--wait", "finite number"]),
    (["watch", "--timeout", "inf"], ["--timeout", "finite number"]),
    (["web", "--session-idle", "nan"], ["--session-idle", "finite number"]),
    (["serve", "--crash-wait", "nan"], ["--crash-wait", "finite number"]),
    (["next", "--schedule", "* * * * *", "--timezone", "Mars/Olympus"], ["--timezone", "unknown time zone"]),
    (["next", "--schedule", "* * * * *", "--timezone", ""], ["--timezone", "blank"]),
    (["next", "--schedule", ""], ["--schedule", "is not an interval"]),
    (["history", "--since", "99999999999999999999999w"], ["--since", "at most 36525d"]),
    (["history", "--since", "1000000000d"], ["--since", "at most 36525d"]),
    (["history", "--since", "5000000d"], ["--since", "at most 36525d"]),
    (["history", "--since", ""], ["--since", "is not a duration"]),
    (["import", "pg-cron", "--dsn", f"postgresql://u:{SECRET}@127.0.0.1:1/x"], ["--dsn (or PGSCHED_DSN)"]),
    (["import", "pg-cron", "--dsn", f"host=127.0.0.1 port=1 password={SECRET} x"], ["--dsn", "not a valid"]),
    (["import", "pg-cron", "--dsn", "host=127.0.0.1 port=1", "--target", f"postgresql://u:{SECRET}@h/x"],
     ["--target (or PGSCHED_TARGET)", "not a valid"]),
    (["import", "pg-cron", "--dsn", ""], ["--dsn", "blank"]),
    (["import", "pg-cron", "--dsn", "host=127.0.0.1 port=1", "--target", " "], ["--target", "blank"]),
])
def test_a_bad_value_is_one_line_naming_its_argument_with_exit_2(args: list[str], needles: list[str]) -> None:
    r = cli(*args, "--dsn", "host=127.0.0.1 port=1 connect_timeout=1") \
        if args[0] in ("history", "jobs", "pause", "trigger", "watch") and "--dsn" not in args else cli(*args)
    _one_line(r, 2, *needles)
    assert SECRET not in r.stdout + r.stderr


def test_extension_install_refuses_a_blank_or_foreign_pg_config() -> None:
    _one_line(cli("extension", "install", "--pg-config="), 1, "--pg-config is blank")
    _one_line(cli("extension", "install", "--pg-config", "/bin/echo"), 1, "/bin/echo is not a PostgreSQL server's")


def test_import_takes_its_options_from_the_environment_and_names_the_database_it_cannot_reach() -> None:
    r = cli("import", "pg-cron", env={"PGSCHED_DSN": f"host=127.0.0.1 port=1 user=u password={SECRET}"})
    _one_line(r, 1, "cannot connect to pg_cron's database (--dsn)", "password=***")
    assert SECRET not in r.stdout + r.stderr
    r = cli("import", "pg-cron", "--help")
    assert "PGSCHED_TARGET" in r.stdout and "PGSCHED_HISTORY" in r.stdout
    assert "PGSCHED_PG_CONFIG" in cli("extension", "install", "--help").stdout


@pytest.fixture
def roles(dsn: str) -> Iterator[tuple[str, str, str]]:  # noqa: F811 (the fixture imported above)
    """(database owner's DSN, alice's DSN, alice): a database owned by a login role `dbo_...`, who may
    see every job there but change only its own, and a login role alice."""
    tag = uuid.uuid4().hex[:8]
    dbo, alice = f"dbo_{tag}", f"alice_{tag}"
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    for r in (dbo, alice):
        execute(dsn, sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(r)))
    execute(dsn, sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(params["dbname"]),
                                                                  sql.Identifier(dbo)))
    try:
        yield (psycopg.conninfo.make_conninfo(**{**params, "user": dbo}),
               psycopg.conninfo.make_conninfo(**{**params, "user": alice}), alice)
    finally:
        execute(dsn, "DELETE FROM pgsched.job")
        execute(dsn, sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(sql.Identifier(params["dbname"])))
        for r in (dbo, alice):
            execute(dsn, sql.SQL("DROP OWNED BY {}").format(sql.Identifier(r)))
            execute(dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(r)))


def _owned_by(dsn: str, role: str, args: str) -> int:  # noqa: F811
    job = add_job(dsn, args)
    execute(dsn, "UPDATE pgsched.job SET owner = %s::regrole WHERE job_id = %s", (role, job))
    return job


def test_pause_of_several_jobs_writes_all_or_nothing(dsn: str, roles: tuple[str, str, str]) -> None:  # noqa: F811
    """The database owner may see alice's job but not change it: pausing its own and hers pauses
    neither (before, its own was paused and the command then failed)."""
    as_dbo, _, alice = roles
    dbo = psycopg.conninfo.conninfo_to_dict(as_dbo)["user"]
    own = _owned_by(dsn, str(dbo), "'tick', '1 hour', job_name => 'own', initial_start => '2100-01-01 00:00+00'")
    hers = _owned_by(dsn, alice, "'tick', '1 hour', job_name => 'hers', initial_start => '2100-01-01 00:00+00'")
    r = cli("pause", "own", "hers", "--dsn", as_dbo)
    _one_line(r, 1, f"job {hers} belongs to role {alice}", "may see it but not change")
    assert "paused" not in r.stdout
    assert stats(dsn, own)["state"] == stats(dsn, hers)["state"] == "scheduled"
    _one_line(cli("pause", "own", "\u00b2", "--dsn", as_dbo), 1, "'\u00b2' not found")  # a digit int() refuses
    assert stats(dsn, own)["state"] == "scheduled"
    r = cli("pause", "own", "--dsn", as_dbo)
    assert r.returncode == 0 and r.stdout == f"job {own} (own) paused\n"
    assert stats(dsn, own)["state"] == "disabled"


def test_names_and_errors_from_the_database_are_shown_as_written(dsn: str) -> None:  # noqa: F811
    """A job named '[/oops]' whose run failed with '[/boom] [bold]x': jobs, history and status show
    both as they are (rich would have read them as markup, and '[/oops]' failed the whole table)."""
    execute(dsn, "CREATE FUNCTION public.markup(job_id int, config jsonb) RETURNS void LANGUAGE plpgsql "
                 "AS $$ BEGIN RAISE EXCEPTION '[/boom] [bold]x'; END $$")
    job = add_job(dsn, "'markup', '1 hour', job_name => '[/oops]', initial_start => '2100-01-01 00:00+00'")
    with psycopg.connect(dsn, autocommit=True) as c, pytest.raises(psycopg.errors.RaiseException):
        c.execute("CALL pgsched.run_job(%s)", (job,))
    for args, code in ((["jobs"], 0), (["history"], 0), (["status"], 2)):  # status: 2, no live instance
        r = cli(*args, "--dsn", dsn)
        assert r.returncode == code and "Traceback" not in r.stderr, (args, r.stderr)
        assert "[/oops]" in r.stdout, (args, r.stdout)
        if args != ["jobs"]:
            assert "[/boom] [bold]x" in r.stdout, (args, r.stdout)


def test_control_characters_a_role_wrote_reach_no_terminal(dsn: str) -> None:  # noqa: F811
    """A job named with an escape sequence (OSC: the terminal's title; CSI: clear the screen) and a
    newline forging a line: the commands that print it show it escaped (rich strips a few control
    characters, not ESC; click.echo none). Review of 2026-11-29."""
    name = "evil\x1b[2J\x1b]0;pwned\x07name\nforged line"
    execute(dsn, "CREATE FUNCTION public.evil(job_id int, config jsonb) RETURNS void LANGUAGE plpgsql "
                 "AS $$ BEGIN RAISE EXCEPTION E'bad\\x1b[31m\\nnews'; END $$")
    job = add_job(dsn, "'evil', '1 hour', job_name => %s, initial_start => '2100-01-01 00:00+00'", (name,))
    with psycopg.connect(dsn, autocommit=True) as c, pytest.raises(psycopg.errors.RaiseException):
        c.execute("CALL pgsched.run_job(%s)", (job,))
    for args in (["pause", str(job)], ["resume", str(job)], ["jobs"], ["history"], ["status"], ["next", str(job)]):
        r = cli(*args, "--dsn", dsn)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        for stream in (r.stdout, r.stderr):
            assert "\x1b" not in stream and "\x07" not in stream and "forged line\n" not in stream.replace(
                "\\nforged line", ""), (args, stream)
    r = cli("pause", str(job), "--dsn", dsn)
    assert r.stdout == f"job {job} (evil\\x1b[2J\\x1b]0;pwned\\x07name\\nforged line) paused\n"


def test_watch_believes_the_views_not_the_notification(dsn: str, roles: tuple[str, str, str]) -> None:  # noqa: F811
    """Any role may NOTIFY on pgsched_events. Payloads without the kind or the ids, or of another
    shape, are ignored; an event the views do not bear out (a job that is not disabled, a run that
    does not exist or did not fail) is not shown; a real one is shown with the views' facts, not the
    payload's (its plan_time here)."""
    _, as_alice, alice = roles
    job = _owned_by(dsn, alice, "'tick', '1 hour', job_name => 'watched', initial_start => '2100-01-01 00:00+00'")
    with watching("--dsn", as_alice, "--json", "--count", "2", "--timeout", "20") as w:
        spoofs: list[Any] = [
            {"job_id": job}, {"event": "run_end", "job_id": job}, [1, 2], "x", 7,
            {"event": "job_disabled", "job_id": job, "plan_time": "2026-01-01"},
            {"event": "run_end", "job_id": job, "run_id": 999999},
            {"event": "job_disabled", "job_id": str(job)}, {"event": "whatever", "job_id": job}]
        with psycopg.connect(as_alice, autocommit=True) as c:
            for p in spoofs:
                c.execute("SELECT pg_notify('pgsched_events', %s)", (json.dumps(p),))
            c.execute("SELECT pg_notify('pgsched_events', 'not json')")
        time.sleep(0.5)  # the spoofs are read (and dropped) before the real event is sent
        execute(dsn, "SELECT pgsched._disable_job_v2(%s, 'a reason')", (job,))
        with psycopg.connect(as_alice, autocommit=True) as c:
            c.execute("SELECT pg_notify('pgsched_events', %s)",
                      (json.dumps({"event": "job_disabled", "job_id": job, "plan_time": "2026-01-01"}),))
        out, err = w.communicate(timeout=20)
    assert w.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines()]
    # The real event, then the spoof naming the (now) disabled job: shown with the views' facts,
    # its plan_time the views' (none: a disable without a run), not the payload's.
    assert len(events) == 2, events
    for e in events:
        assert (e["event"], e["job_id"], e["job_name"], e["state"], e["disabled_reason"], e["plan_time"]) == (
            "job_disabled", job, "watched", "disabled", "a reason", None), e


def test_watch_shows_a_runs_end_once_and_only_while_it_is_news(dsn: str, roles: tuple[str, str, str]) -> None:  # noqa: F811
    """A notification sent again (anyone may NOTIFY) naming a run that failed long ago, or one
    already shown, is not shown; a run that just failed is, once."""
    _, as_alice, alice = roles
    job = _owned_by(dsn, alice, "'tick', '1 hour', job_name => 'watched', initial_start => '2100-01-01 00:00+00'")
    with psycopg.connect(dsn, autocommit=True) as c:
        old_run, new_run = (c.execute("INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, "
                                      "outcome, sqlstate, message) SELECT %s, t, t, t, 'failure', 'P0001', %s "
                                      "FROM (SELECT now() - %s::interval AS t) x RETURNING run_id",
                                      (job, f"boom {ago}", ago)).fetchone()[0]  # type: ignore[index]
                            for ago in ("10 minutes", "0 seconds"))
    with watching("--dsn", as_alice, "--json", "--count", "2", "--timeout", "3") as w:
        with psycopg.connect(as_alice, autocommit=True) as c:
            for run in (old_run, new_run, new_run, old_run):
                c.execute("SELECT pg_notify('pgsched_events', %s)",
                          (json.dumps({"event": "run_end", "job_id": job, "run_id": run}),))
        out, err = w.communicate(timeout=20)
    assert w.returncode == 0, err
    assert [(e["run_id"], e["message"]) for e in map(json.loads, out.splitlines())] == [(new_run, "boom 0 seconds")]


def test_watch_times_out_while_only_events_it_may_not_see_arrive(dsn: str, roles: tuple[str, str, str]) -> None:  # noqa: F811
    """--timeout counts from the last event shown: another role's events (which this role's views
    do not bear out) used to reset it, and the watch never ended."""
    _, as_alice, _ = roles
    started = time.monotonic()
    with watching("--dsn", as_alice, "--timeout", "2") as w, psycopg.connect(dsn, autocommit=True) as c:
        while w.poll() is None and time.monotonic() - started < 15:
            c.execute("SELECT pg_notify('pgsched_events', %s)",
                      (json.dumps({"event": "job_disabled", "job_id": 424242}),))
            time.sleep(0.3)
        assert w.wait(timeout=5) == 0
    assert time.monotonic() - started < 12


def test_a_runs_end_written_late_is_news_to_a_watch_that_began_before_it_ended(dsn: str) -> None:  # noqa: F811
    """The age that makes a run's end a replay counts from when the watch began: a close written
    late (its scheduler cut off, the catalog locked) names a run that ended long ago but after the
    watch began, and is shown."""
    from pgsched.ops import query, watch

    job = add_job(dsn, "'tick', '1 hour', job_name => 'late', initial_start => '2100-01-01 00:00+00'")
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome, sqlstate, "
                        "message) SELECT %s, t, t, t, 'failure', 'P0001', 'late' "
                        "FROM (SELECT now() - interval '10 minutes' AS t) x RETURNING run_id", (job,)).fetchone()
    assert row is not None
    payload = json.dumps({"event": "run_end", "job_id": job, "run_id": row[0]})
    with query.connect(dsn) as conn:
        assert watch.describe(conn, payload) is None  # a watch that began a moment ago: a replay
        shown = watch.describe(conn, payload, max_age=15 * 60)  # one that began 14 minutes ago
        assert shown is not None and shown["message"] == "late"
