"""The `pgsched` command line: parses options and hands off; no logic lives here.

The program starts in pgsched/cli.py, which may have started `serve`'s fork server already."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import psycopg

from pgsched import __version__, migrate
from pgsched.config import dsn_problem, redact, resolve_dsn, scrub
from pgsched.errors import PgschedError, first_line, printable
from pgsched.settings import MAX_WORKER_SESSIONS


def _hint(param: click.Parameter) -> str:
    """How an error names an option: its long name, and its environment variable (EnvCommand)."""
    name = max(param.opts, key=len)
    envvar = getattr(param, "envvar", None)
    return f"{name} (or {envvar})" if isinstance(envvar, str) else name


def _checked_dsn(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--dsn (or PGSCHED_DSN, EnvCommand), or another connection string, refused before any use if
    libpq cannot parse it, with a message that quotes none of it: it may hold a password."""
    if value and (problem := dsn_problem(value)):
        raise click.BadParameter(problem, ctx=ctx, param_hint=_hint(param))
    return value


class Text(click.types.StringParamType):
    """Click's text, refused when it is not UTF-8 (the bytes of another encoding on the command line
    or in the environment, which Python carries as lone surrogates and nothing downstream can send)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        try:
            rv.encode("utf-8")
        except UnicodeEncodeError:
            # Not quoted: the value may be a connection string holding a password.
            self.fail("is not valid UTF-8 text (bytes of another encoding)", param, ctx)
        return rv


class Seconds(click.FloatRange):
    """A number of seconds of at least `min`: a float range that also refuses nan and infinity
    (which click's FloatRange lets through: no comparison with nan is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a number of seconds: give a finite number of at least {self.min:g}",
                      param, ctx)
        return rv


def _checked_job(ctx: click.Context, param: click.Parameter, value: str | tuple[str, ...] | None
                 ) -> str | tuple[str, ...] | None:
    """JOB (each of JOB...): a blank one names no job, and would otherwise read as none given."""
    for ref in (value,) if isinstance(value, str) else value or ():
        if not ref.strip():
            raise click.BadParameter(f"{ref!r} is blank: expected a job id or the name of a job you may see "
                                     "(see `pgsched jobs`)", ctx=ctx, param=param)
    return value


dsn_option = click.option(
    "--dsn", default=None, callback=_checked_dsn,
    help="libpq connection string; default PGSCHED_DSN, then the libpq environment (PGHOST, PGDATABASE, ...).",
)


class EnvCommand(click.Command):
    """A command each of whose options may also come from PGSCHED_<OPTION> (--max-workers:
    PGSCHED_MAX_WORKERS); the command line wins. Shown in --help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if p.type is click.STRING:
                p.type = Text()
            if isinstance(p, click.Option) and p.envvar is None:
                long = max(p.opts, key=len).lstrip("-")
                p.envvar = "PGSCHED_" + long.upper().replace("-", "_")
                p.show_envvar = True


class EnvGroup(click.Group):
    """A group whose commands, and whose groups' commands, are EnvCommands."""

    command_class = EnvCommand
    group_class = type  # its groups are EnvGroups too


@click.group(cls=EnvGroup)
# The version of the code that runs (not of an installed distribution's metadata): the one
# it registers in pgsched.instances and checks against the schema's API.
@click.version_option(__version__, package_name="pgsched")
def main() -> None:
    """pgsched: run jobs that live in a PostgreSQL database."""


@main.command()
@dsn_option
@click.option("--no-plpython", is_flag=True, help="Do not install the PL/Python schedule functions.")
@click.option("--pg-cron-compat", is_flag=True,
              help="Also install the schema cron with pg_cron's functions and tables over pgsched's catalog "
                   "(refused while the pg_cron extension is installed); kept by later inits.")
