"""Jitter (issue 14): each planned start is delayed by a pseudo-random amount in [0, jitter),
derived from the job and the plan (pgsched._jitter_us, migration 0010), so every instance agrees.
With explicit time (no sleeping): the rule's determinism and range, the claim, the scheduler's
wake-up (_next_due), the recorded run, the views and bad input.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from tests.integration.helpers import Conn, rows, scalar, snapshot
from tests.integration.test_core_sql_time import S, T, add_job, claim, register

MINUTE_US = 60_000_000


def offsets(api: Conn, job_id: int, jitter_us: int, n: int) -> list[int]:
    """The rule's delays of `n` consecutive minutely plans from T."""
    return [int(r["j"]) for r in rows(
        api, "SELECT pgsched._jitter_us(%s, %s + i * interval '1 minute', %s) AS j FROM generate_series(0, %s) i",
        (job_id, T, jitter_us, n - 1))]


def test_the_rule_is_deterministic_within_range_and_spread(api: Conn) -> None:
    a = offsets(api, 1, MINUTE_US, 2000)
    assert a == offsets(api, 1, MINUTE_US, 2000)  # the same inputs: the same delay, on any session
    assert all(0 <= x < MINUTE_US for x in a)
    assert len(set(a)) > 1990  # plans of one job get different delays
    # roughly uniform: each tenth of the range holds 10 % of 2,000 (+-4 %)
    tenths = [sum(1 for x in a if k * MINUTE_US // 10 <= x < (k + 1) * MINUTE_US // 10) for k in range(10)]
    assert all(120 <= t <= 280 for t in tenths), tenths
    # another job with the same plans: other delays
    b = offsets(api, 2, MINUTE_US, 2000)
    assert sum(x == y for x, y in zip(a, b, strict=True)) < 5
    # no jitter, or a plan at infinity: no delay
    assert offsets(api, 1, 0, 10) == [0] * 10
    assert scalar(api, "SELECT pgsched._jitter_us(1, 'infinity', %s)", (MINUTE_US,)) == 0


def test_a_jittered_job_is_claimed_at_its_plan_plus_its_delay_and_the_run_records_it(api: Conn) -> None:
    job = add_job(api, T, jitter="1 minute")
    delay = timedelta(microseconds=offsets(api, job, MINUTE_US, 1)[0])
    assert delay > timedelta(0)
    me = register(api, T - S)
    # the scheduler's sleep: the next due instant is the plan's, delayed
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T,)) == T + delay
    assert scalar(api, "SELECT next_due FROM pgsched.job_stats WHERE job_id = %s", (job,)) == T + delay
    assert claim(api, me, T + delay - timedelta(microseconds=1)) == []
    [run] = claim(api, me, T + delay)
    assert (run["job_id"], run["plan_time"], run["started_at"]) == (job, T, T + delay)
    assert run["jitter_s"] == 60.0  # the launch row carries the setting
    assert rows(api, "SELECT plan_time, started_at, jitter FROM pgsched.job_history WHERE run_id = %s",
                (run["run_id"],)) == [{"plan_time": T, "started_at": T + delay, "jitter": delay}]


def test_claimed_ahead_the_run_starts_at_its_delayed_instant(api: Conn) -> None:
    job = add_job(api, T, jitter="10 seconds")
    delay = timedelta(microseconds=offsets(api, job, 10_000_000, 1)[0])
    me = register(api, T - S)
    [run] = claim(api, me, T + delay - S / 2, ahead=S)
    assert run["started_at"] == T + delay


def test_jitter_with_schedule_delay_adds_to_it_and_the_plan_time_stays(api: Conn) -> None:
    job = add_job(api, T, jitter="1 minute", schedule_delay="30 seconds")  # next_start = plan + 30 s
    delay = timedelta(microseconds=offsets(api, job, MINUTE_US, 1)[0])
    me = register(api, T - S)
    [run] = claim(api, me, T + delay)
    assert (run["plan_time"], run["started_at"]) == (T - 30 * S, T + delay)


