"""SVG geometry for the dashboard's two pictures, from rows already read (pure: the time
comes in). The templates draw the shapes; nothing here writes markup, so Jinja's escaping
covers every text. Colours are CSS classes named after outcomes (static/style.css).

Distances in time are taken between instants (UTC), never by the wall clock of a zone, which
Python's arithmetic on two datetimes of one zone is: across a DST change that is an hour off.
Labels are in the zone of the time given as `now` or `end` (the session's)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

# The order stacks and legends use, worst last so a bucket takes the colour of its worst run.
OUTCOMES = ("success", "running", "skipped", "missed", "cancelled", "timeout", "failure", "crash")
WIDTH = 960
ROW_HEIGHT = 18
LABEL_WIDTH = 180


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    cls: str
    title: str
    href: str | None = None


@dataclass
class Chart:
    width: int
    height: int
    rects: list[Rect]
    labels: list[tuple[float, float, str]]  # x, y, text
    legend: list[tuple[str, int]]
    peak: int


def runs_per_minute(rows: list[dict[str, Any]], now: datetime, minutes: int = 60, height: int = 160) -> Chart:
    """A stacked bar per minute (oldest left) of the runs that ended in it, by outcome."""
    first = now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    per: dict[int, dict[str, int]] = defaultdict(dict)
    totals: dict[str, int] = defaultdict(int)
    for r in rows:
        i = int((r["minute"].timestamp() - first.timestamp()) // 60)
        if 0 <= i < minutes:
            per[i][r["outcome"]] = per[i].get(r["outcome"], 0) + int(r["n"])
            totals[r["outcome"]] += int(r["n"])
    peak = max((sum(v.values()) for v in per.values()), default=0)
    plot_h = height - 20
    bar_w = WIDTH / minutes
    rects: list[Rect] = []
    for i, counts in sorted(per.items()):
        y = float(plot_h)
        at = (first + timedelta(minutes=i)).astimezone(now.tzinfo).strftime("%H:%M")
        for outcome in OUTCOMES:
            n = counts.get(outcome, 0)
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            rects.append(Rect(i * bar_w + 1, y, bar_w - 2, h, outcome, f"{at}: {n} {outcome}"))
    labels = [(i * bar_w, float(height - 4), (first + timedelta(minutes=i)).astimezone(now.tzinfo).strftime("%H:%M"))
              for i in range(0, minutes, max(1, minutes // 6))]
    legend = [(o, totals[o]) for o in OUTCOMES if totals.get(o)]
    return Chart(WIDTH, height, rects, labels, legend, peak)


@dataclass
class Timeline:
    start: datetime
    end: datetime
    width: int
    height: int
    rows: list[tuple[float, str, str]]  # y (the row's top), label, href
    rects: list[Rect] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    bucket: timedelta | None = None


def _x(t: datetime, start: datetime, span: float) -> float:
    return LABEL_WIDTH + (WIDTH - LABEL_WIDTH) * max(0.0, min(1.0, (t.timestamp() - start.timestamp()) / span))


def _frame(start: datetime, end: datetime, jobs: list[dict[str, Any]], link: str) -> Timeline:
    rows = [(i * ROW_HEIGHT + 8.0, f"{j['job_id']} {j['job_name']}", link.format(job_id=j["job_id"]))
            for i, j in enumerate(jobs)]
    span = end.timestamp() - start.timestamp()
    at = [start.astimezone(UTC) + timedelta(seconds=span * k / 6) for k in range(7)]
    ticks = [(_x(t, start, span), t.astimezone(end.tzinfo).strftime("%m-%d %H:%M:%S" if span < 600 else "%m-%d %H:%M"))
             for t in at]
    return Timeline(start, end, WIDTH, len(jobs) * ROW_HEIGHT + 24, rows, ticks=ticks)


def timeline(start: datetime, end: datetime, jobs: list[dict[str, Any]], runs: list[dict[str, Any]],
             link: str = "/jobs/{job_id}") -> Timeline:
    """One bar per run, on its job's row, from its start to its end (at least a pixel wide);
    a skipped or missed plan, which never ran, as a thin mark at its plan time."""
    tl = _frame(start, end, jobs, link)
    span = end.timestamp() - start.timestamp()
    y_of = {j["job_id"]: i * ROW_HEIGHT + 8.0 for i, j in enumerate(jobs)}
    for r in runs:
        y = y_of.get(r["job_id"])
        if y is None:
            continue
        x0, x1 = _x(r["run_from"], start, span), _x(r["run_to"], start, span)
        marker = r["outcome"] in ("skipped", "missed")
        err = f" [{r['sqlstate']}] {r['message']}" if r.get("sqlstate") else ""
        title = (f"run {r['run_id']} {r['outcome']} ({r['trigger']}) plan {r['plan_time']:%Y-%m-%d %H:%M:%S}"
                 f"{err}")
        tl.rects.append(Rect(x0, y + (2 if marker else 0), 2.0 if marker else max(1.0, x1 - x0),
                             ROW_HEIGHT - 6 if marker else ROW_HEIGHT - 4,
                             f"run {r['outcome']}{' mark' if marker else ''}", title,
                             link.format(job_id=r["job_id"])))
    return tl


def bucket_size(span: timedelta, max_buckets: int) -> timedelta:
    """The smallest round bucket that cuts `span` into at most `max_buckets` pieces."""
    for seconds in (1, 5, 10, 30, 60, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 86400):
        if span.total_seconds() / seconds <= max_buckets:
            return timedelta(seconds=seconds)
    return timedelta(days=1)


def bucketed(start: datetime, end: datetime, jobs: list[dict[str, Any]], buckets: list[dict[str, Any]],
             bucket: timedelta, link: str = "/jobs/{job_id}") -> Timeline:
    """One bar per job and bucket with runs, coloured by the worst outcome in it; its title
    counts the runs by outcome (so none is dropped silently)."""
    tl = _frame(start, end, jobs, link)
    tl.bucket = bucket
    span = end.timestamp() - start.timestamp()
    y_of = {j["job_id"]: i * ROW_HEIGHT + 8.0 for i, j in enumerate(jobs)}
    grouped: dict[tuple[int, datetime], dict[str, int]] = defaultdict(dict)
    for b in buckets:
        grouped[(b["job_id"], b["bucket_start"])][b["outcome"]] = int(b["n"])
    for (job_id, t0), counts in sorted(grouped.items()):
        y = y_of.get(job_id)
        if y is None:
            continue
        worst = max(counts, key=lambda o: OUTCOMES.index(o) if o in OUTCOMES else -1)
        x0, x1 = _x(t0, start, span), _x(t0.astimezone(UTC) + bucket, start, span)
        what = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
        tl.rects.append(Rect(x0, y, max(1.0, x1 - x0 - 0.5), ROW_HEIGHT - 4, f"bucket {worst}",
                             f"{t0:%Y-%m-%d %H:%M:%S} +{int(bucket.total_seconds())}s: {sum(counts.values())} runs "
                             f"({what})", link.format(job_id=job_id)))
    return tl
