"""The upgrade of release 0.1.0's run history to the partitioned job_run (issue 12, migration 0015):
every row kept, where it was (job_run_live, attached whole), run ids counting on, and the
retention applied to the old rows by the purge's batches and to the new ones by their
partitions. Release 0.1.0's schema is installed by its own `pgsched init` (tests/previous_release.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from pgsched import migrate
from tests import previous_release
from tests.integration.helpers import SETUP_SQL, Conn, rows, scalar


@pytest.fixture
def old_schema(empty_db: str) -> Iterator[Conn]:
    previous_release.init(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        c.execute(SETUP_SQL)
        yield c


def test_an_upgrade_from_release_0_1_0_keeps_every_row_and_then_applies_the_retention(old_schema: Conn) -> None:
    c = old_schema
    job_id = int(scalar(c, "SELECT pgsched.add_job('ok_fn', '1 hour')"))
    # As 0.1.0 left them: a success that ended 40 days ago, a failure 20 days ago (failures are
    # kept 30), a success and a failure a day ago, and a run in progress.
    ended: dict[tuple[int, str], int] = {}
    for age, outcome in ((40, "success"), (20, "failure"), (1, "success"), (1, "failure")):
        ended[(age, outcome)] = int(scalar(c, """
            INSERT INTO pgsched.job_run (job_id, plan_time, started_at, finished_at, outcome)
            VALUES (%s, now() - make_interval(days => %s, secs => %s), now() - make_interval(days => %s),
                    now() - make_interval(days => %s), %s) RETURNING run_id""",
            (job_id, age, len(ended), age, age, outcome)))
    running = int(scalar(c, "INSERT INTO pgsched.job_run (job_id, plan_time, started_at) VALUES (%s, now(), now()) "
                            "RETURNING run_id", (job_id,)))
    before = rows(c, "SELECT run_id, job_id, plan_time, outcome, finished_at FROM pgsched.job_run ORDER BY run_id")

    result = migrate.init(c)
    assert 15 in result.applied
    # every row, as it was, in the default partition, with no end of retention
    assert rows(c, "SELECT run_id, job_id, plan_time, outcome, finished_at FROM pgsched.job_run "
                   "ORDER BY run_id") == before
    assert rows(c, "SELECT DISTINCT tableoid::regclass::text AS t, keep_until FROM pgsched.job_run") == [
        {"t": "pgsched.job_run_live", "keep_until": None}]
    assert scalar(c, "SELECT relkind FROM pg_class WHERE oid = 'pgsched.job_run'::regclass") == "p"

    # the purge: validates job_run_live's constraint (so that partitions attach without reading
    # it), makes the partitions, and deletes the old rows past their retention, no other
    got = rows(c, "SELECT * FROM pgsched.purge_history()")[0]
    assert (got["runs"], got["instances"]) == (1, 0)
    left = {r["run_id"] for r in rows(c, "SELECT run_id FROM pgsched.job_run")}
    assert left == {ended[(20, "failure")], ended[(1, "success")], ended[(1, "failure")], running}
    assert scalar(c, "SELECT convalidated FROM pg_constraint WHERE conname = 'job_run_live_kept_in_place'") is True
    assert scalar(c, "SELECT count(*) FROM pgsched._history_partitions") >= 31

    # the run in progress closes into its partition; run ids count on from 0.1.0's
    c.execute("SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, NULL)", (running,))
    assert scalar(c, "SELECT tableoid::regclass::text FROM pgsched.job_run WHERE run_id = %s", (running,)) != \
        "pgsched.job_run_live"
    c.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert scalar(c, "SELECT max(run_id) FROM pgsched.job_run") == running + 1
    # and eleven days on, the old failure goes too
    later = scalar(c, "SELECT now()") + timedelta(days=11)
    c.execute("SELECT * FROM pgsched.purge_history(now => %s)", (later,))
    assert ended[(20, "failure")] not in {r["run_id"] for r in rows(c, "SELECT run_id FROM pgsched.job_run")}
