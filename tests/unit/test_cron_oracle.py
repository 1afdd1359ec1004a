"""pgsched's cron engine against croniter, on the plain 5-field UTC subset where croniter is right.

pgsched does not use croniter at run time (its own engine handles seconds-first 6/7-field
expressions and the DST rule, and croniter mis-fires on some ranges); croniter stays as an
independent oracle for the common case.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from croniter import croniter

from pgsched.schedule import cron_next, parse_cron, zone

FIELDS = [(0, 59), (0, 23), (1, 28), (1, 12), (0, 6)]


def random_field(rng: random.Random, lo: int, hi: int) -> str:
    kind = rng.choice(["*", "n", "range", "step", "list", "rangestep"])
    a, b = sorted(rng.sample(range(lo, hi + 1), 2))
    if kind == "*":
        return "*"
    if kind == "n":
        return str(a)
    if kind == "range":
        return f"{a}-{b}"
    if kind == "step":
        return f"*/{rng.randint(1, max(1, (hi - lo) // 2))}"
    if kind == "rangestep":
        return f"{a}-{b}/{rng.randint(1, 5)}"
    return ",".join(str(x) for x in sorted(rng.sample(range(lo, hi + 1), rng.randint(2, 4))))


def test_matches_croniter_on_random_five_field_expressions() -> None:
    rng = random.Random(20261122)
    utc = zone("UTC")
    checked = 0
    for _ in range(400):
        fields = [random_field(rng, lo, hi) for lo, hi in FIELDS]
        # croniter ORs a '*/n' day field with the other one; Vixie cron and pg_cron (and pgsched)
        # treat a field beginning with '*' as unrestricted and AND them. Compare where both agree.
        for i in (2, 4):
            if fields[i].startswith("*/"):
                fields[i] = "*"
        expr = " ".join(fields)
        start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 2 * 365 * 86400))
        ours = parse_cron(expr)
        theirs = croniter(expr, start)
        t = start
        for _ in range(3):
            expected = theirs.get_next(datetime)
            t = cron_next(ours, utc, t)
            assert t == expected, (expr, start)
            checked += 1
    assert checked == 1200
