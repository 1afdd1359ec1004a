"""The program's entry (pgsched/cli.py): which command lines start `serve`'s fork server early, and
what a fork from a fork server started that early is sent of the environment."""

from __future__ import annotations

import pytest

from pgsched.cli import serves_one_database
from pgsched.forkserver import environ_changes


@pytest.mark.parametrize(("args", "environ", "early"), [
    (["serve"], {}, True),
    (["serve", "--dsn", "dbname=x", "--max-workers", "4"], {}, True),
    (["serve", "--app", "jobs", "--log-format", "json"], {"PGSCHED_DSN": "dbname=x"}, True),
    (["serve", "--all-databases"], {}, False),  # the launcher forks no workers of its own
    (["serve"], {"PGSCHED_ALL_DATABASES": "1"}, False),
    (["serve", "--help"], {}, False),
    ([], {}, False),
    (["status"], {}, False),
    (["--version"], {}, False),
    (["run", "serve"], {}, False),  # `serve` as another command's argument
])
def test_only_serve_for_one_database_starts_the_fork_server_early(
        args: list[str], environ: dict[str, str], early: bool) -> None:
    assert serves_one_database(args, environ) is early


def test_a_fork_is_sent_what_changed_since_the_fork_server_started() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/a", "GONE": "x", "SAME": "1"}
    wanted = {"PATH": "/bin", "PYTHONPATH": "/cwd:/a", "SAME": "1", "PGSCHED_WORKER_DSN": "dbname=x"}
    assert environ_changes(base, wanted) == {"PYTHONPATH": "/cwd:/a", "PGSCHED_WORKER_DSN": "dbname=x", "GONE": None}
    changes = environ_changes(base, wanted)
    applied = {**base, **{k: v for k, v in changes.items() if v is not None}}
    assert {k: v for k, v in applied.items() if changes.get(k, "") is not None} == wanted
    assert environ_changes(wanted, wanted) == {}


@pytest.mark.parametrize(("args", "environ"), [
    (["jobs", "--dsn", "postgresql://alice:S3cr%t!pw@localhost:5432/app"], {}),
    (["status"], {"PGSCHED_DSN": "host=db password=top S3cr%t!pw"}),
    (["serve", "--dsn", "host=db password='S3cr%t!pw"], {}),
])
def test_a_dsn_libpq_cannot_parse_is_refused_without_quoting_it(args: list[str], environ: dict[str, str]) -> None:
    """libpq's own message quotes the token it could not parse, which may be the password."""
    from click.testing import CliRunner

    from pgsched.commands import main

    result = CliRunner().invoke(main, args, env=environ)
    assert result.exit_code == 2, result.output
    assert "not a valid connection string" in result.output and "--dsn" in result.output
    assert "S3cr" not in result.output


def test_next_of_a_schedule_beyond_the_year_9999_is_a_usage_error() -> None:
    from click.testing import CliRunner

    from pgsched.commands import main

    result = CliRunner().invoke(main, ["next", "--schedule", "178000000 years"])
    assert result.exit_code == 2, result.output
    assert "--schedule" in result.output and "9999" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args", [["history", ""], ["next", " "], ["trigger", ""], ["cancel", "\t"],
                                  ["pause", "1", ""], ["resume", ""]])
def test_a_blank_job_is_a_usage_error_before_any_connection(args: list[str]) -> None:
    """`history ''` listed every job's runs: a blank JOB read as no JOB at all."""
    from click.testing import CliRunner

    from pgsched.commands import main

    result = CliRunner().invoke(main, [*args, "--dsn", "host=127.0.0.1 port=1 connect_timeout=1"])
    assert result.exit_code == 2, result.output
    assert "is blank: expected a job id or the name of a job" in result.output and "JOB" in result.output
