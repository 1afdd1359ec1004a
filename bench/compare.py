"""Before and after in one sitting: a bench run alternately on another commit and on this tree.

    ./dev bench compare --against REF [--pairs 4] [--warmup 1] [--keys runs_per_s,cpu_us_per_run] BENCH [ARGS...]
    ./dev bench compare --against 91430c7 --pairs 6 scheduler throughput
    ./dev bench compare --against HEAD cpu_split --seconds 15

BENCH is a script of bench/ (`scheduler`, `cpu_split`, ...) that prints one JSON object as its
last line; ARGS are its own. REF is checked out into a temporary `git worktree` (removed at the
end) and each run imports the pgsched of its tree (PYTHONPATH), with this tree's bench script,
so both are measured the same way. The trees alternate in pairs whose order flips each time
(before-after, after-before, ...), so that a drift of the machine during the sitting weighs on
both alike: this machine's speed moves by ±15 % within minutes, more than most changes measured.
The first run of a sitting tends to be the fastest (in three sittings of `throughput` on
2026-11-27 the first gave 2,374-2,461 runs/s and the others 1,792-2,283; a fourth had no such
drop): --warmup runs (default 1, of this tree) go first and are not counted.

Each run prints one JSON line as it ends (`tree`: before or after, `at`, the bench's own keys);
then a summary per numeric key (or per --keys): each side's values, mean and median, the mean
of the pairs' differences (after - before) and of their ratios, and in how many pairs after was
higher. A difference smaller than the spread of one side's values is not one this sitting
resolved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import TREE, worktree

BENCH = Path(__file__).resolve().parent


def order(pair: int) -> tuple[str, str]:
    """Which tree runs first in the pair numbered `pair` (from 0): before first in even pairs."""
    return ("before", "after") if pair % 2 == 0 else ("after", "before")


def summarize(before: list[dict[str, Any]], after: list[dict[str, Any]], keys: list[str] | None = None
              ) -> dict[str, dict[str, Any]]:
    """Per key, the two sides' values (in pair order) and how after compares with before.

    Pairs are matched by index; a key is summarized when it is numeric in every run of both
    sides (booleans are not numbers here), or when it is named in `keys` (then it must be)."""
    def numeric(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if len(before) != len(after):
        raise ValueError(f"{len(before)} runs before and {len(after)} after: the pairs must be complete")
    runs = before + after
    if keys is None:
        keys = [k for k in (runs[0] if runs else {}) if all(numeric(r.get(k)) for r in runs)]
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        missing = [i for i, r in enumerate(runs) if not numeric(r.get(key))]
        if missing:
            raise ValueError(f"--keys: {key!r} is not a number in every run (the bench's keys: "
                             f"{', '.join(sorted(runs[missing[0]]))})")
        b = [float(r[key]) for r in before]
        a = [float(r[key]) for r in after]
        diffs = [y - x for x, y in zip(b, a, strict=True)]
        out[key] = {
            "before": b, "after": a,
            "before_mean": _round(statistics.fmean(b)), "after_mean": _round(statistics.fmean(a)),
            "before_median": _round(statistics.median(b)), "after_median": _round(statistics.median(a)),
            "mean_difference": _round(statistics.fmean(diffs)),
            "mean_ratio": _round(statistics.fmean([y / x for x, y in zip(b, a, strict=True)]))
            if all(b) else None,
            "pairs_higher_after": sum(1 for d in diffs if d > 0),
            "pairs": len(diffs),
        }
    return out


def _round(x: float) -> float:
    return round(x, 4 if abs(x) < 10 else 1)


def run_once(tree: Path, bench: str, args: list[str]) -> dict[str, Any]:
    """One run of bench/<bench>.py with the pgsched of `tree`; its last line of output, as JSON."""
    # In the tree's directory too: a process the bench starts as `python -m pgsched...` (a worker
    # that bench/worker_alone launches) puts its working directory first on sys.path, before
    # PYTHONPATH, so from this checkout it would import this tree's pgsched on both sides.
    proc = subprocess.run([sys.executable, str(BENCH / f"{bench}.py"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench/{bench}.py {' '.join(args)} failed in {tree} (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if not isinstance(result, dict):
        raise SystemExit(f"bench/{bench}.py did not end with a JSON object: {lines[-1][:200]}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="git ref of the code before (a commit, a tag, HEAD)")
    ap.add_argument("--pairs", type=int, default=4, help="before/after pairs, order alternating (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="runs of this tree first, not counted (default 1)")
    ap.add_argument("--keys", default=None, help="comma-separated keys to summarize (default: every numeric key)")
    ap.add_argument("bench", help="a script of bench/, without .py (scheduler, cpu_split, ...)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the bench's own arguments")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs: at least 1")
    if args.warmup < 0:
        ap.error("--warmup: 0 or more")
    if args.bench == "compare" or not (BENCH / f"{args.bench}.py").is_file():
        ap.error(f"bench: a script of {BENCH} other than compare, without .py (got {args.bench!r})")
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with worktree(args.against) as before_tree:
        trees = {"before": before_tree, "after": TREE}
        for n in range(args.warmup):
            result = run_once(TREE, args.bench, args.args)
            print(json.dumps({"tree": "warmup", "run": n + 1, "at": time.strftime("%H:%M:%S"), **result}), flush=True)
        for pair in range(args.pairs):
            for side in order(pair):
                result = run_once(trees[side], args.bench, args.args)
                results[side].append(result)
                print(json.dumps({"tree": side, "pair": pair + 1, "at": time.strftime("%H:%M:%S"), **result}),
                      flush=True)
    try:
        summary = summarize(results["before"], results["after"], keys)
    except ValueError as e:
        raise SystemExit(str(e)) from e
    print(json.dumps({"compare": args.bench, "args": args.args, "against": args.against, "summary": summary}))


if __name__ == "__main__":
    main()