def init(dsn: str | None, no_plpython: bool, pg_cron_compat: bool) -> None:
    """Install or upgrade the pgsched schema in a database."""
    target = resolve_dsn(dsn)
    try:
        with psycopg.connect(target or "", autocommit=True) as conn:
            result = migrate.init(conn, plpython=not no_plpython, pg_cron_compat=pg_cron_compat)
    except (PgschedError, psycopg.Error) as e:
        raise click.ClickException(f"{redact(target or '')}: {e}".lstrip(": ")) from None
    if result.applied:
        click.echo(f"applied migrations {', '.join(map(str, result.applied))}; schema version {result.version}")
    else:
        click.echo(f"schema version {result.version} is up to date")
    click.echo(f"PL/Python schedule functions: {'installed' if result.plpython else 'not available'}")
    if result.pg_cron_compat:
        click.echo("pg_cron compatibility schema cron: installed")
    if result.api is not None:
        click.echo(f"internal API {result.api.api_version} (release {result.api.release}); instances of "
                   f"API {result.api.oldest_api_served} to {result.api.api_version} may run on it")
    if result.dropped:
        click.echo(f"dropped what no release in that window calls: {', '.join(result.dropped)}")


app_option = click.option(
    "--app", "apps", multiple=True,
    help="Importable module (or package) with @pgsched.job handlers; may be given several times.",
)


def _app_path(apps: tuple[str, ...]) -> None:
    """Like other app servers, find the user's modules from the current directory (here, and in
    the workers, through PYTHONPATH)."""
    if not apps:
        return
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)


def _import_apps(apps: tuple[str, ...]) -> None:
    """Import the app modules now (from _app_path's path), so a bad declaration stops us before
    anything is written."""
    from pgsched import app, pyjob

    if not apps:
        return
    try:
        for warning in pyjob.import_apps(list(apps)):
            click.echo(f"warning: {warning}", err=True)
    except app.JobDeclarationError as e:
        raise click.ClickException(str(e)) from None
    except ImportError as e:
        raise click.ClickException(f"cannot import {e.name or 'an app module'}: {e}") from None


def _embedded_dsn() -> str:
    """Start (creating on first use) the per-user local cluster and its `pgsched` database."""
    from pgsched.embedded import Cluster, default_home

    home = default_home()
    cluster = Cluster(datadir=home / "pgdata")
    fresh = not cluster.exists()
    cluster.initdb()
    cluster.start()
    cluster.wait_ready()
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'pgsched'").fetchone() is None:
            conn.execute("CREATE DATABASE pgsched")
    dsn = cluster.dsn("pgsched")
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate.init(conn)
    click.echo(
        f"{'Created' if fresh else 'Using'} the embedded PostgreSQL in {cluster.datadir} (port {cluster.port}).\n"
        f"Connect:  {cluster.psql_command('pgsched')}\n"
        "Add a job: CREATE PROCEDURE hello(job_id int, config jsonb) LANGUAGE sql AS "
        "$$ SELECT 1 $$;  SELECT add_job('hello', '10 seconds');\n"
        "See runs:  SELECT * FROM job_stats;  SELECT * FROM job_history ORDER BY run_id DESC LIMIT 10;\n"
        f"Stop it later with: {cluster.stop_command()}",
        err=True,
    )
    return dsn


@main.command()
@dsn_option
@click.option("--max-workers", type=click.IntRange(1, 1000), default=None,
              help="Runs at once (default 16 per CPU core, at most 32 and at most a quarter of the "
                   "server's connections).")
@click.option("--worker-sessions", type=click.IntRange(1, MAX_WORKER_SESSIONS), default=None,
              help="Sessions each worker keeps, one per job owner and database it ran lately (default 4).")
@click.option("--shutdown-timeout", type=Seconds(0), default=None,
              help="Seconds SIGTERM waits for running jobs before cancelling them (default 30).")
@click.option("--crash-wait", type=Seconds(0), default=None,
              help="After start-up, seconds before a job whose run crashed runs again (default 300).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file of settings and of any of these options (dsn without a password); SIGHUP "
                   "re-reads the settings.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None, help="text (default) or json.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
              help="Default info.")
@click.option("--http", default=None, metavar="HOST:PORT",
              help="Serve /metrics (Prometheus), /healthz and /readyz here (needs pgsched[http]); off by default.")
@click.option("--metrics-dsn", default=None, callback=_checked_dsn,
              help="With --http: read the catalog's series of /metrics as this DSN's role, under row-level "
                   "security (default: the scheduler's, which sees every job).")
@click.option("--metrics-max-jobs", type=click.IntRange(0), default=None,
              help="Above this many jobs, /metrics leaves out the per-job series (default 1000).")
