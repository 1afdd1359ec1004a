"""The JSON log format: fixed keys, the record's extras as keys of their own, exceptions as text."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from datetime import date

import pytest

from pgsched import logs
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


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_held_records_are_written_only_when_asked_in_order_with_the_time_they_were_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("pgsched.test_held")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    out = _Collect()
    logger.addHandler(out)
    wall = [100.0]
    # LogRecord reads time.time() (time.time_ns() from Python 3.13 on).
    monkeypatch.setattr(time, "time", lambda: wall[0])
    monkeypatch.setattr(time, "time_ns", lambda: round(wall[0] * 1e9))
    mono = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: mono[0])
    try:
        held = logs.HeldRecords(logger)
        assert not held.overdue()  # nothing held
        held.info("run start job=%s", 1, extra={"run_id": 5})
        wall[0] = 100.01
        held.info("run end job=%s", 1, extra={"run_id": 5, "outcome": "success"})
        wall[0] = 200.0  # written later: each keeps the time it was made
        assert out.records == []
        mono[0] = 10.0 + held.MAX_HOLD_S - 0.001
        assert not held.overdue()
        mono[0] = 10.0 + held.MAX_HOLD_S
        assert held.overdue()
        held.write()
        assert [(r.getMessage(), r.created, r.__dict__["run_id"]) for r in out.records] == [
            ("run start job=1", 100.0, 5), ("run end job=1", 100.01, 5)]
        assert out.records[1].__dict__["outcome"] == "success" and out.records[0].levelno == logging.INFO
        assert not held.overdue() and held.records == []
        held.write()  # nothing more
        assert len(out.records) == 2
        logger.setLevel(logging.WARNING)  # --log-level warning: nothing is made, nothing held
        held.info("run start job=%s", 2, extra={"run_id": 6})
        assert held.records == []
    finally:
        logger.removeHandler(out)
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def test_a_text_record_is_one_line_whatever_a_role_wrote_into_it() -> None:
    """A job's name holding an escape sequence and a newline cannot rewrite the terminal or forge
    another record (review of 2026-11-29); its traceback still follows on lines of its own."""
    name = "evil\x1b[2K\r2026-11-29 job 1 (payroll) FAILURE [XX000]: fake\nline2\x85"
    formatter = logs.TextFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("pgsched.scheduler", logging.ERROR, __file__, 1, "job %s (%s) disabled",
                               (7, name), None)
    out = formatter.format(record)
    assert out == ("ERROR pgsched.scheduler: job 7 (evil\\x1b[2K\\r2026-11-29 job 1 (payroll) FAILURE [XX000]: "
                   "fake\\nline2\\x85) disabled")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("pgsched", logging.ERROR, __file__, 1, "tab\tand caf\u00e9", (), sys.exc_info())
    lines = formatter.format(record).splitlines()
    assert lines[0] == "ERROR pgsched: tab\tand caf\u00e9" and lines[-1] == "ValueError: boom"


def test_watch_lines_escape_control_characters() -> None:
    from datetime import UTC, datetime

    from pgsched.ops import watch

    line = watch.text({"event": "run_end", "job_id": 3, "job_name": "a\x1b]0;x\x07\nb", "run_id": 9, "attempt": 1,
                       "outcome": "failure", "sqlstate": "P0001", "message": "two\nlines",
                       "plan_time": datetime(2026, 11, 29, tzinfo=UTC)})
    assert line == ("2026-11-29T00:00:00+00:00 job 3 (a\\x1b]0;x\\x07\\nb) run 9 attempt 1 FAILURE [P0001]: "
                    "two\\nlines")


class _Stream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


class _Bad:
    def __str__(self) -> str:
        raise RuntimeError("cannot print")


def test_held_records_reaching_only_the_installed_handler_are_written_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Held records go out in one write when setup()'s handler is the only one they reach; a
    record that cannot be formatted is reported as logging reports it, and the rest are written;
    whatever logging would apply on the way (a filter, a level, another handler, a disabled
    logger) sends them one at a time through Logger.handle, which applies it."""
    root = logging.getLogger()
    scheduler = logging.getLogger("pgsched.scheduler")
    saved = (root.handlers[:], root.level, logging._srcfile, logging.logThreads, logging.logProcesses,
             logging.logMultiprocessing)
    errors: list[logging.LogRecord] = []

    def written() -> list[int]:
        return [json.loads(line)["run_id"] for line in stream.getvalue().splitlines()]

    try:
        logs.setup("json", "info")
        handler = root.handlers[0]
        assert isinstance(handler, logs.LinesHandler)
        stream = _Stream()
        handler.setStream(stream)
        monkeypatch.setattr(handler, "handleError", errors.append)
        held = logs.HeldRecords(scheduler)
        held.info("run start job=%s", 1, extra={"run_id": 5})
        held.info("run start job=%s", _Bad(), extra={"run_id": 6})
        held.info("run end job=%s", 1, extra={"run_id": 5, "outcome": "success"})
        held.write()
        assert stream.writes == 1 and held.records == []
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [(r["msg"], r["run_id"]) for r in lines] == [("run start job=1", 5), ("run end job=1", 5)]
        assert [r.__dict__["run_id"] for r in errors] == [6]
        # Another handler on the way (pytest's caplog, a user's): one record at a time, to both.
        other = _Collect()
        root.addHandler(other)
        held.info("run start job=%s", 2, extra={"run_id": 7})
        held.info("run end job=%s", 2, extra={"run_id": 7, "outcome": "success"})
        held.write()
        assert stream.writes == 3 and [r.getMessage() for r in other.records] == ["run start job=2", "run end job=2"]
        root.removeHandler(other)
        # A filter on the logger, on the handler, a level on the handler, a logger that does not
        # propagate to it, a disabled logger: what they drop is not written.
        for drop in ("logger filter", "handler filter", "handler level", "no propagation", "disabled"):
            if drop == "logger filter":
                scheduler.addFilter(lambda r: r.__dict__.get("run_id") != 8)
            elif drop == "handler filter":
                handler.addFilter(lambda r: r.__dict__.get("run_id") != 8)
            elif drop == "handler level":
                handler.setLevel(logging.WARNING)
            elif drop == "no propagation":
                scheduler.propagate = False
            held.info("run start job=%s", 3, extra={"run_id": 8})
            if drop == "disabled":
                scheduler.disabled = True  # logging.config's doing, after the record was held
            before = written()
            held.write()
            assert written() == before and held.records == [], drop
            scheduler.filters.clear()
            handler.filters.clear()
            handler.setLevel(logging.NOTSET)
            scheduler.propagate = True
            scheduler.disabled = False
        held.info("run start job=%s", 4, extra={"run_id": 9})
        held.write()
        assert written() == [5, 5, 7, 7, 9]
    finally:
        scheduler.filters.clear()
        scheduler.propagate = True
        scheduler.disabled = False
        (root.handlers[:], level, logging._srcfile, logging.logThreads, logging.logProcesses,
         logging.logMultiprocessing) = saved
        root.setLevel(level)
