"""Time per next-firing computation: pgsched's cron engine against croniter.

    ./dev bench cron_speed [--calls 500] [--repeat 5]

For each expression in EXPRESSIONS and each zone in ZONES, both engines walk --calls consecutive firings from START:

* next: pgsched's ``cron_next`` on the parsed expression (the scheduler parses a schedule once and caches it) against
  croniter's ``get_next`` on one iterator (``second_at_beginning=True, implement_cron_bug=True``, as the oracle
  test uses it) -- reusing the iterator is croniter's cheapest way;
* parse+next: a fresh parse for every firing, as a stateless caller pays it (``parse_cron`` then ``cron_next``,
  against a new ``croniter`` then ``get_next``).

A figure is the best of --repeat runs (time.perf_counter) divided by --calls, in µs per call. Prints one JSON line per
(expression, zone), then a table and the median and range of each column. Pure computation: no cluster, so unlike
the other benchmarks it does not use common.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from pgsched.schedule import cron_next, parse_cron, zone

# Representative schedules: the common 5-field forms, seconds-first 6-field ones, the day specials, a year field.
EXPRESSIONS = (
    "*/5 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "0 9 * * MON-FRI",
    "0 0 1 * *",
    "0 30 9 * * MON-FRI",
    "*/15 * * * * *",
    "0 0 0 L * *",
    "0 0 12 * * 5#3",
    "0 0 12 * * ? 2026-2099",
)
ZONES = ("UTC", "Europe/Berlin", "America/New_York")
# Before the spring transitions of both northern zones, so the frequent schedules' walks stay near them and the
# daily and monthly ones cross the year's transitions.
START = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest of ``repeat`` timed calls of ``run``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(expr: str, tz_name: str, calls: int, repeat: int) -> dict[str, Any]:
    tz = zone(tz_name)
    cron = parse_cron(expr)
    start_local = START.astimezone(ZoneInfo(tz_name))

    def ours() -> list[datetime]:
        out, t = [], START
        for _ in range(calls):
            t = cron_next(cron, tz, t)
            out.append(t)
        return out

    def theirs() -> list[datetime]:
        it = croniter(expr, start_local, second_at_beginning=True, implement_cron_bug=True)
        return [it.get_next(datetime) for _ in range(calls)]

    walk = ours()
    if tz_name == "UTC":
        # The same firings, so the same work. (In a DST zone croniter's walk also has the repeated hour's second
        # pass, one or a few firings a year: a difference the figures do not notice.)
        assert walk == theirs(), expr
    afters = [START, *walk[:-1]]

    def ours_fresh() -> None:
        for t in afters:
            cron_next(parse_cron(expr), tz, t)

    def theirs_fresh() -> None:
        for t in afters:
            croniter(expr, t.astimezone(tz), second_at_beginning=True, implement_cron_bug=True).get_next(datetime)

    def us(run: Callable[[], object]) -> float:
        return round(1e6 * best_of(repeat, run) / calls, 1)

    pgsched, croniter_ = us(ours), us(theirs)
    return {"scenario": "cron_speed", "expression": expr, "zone": tz_name, "calls": calls,
            "pgsched_us": pgsched, "croniter_us": croniter_, "ratio": round(croniter_ / pgsched, 1),
            "pgsched_parse_next_us": us(ours_fresh), "croniter_parse_next_us": us(theirs_fresh),
            "last_firing": walk[-1].isoformat()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=500, help="consecutive firings per run (default 500)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure, the best is kept (default 5)")
    args = ap.parse_args()
    rows = []
    for expr in EXPRESSIONS:
        for tz_name in ZONES:
            row = measure(expr, tz_name, args.calls, args.repeat)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nµs per call, best of {args.repeat} walks of {args.calls} firings from {START.isoformat()}")
    print(f"{'':<24} {'':<17} {'next':^25} {'parse+next':^19}")
    print(f"{'expression':<24} {'zone':<17} {'pgsched':>8} {'croniter':>9} {'ratio':>6} {'pgsched':>9} {'croniter':>9}")
    for r in rows:
        print(f"{r['expression']:<24} {r['zone']:<17} {r['pgsched_us']:>8.1f} {r['croniter_us']:>9.1f}"
              f" {r['ratio']:>6.1f} {r['pgsched_parse_next_us']:>9.1f} {r['croniter_parse_next_us']:>9.1f}")
    for key in ("pgsched_us", "croniter_us", "ratio", "pgsched_parse_next_us", "croniter_parse_next_us"):
        xs = [float(r[key]) for r in rows]
        print(f"{key}: median {statistics.median(xs):.1f}, range {min(xs):.1f}-{max(xs):.1f}")

if __name__ == "__main__":
    main()
