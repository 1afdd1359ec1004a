"""pgsched: a PostgreSQL job scheduler that runs beside the database as an ordinary client."""

__version__ = "0.1.0"
