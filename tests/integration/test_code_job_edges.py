"""Python jobs at the edges of the run contract (real PostgreSQL): what a handler returns, catches,
raises or leaves on its connection, and how `pgsched run` records the end (tests/apps/edge_jobs.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgsched import app, protocol, pyjob, worker
from tests.apps import edge_jobs
from tests.apps.edge_jobs import BAD_DATA, BAD_ROWS, DIRTY, GOOD_ROWS
from tests.integration.test_code_jobs import deploy, job_id, last_run, one, run_now_and_wait

Conn = psycopg.Connection[tuple[Any, ...]]
EDGE = edge_jobs.MODULE


@pytest.fixture
def py(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE py_hits (job text, plan_time timestamptz, attempt int, config jsonb)")
    return conn


@pytest.fixture
def session(db: str, py: Conn) -> Iterator[worker.Session]:
    """A worker's session, as `python -m pgsched.worker` keeps it between runs."""
    s = worker.Session(db)
    try:
        yield s
    finally:
        s.close()


def python_run(session: worker.Session, name: str, run_id: int = 1, config: Any = None) -> protocol.Done:
    """Run the handler of job `name` as a worker runs one (run_one, then the session's reset)."""
    spec = app.REGISTRY[name]
    msg = {"run_id": run_id, "job_id": 1, "kind": "python", "owner": session.role, "job_name": name,
           "code_module": spec.module, "code_function": spec.function,
           "config": spec.config if config is None else config, "app": f"pgsched job 1 run {run_id} lease 1",
           "plan_time": "2026-01-01T00:00:00+00:00", "lease_token": 1, "scope": "", "scope_query": None,
           "start_at": 0}
    heartbeat = pyjob.Heartbeat(session.dsn)
    try:
        done, reset = worker.run_one(session.conn, msg, heartbeat)
    finally:
        heartbeat.close()
    assert not reset and worker.reset_session(session.conn)
    return done


def hits(conn: Conn, name: str) -> int:
    return int(one(conn, "SELECT count(*) FROM py_hits WHERE job = %s", name))


# -- rows_affected ---------------------------------------------------------------------------------

def test_a_rows_affected_that_is_not_a_bigint_fails_its_run_and_nothing_else(db: str, py: Conn) -> None:
    """'many', 2.5, True, 2**70 made the batched close fail (the job disabled, a crash counted, history
    saying success); a Decimal crashed the worker in its report. Each is a plain failure of its run."""
    names = [f"edge.rows.{label}" for label in [*BAD_ROWS, *GOOD_ROWS]]
    run_now_and_wait(db, py, names, apps=(EDGE,))
    for label in BAD_ROWS:
        h = last_run(py, f"edge.rows.{label}")
        assert h["outcome"] == "failure", (label, h)
        assert h["message"].startswith("pgsched.Result: rows_affected must be a whole number (int) from "
                                       f"{-(2**63)} to {2**63 - 1}, or None"), (label, h["message"])
        assert (h["rows_affected"], h["result"]) == (None, None)
        assert hits(py, f"edge.rows.{label}") == 0  # its work rolled back
        st = py.execute("SELECT state, total_failures, total_crashes, disabled_reason FROM job_stats "
                        "WHERE job_name = %s", (f"edge.rows.{label}",)).fetchone()
        assert st == ("scheduled", 1, 0, None), (label, st)
    for label, config in GOOD_ROWS.items():
        h = last_run(py, f"edge.rows.{label}")
        assert (h["outcome"], h["rows_affected"], h["result"]) == ("success", config["rows"], {"ok": True}), label


# -- a database error caught -----------------------------------------------------------------------------

def test_a_handler_that_catches_a_database_error_and_returns_fails_with_25P02(session: worker.Session,
                                                                             py: Conn) -> None:
    """Its transaction was in the error state: COMMIT rolled it back, while the run said success."""
    done = python_run(session, "edge.caught")
    assert (done.ok, done.sqlstate) == (False, "25P02"), done
    assert done.message is not None and "caught a database error and went on" in done.message
    assert "rolled back" in done.message
    assert hits(py, "edge.caught") == 0
    # The session is as a worker leaves it between runs, and runs the next one.
    assert session.conn.autocommit and session.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert python_run(session, "edge.rows.most").ok


# -- client-side settings left on the connection ---------------------------------------------------------

