"""A job's priority (issue 14): the claim's order, with explicit time (no sleeping).

Among due jobs the claim takes the smallest next_start - priority seconds first (migration 0008's
index). So a higher priority goes first among jobs due together, and a lower one ages: a job due
more than the difference in priorities after it never passes it.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from pgsched.model import PRIORITY_MAX, PRIORITY_MIN
from tests.integration.helpers import Conn, rows, scalar, snapshot
from tests.integration.test_core_sql_time import S, T, add_job, claim, register


def test_higher_priority_first_among_jobs_due_together(api: Conn) -> None:
    low = [add_job(api, T) for _ in range(4)]
    high = [add_job(api, T, priority=10) for _ in range(4)]
    me = register(api, T - S)
    first = claim(api, me, T, workers=4)
    assert sorted(r["job_id"] for r in first) == sorted(high)
    assert {r["priority"] for r in first} == {10}  # the launch row carries it
    assert sorted(r["job_id"] for r in claim(api, me, T, workers=4)) == sorted(low)


def test_a_lower_priority_ages_a_job_due_later_by_more_than_the_difference_does_not_pass_it(api: Conn) -> None:
    low = add_job(api, T)                              # key T
    high_soon = add_job(api, T + 9 * S, priority=10)   # key T - 1 s: before low
    high_late = add_job(api, T + 11 * S, priority=10)  # key T + 1 s: after low
    me = register(api, T - S)
    [r] = claim(api, me, T + 20 * S)
    assert r["job_id"] == high_soon
    [r] = claim(api, me, T + 20 * S)
    assert r["job_id"] == low
    [r] = claim(api, me, T + 20 * S)
    assert r["job_id"] == high_late


def test_a_job_not_due_is_not_claimed_whatever_its_priority(api: Conn) -> None:
    add_job(api, T + 5 * S, priority=PRIORITY_MAX)
    low = add_job(api, T, priority=PRIORITY_MIN)
    me = register(api, T - S)
    assert [r["job_id"] for r in claim(api, me, T, workers=2)] == [low]


def test_alter_job_changes_the_claim_order(api: Conn) -> None:
    a, b = add_job(api, T), add_job(api, T + S)
    scalar(api, "SELECT job_id FROM pgsched.alter_job(%s, priority => 5)", (b,))
    assert scalar(api, "SELECT priority FROM pgsched.jobs WHERE job_id = %s", (b,)) == 5
    me = register(api, T - S)
    assert [r["job_id"] for r in claim(api, me, T + 2 * S)] == [b]
    assert [r["job_id"] for r in claim(api, me, T + 2 * S)] == [a]
    # NULL in alter_job keeps it; the job's trigger keeps job_stat's copy in step.
    scalar(api, "SELECT job_id FROM pgsched.alter_job(%s, max_retries => 2)", (b,))
    assert rows(api, "SELECT j.priority AS job, s.priority AS stat FROM pgsched.job j "
                     "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (b,)) == [{"job": 5, "stat": 5}]


@pytest.mark.parametrize(("value", "sqlstate", "says"), [
    (PRIORITY_MAX + 1, "22023", "3601 is out of range"),
    (PRIORITY_MIN - 1, "22023", "-3601 is out of range"),
    (None, "22004", "NULL"),
])
def test_bad_priority_is_refused_naming_it_and_nothing_is_written(api: Conn, value: int | None, sqlstate: str,
                                                                   says: str) -> None:
    before = snapshot(api)
    with pytest.raises(psycopg.Error) as e:
        api.execute("SELECT pgsched.add_job('ok_fn', '1 minute', priority => %s)", (value,))
    assert e.value.sqlstate == sqlstate
    assert "priority" in str(e.value) and says in str(e.value)
    assert "a whole number from -3600 to 3600" in str(e.value)
    assert snapshot(api) == before


def test_both_ends_of_the_range_are_accepted_in_sql(api: Conn) -> None:
    for value in (PRIORITY_MIN, PRIORITY_MAX):
        job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 minute', priority => %s)", (value,)))
        assert scalar(api, "SELECT priority FROM pgsched.job_stat WHERE job_id = %s", (job,)) == value


def test_the_claim_reads_the_start_order_index(api: Conn) -> None:
    """The claim's due jobs come from migration 0010's index (0008's, jitter added) in its order: the scan stops at the
    rows it takes instead of sorting every due job."""
    for _ in range(200):
        add_job(api, T - timedelta(minutes=1))
    api.execute("ANALYZE pgsched.job_stat")
    plan = "\n".join(str(r[0]) for r in api.execute(
        "EXPLAIN SELECT s.job_id FROM pgsched.job_stat s WHERE s.state = 'scheduled' AND s.next_start <= %s "
        "ORDER BY pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority), s.job_id LIMIT 8",
        (T,)).fetchall())
    assert "job_stat_start_order_idx" in plan and "Sort" not in plan, plan
