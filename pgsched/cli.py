"""The `pgsched` program's entry point: what `serve` needs started first, then the command line.

`serve`'s first run waits for a worker, and its first worker for the fork server's imports
(psycopg, pgsched.worker: about as long as this process's own imports of click and psycopg). The
fork server is therefore started here, before those imports, so that the two overlap on two
cores; from the serve command it would start only after them. Whether the command is `serve` is
read from the arguments before click parses them, so it is a guess: the command keeps the fork
server (launcher.start_fork_server), or stops it should the guess be wrong (forkserver.discard_early,
for `--all-databases`). The commands themselves are in pgsched/commands.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def main() -> None:
    """`pgsched ...`: start the fork server when the command serves one database, then run it."""
    if serves_one_database(sys.argv[1:], os.environ):
        from pgsched import forkserver

        forkserver.start_early()
    from pgsched.commands import main as commands

    commands(prog_name="pgsched")


def serves_one_database(args: list[str], environ: Mapping[str, str]) -> bool:
    """Whether these arguments look like `pgsched serve` for one database (not its --help)."""
    return (bool(args) and args[0] == "serve" and not {"--help", "--all-databases"} & set(args)
            and "PGSCHED_ALL_DATABASES" not in environ)


if __name__ == "__main__":
    main()
