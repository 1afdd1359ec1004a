"""The JSON log format: fixed keys, the record's extras as keys of their own, exceptions as text."""

from __future__ import annotations

import json
import logging
import sys
from datetime import date

from pgsched.logs import RUN_FIELDS, PgschedJsonFormatter


def _record(msg: object, args: tuple[object, ...] | None = None, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("pgsched.dispatch", logging.WARNING, __file__, 1, msg, args, exc_info)
    rec.created = 1_790_000_000.25
    return rec


def test_fixed_keys_first_then_the_extras_in_call_order() -> None:
    rec = _record("run %s ended: %s", (5, "success"))
    extra = dict(zip(RUN_FIELDS, (7, "nightly", 5, "success", 0.5, 0.001, None, 3), strict=True))
    for key, value in extra.items():
        setattr(rec, key, value)
    out = json.loads(PgschedJsonFormatter().format(rec))
    assert list(out) == ["ts", "level", "logger", "msg", *RUN_FIELDS]
    assert out["ts"] == "2026-09-21T14:13:20.250+00:00"
    assert (out["level"], out["logger"], out["msg"]) == ("warning", "pgsched.dispatch", "run 5 ended: success")
    assert {k: out[k] for k in RUN_FIELDS} == extra


def test_exception_is_one_text_field_and_private_attributes_stay_out() -> None:
    rec = _record("failed", exc=True)
    rec._private = "x"
    out = json.loads(PgschedJsonFormatter().format(rec))
    assert set(out) == {"ts", "level", "logger", "msg", "exc"}
    assert out["exc"].startswith("Traceback") and "ZeroDivisionError: division by zero" in out["exc"]


def test_non_ascii_and_non_json_values_are_written() -> None:
    rec = _record("job %s", ("überprüfung",))
    rec.when = date(2026, 3, 29)
    line = PgschedJsonFormatter().format(rec)
    assert "überprüfung" in line
    assert json.loads(line)["when"] == "2026-03-29"
