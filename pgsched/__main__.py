"""`python -m pgsched`: the same command line as `pgsched`."""

from pgsched.cli import main

main(prog_name="pgsched")