@click.option("--all-databases", is_flag=True, default=False,
              help="One scheduler for every database of the DSN's cluster where pgsched is installed, "
                   "sharing --max-workers between them (the DSN's database is only where to look from).")
@app_option
def serve(dsn: str | None, max_workers: int | None, worker_sessions: int | None, shutdown_timeout: float | None,
          crash_wait: float | None, config_file: str | None, log_format: str | None, log_level: str | None,
          http: str | None, metrics_dsn: str | None, metrics_max_jobs: int | None, all_databases: bool,
          apps: tuple[str, ...]) -> None:
    """Run the scheduler for one database (an embedded local PostgreSQL when no DSN is configured)."""
    from pgsched import forkserver, launcher, logs
    from pgsched.config import read_serve_options, read_settings_file
    from pgsched.scheduler import Scheduler, Settings

    try:
        # The command line (and PGSCHED_<OPTION>) wins over the file.
        opts = read_serve_options(config_file) if config_file else {}
    except PgschedError as e:
        raise click.ClickException(str(e)) from None
    log_format = log_format or str(opts.get("log_format", "text"))
    log_level = log_level or str(opts.get("log_level", "info"))
    logs.setup(log_format, log_level)
    apps = apps or tuple(opts.get("app", ()))  # type: ignore[arg-type]
    http = http or opts.get("http")  # type: ignore[assignment]
    metrics_dsn = metrics_dsn or opts.get("metrics_dsn")  # type: ignore[assignment]
    _app_path(apps)
    if all_databases:
        forkserver.discard_early()  # each database's scheduler starts its own
    else:
        # Usually started already (pgsched/cli.py); the scheduler stops it, and it dies with this
        # process in any case.
        launcher.start_fork_server()
    _import_apps(apps)
    cli_values: dict[str, object] = {k: v for k, v in {
        "max_workers": max_workers, "shutdown_timeout": shutdown_timeout, "crash_wait": crash_wait,
        "metrics_max_jobs": metrics_max_jobs, "worker_sessions": worker_sessions,
    }.items() if v is not None}
    cli_values["apps"] = apps
    try:
        target = resolve_dsn(dsn or opts.get("dsn"))  # type: ignore[arg-type]
        if target and (problem := dsn_problem(target)):  # the --config file's dsn (--dsn is checked already)
            raise click.BadParameter(problem, param_hint="dsn (--config)")
        if target is None:
            target = _embedded_dsn()
        if all_databases:
            if http:
                raise click.UsageError("--http and --all-databases cannot be combined yet: give each database's "
                                       "scheduler its own `serve --http`")
            _serve_all_databases(target, max_workers, worker_sessions, shutdown_timeout, crash_wait, config_file,
                                 log_format, log_level, apps)
            return

        def load() -> Settings:
            given = {**(read_settings_file(config_file) if config_file else {}), **cli_values}
            return Settings(dsn=target or "", max_workers_default="max_workers" not in given,
                            **given)  # type: ignore[arg-type]

        scheduler = Scheduler(load())
        if config_file:
            scheduler.reloader = load
        server = None
        if http:
            from pgsched.httpd import start_http

            server = start_http(http, scheduler, metrics_dsn)
        scheduler.install_signal_handlers()
        try:
            scheduler.run()
        finally:
            if server is not None:
                server.stop()
    except PgschedError as e:
        raise click.ClickException(str(e)) from None


def _serve_all_databases(dsn: str, max_workers: int | None, worker_sessions: int | None,
                         shutdown_timeout: float | None,
                         crash_wait: float | None, config_file: str | None, log_format: str, log_level: str,
                         apps: tuple[str, ...]) -> None:
    """`serve --all-databases`: the launcher (pgsched/multidb.py), each database's scheduler started with
    this command's other options and its share of --max-workers."""
    from pgsched.config import read_settings_file
    from pgsched.multidb import Launcher

    passed = [*(["--worker-sessions", str(worker_sessions)] if worker_sessions is not None else []),
              *(["--shutdown-timeout", str(shutdown_timeout)] if shutdown_timeout is not None else []),
              *(["--crash-wait", str(crash_wait)] if crash_wait is not None else []),
              *(["--config", config_file] if config_file else []),
              "--log-level", log_level, *(a for app in apps for a in ("--app", app))]
    if max_workers is None and config_file:
        # The file's count is the launcher's total: each scheduler gets its share on its command line.
        filed = read_settings_file(config_file).get("max_workers")
        max_workers = filed if isinstance(filed, int) else None  # read_settings_file checked its type
    launcher = Launcher(dsn, max_workers, passed, log_format=log_format)
    launcher.install_signal_handlers()
    launcher.run()