def test_jobs_without_jitter_record_none_and_start_at_next_start(api: Conn) -> None:
    job = add_job(api, T)
    me = register(api, T - S)
    [run] = claim(api, me, T)
    assert run["started_at"] == T
    assert scalar(api, "SELECT jitter FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) is None
    assert rows(api, "SELECT next_start, next_due FROM pgsched.job_stats WHERE job_id = %s",
                (job,)) == [{"next_start": T, "next_due": T}]


def test_the_claim_takes_jobs_in_due_order_jitter_included(api: Conn) -> None:
    jobs = [add_job(api, T, jitter="1 minute") for _ in range(6)]
    due = {j: T + timedelta(microseconds=offsets(api, j, MINUTE_US, 1)[0]) for j in jobs}
    me = register(api, T - S)
    got = [claim(api, me, T + 2 * 60 * S)[0]["job_id"] for _ in jobs]  # one worker each: the claim's order
    assert got == sorted(jobs, key=lambda j: (due[j], j))


def test_alter_job_sets_and_removes_jitter_and_the_trigger_copies_it(api: Conn) -> None:
    job = add_job(api, T)
    scalar(api, "SELECT job_id FROM pgsched.alter_job(%s, jitter => '2 minutes')", (job,))
    stat: dict[str, Any] = rows(api, "SELECT j.jitter, s.jitter_us FROM pgsched.jobs j "
                                     "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (job,))[0]
    assert stat == {"jitter": timedelta(minutes=2), "jitter_us": 120_000_000}
    scalar(api, "SELECT job_id FROM pgsched.alter_job(%s, max_retries => 2)", (job,))  # NULL keeps it
    assert scalar(api, "SELECT jitter_us FROM pgsched.job_stat WHERE job_id = %s", (job,)) == 120_000_000
    scalar(api, "SELECT job_id FROM pgsched.alter_job(%s, jitter => '0')", (job,))
    assert scalar(api, "SELECT jitter_us FROM pgsched.job_stat WHERE job_id = %s", (job,)) == 0
    assert scalar(api, "SELECT next_due FROM pgsched.job_stats WHERE job_id = %s", (job,)) == T


def test_both_ends_of_the_range_are_accepted(api: Conn) -> None:
    for value, us in (("0", 0), ("1 day", 86_400_000_000), ("24:00:00", 86_400_000_000)):
        job = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 minute', jitter => %s)", (value,)))
        assert scalar(api, "SELECT jitter_us FROM pgsched.job_stat WHERE job_id = %s", (job,)) == us


@pytest.mark.parametrize(("value", "sqlstate", "says"), [
    ("-1 second", "22023", "is negative"),
    ("1 mon", "22023", "has months or years"),
    ("1 day 1 second", "22023", "is longer than 1 day"),
    (None, "22004", "NULL"),
])
def test_bad_jitter_is_refused_naming_it_and_nothing_is_written(api: Conn, value: str | None, sqlstate: str,
                                                                says: str) -> None:
    job = add_job(api, T)
    before = snapshot(api)
    for call in ("SELECT pgsched.add_job('ok_fn', '1 minute', jitter => %s)",
                 f"SELECT * FROM pgsched.alter_job({job}, jitter => %s)"):
        if value is None and "alter_job" in call:
            continue  # NULL in alter_job keeps the setting
        with pytest.raises(psycopg.Error) as e:
            api.execute(call, (value,))
        assert e.value.sqlstate == sqlstate
        assert "invalid jitter" in str(e.value) and says in str(e.value)
        assert e.value.diag.message_hint is not None and "a duration from 0 up to 1 day" in e.value.diag.message_hint
        api.rollback()
        assert snapshot(api) == before


def test_the_claim_reads_the_start_order_index_and_the_sleep_the_due_index(api: Conn) -> None:
    """Migration 0010's indexes serve the claim in its order and the scheduler's next-due
    question: the scans stop at the rows they take instead of sorting every due job."""
    for i in range(200):
        add_job(api, T - timedelta(minutes=1), **({"jitter": "1 minute"} if i % 2 else {}))
    api.execute("ANALYZE pgsched.job_stat")
    plan = "\n".join(str(r[0]) for r in api.execute(
        "EXPLAIN SELECT s.job_id FROM pgsched.job_stat s WHERE s.state = 'scheduled' "
        "AND pgsched._due_at(s.job_id, s.next_start, s.jitter_us) <= %s "
        "ORDER BY pgsched._start_key(s.job_id, s.next_start, s.jitter_us, s.priority), s.job_id LIMIT 8",
        (T,)).fetchall())
    assert "job_stat_start_order_idx" in plan and "Sort" not in plan, plan
    # _next_due's statement (the function itself is not inlined: it pins search_path)
    body = "\n".join(str(r[0]) for r in api.execute(
        "EXPLAIN SELECT s.next_start FROM pgsched.job_stat s WHERE s.state = 'scheduled' "
        "AND pg_catalog.isfinite(s.next_start) ORDER BY pgsched._due_at(s.job_id, s.next_start, s.jitter_us) "
        "LIMIT 1").fetchall())
    assert "job_stat_due_at_idx" in body and "Sort" not in body, body
