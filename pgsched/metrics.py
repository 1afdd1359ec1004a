"""What the scheduler loop counts for `serve --http` (pgsched/http.py exports it).

Plain counters and fixed-bucket histograms, written by the loop only (one thread), read by
the HTTP thread at scrape time: a run costs a few integer additions and no SQL. Without
--http the loop holds no LoopMetrics at all (`metrics is None`), and pays one test per run.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
LOOP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Histogram:
    """Counts per bucket (an observation lands in the first bucket whose bound is >= it), and the sum."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus' buckets: (le, count of observations <= le), ending with +Inf."""
        counts, out, total = list(self.counts), [], 0
        for bound, n in zip((*self.buckets, float("inf")), counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class LoopMetrics:
    """The loop's counts since start."""

    def __init__(self) -> None:
        self.runs = Counter[str]()  # by outcome
        self.duration = Histogram(DURATION_BUCKETS)
        self.lag = Histogram(LAG_BUCKETS)
        self.loop = Histogram(LOOP_BUCKETS)
        self.last_tick = time.monotonic()

    def run_started(self, lag_s: float) -> None:
        self.lag.observe(max(lag_s, 0.0))

    def run_ended(self, outcome: str, duration_s: float) -> None:
        self.runs[outcome] += 1
        self.duration.observe(max(duration_s, 0.0))

    def closed_unrun(self, outcome: str) -> None:
        """A claimed plan closed without running (skipped, or a job that cannot run at all, a
        failure): counted by outcome as job_history records it, with no duration."""
        self.runs[outcome] += 1

    def ticked(self, seconds: float) -> None:
        self.loop.observe(seconds)
        self.last_tick = time.monotonic()
