"""A claimed run's job is built once and kept while its launch row's job columns stay the same
(pgsched/store.py, _job_from_row), against real claims."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgsched import store as store_module
from pgsched.clock import DbClock
from pgsched.model import Run
from pgsched.store import Finish, Store

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def store(db: str, api: Conn) -> Iterator[Store]:
    s = Store(db, DbClock())
    try:
        yield s
    finally:
        s.close()


def add_due(api: Conn, args: str = "") -> int:
    """A job due now (the scheduler would plan its first start; here it is set)."""
    row = api.execute(f"SELECT pgsched.add_job('ok_fn', '1 hour'{args})").fetchone()
    assert row is not None
    make_due(api, int(row[0]))
    return int(row[0])


def make_due(api: Conn, job: int) -> None:
    api.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second' WHERE job_id = %s", (job,))


def claim(store: Store, instance_id: int) -> Run:
    claimed, _, _ = store.claim(instance_id, [(1, 1)])
    assert len(claimed) == 1 and claimed[0].run is not None, claimed
    return claimed[0].run


def close(store: Store, run: Run) -> None:
    """Ended, and due again at once."""
    now = datetime.now(UTC)
    assert store.close_runs([Finish(run_id=run.run_id, outcome="success", sqlstate=None, message=None,
                                    next_start=now - timedelta(seconds=1), finished_at=now,
                                    lease_token=run.lease_token)]) != [None]


def test_a_job_unchanged_is_built_once_and_a_changed_one_again(store: Store, api: Conn) -> None:
    job = add_due(api, ", config => '{\"n\": 1}'")
    instance = store.register_instance("h", 1, "test", 1)
    first = claim(store, instance)
    close(store, first)
    second = claim(store, instance)
    assert second.run_id != first.run_id and second.job is first.job
    close(store, second)
    # A change of the job through the API is a change of its launch row's job columns.
    api.execute("SELECT pgsched.alter_job(%s, config => '{\"n\": 2}', max_runtime => '5 seconds')", (job,))
    third = claim(store, instance)
    assert third.job is not first.job
    assert third.job.config == {"n": 2} and third.job.max_runtime == timedelta(seconds=5)
    close(store, third)
    api.execute("SELECT pgsched.alter_job(%s, schedule => '*/5 * * * *')", (job,))
    make_due(api, job)
    fourth = claim(store, instance)
    assert fourth.job is not third.job and fourth.job.schedule.cron is not None


def test_the_columns_left_out_of_a_jobs_identity_are_the_runs(store: Store, api: Conn) -> None:
    """What _RUN_COLUMNS leaves out of the comparison must not be read into the job: a run column
    changed in a real launch row builds an equal job (and the kept one is taken); any other
    column changed builds a new one."""
    add_due(api, ", exclude => '* 2 * * *'")
    instance = store.register_instance("h", 1, "test", 1)
    with psycopg.connect(store.dsn, autocommit=True, row_factory=dict_row) as c:
        row = c.execute("SELECT * FROM pgsched._claim_v2(%s, '{1}', '{1}')", (instance,)).fetchone()
    assert row is not None
    assert row.keys() >= store_module._RUN_COLUMNS
    kept = store_module._job_from_row(row)
    for column in store_module._RUN_COLUMNS:
        changed = {**row, column: object()}  # whatever read it would fail or differ
        assert store_module._build_job(changed) == kept, column
        assert store_module._job_from_row(changed) is kept, column
    # jsonb true, 1 and 1.0 are equal as Python values, not as a job's config.
    flags = [store_module._job_from_row({**row, "config": {"flag": v}}) for v in (True, 1, 1.0, True)]
    assert [f.config["flag"] for f in flags] == [True, 1, 1.0, True]
    assert [type(f.config["flag"]) for f in flags] == [bool, int, float, bool]
    renamed = {**row, "job_name": "another name"}
    assert store_module._job_from_row(renamed) is not kept
    assert store_module._job_from_row(renamed).job_name == "another name"


def test_at_most_jobs_kept_are_kept(store: Store, api: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "JOBS_KEPT", 5)
    monkeypatch.setattr(store_module, "_built", {})
    add_due(api)
    instance = store.register_instance("h", 1, "test", 1)
    with psycopg.connect(store.dsn, autocommit=True, row_factory=dict_row) as c:
        row = c.execute("SELECT * FROM pgsched._claim_v2(%s, '{1}', '{1}')", (instance,)).fetchone()
    assert row is not None
    for job_id in range(1, 9):
        store_module._job_from_row({**row, "job_id": job_id})
    assert list(store_module._built) == [4, 5, 6, 7, 8]  # the first built went first