def test_client_settings_a_run_leaves_on_its_connection_do_not_reach_the_next(session: worker.Session,
                                                                           py: Conn) -> None:
    edge_jobs.NOTICES.clear()
    threshold, row_factory = session.conn.prepare_threshold, session.conn.row_factory
    assert python_run(session, "edge.settings.left", 1).ok
    seen = python_run(session, "edge.settings.seen", 2)
    assert seen.ok, seen
    assert seen.result == {"row": "tuple", "one": "1", "isolation": "read committed", "deferrable": "off",
                           "read_only": None, "prepare_threshold": None, "notices": []}
    assert hits(py, "edge.settings.seen") == 1
    assert edge_jobs.NOTICES == []  # the first run's notice handler is gone
    assert (session.conn.prepare_threshold, session.conn.row_factory) == (threshold, row_factory)
    assert (session.conn.read_only, session.conn.isolation_level, session.conn.deferrable) == (None, None, None)
    # The worker's own statements read integers as integers again.
    assert session.conn.execute("SELECT 1").fetchone() == (1,)


# -- a Result that cannot be stored --------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(BAD_DATA))
def test_a_result_that_cannot_be_encoded_fails_the_run_before_its_commit(session: worker.Session, py: Conn,
                                                                         kind: str) -> None:
    """It was encoded after the commit: a failure recorded (and retried) for work that was committed."""
    done = python_run(session, "edge.bad_data", config={"kind": kind})
    assert (done.ok, done.rows_affected, done.result) == (False, None, None), done
    assert hits(py, "edge.bad_data") == 0
    assert done.message is not None and done.message.startswith("pgsched.Result: data must be"), done.message


# -- an exception whose __str__ raises -----------------------------------------------------------------

def test_an_exception_whose_str_raises_is_a_clean_failure(session: worker.Session, py: Conn) -> None:
    done = python_run(session, "edge.unspeakable")
    assert done.ok is False and done.message is not None
    assert done.message.startswith("Unspeakable: <exception str() failed>\nTraceback (most recent call last):"), \
        done.message
    assert "raise Unspeakable()" in done.message
    assert hits(py, "edge.unspeakable") == 0


# -- KeyboardInterrupt, SystemExit ---------------------------------------------------------------------

@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_in_a_handler_rolls_back_and_goes_on_up(session: worker.Session, py: Conn,
                                                                 raised: type[BaseException]) -> None:
    """In a worker: raised on (the worker exits, as for a real signal), the run's work rolled back and the
    session back in autocommit (the ProgrammingError of switching it mid-transaction hid the original)."""
    with pytest.raises(raised):
        python_run(session, "edge.interrupt", config={"raise": raised.__name__})
    assert session.conn.autocommit and session.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert hits(py, "edge.interrupt") == 0


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_pgsched_run_records_a_base_exception_then_raises_it(db: str, py: Conn, raised: type[BaseException]) -> None:
    deploy(db, [EDGE])
    j = job_id(py, "edge.interrupt")
    py.execute("SELECT alter_job(%s, config => %s)", (j, Jsonb({"raise": raised.__name__})))
    with pytest.raises(raised):
        pyjob.run_now(db, j)
    h = last_run(py, "edge.interrupt")
    assert h["outcome"] == "failure" and h["message"].startswith(f"{raised.__name__}\n"), h
    assert hits(py, "edge.interrupt") == 0


# -- `pgsched run`'s end ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "outcome", "field", "stored"), [
    ("nan", "success", "result", {"invalid_result": "not representable as JSON: Out of range float values are "
                                                    "not JSON compliant"}),
    ("nul_data", "success", "result", {"text": "a\\0b"}),
    ("nul_message", "failure", "message", "ValueError: before\\0after\nTraceback (most recent call last):"),
])
def test_pgsched_run_writes_the_end_cleaned_as_the_scheduler_does(db: str, py: Conn, case: str, outcome: str,
                                                                  field: str, stored: Any) -> None:
    """NaN or a NUL made _mark_end fail: the run stayed 'running', to be closed later as a crash."""
    deploy(db, [EDGE])
    j = job_id(py, "edge.dirty")
    py.execute("SELECT alter_job(%s, config => %s)", (j, Jsonb(DIRTY[case])))
    done = pyjob.run_now(db, j)
    assert done.ok is (outcome == "success")
    h = last_run(py, "edge.dirty")
    assert h["outcome"] == outcome, h
    if field == "result":  # as store._json says it (Python's own words may go on: ": nan")
        assert h[field].keys() == stored.keys() and all(h[field][k].startswith(v) for k, v in stored.items()), h
    else:
        assert h[field].startswith(stored), h
    assert hits(py, "edge.dirty") == (1 if outcome == "success" else 0)


