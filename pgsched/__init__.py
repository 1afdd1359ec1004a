"""pgsched: a PostgreSQL job scheduler that runs beside the database as an ordinary client.

Python jobs: decorate a handler with @pgsched.job(...) and run `pgsched serve --app MODULE`.
"""

from pgsched.app import JobDeclarationError, LeaseLost, Result, Run, job

__version__ = "0.2.0"
__all__ = ["JobDeclarationError", "LeaseLost", "Result", "Run", "__version__", "job"]
