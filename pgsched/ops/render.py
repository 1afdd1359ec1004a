"""Drawing the operator commands' results: rich tables for people, JSON for programs (--json:
one JSON document on stdout, times in ISO 8601, durations in seconds)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pgsched.errors import printable


def _plain(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def to_json(data: Any) -> str:
    return json.dumps(data, default=_plain, indent=None)


def emit_json(data: Any) -> None:
    sys.stdout.write(to_json(data) + "\n")


def cell(value: Any) -> str:
    """How a value reads in a table: times to the second in the reader's zone as stored, seconds to
    ms, text with its control characters escaped (rich strips a few, not ESC: a job's name could
    drive the reader's terminal)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, timedelta):
        return f"{value.total_seconds():.3f}s"
    return printable(str(value))


def table(title: str | None, rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
          console: Console | None = None) -> None:
    """A table of `rows` with (key, header) columns; an empty result says so."""
    out = console or Console()
    if not rows:
        out.print(f"{title + ': ' if title else ''}none")
        return
    t = Table(title=title, title_justify="left", show_lines=False)
    for _, header in columns:
        t.add_column(header, overflow="fold")
    for r in rows:
        # Text, not str: what the database holds (a job's name, an error) is shown as written,
        # never read as rich's markup ('[/x]' would fail the whole table).
        t.add_row(*(Text(cell(r.get(key))) for key, _ in columns))
    out.print(t)


def line(text: str, console: Console | None = None) -> None:
    (console or Console()).print(printable(text), markup=False, highlight=False)
