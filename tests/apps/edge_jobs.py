"""Python jobs that misbehave at the edges of the run contract (tests/integration/test_code_job_edges.py).

Each records what it did in `py_hits` (job, plan_time, attempt, config) unless the test says otherwise,
so that a test can tell committed work from work rolled back. Their first start is far away: the
tests run them through a worker's run_one, through `pgsched run` (pyjob.run_now) or trigger them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import psycopg
import psycopg.rows
from psycopg.types.string import TextLoader

import pgsched
from tests.apps.demo_jobs import FAR

MODULE = __name__


def _hit(run: pgsched.Run) -> None:
    run.connection.execute("INSERT INTO py_hits VALUES (%s, %s, %s, NULL)", (run.job_name, run.plan_time, run.attempt))


# -- rows_affected: what a handler may put there (the scheduler closes the run with it) -------------

# A job per value, the value in its config ({"decimal": text} for a Decimal, which JSON cannot carry).
BAD_ROWS: dict[str, Any] = {"text": {"rows": "many"}, "float": {"rows": 2.5}, "bool": {"rows": True},
                            "huge": {"rows": 2**70}, "decimal": {"decimal": "3"}}
GOOD_ROWS: dict[str, Any] = {"most": {"rows": 2**63 - 1}, "least": {"rows": -(2**63)}, "none": {"rows": None}}


def rows_affected(run: pgsched.Run) -> pgsched.Result:
    _hit(run)
    value: Any = Decimal(run.config["decimal"]) if "decimal" in run.config else run.config["rows"]
    return pgsched.Result(rows_affected=value, data={"ok": True})


for _label, _config in {**BAD_ROWS, **GOOD_ROWS}.items():
    pgsched.job(every="1 hour", initial_start=FAR, config=_config, name=f"edge.rows.{_label}")(rows_affected)


# -- a database error caught by the handler ------------------------------------------------------------

@pgsched.job(every="1 hour", initial_start=FAR, name="edge.caught")
def caught(run: pgsched.Run) -> None:
    _hit(run)
    # ... and goes on: its transaction is in the error state, its COMMIT would roll it back.
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        run.connection.execute("SELECT 1 / 0")


# -- client-side settings a run leaves on its connection --------------------------------------------

NOTICES: list[str] = []


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.settings.left")
def settings_left(run: pgsched.Run) -> None:
    conn = run.connection
    conn.read_only = True
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    conn.deferrable = True
    conn.row_factory = psycopg.rows.dict_row
    conn.prepare_threshold = 0
    conn.adapters.register_loader("int4", TextLoader)  # integers read back as text
    conn.add_notice_handler(lambda d: NOTICES.append(d.message_primary or ""))
    for _ in range(2):
        conn.execute("SELECT 1 AS one").fetchone()  # prepared (threshold 0), as psycopg names it


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.settings.seen")
def settings_seen(run: pgsched.Run) -> pgsched.Result:
    conn = run.connection
    _hit(run)  # fails in a read-only transaction
    row = conn.execute("SELECT 1 AS one, current_setting('transaction_isolation'), "
                       "current_setting('transaction_deferrable')").fetchone()
    conn.execute("DO $$ BEGIN RAISE NOTICE 'seen'; END $$")
    assert row is not None
    return pgsched.Result(data={
        "row": type(row).__name__, "one": repr(row[0]), "isolation": row[1], "deferrable": row[2],
        "read_only": conn.read_only, "prepare_threshold": conn.prepare_threshold, "notices": list(NOTICES),
    })


# -- a Result that cannot be stored -------------------------------------------------------------------

def _circular() -> dict[str, Any]:
    data: dict[str, Any] = {}
    data["self"] = data
    return data


BAD_DATA: dict[str, Callable[[], Any]] = {"tuple_key": lambda: {(1, 2): 1}, "circular": _circular}


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.bad_data")
def bad_data(run: pgsched.Run) -> pgsched.Result:
    _hit(run)
    return pgsched.Result(rows_affected=1, data=BAD_DATA[run.config["kind"]]())


# -- an exception that cannot say what it is -------------------------------------------------------

class Unspeakable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception's __str__ raises")


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.unspeakable")
def unspeakable(run: pgsched.Run) -> None:
    _hit(run)
    raise Unspeakable()


# -- BaseExceptions: Ctrl-C in `pgsched run`, sys.exit() ---------------------------------------------

@pgsched.job(every="1 hour", initial_start=FAR, config={"raise": "KeyboardInterrupt"}, name="edge.interrupt")
def interrupt(run: pgsched.Run) -> None:
    _hit(run)
    raise {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[run.config["raise"]]()


# -- values the end's write must clean (`pgsched run`) ----------------------------------------------

DIRTY: dict[str, Any] = {"nan": {"data": "nan"}, "nul_data": {"data": "nul"}, "nul_message": {"raise": "nul"}}


@pgsched.job(every="1 hour", initial_start=FAR, config=DIRTY["nan"], name="edge.dirty")
def dirty(run: pgsched.Run) -> pgsched.Result:
    _hit(run)
    if run.config.get("raise") == "nul":
        raise ValueError("before\x00after")
    return pgsched.Result(data={"nan": float("nan")} if run.config["data"] == "nan" else {"text": "a\x00b"})


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.closed_under")
def closed_under(run: pgsched.Run) -> None:
    """Its run is closed by "another scheduler" while it runs; it returns normally all the same."""
    _hit(run)
    with psycopg.connect(run.connection.info.dsn, autocommit=True) as other:
        other.execute("UPDATE pgsched.job_run SET outcome = 'crash', finished_at = now(), "
                      "message = 'closed by another scheduler' WHERE run_id = %s", (run.run_id,))


# -- text PostgreSQL cannot store: lone surrogates (a NUL has its own tests) ------------------------

@pgsched.job(every="1 hour", initial_start=FAR, name="edge.surrogate.message")
def surrogate_message(run: pgsched.Run) -> None:
    raise ValueError("bad \udc80 byte")  # as os.fsdecode gives an undecodable file name


@pgsched.job(every="1 hour", initial_start=FAR, name="edge.surrogate.data")
def surrogate_data(run: pgsched.Run) -> pgsched.Result:
    _hit(run)
    return pgsched.Result(data={"name": "bad \ud800 byte", "\udc80": 1})
