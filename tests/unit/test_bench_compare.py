"""bench/compare.py's pairing and summary: which tree runs first, and how after compares with before."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _compare() -> ModuleType:
    # bench/ scripts import their neighbours (`common`) as top-level modules, as `python bench/X.py` runs them.
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_compare", BENCH / "compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = _compare()


def test_order_alternates_within_pairs() -> None:
    assert [compare.order(i) for i in range(4)] == [("before", "after"), ("after", "before"),
                                                     ("before", "after"), ("after", "before")]


def test_summary_of_numeric_keys() -> None:
    before = [{"scenario": "t", "runs_per_s": 100.0, "ok": True, "cpu": 5},
              {"scenario": "t", "runs_per_s": 200.0, "ok": True, "cpu": 7}]
    after = [{"scenario": "t", "runs_per_s": 110.0, "ok": False, "cpu": 4},
             {"scenario": "t", "runs_per_s": 180.0, "ok": True, "cpu": 6}]
    s = compare.summarize(before, after)
    assert set(s) == {"runs_per_s", "cpu"}  # text and booleans are left out
    r = s["runs_per_s"]
    assert r["before"] == [100.0, 200.0] and r["after"] == [110.0, 180.0]
    assert r["before_mean"] == 150.0 and r["after_mean"] == 145.0
    assert r["mean_difference"] == -5.0
    assert r["mean_ratio"] == pytest.approx((1.1 + 0.9) / 2)
    assert r["pairs_higher_after"] == 1 and r["pairs"] == 2
    assert s["cpu"]["mean_difference"] == -1.0 and s["cpu"]["pairs_higher_after"] == 0


def test_summary_of_named_keys_and_bad_input() -> None:
    before = [{"a": 1, "b": 2}]
    after = [{"a": 3, "b": None}]
    assert set(compare.summarize(before, after, ["a"])) == {"a"}
    with pytest.raises(ValueError, match="'b' is not a number in every run"):
        compare.summarize(before, after, ["b"])
    with pytest.raises(ValueError, match="the pairs must be complete"):
        compare.summarize(before, [], None)
    # A key missing from some run is not summarized unless named.
    assert set(compare.summarize(before, after)) == {"a"}
    # A zero before: no ratio, the difference still.
    z = compare.summarize([{"a": 0}], [{"a": 2}])["a"]
    assert z["mean_ratio"] is None and z["mean_difference"] == 2.0