@main.command("run")
@click.argument("job_id", type=int)
@dsn_option
@app_option
def run_cmd(job_id: int, dsn: str | None, apps: tuple[str, ...]) -> None:
    """Run a job now in this process (Python jobs need their --app), recorded like any run."""
    from pgsched import pyjob

    _app_path(apps)
    _import_apps(apps)
    target = resolve_dsn(dsn) or ""
    try:
        result = pyjob.run_now(target, job_id)
    except (PgschedError, psycopg.Error) as e:
        _fail(scrub(str(e).strip(), target))
    if not result.ok:
        _fail(f"job {job_id} failed: {result.message}")
    click.echo(printable(f"job {job_id} succeeded" + (f": {result.result}" if result.result is not None else "")))


# -- operator commands: logic in pgsched/ops/ --------------------------------------------------

json_option = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout instead of tables.")
OUTCOMES = click.Choice(["running", "queued", "success", "failure", "timeout", "crash", "cancelled", "skipped",
                         "missed"])
STATES = click.Choice(["scheduled", "starting", "terminating", "disabled"])


def _ops_dsn(dsn: str | None) -> str:
    return resolve_dsn(dsn) or ""


class DownError(click.ClickException):
    """`status`: the database is unreachable or unusable (exit code 2, as with no live instance)."""

    exit_code = 2


def _fail(message: str, code: int = 1) -> NoReturn:
    raise (DownError if code == 2 else click.ClickException)(_printable_lines(message))


def _printable_lines(text: str) -> str:
    """What roles wrote (a job's name, an error, a traceback's lines) as the terminal must show it:
    line by line, control characters escaped (errors.printable)."""
    return "\n".join(printable(line) for line in text.split("\n"))


@contextlib.contextmanager
def _ops(dsn: str | None) -> Iterator[Any]:
    """A connection for an operator command; every error becomes one line (password redacted), exit 1."""
    from pgsched.ops import query

    target = _ops_dsn(dsn)
    try:
        with query.connect(target) as conn:
            yield conn
    except (PgschedError, psycopg.Error) as e:
        _fail(scrub(first_line(e), target))


def _job(conn: Any, ref: str) -> Any:
    from pgsched.ops import query

    return query.resolve_job(conn, ref)


@main.command()
@dsn_option
@click.option("--state", type=STATES, default=None, help="Only jobs in this state.")
@click.option("--failing", is_flag=True, help="Only jobs whose last run failed, timed out or crashed.")
@click.option("--owner", default=None, help="Only the jobs of this role.")
@json_option
def jobs(dsn: str | None, state: str | None, failing: bool, owner: str | None, as_json: bool) -> None:
    """List the jobs you may see."""
    from pgsched.ops import query, render

    with _ops(dsn) as conn:
        rows = query.jobs(conn, state=state, failing=failing, owner=owner)
    if as_json:
        render.emit_json(rows)
        return
    render.table(None, rows, [("job_id", "id"), ("job_name", "name"), ("owner", "owner"), ("kind", "kind"),
                              ("schedule", "schedule"), ("priority", "priority"), ("state", "state"),
                              ("next_start", "next start"),
                              ("last_outcome", "last outcome"), ("last_outcome_at", "at"),
                              ("consecutive_failures", "failures in a row"), ("waiting_for", "waiting for")])


