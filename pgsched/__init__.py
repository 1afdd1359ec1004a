"""pgsched: a PostgreSQL job scheduler that runs beside the database as an ordinary client.

Python jobs: decorate a handler with @pgsched.job(...) and run `pgsched serve --app MODULE`.

The names below come from pgsched.app on first use, not on `import pgsched`: every worker
process imports this package, and a worker that runs SQL jobs has no use for the declaration
machinery (pgsched.app and what it imports took about 60 ms of each worker's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgsched.app import JobDeclarationError, LeaseLost, Result, Run, job

__version__ = "0.2.0"
__all__ = ["JobDeclarationError", "LeaseLost", "Result", "Run", "__version__", "job"]
_FROM_APP = frozenset(__all__) - {"__version__"}


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if not TYPE_CHECKING:  # for the type checker the names are the imports above, and a misspelling an error

    def __getattr__(name: str) -> Any:
        if name in _FROM_APP:
            return getattr(importlib.import_module("pgsched.app"), name)
        raise AttributeError(f"module 'pgsched' has no attribute {name!r}")
