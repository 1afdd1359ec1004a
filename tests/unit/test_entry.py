"""The program's entry (pgsched/cli.py): which command lines start `serve`'s fork server early."""

from __future__ import annotations

import pytest

from pgsched.cli import serves_one_database


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