@main.command()
@click.argument("job", required=False, callback=_checked_job)
@dsn_option
@click.option("--outcome", type=OUTCOMES, default=None, help="Only runs with this outcome.")
@click.option("--since", default=None, help="Only runs that ended (or started) this recently: 90s, 15m, 1h, 2d.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=20, show_default=True)
@json_option
def history(job: str | None, dsn: str | None, outcome: str | None, since: str | None, limit: int,
            as_json: bool) -> None:
    """Runs, newest first (of JOB: a job id or name)."""
    from pgsched.ops import query, render

    try:
        window = query.parse_duration(since, "--since") if since is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e).split(": ", 1)[1], param_hint="--since") from None
    with _ops(dsn) as conn:
        job_id = _job(conn, job).job_id if job is not None else None
        rows = query.history(conn, job_id=job_id, outcome=outcome, since=window, limit=limit)
    if as_json:
        render.emit_json(rows)
        return
    render.table(None, rows, [("run_id", "run"), ("job_id", "job"), ("job_name", "name"), ("trigger", "trigger"),
                              ("started_at", "started"), ("outcome", "outcome"), ("duration_s", "duration s"),
                              ("lag_s", "lag s"), ("sqlstate", "sqlstate"), ("message", "message")])


@main.command("next")
@click.argument("job", required=False, callback=_checked_job)
@click.option("--schedule", "expr", default=None, help="A cron expression or interval instead of a job's.")
@click.option("--timezone", default=None, help="IANA time zone of --schedule (default UTC).")
@click.option("-n", "--count", type=click.IntRange(1, 1000), default=5, show_default=True)
@dsn_option
@json_option
def next_cmd(job: str | None, expr: str | None, timezone: str | None, count: int, dsn: str | None,
             as_json: bool) -> None:
    """Next start times of JOB, or of --schedule EXPR (pgsched's own schedule code; no database needed)."""
    from datetime import UTC, datetime

    from pgsched import schedule
    from pgsched.ops import query, render, upcoming

    if (job is None) == (expr is None):
        raise click.UsageError("give either JOB or --schedule EXPR")
    if timezone is not None and not timezone.strip():
        raise click.BadParameter("is blank: give an IANA time zone such as 'Europe/Berlin' or 'UTC', or leave "
                                 "it out for UTC", param_hint="--timezone")
    try:
        if expr is not None:
            s = upcoming.parse(expr, timezone)
            starts = upcoming.next_starts(s, first=schedule.first_start(s, datetime.now(UTC)), n=count)
        else:
            if timezone is not None:
                raise click.UsageError("--timezone goes with --schedule (a job has its own)")
            with _ops(dsn) as conn:
                row = query.job_schedule(conn, _job(conn, job).job_id)  # type: ignore[arg-type]
                now = query.db_now(conn)
            starts = upcoming.job_starts(row, now=now, n=count)
    except schedule.ScheduleError as e:
        where = "JOB" if expr is None else "--timezone" if e.argument == "timezone" else "--schedule"
        raise click.BadParameter(str(e), param_hint=where) from None
    except (OverflowError, ValueError) as e:  # datetime's own: a plan after the year 9999
        where = "--schedule" if expr is not None else "JOB"
        raise click.BadParameter(f"its next starts fall beyond the year 9999 ({e})", param_hint=where) from None
    if as_json:
        render.emit_json(starts)
        return
    for t in starts:
        render.line(t.isoformat())


def _set_scheduled(dsn: str | None, refs: tuple[str, ...], scheduled: bool) -> None:
    from pgsched.ops import query

    with _ops(dsn) as conn:
        found = [_job(conn, r) for r in refs]  # every JOB checked before anything is written
        # One transaction: a job this role may see but not change (alter_job refuses it) leaves
        # the others as they were.
        with conn.transaction():
            for j in found:
                query.set_scheduled(conn, j.job_id, scheduled)
    for j in found:
        click.echo(printable(f"job {j.job_id} ({j.job_name}) {'resumed' if scheduled else 'paused'}"))


@main.command()
@click.argument("jobs_", metavar="JOB...", nargs=-1, required=True, callback=_checked_job)
@dsn_option
def pause(jobs_: tuple[str, ...], dsn: str | None) -> None:
    """Pause jobs (alter_job scheduled => false): a run in progress finishes."""
    _set_scheduled(dsn, jobs_, False)


@main.command()
@click.argument("jobs_", metavar="JOB...", nargs=-1, required=True, callback=_checked_job)
@dsn_option
def resume(jobs_: tuple[str, ...], dsn: str | None) -> None:
    """Resume paused or disabled jobs (alter_job scheduled => true)."""
    _set_scheduled(dsn, jobs_, True)


