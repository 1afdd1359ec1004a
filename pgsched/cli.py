"""The `pgsched` command line: parses options and hands off; no logic lives here."""

from __future__ import annotations

import sys

import click
import psycopg

from pgsched import migrate
from pgsched.config import redact, resolve_dsn
from pgsched.errors import PgschedError

dsn_option = click.option(
    "--dsn", envvar=None, default=None,
    help="libpq connection string; default PGSCHED_DSN, then the libpq environment (PGHOST, PGDATABASE, ...).",
)


@click.group()
@click.version_option(package_name="pgsched")
def main() -> None:
    """pgsched: run jobs that live in a PostgreSQL database."""


@main.command()
@dsn_option
@click.option("--no-plpython", is_flag=True, help="Do not install the PL/Python schedule functions.")
def init(dsn: str | None, no_plpython: bool) -> None:
    """Install or upgrade the pgsched schema in a database."""
    target = resolve_dsn(dsn)
    try:
        with psycopg.connect(target or "", autocommit=True) as conn:
            result = migrate.init(conn, plpython=not no_plpython)
    except (PgschedError, psycopg.Error) as e:
        raise click.ClickException(f"{redact(target or '')}: {e}".lstrip(": ")) from None
    if result.applied:
        click.echo(f"applied migrations {', '.join(map(str, result.applied))}; schema version {result.version}")
    else:
        click.echo(f"schema version {result.version} is up to date")
    click.echo(f"PL/Python schedule functions: {'installed' if result.plpython else 'not available'}")


if __name__ == "__main__":
    sys.exit(main())
