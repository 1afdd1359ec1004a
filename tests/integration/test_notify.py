"""Every catalog change, through the API or by direct DML, wakes a LISTENing scheduler."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.helpers import Conn, add_job, collect_notifications

CHANNEL = "pgsched_catalog"


@pytest.fixture
def listener(db: str) -> Iterator[Conn]:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f"LISTEN {CHANNEL}")
        yield c


# (statement run after a job 1000 named 'existing' exists, payload that must arrive)
CHANGES = [
    ("SELECT add_job('ok_fn', '5 minutes')", "job:insert"),
    ("SELECT add_job('ok_fn', interval '5 minutes')", "job:insert"),
    ("SELECT alter_job(1000, max_retries => 3)", "job:update"),
    ("SELECT alter_job(1000, next_start => '2100-01-01')", "job_stat:update"),
    ("SELECT delete_job(1000)", "job:delete"),
    ("SELECT schedule('new', '1 day', 'SELECT 1')", "job:insert"),
    ("SELECT schedule('existing', '1 day', 'SELECT 1')", "job:update"),
    ("SELECT schedule('1 day', 'SELECT 1')", "job:insert"),
    ("SELECT unschedule('existing')", "job:delete"),
    ("SELECT unschedule(1000)", "job:delete"),
    ("CALL run_job(1000)", "job_stat:update"),
    ("INSERT INTO pgsched.job (job_name, kind, command, schedule) VALUES ('dml', 'command', 'SELECT 1', '1 day')",
     "job:insert"),
    ("UPDATE pgsched.job SET max_retries = 1 WHERE job_id = 1000", "job:update"),
    ("DELETE FROM pgsched.job WHERE job_id = 1000", "job:delete"),
    ("UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = 1000", "job_stat:update"),
    ("TRUNCATE pgsched.job CASCADE", "job:truncate"),
]


@pytest.mark.parametrize(("statement", "payload"), CHANGES, ids=[s for s, _ in CHANGES])
def test_catalog_change_notifies(api: Conn, listener: Conn, statement: str, payload: str) -> None:
    assert add_job(api, "'ok_fn', '1 hour', job_name => 'existing'") == 1000
    assert payload.split(":")[0] in ("job", "job_stat")
    collect_notifications(listener, api)  # drain what the setup sent
    api.execute(statement)
    assert payload in collect_notifications(listener, api)


def test_no_notification_without_a_change(api: Conn, listener: Conn) -> None:
    add_job(api, "'ok_fn', '1 hour'")
    collect_notifications(listener, api)
    api.execute("SELECT * FROM job_stats")
    assert collect_notifications(listener, api) == []


def test_internal_job_stat_update_is_silent(api: Conn, listener: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour'")
    collect_notifications(listener, api)
    with api.transaction():
        api.execute("SET LOCAL pgsched.internal = on")
        api.execute("UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = %s", (job_id,))
    assert collect_notifications(listener, api) == []
    # the same update without the setting is heard
    api.execute("UPDATE pgsched.job_stat SET next_start = now() WHERE job_id = %s", (job_id,))
    assert collect_notifications(listener, api) == ["job_stat:update"]


def test_rolled_back_change_does_not_notify(api: Conn, listener: Conn) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero), api.transaction():
        add_job(api, "'ok_fn', '1 hour'")
        api.execute("SELECT 1/0")
    assert collect_notifications(listener, api) == []