def test_pgsched_run_of_a_bad_rows_affected_records_a_failure(db: str, py: Conn) -> None:
    deploy(db, [EDGE])
    done = pyjob.run_now(db, job_id(py, "edge.rows.text"))
    assert done.ok is False
    h = last_run(py, "edge.rows.text")
    assert h["outcome"] == "failure" and h["message"].startswith("pgsched.Result: rows_affected must be"), h
    assert one(py, "SELECT count(*) FROM pgsched.job_run WHERE outcome = 'running'") == 0


def test_pgsched_run_closes_the_owners_session_only_after_writing_the_end(db: str, py: Conn,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler takes a manual run whose session is gone for abandoned: closed before the end was
    written, a successful run could be closed as a crash in that gap."""
    deploy(db, [EDGE])
    j = job_id(py, "edge.rows.most")
    at_close: list[list[str]] = []
    close = worker.Session.close

    def watched_close(self: worker.Session) -> None:
        at_close.append([r[0] for r in py.execute("SELECT outcome FROM pgsched.job_run WHERE job_id = %s", (j,))])
        close(self)

    monkeypatch.setattr(worker.Session, "close", watched_close)
    assert pyjob.run_now(db, j).ok
    assert at_close == [["success"]]


def test_pgsched_run_says_when_its_run_was_closed_under_it(db: str, py: Conn) -> None:
    deploy(db, [EDGE])
    j = job_id(py, "edge.closed_under")
    with pytest.raises(pyjob.EndNotRecorded, match=r"job \d+ run \d+: its end \(success\) was not recorded: the "
                                                   r"run was already closed"):
        pyjob.run_now(db, j)
    h = last_run(py, "edge.closed_under")
    assert (h["outcome"], h["message"]) == ("crash", "closed by another scheduler")


# -- declarations at the limits the deploy has ----------------------------------------------------------

def test_declarations_at_the_limits_deploy(db: str, conn: Conn) -> None:
    """What the declaration accepts, the deploy accepts: the limits are the catalog's (their refusals are
    tests/unit/test_app.py's)."""
    from datetime import UTC, datetime, timedelta

    from pgsched.clock import DbClock
    from pgsched.store import Store

    limits: dict[str, dict[str, Any]] = {
        "first": {"every": "1 minute", "initial_start": datetime(1, 1, 2, tzinfo=UTC)},
        "last": {"every": "1 year", "initial_start": datetime(9997, 12, 31, tzinfo=UTC)},
        "long": {"every": timedelta(days=365 * 7000), "max_retries": 2**31 - 1, "retry_period": "2562047788 hours",
                 "max_runtime": timedelta(days=999_999_999), "success_retention": "2700000 years"},
        "text": {"every": "1 minute", "config": {"é": ["✓", 1.5, None, {"k": True}]}, "concurrency_key": "ключ"},
    }
    specs = []
    try:
        for name, kwargs in limits.items():
            def handler(run: Any) -> None: ...
            handler.__qualname__ = f"limit_{name}"
            app.job(name=f"limit.{name}", **kwargs)(handler)
            specs.append(app.REGISTRY[f"limit.{name}"].catalog_row())
    finally:
        app.forget(__name__)
    store = Store(db, DbClock())
    try:
        assert [a for _, _, a in store.deploy([__name__], specs)] == ["inserted"] * len(limits)
    finally:
        store.close()
    assert one(conn, "SELECT config FROM pgsched.jobs WHERE job_name = 'limit.text'") == limits["text"]["config"]


# -- text PostgreSQL cannot store: lone surrogates --------------------------------------------------------

def test_lone_surrogates_in_a_message_or_a_result_are_stored_escaped(db: str, py: Conn) -> None:
    """They made every batch of closes fail ("invalid input syntax for type json"), the scheduler's
    loop retrying it until it stopped with the outcomes unwritten."""
    run_now_and_wait(db, py, ["edge.surrogate.message", "edge.surrogate.data"], apps=(EDGE,))
    h = last_run(py, "edge.surrogate.message")
    assert h["outcome"] == "failure" and h["message"].startswith("ValueError: bad \\udc80 byte\n"), h
    h = last_run(py, "edge.surrogate.data")
    assert (h["outcome"], h["result"]) == ("success", {"name": "bad \\ud800 byte", "\\udc80": 1}), h
    assert hits(py, "edge.surrogate.data") == 1
