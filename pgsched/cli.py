"""The `pgsched` command line: parses options and hands off; no logic lives here."""

from __future__ import annotations

import os
import sys

import click
import psycopg

from pgsched import __version__, migrate
from pgsched.config import redact, resolve_dsn
from pgsched.errors import PgschedError

dsn_option = click.option(
    "--dsn", envvar=None, default=None,
    help="libpq connection string; default PGSCHED_DSN, then the libpq environment (PGHOST, PGDATABASE, ...).",
)


@click.group()
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


def _import_apps(apps: tuple[str, ...]) -> None:
    """Import the app modules now, so a bad declaration stops us before anything is written."""
    from pgsched import app, pyjob

    if not apps:
        return
    # Like other app servers, find the user's modules from the current directory.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    try:
        pyjob.import_apps(list(apps))
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
              help="Runs at once (default 8).")
@click.option("--shutdown-timeout", type=click.FloatRange(0), default=None,
              help="Seconds SIGTERM waits for running jobs before cancelling them (default 30).")
@click.option("--crash-wait", type=click.FloatRange(0), default=None,
              help="After start-up, seconds before a job whose run crashed runs again (default 300).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file of settings; SIGHUP re-reads it.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
@app_option
def serve(dsn: str | None, max_workers: int | None, shutdown_timeout: float | None, crash_wait: float | None,
          config_file: str | None, log_format: str, log_level: str, apps: tuple[str, ...]) -> None:
    """Run the scheduler for one database (an embedded local PostgreSQL when no DSN is configured)."""
    from pgsched import logs
    from pgsched.config import read_settings_file
    from pgsched.scheduler import Scheduler, Settings

    logs.setup(log_format, log_level)
    _import_apps(apps)
    cli_values: dict[str, object] = {k: v for k, v in {
        "max_workers": max_workers, "shutdown_timeout": shutdown_timeout, "crash_wait": crash_wait,
    }.items() if v is not None}
    cli_values["apps"] = apps
    try:
        target = resolve_dsn(dsn)
        if target is None:
            target = _embedded_dsn()

        def load() -> Settings:
            from_file = read_settings_file(config_file) if config_file else {}
            return Settings(dsn=target or "", **{**from_file, **cli_values})  # type: ignore[arg-type]

        scheduler = Scheduler(load())
        if config_file:
            scheduler.reloader = load
        scheduler.install_signal_handlers()
        scheduler.run()
    except PgschedError as e:
        raise click.ClickException(str(e)) from None


@main.command("run")
@click.argument("job_id", type=int)
@dsn_option
@app_option
def run_cmd(job_id: int, dsn: str | None, apps: tuple[str, ...]) -> None:
    """Run a job now in this process (Python jobs need their --app), recorded like any run."""
    from pgsched import pyjob

    _import_apps(apps)
    target = resolve_dsn(dsn) or ""
    try:
        result = pyjob.run_now(target, job_id)
    except (PgschedError, psycopg.Error) as e:
        raise click.ClickException(str(e).strip()) from None
    if not result.ok:
        raise click.ClickException(f"job {job_id} failed: {result.message}")
    click.echo(f"job {job_id} succeeded" + (f": {result.result}" if result.result is not None else ""))


if __name__ == "__main__":
    sys.exit(main())


@main.group("import")
def import_group() -> None:
    """Move jobs from another scheduler into pgsched."""


@import_group.command("pg-cron")
@click.option("--dsn", "source", required=True,
              help="libpq connection string of the database where pg_cron runs (its cron.database_name).")
@click.option("--target", default=None,
              help="pgsched's database when it is not that one (then --disable-source is refused).")
@click.option("--history", is_flag=True, help="Also copy cron.job_run_details into pgsched's history.")
@click.option("--disable-source", is_flag=True,
              help="Set the imported pg_cron jobs inactive in the same transaction (the switch-over).")
def import_pg_cron(source: str, target: str | None, history: bool, disable_source: bool) -> None:
    """Create pgsched jobs from pg_cron's cron.job in one transaction; safe to run again."""
    from pgsched.pgcron_import import import_pg_cron as run_import

    try:
        report = run_import(source, target, history=history, disable_source=disable_source)
    except (PgschedError, psycopg.Error) as e:
        raise click.ClickException(f"{redact(source)}: {str(e).strip()}") from None
    for line in report.lines():
        click.echo(line)