wait_option = click.option("--wait", type=Seconds(0), default=10.0, show_default=True,
                           help="Seconds to wait for a scheduler to act (0: do not wait).")


@main.command()
@click.argument("job", callback=_checked_job)
@dsn_option
@wait_option
def trigger(job: str, dsn: str | None, wait: float) -> None:
    """Run JOB now on a scheduler (recorded with trigger 'manual'; the schedule is unchanged)."""
    from pgsched.ops import query

    with _ops(dsn) as conn:
        j = _job(conn, job)
        plan = query.trigger(conn, j.job_id)
        deadline = time.monotonic() + wait
        run = query.manual_run(conn, j.job_id, plan)
        while run is None and time.monotonic() < deadline:
            time.sleep(0.1)
            run = query.manual_run(conn, j.job_id, plan)
    if run is None and wait > 0:
        _fail(f"job {j.job_id} ({j.job_name}): no scheduler started the run within {wait:g}s: is `pgsched serve` "
              "running (with the job's --app, for a Python job)? The request stands for 10 minutes: a scheduler "
              "started meanwhile takes it, and one that heard it starts it once the job's run in progress ends")
    click.echo(printable(f"job {j.job_id} ({j.job_name}): " +
                         (f"run {run['run_id']} started" if run else f"run requested (plan_time {plan.isoformat()})")))


