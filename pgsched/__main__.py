"""`python -m pgsched`: the same program as `pgsched`."""

from pgsched.cli import main

main()
