"""Log set-up: plain text, or one JSON object per line (--log-format json, python-json-logger);
and the scheduler's held records (HeldRecords).

A JSON record has ts, level, logger and msg, plus whatever the call passed as `extra`: the
scheduler's run start and end records carry RUN_FIELDS as keys of their own, so a program
reads them without parsing the message (bench/ does).
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.json import JsonEncoder, JsonFormatter

from pgsched.errors import printable

# The keys of a run's start and end records (pgsched/dispatch.py): what each holds.
RUN_FIELDS = ("job_id", "job_name", "run_id", "outcome", "duration_s", "lag_s", "sqlstate", "instance_id")


class PgschedJsonFormatter(JsonFormatter):
    """python-json-logger with pgsched's key names: ts (UTC, ms), level (lower case), logger, msg."""

    def __init__(self) -> None:
        super().__init__("{asctime}{levelname}{name}{message}", style="{",
                         rename_fields={"asctime": "ts", "levelname": "level", "name": "logger", "message": "msg"},
                         json_ensure_ascii=False)
        self._encoder = JsonEncoder(ensure_ascii=False)

    def jsonify_log_record(self, log_data: dict[str, Any]) -> str:
        # One encoder for every record: json.dumps(cls=...) builds a new one per call.
        return str(self._encoder.encode(log_data))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        # The keys are fixed, so the library's generic add_fields (defaults, renames, prefix checks
        # per key) is not needed; with the one encoder below, a run record takes 6.6 us instead of
        # 10 (the scheduler writes two per run at info).
        log_data["ts"] = record.asctime
        log_data["level"] = record.levelname.lower()
        log_data["logger"] = record.name
        log_data["msg"] = record.message
        log_data.update(message_dict)
        skip = self._skip_fields
        for key, value in record.__dict__.items():
            if key not in skip and key[:1] != "_":
                log_data[key] = value
        if "exc_info" in log_data:
            log_data["exc"] = log_data.pop("exc_info")


class HeldRecords:
    """Info records made now and written later: the scheduler's run start and end records (two a
    run, the largest part of its own work a run) are written while its claim is on the database
    or when it has nothing else to do, not between a worker's report and the next claim. A record
    keeps the time it was made, so its ts is the event's; it may be written after a record made
    later in the same round. A scheduler killed with -9 loses the records it held (at most a
    round's). Where setup()'s handler is the only one they reach, they go out as one write: a
    write a record cost the scheduler a system call per run start and end (`cpu_split`, 2026-12-02:
    1,267 runs/s against 1,391 with one write a round)."""

    # Held longer than this, they are written even when the scheduler has more to do at once.
    MAX_HOLD_S = 0.05

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.records: list[logging.LogRecord] = []
        self._since = 0.0  # monotonic: when the oldest was made

    def info(self, msg: str, *args: object, extra: dict[str, Any]) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        if not self.records:
            self._since = time.monotonic()
        # What Logger._log makes with logging._srcfile off (setup), without writing it.
        self.records.append(self.logger.makeRecord(self.logger.name, logging.INFO, "(unknown file)", 0, msg, args,
                                                   None, "(unknown function)", extra))

    def overdue(self) -> bool:
        return bool(self.records) and time.monotonic() >= self._since + self.MAX_HOLD_S

    def write(self) -> None:
        records = self.records
        if not records:
            return
        handler = _sole_handler(self.logger)
        if handler is not None:
            self.records = []
            handler.emit_all(records)
            return
        # One at a time off the front: a filter or handler that raises leaves the rest held.
        while records:
            self.logger.handle(records.pop(0))


class LinesHandler(logging.StreamHandler[TextIO]):
    """The handler setup() installs: a StreamHandler that can also write several records at once."""

    def emit_all(self, records: list[logging.LogRecord]) -> None:
        """Write `records` as one write and one flush: the held records of a round (a claim's
        worth of run starts and ends) cost one system call instead of one each."""
        lines = []
        last: logging.LogRecord | None = None
        for record in records:
            try:
                lines.append(self.format(record) + self.terminator)
                last = record
            except RecursionError:  # as StreamHandler.emit: not a record's fault
                raise
            except Exception:
                self.handleError(record)
        if last is None:
            return
        self.acquire()
        try:
            self.stream.write("".join(lines))
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(last)
        finally:
            self.release()


def _sole_handler(logger: logging.Logger) -> LinesHandler | None:
    """The LinesHandler that every INFO record of `logger` would reach, and nothing else would:
    no filter on the way, no other handler (pytest's caplog adds one). None: records go through
    logger.handle. (A logger class of a program's own, logging.setLoggerClass, whose handle or
    callHandlers does more is not consulted: pgsched's command line installs none.)"""
    if logger.disabled:
        return None
    current: logging.Logger | None = logger
    found: list[logging.Handler] = []
    while current is not None:
        if current.filters:
            return None
        found += current.handlers
        if not current.propagate:
            break
        current = current.parent
    if len(found) != 1 or not isinstance(found[0], LinesHandler):
        return None
    handler = found[0]
    return handler if not handler.filters and handler.level <= logging.INFO else None


class TextFormatter(logging.Formatter):
    """One line a record (its traceback aside): a job's name or error holding a newline or an
    escape sequence cannot forge another record or rewrite the terminal (errors.printable)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def setup(fmt: str = "text", level: str = "info") -> None:
    # Neither format shows where a record was logged from, nor its thread or process: the logging
    # module's documented switches (Logging HOWTO, "Optimization") leave them out of every record,
    # about 1.5 us of the 12 a run record costs (the scheduler writes two a run).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = LinesHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(PgschedJsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
