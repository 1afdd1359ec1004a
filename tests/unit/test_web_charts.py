"""The dashboard's pure parts: SVG geometry (pgsched/web/charts.py) and schedules in words
(pgsched/web/words.py), with literal times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgsched.web import charts, words

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("expr", "tz", "said"), [
    ("* * * * *", None, "every minute"),
    ("*/5 * * * *", None, "every 5 minutes"),
    ("7 * * * *", None, "hourly at minute 7"),
    ("0 */6 * * *", None, "every 6 hours at minute 0"),
    ("30 2 * * *", "Europe/Berlin", "daily at 02:30 (Europe/Berlin)"),
    ("0 9 * * 1", None, "every Monday at 09:00"),
    ("0 9 * * 1-5", None, "weekdays at 09:00"),
    ("15 4 1 * *", None, "monthly on day 1 at 04:15"),
    ("0 9 * 1 3", None, "cron: 0 9 * 1 3"),
    ("15 minutes", None, "every 15 minutes"),
    (None, None, "not scheduled"),
])
def test_schedules_in_words(expr: str | None, tz: str | None, said: str) -> None:
    assert words.describe(expr, tz) == said


def test_runs_per_minute_stacks_each_minutes_outcomes_and_scales_to_the_peak() -> None:
    now = T0 + timedelta(seconds=30)
    rows = [{"minute": T0, "outcome": "success", "n": 6}, {"minute": T0, "outcome": "failure", "n": 2},
            {"minute": T0 - timedelta(minutes=10), "outcome": "success", "n": 4},
            {"minute": T0 - timedelta(minutes=90), "outcome": "success", "n": 99}]  # outside the hour
    c = charts.runs_per_minute(rows, now, minutes=60, height=120)
    assert c.peak == 8
    assert c.legend == [("success", 10), ("failure", 2)]
    last = [r for r in c.rects if r.x > 59 * c.width / 60]
    assert sorted(r.cls for r in last) == ["failure", "success"]
    assert sum(r.h for r in last) == pytest.approx(100)  # the peak minute fills the plot (height - 20)
    ten_ago = [r for r in c.rects if 49 * c.width / 60 < r.x < 50 * c.width / 60]
    assert [r.h for r in ten_ago] == [pytest.approx(50)]


def test_one_bar_per_run_and_skipped_plans_as_marks() -> None:
    start, end = T0, T0 + timedelta(hours=1)
    jobs = [{"job_id": 1, "job_name": "a"}, {"job_id": 2, "job_name": "b"}]
    run = {"trigger": "schedule", "sqlstate": None, "message": None}
    runs = [
        {**run, "run_id": 10, "job_id": 1, "outcome": "success", "plan_time": T0,
         "run_from": T0 + timedelta(minutes=30), "run_to": T0 + timedelta(minutes=45)},
        {**run, "run_id": 11, "job_id": 2, "outcome": "skipped", "plan_time": T0,
         "run_from": T0 + timedelta(minutes=6), "run_to": T0 + timedelta(minutes=9)},
        {**run, "run_id": 12, "job_id": 2, "outcome": "failure", "plan_time": T0, "sqlstate": "22012",
         "message": "division by zero", "run_from": T0 - timedelta(minutes=5), "run_to": T0 + timedelta(seconds=1)},
    ]
    tl = charts.timeline(start, end, jobs, runs)
    assert len(tl.rects) == 3
    ok, skipped, failed = tl.rects
    span = charts.WIDTH - charts.LABEL_WIDTH
    assert ok.x == pytest.approx(charts.LABEL_WIDTH + span / 2) and ok.w == pytest.approx(span / 4)
    assert skipped.cls == "run skipped mark" and skipped.w == 2.0 and skipped.y > ok.y
    assert failed.x == charts.LABEL_WIDTH and failed.w == 1.0  # clipped at the window, still a pixel
    assert "[22012] division by zero" in failed.title


def test_buckets_count_every_run_and_take_the_worst_colour() -> None:
    assert charts.bucket_size(timedelta(hours=1), 240) == timedelta(seconds=30)
    assert charts.bucket_size(timedelta(days=7), 240) == timedelta(hours=1)
    assert charts.bucket_size(timedelta(hours=24), 100) == timedelta(minutes=15)
    assert charts.bucket_size(timedelta(days=7), 100) == timedelta(hours=2)
    jobs = [{"job_id": 1, "job_name": "a"}]
    b = [{"job_id": 1, "bucket_start": T0, "outcome": "success", "n": 40},
         {"job_id": 1, "bucket_start": T0, "outcome": "timeout", "n": 1},
         {"job_id": 1, "bucket_start": T0 + timedelta(minutes=30), "outcome": "success", "n": 7}]
    tl = charts.bucketed(T0, T0 + timedelta(hours=1), jobs, b, timedelta(minutes=30))
    assert [r.cls for r in tl.rects] == ["bucket timeout", "bucket success"]
    assert "41 runs (40 success, 1 timeout)" in tl.rects[0].title
    assert tl.bucket == timedelta(minutes=30)


def test_schedules_the_database_plans_are_described_in_words() -> None:
    assert words.describe("@after") == "after its upstream jobs"
    assert words.describe(" @restart ") == "when the server starts"


def test_distances_are_between_instants_across_a_dst_change() -> None:
    """Times come in the session's zone; a 24-hour window over New York's fall-back is 24 hours,
    and the two 01:30s of that night (EDT, then EST) are an hour apart on the timeline."""
    ny = ZoneInfo("America/New_York")
    now = datetime(2026, 11, 1, 12, 0, tzinfo=ny)  # EST; 01:00-02:00 happened twice that night
    start = now.astimezone(UTC) - timedelta(hours=24)
    first = datetime(2026, 11, 1, 1, 30, tzinfo=ny)  # EDT (fold 0)
    second = datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=ny)  # EST
    assert second.timestamp() - first.timestamp() == 3600
    run = {"trigger": "schedule", "sqlstate": None, "message": None, "job_id": 1, "outcome": "success"}
    runs = [{**run, "run_id": 1, "plan_time": t, "run_from": t, "run_to": t + timedelta(minutes=1)}
            for t in (first, second)]
    tl = charts.timeline(start, now, [{"job_id": 1, "job_name": "a"}], runs)
    span = charts.WIDTH - charts.LABEL_WIDTH
    a, b = tl.rects
    assert b.x - a.x == pytest.approx(span / 24)
    # The ticks are every 4 hours of real time, labelled by New York's clock: 24 hours before
    # 12:00 EST is 13:00 EDT, and the night's extra hour shows between 01:00 and 04:00.
    assert [t for _, t in tl.ticks] == ["10-31 13:00", "10-31 17:00", "10-31 21:00", "11-01 01:00",
                                        "11-01 04:00", "11-01 08:00", "11-01 12:00"]
    # Runs per minute: the minute an hour before now (by the clock of instants) is 60 bars back.
    rows = [{"minute": datetime(2026, 11, 1, 11, 50, tzinfo=ny), "outcome": "success", "n": 1}]
    c = charts.runs_per_minute(rows, now, minutes=60)
    assert [r.x for r in c.rects] == [pytest.approx(49 * c.width / 60 + 1)]
    assert c.labels[0][2] == "11:01"