@main.command()
@click.argument("job", callback=_checked_job)
@dsn_option
@wait_option
def cancel(job: str, dsn: str | None, wait: float) -> None:
    """Cancel JOB's run in progress (outcome 'cancelled')."""
    from pgsched.ops import query

    with _ops(dsn) as conn:
        j = _job(conn, job)
        run_ids = query.cancel(conn, j.job_id)
        if not run_ids:
            own = query.session_runs(conn, j.job_id)
            if own:
                _fail(f"job {j.job_id} ({j.job_name}): run {own[0]['run_id']} is a run_job in the session of "
                      f"backend {own[0]['backend_pid']}, not a scheduler's: cancel it with "
                      f"SELECT pg_cancel_backend({own[0]['backend_pid']})")
            _fail(f"job {j.job_id} ({j.job_name}) has no run in progress")
        deadline = time.monotonic() + wait
        outcomes = query.run_outcomes(conn, run_ids)
        while any(o == "running" for o in outcomes.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            outcomes = query.run_outcomes(conn, run_ids)
    for rid in run_ids:
        outcome = outcomes.get(rid, "ended (its job's history level keeps no row of it)")
        click.echo(printable(f"job {j.job_id} ({j.job_name}): run {rid} "
                             f"{outcome if outcome != 'running' else 'cancel asked'}"))
    if wait > 0 and any(o == "running" for o in outcomes.values()):
        _fail(f"job {j.job_id}: the run did not end within {wait:g}s (its scheduler may be unreachable)")


@main.command()
@dsn_option
@click.option("--all", "all_", is_flag=True, help="Stopped instances too.")
@json_option
def instances(dsn: str | None, all_: bool, as_json: bool) -> None:
    """Scheduler instances: host, pid, version, workers busy/total, last heartbeat."""
    from pgsched.ops import query, render

    with _ops(dsn) as conn:
        rows = query.instances(conn, all_=all_)
    if as_json:
        render.emit_json(rows)
        return
    for r in rows:
        r["workers"] = f"{r['runs_in_progress']}/{r['max_workers']}"
    render.table(None, rows, [("instance_id", "id"), ("host", "host"), ("pid", "pid"), ("version", "version"),
                              ("alive", "alive"), ("workers", "busy/total"), ("heartbeat_at", "last heartbeat"),
                              ("runs_in_progress", "runs"), ("started_at", "started"), ("stopped_at", "stopped")])


@main.command()
@dsn_option
@json_option
def limits(dsn: str | None, as_json: bool) -> None:
    """Concurrency keys: each one's limit, the runs holding it and the jobs waiting for it
    (set a limit with SELECT pgsched.set_concurrency_limit('key', n))."""
    from pgsched.ops import query, render

    with _ops(dsn) as conn:
        rows = query.concurrency_limits(conn)
    if as_json:
        render.emit_json(rows)
        return
    render.table(None, rows, [("concurrency_key", "key"), ("max_running", "limit"), ("running", "running"),
                              ("jobs", "jobs"), ("waiting", "waiting")])


@main.command()
@dsn_option
@json_option
def status(dsn: str | None, as_json: bool) -> None:
    """One screen of health. Exit 0 healthy, 1 degraded (a job disabled by failures or crashes, an
    instance that stopped heartbeating), 2 no live instance or the database unreachable."""
    from pgsched.ops import health, query, render

    target = _ops_dsn(dsn)
    try:
        with query.connect(target) as conn:
            now = query.db_now(conn)
            inst = query.instances(conn)
            job_rows = query.jobs(conn)
            counts = query.run_counts(conn)
            errors = query.last_errors(conn)
    except (PgschedError, psycopg.Error) as e:
        if as_json:
            render.emit_json({"status": "down", "code": 2, "reasons": [scrub(first_line(e), target)]})
        _fail(scrub(first_line(e), target), 2)
    verdict = health.judge(inst, job_rows, now)
    failing = [j for j in job_rows if j["consecutive_failures"] or j["consecutive_crashes"]]
    disabled = [j for j in job_rows if j["state"] == "disabled" and j["disabled_reason"]]
    for c in counts:
        c["per_min_5m"], c["per_min_60m"] = c["last_5m"] / 5, c["last_60m"] / 60
    alive = [i for i in inst if i["alive"]]
    busy, total = sum(i["runs_in_progress"] for i in alive), sum(i["max_workers"] for i in alive)
    if as_json:
        render.emit_json({"status": verdict.word, "code": verdict.code, "reasons": verdict.reasons,
                          "instances_alive": len(alive), "workers_busy": busy, "workers_total": total,
                          "runs": counts, "failing_jobs": failing, "disabled_jobs": disabled, "last_errors": errors})
    else:
        render.line(f"{verdict.word.upper()}: {len(alive)} live instance(s), workers busy {busy}/{total}")
        for reason in verdict.reasons:
            render.line(f"  - {reason}")
        render.table("runs per minute", counts, [("outcome", "outcome"), ("per_min_5m", "last 5 min"),
                                                 ("per_min_60m", "last 60 min")])
        render.table("failing jobs", failing, [("job_id", "id"), ("job_name", "name"),
                                               ("consecutive_failures", "failures"),
                                               ("consecutive_crashes", "crashes"), ("last_outcome", "last")])
        render.table("disabled jobs", disabled, [("job_id", "id"), ("job_name", "name"),
                                                 ("disabled_reason", "reason")])
        render.table("last errors", errors, [("run_id", "run"), ("job_id", "job"), ("job_name", "name"),
                                             ("outcome", "outcome"), ("finished_at", "at"),
                                             ("sqlstate", "sqlstate"), ("message", "message")])
    sys.exit(verdict.code)


@main.command()
@dsn_option
@click.option("--count", type=click.IntRange(1), default=None, help="Exit after this many events.")
@click.option("--timeout", type=Seconds(0), default=None, help="Exit after this many seconds without one.")
@json_option
def watch(dsn: str | None, count: int | None, timeout: float | None, as_json: bool) -> None:
    """Print failures, timeouts, crashes and disabled jobs as they happen (pgsched_events).

    A lost connection (a server restart, a failover) is re-opened, waiting up to 10 s between
    tries; the events sent meanwhile are not shown (`pgsched history` lists every run)."""
    from pgsched.ops import query, render
    from pgsched.ops import watch as w

    shown = 0
    pause = 0.5
    target = _ops_dsn(dsn)

    def listening() -> None:
        nonlocal pause
        pause = 0.5
        click.echo("watching pgsched_events (Ctrl-C to stop)", err=True)

    try:
        while True:
            try:
                with query.connect(target) as conn:
                    for event in w.follow(conn, limit=None if count is None else count - shown, timeout=timeout,
                                          on_listening=listening):
                        click.echo(render.to_json(event) if as_json else w.text(event))
                        shown += 1
                return
            except psycopg.OperationalError as e:
                click.echo(f"connection lost ({scrub(first_line(e), target)}); reconnecting in {pause:.1f}s",
                           err=True)
                time.sleep(pause)
                pause = min(10.0, pause * 2)
            except (PgschedError, psycopg.Error) as e:
                _fail(scrub(first_line(e), target))
    except KeyboardInterrupt:
        pass


@main.command()
@dsn_option
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve the dashboard on.")
@click.option("--single-user", is_flag=True,
              help="No sign-in: act as the DSN's role (loopback addresses only).")
@click.option("--session-idle", type=Seconds(10), default=1800.0, show_default=True,
              help="A session ends after this many seconds without a request of the person's "
                   "(the live refresh's do not count).")
@click.option("--session-lifetime", type=Seconds(60), default=8 * 3600.0, show_default=True,
              help="A session ends this many seconds after sign-in.")
@click.option("--secure-cookies", is_flag=True,
              help="Mark cookies Secure (sent over https only): for a dashboard reached through an https proxy.")
def web(dsn: str | None, listen: str, single_user: bool, session_idle: float, session_lifetime: float,
        secure_cookies: bool) -> None:
    """The web dashboard (needs `pip install 'pgsched[web]'`): sign in with a PostgreSQL role."""
    try:
        import uvicorn  # noqa: F401

        import pgsched.web.app  # noqa: F401 (starlette, jinja2)
        from pgsched.web import server
    except ImportError as e:  # pragma: no cover - depends on the installed extras
        _fail(f"pgsched web needs the web extra: pip install 'pgsched[web]' ({e})")
    target = _ops_dsn(dsn)
    try:
        server.serve(target, listen, single_user=single_user, idle=session_idle, lifetime=session_lifetime,
                     secure_cookies=secure_cookies)
    except (PgschedError, psycopg.Error) as e:
        _fail(scrub(first_line(e), target))


@main.group("import")
def import_group() -> None:
    """Move jobs from another scheduler into pgsched."""


@import_group.command("pg-cron")
@click.option("--dsn", "source", required=True, callback=_checked_dsn,
              help="libpq connection string of the database where pg_cron runs (its cron.database_name).")
@click.option("--target", default=None, callback=_checked_dsn,
              help="pgsched's database when it is not that one (then --disable-source is refused).")
@click.option("--history", is_flag=True, help="Also copy cron.job_run_details into pgsched's history.")
@click.option("--disable-source", is_flag=True,
              help="Set the imported pg_cron jobs inactive in the same transaction (the switch-over).")
def import_pg_cron(source: str, target: str | None, history: bool, disable_source: bool) -> None:
    """Create pgsched jobs from pg_cron's cron.job in one transaction; safe to run again."""
    from pgsched.pgcron_import import import_pg_cron as run_import

    for value, name in ((source, "--dsn"), (target, "--target")):
        if value is not None and not value.strip():
            raise click.BadParameter("is blank: give a libpq connection string (host=db dbname=app ...) or a URI",
                                     param_hint=name)
    try:
        report = run_import(source, target, history=history, disable_source=disable_source)
    except (PgschedError, psycopg.Error) as e:
        # Its connection errors name the database and DSN (password removed); a driver message
        # from later may still echo a password.
        _fail(scrub(scrub(str(e).strip(), source), target or ""))
    for line in report.lines():
        click.echo(line)


@main.group("extension")
def extension_group() -> None:
    """CREATE EXTENSION pgsched on a self-hosted server (pgsched init is the way on a managed one)."""


@extension_group.command("install")
@click.option("--pg-config", "pg_config", default=None,
              help="The server's pg_config (default: the one on PATH); its --sharedir decides where.")
@click.option("--dir", "directory", default=None, type=click.Path(path_type=Path), envvar="PGSCHED_EXTENSION_DIR",
              show_envvar=True,
              help="Write into this directory instead (packaging; the server's is SHAREDIR/extension).")
def extension_install(pg_config: str | None, directory: Path | None) -> None:
    """Write pgsched.control and the versioned scripts, generated from this pgsched's sql/, into the
    server's extension directory; then CREATE EXTENSION pgsched (or ALTER EXTENSION pgsched UPDATE)."""
    from pgsched import extension

    try:
        target = directory if directory is not None else extension.sharedir(pg_config)
        written = extension.install(target, extension.scripts())
    except PgschedError as e:
        _fail(str(e))
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"pgsched {__version__}: now CREATE EXTENSION pgsched; (or ALTER EXTENSION pgsched UPDATE;) "
               "in each database")
