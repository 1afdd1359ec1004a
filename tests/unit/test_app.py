"""@pgsched.job declarations: mistakes fail at import, naming the function, before anything is written."""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import pgsched
from pgsched import app


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    saved = dict(app.REGISTRY)
    app.REGISTRY.clear()
    yield
    app.REGISTRY.clear()
    app.REGISTRY.update(saved)


def test_a_declared_job_is_registered_with_its_settings() -> None:
    @pgsched.job(cron="0 */5 * * * *", timezone="Europe/Paris", max_runtime="2 minutes", max_retries=5,
                 config={"k": 1})
    def rollup(run: pgsched.Run) -> pgsched.Result | None:
        return None

    spec = app.REGISTRY[f"{__name__}.test_a_declared_job_is_registered_with_its_settings.<locals>.rollup"]
    assert (spec.schedule, spec.timezone, spec.max_runtime, spec.max_retries) == (
        "0 */5 * * * *", "Europe/Paris", "00:02:00", 5)
    row = spec.catalog_row()
    assert row["code_module"] == __name__ and row["config"] == {"k": 1} and row["retry_period"] == "00:05:00"


def test_exclude_is_carried_to_the_catalog_row() -> None:
    @pgsched.job(every="5 minutes", name="nights off", exclude=" * 2  * * * ")
    def a(run: pgsched.Run) -> None: ...

    @pgsched.job(every="5 minutes", name="always")
    def b(run: pgsched.Run) -> None: ...

    assert app.REGISTRY["nights off"].catalog_row()["exclude"] == "* 2 * * *"
    assert app.REGISTRY["always"].catalog_row()["exclude"] is None


def test_every_accepts_text_and_timedelta_and_a_name() -> None:
    @pgsched.job(every=timedelta(minutes=10), name="ten")
    def a(run: pgsched.Run) -> None: ...

    @pgsched.job(every="1 month", name="monthly", initial_start=datetime(2026, 1, 31, tzinfo=UTC))
    def b(run: pgsched.Run) -> None: ...

    assert app.REGISTRY["ten"].schedule == "00:10:00"
    assert app.REGISTRY["monthly"].schedule == "1 mon"
    assert [s.name for s in app.registered([__name__])] == ["monthly", "ten"]


def no_params() -> None: ...
def two_params(run: Any, other: Any) -> None: ...
def keyword_only(*, run: Any) -> None: ...


@pytest.mark.parametrize("handler", [no_params, two_params, keyword_only])
def test_a_handler_that_cannot_take_a_run_is_refused(handler: Any) -> None:
    with pytest.raises(pgsched.JobDeclarationError, match=rf"{handler.__name__}: a job handler must take"):
        pgsched.job(every="1 minute")(handler)
    assert app.REGISTRY == {}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({}, "exactly one of every="),
    ({"every": "1 minute", "cron": "* * * * *"}, "exactly one of every="),
    ({"cron": "61 * * * *"}, "invalid schedule"),
    ({"cron": "0 0 31 2 *"}, "never fire"),
    ({"every": "five minutes"}, "is not an interval"),
    ({"every": "0 seconds"}, "not positive"),
    ({"every": "999 microseconds"}, "shorter than 1 millisecond"),
    ({"every": timedelta(microseconds=1)}, "shorter than 1 millisecond"),
    ({"every": "1 month 2 days"}, "cannot be combined"),
    ({"every": "1 minute", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"every": "1 minute", "max_runtime": "1 month"}, "max_runtime must be a positive duration"),
    ({"every": "1 minute", "retry_period": "-5 seconds"}, "is not an interval"),
    ({"every": "1 minute", "max_retries": -2}, "max_retries"),
    ({"every": "1 minute", "catch_up": "sometimes"}, "catch_up"),
    ({"every": "1 minute", "initial_start": datetime(2026, 1, 1)}, "timezone-aware"),
    ({"every": "1 minute", "config": {"x": object()}}, "JSON"),
    ({"every": "1 minute", "catch_up_window": "0 seconds"}, "catch_up_window must be a positive duration"),
    ({"every": "1 minute", "catch_up_window": timedelta(minutes=-5)}, "catch_up_window must be a positive duration"),
    ({"every": "1 minute", "catch_up_window": "1 month"}, "catch_up_window must be a positive duration"),
    ({"every": "1 minute", "catch_up_window": "soon"}, "invalid catch_up_window: 'soon' is not an interval"),
    ({"every": "1 minute", "catch_up_window": 3600}, "catch_up_window must be a positive duration"),
    ({"every": "1 minute", "max_plans_per_tick": 0}, "max_plans_per_tick must be a whole number from 1"),
    ({"every": "1 minute", "max_plans_per_tick": -1}, "max_plans_per_tick"),
    ({"every": "1 minute", "max_plans_per_tick": 2**31}, "max_plans_per_tick"),
    ({"every": "1 minute", "max_plans_per_tick": 2.5}, "max_plans_per_tick"),
    ({"every": "1 minute", "max_plans_per_tick": True}, "max_plans_per_tick"),
    ({"every": "1 minute", "max_plans_per_tick": None}, "max_plans_per_tick"),
    ({"every": "1 minute", "schedule_delay": None}, "schedule_delay must be a duration from 0"),
    ({"every": "1 minute", "schedule_delay": timedelta(seconds=-1)}, "schedule_delay must be a duration from 0"),
    ({"every": "1 minute", "schedule_delay": "1 month"}, "no months"),
    ({"every": "1 minute", "schedule_delay": "366 days"}, "up to 365 days"),
    ({"every": "1 minute", "schedule_delay": timedelta(days=365, microseconds=1)}, "up to 365 days"),
    ({"every": "1 minute", "schedule_delay": "later"}, "invalid schedule_delay: 'later' is not an interval"),
    ({"every": "1 minute", "schedule_delay": 60}, "schedule_delay must be a duration from 0"),
    ({"every": "1 minute", "allow_stale_reentry": "yes"}, "allow_stale_reentry must be True or False"),
    ({"every": "1 minute", "allow_stale_reentry": 1}, "allow_stale_reentry must be True or False"),
    ({"every": "1 minute", "allow_stale_reentry": None}, "allow_stale_reentry"),
    ({"every": "1 minute", "scope_query": ""}, "scope_query must be one SQL query"),
    ({"every": "1 minute", "scope_query": " \n\t"}, "scope_query must be one SQL query"),
    ({"every": "1 minute", "scope_query": "x" * 10_001}, "at most 10000 characters"),
    ({"every": "1 minute", "scope_query": b"SELECT 1"}, "scope_query must be one SQL query"),
    ({"every": "1 minute", "scope_query": ["SELECT 1"]}, "or None for a job that is not scoped"),
    ({"every": "1 minute", "priority": 3601}, "priority must be a whole number from -3600 to 3600"),
    ({"every": "1 minute", "priority": -3601}, "priority must be a whole number from -3600 to 3600"),
    ({"every": "1 minute", "priority": 1.5}, "priority must be a whole number"),
    ({"every": "1 minute", "priority": True}, "priority must be a whole number"),
    ({"every": "1 minute", "priority": None}, "priority must be a whole number"),
    ({"every": "1 minute", "exclude": "* 2 * *"}, "invalid exclude: '\\* 2 \\* \\*' is not a cron expression of 5"),
    ({"every": "1 minute", "exclude": "@daily"}, "invalid exclude"),
    ({"every": "1 minute", "exclude": "* * * * *"}, "excludes every minute"),
    ({"every": "1 minute", "exclude": "0 0 31 2 *"}, "invalid exclude: .*can never fire"),
    ({"cron": "30 10 * * *", "exclude": "* 10 * * *"}, "invalid exclude: '\\* 10 \\* \\* \\*' leaves schedule "
                                                       "'30 10 \\* \\* \\*' no start"),
    ({"every": "1 minute", "exclude": 2}, "exclude must be a cron expression of 5 fields"),
    ({"every": "1 minute", "jitter": timedelta(seconds=-1)}, "jitter must be a duration from 0 up to 1 day"),
    ({"every": "1 minute", "jitter": "1 month"}, "jitter must be .*no months"),
    ({"every": "1 minute", "jitter": "25 hours"}, "jitter must be a duration from 0 up to 1 day"),
    ({"every": "1 minute", "jitter": "soon"}, "invalid jitter: 'soon' is not an interval"),
    ({"every": "1 minute", "jitter": None}, "jitter must be a duration"),
    ({"every": "1 minute", "jitter": 30}, "jitter must be a duration"),
    ({"every": "1 minute", "concurrency_key": ""}, "concurrency_key must be a name of 1 to 200 characters"),
    ({"every": "1 minute", "concurrency_key": "  "}, "concurrency_key must be a name of 1 to 200 characters"),
    ({"every": "1 minute", "concurrency_key": "k" * 201}, "concurrency_key must be a name of 1 to 200 characters"),
    ({"every": "1 minute", "concurrency_key": 7}, "concurrency_key must be a name of 1 to 200 characters"),
    ({"every": "1 minute", "history": "some"}, "history must be one of 'all', 'failures', 'none'"),
    ({"every": "1 minute", "history": None}, "history must be one of"),
    ({"every": "1 minute", "success_retention": "0 seconds"}, "success_retention must be a positive duration"),
    ({"every": "1 minute", "failure_retention": timedelta(days=-1)}, "failure_retention must be a positive duration"),
    ({"every": "1 minute", "failure_retention": "soon"}, "invalid failure_retention: 'soon' is not an interval"),
    ({}, "give exactly one of every= .*, or after="),
    ({"after": "extract"}, "after must be a list of 1 to 100 jobs"),
    ({"after": []}, "after must be a list of 1 to 100 jobs"),
    ({"after": ["x"] * 101}, "after must be a list of 1 to 100 jobs"),
    ({"after": [""]}, "'' is none of these"),
    ({"after": [0]}, "0 is none of these"),
    ({"after": [True]}, "True is none of these"),
    ({"after": [print]}, "declare a handler with @pgsched.job before naming it"),
    # the wrong kind of value, said at the declaration (not an AttributeError, nor at deploy)
    ({"every": 5}, "every must be an interval"),
    ({"cron": 5}, "cron must be a cron expression"),
    ({"every": "1 minute", "name": 5}, "name must be a name of 1 to 500"),
    ({"every": "1 minute", "name": "x" * 501}, "name must be a name of 1 to 500"),
    ({"every": "1 minute", "timezone": ""}, "timezone must be an IANA name"),
    ({"every": "1 minute", "max_retries": True}, "max_retries must be -1"),
    ({"every": "1 minute", "scheduled": "no"}, "scheduled must be True or False"),
    ({"every": "1 minute", "fixed_schedule": 1}, "fixed_schedule must be True or False"),
    ({"every": "1 minute", "initial_start": "2026-01-01"}, "initial_start must be a timezone-aware datetime"),
    # accepted here, refused by the deploy ("invalid input syntax for type json", naming neither function nor argument)
    ({"every": "1 minute", "config": {"x": math.nan}}, "config must be JSON-serialisable \\(without NaN"),
    ({"every": "1 minute", "config": [math.inf]}, "config must be JSON-serialisable \\(without NaN"),
    ({"every": "1 minute", "config": {"x": "a\x00b"}}, r"config\['x'\] has a NUL character"),
    ({"every": "1 minute", "config": {"x\x00": 1}}, "the key 'x\\\\x00' in config has a NUL"),
    ({"every": "1 minute", "config": {"x": ["\ud800"]}}, r"config\['x'\]\[0\] has a NUL character or a lone surr"),
    ({"every": "1 minute", "config": {1: "a"}}, "the key 1 in config is not text .*write '1'"),
    ({"every": "1 minute", "config": {"a": {True: 1}}}, r"the key True in config\['a'\] is not text"),
    ({"every": "1 minute", "name": "a\x00b"}, "name must be text without NUL characters or lone surrogates"),
    ({"every": "1 minute", "name": "\udc80"}, "name must be text without NUL"),
    ({"every": "1 minute", "database": "app\x00"}, "database must be text without NUL"),
    ({"every": "1 minute", "database": "\ud800"}, "database must be text without NUL"),
    ({"every": "1 minute", "concurrency_key": "k\x00"}, "concurrency_key must be text without NUL"),
    ({"every": "1 minute", "concurrency_key": "\udfff"}, "concurrency_key must be text without NUL"),
    ({"every": "1 minute", "scope_query": "SELECT 1\x00"}, "scope_query must be text without NUL"),
    ({"every": "1 minute", "timezone": "UTC\x00"}, "timezone must be text without NUL"),
    ({"every": "1 minute", "exclude": "* 2 * * *\x00"}, "exclude must be text without NUL"),
    ({"cron": "* * * * *\x00"}, "cron must be text without NUL"),
    ({"every": "1 minute\x00"}, "every must be text without NUL"),
    ({"every": "1 minute", "retry_period": "\ud800 1 minute"}, "retry_period must be text without NUL"),
    ({"after": ["extract\x00"]}, "after must be text without NUL"),
    ({"every": "1 minute", "max_retries": 2**31}, "max_retries must be -1 \\(unlimited\\) or a whole number from 0 to "
                                                  "2147483647"),
    ({"every": "8000 years"}, "every must be an interval .* before the year 9999; from .* the next plan of "
                              "'8000 years' would fall after the year 9998"),
    ({"every": timedelta(days=999_999_999)}, "the next plan of .* would fall after the year 9998"),
    ({"every": "1 year", "initial_start": datetime(9998, 1, 1, tzinfo=UTC)}, "from 9998-01-01 the next plan"),
    ({"every": "9" * 400 + " months"}, "every must be an interval"),
    ({"every": "1 minute", "max_runtime": "300000000 years"}, "max_runtime must be .* longer than PostgreSQL's"),
    ({"every": "1 minute", "retry_period": "99999999999 hours"}, "retry_period must be .* longer than PostgreSQL's"),
    ({"every": "1 minute", "catch_up_window": "3000000000 days"}, "catch_up_window must be .* longer than PostgreSQL"),
    ({"every": "1 minute", "catch_up_window": "999999999 days 25:00:00"}, "catch_up_window must be .* longer than"),
    ({"every": "1 minute", "success_retention": "3000000000 months"}, "success_retention must be .* longer than"),
    ({"every": "1 minute", "failure_retention": "9" * 400 + " days"}, "failure_retention must be a positive duration"),
    ({"every": "1 minute", "initial_start": datetime(9999, 1, 1, tzinfo=UTC)},
     "initial_start must be a finite time from the year 1 to 9998 .*not 9999-01-01T00:00:00\\+00:00"),
    ({"every": "1 minute", "initial_start": datetime(1, 1, 1, tzinfo=UTC)}, "initial_start must be a finite time"),
    ({"every": "1 minute", "initial_start": datetime(1, 1, 2, 3, tzinfo=timezone(timedelta(hours=5)))},
     "initial_start must be a finite time"),
    ({"every": "1 minute", "initial_start": datetime(9998, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2)))},
     "initial_start must be a finite time"),
])
def test_bad_declarations_name_the_function(kwargs: dict[str, Any], match: str) -> None:
    def handler(run: pgsched.Run) -> None: ...

    with pytest.raises(pgsched.JobDeclarationError, match=match) as e:
        pgsched.job(**kwargs)(handler)
    assert "handler" in str(e.value)
    assert app.REGISTRY == {}


async def async_handler(run: pgsched.Run) -> None: ...
def generator_handler(run: pgsched.Run) -> Iterator[None]: yield None
async def async_generator_handler(run: pgsched.Run) -> AsyncIterator[None]: yield None


class AsyncCallable:
    async def __call__(self, run: pgsched.Run) -> None: ...


@pytest.mark.parametrize(("handler", "kind"), [
    (async_handler, "an async def function"), (generator_handler, "a generator function"),
    (async_generator_handler, "an async generator function"), (AsyncCallable(), "an async def function"),
    (functools.partial(async_handler), "an async def function"),
])
def test_a_handler_whose_call_does_not_run_its_body_is_refused(handler: Any, kind: str) -> None:
    """A coroutine or a generator is what such a call returns: every run would fail."""
    with pytest.raises(pgsched.JobDeclarationError, match=f": a job handler must be a plain function .* it is {kind},"):
        pgsched.job(every="1 minute", name="not plain")(handler)
    assert app.REGISTRY == {}


@pytest.mark.parametrize(("kwargs", "stored"), [
    ({"config": {"a": [1, 2.5, None, True, {"b": "é ✓"}]}}, ("config", {"a": [1, 2.5, None, True, {"b": "é ✓"}]})),
    ({"max_retries": 2**31 - 1}, ("max_retries", 2**31 - 1)),
    ({"initial_start": datetime(1, 1, 2, tzinfo=UTC)}, ("initial_start", "0001-01-02T00:00:00+00:00")),
    ({"every": "1 year", "initial_start": datetime(9997, 12, 31, tzinfo=UTC)}, ("schedule", "12 mons")),
    ({"catch_up_window": "36500 days"}, ("catch_up_window", "36500 days")),
])
def test_declarations_within_the_limits_are_accepted(kwargs: dict[str, Any], stored: tuple[str, Any]) -> None:
    pgsched.job(**{"every": "1 minute", **kwargs}, name="within")(no_params_but_run)
    assert app.REGISTRY["within"].catalog_row()[stored[0]] == stored[1]


def no_params_but_run(run: pgsched.Run) -> None: ...


def test_one_name_for_two_functions_is_refused() -> None:
    @pgsched.job(every="1 minute", name="same")
    def first(run: pgsched.Run) -> None: ...

    def second(run: pgsched.Run) -> None: ...

    with pytest.raises(pgsched.JobDeclarationError, match="already used by"):
        pgsched.job(every="1 minute", name="same")(second)


def test_results_are_size_capped() -> None:
    assert pgsched.Result(3, {"a": 1}).encoded() == (3, {"a": 1})
    rows, big = pgsched.Result(None, {"blob": "x" * 10_000}).encoded()
    assert rows is None and big == {"truncated": True, "bytes": 10_012, "limit": app.MAX_RESULT_BYTES}


@pytest.mark.parametrize("rows", ["many", 2.5, True, 2**63, -(2**63) - 1, Decimal(3), [1]])
def test_a_rows_affected_that_is_not_a_bigint_is_refused(rows: Any) -> None:
    with pytest.raises(app.ResultError, match=r"^pgsched.Result: rows_affected must be a whole number \(int\) "
                                              r"from -9223372036854775808 to 9223372036854775807, or None; the "
                                              r"handler gave"):
        pgsched.Result(rows_affected=rows).encoded()
    assert pgsched.Result(rows_affected=2**63 - 1).encoded() == (2**63 - 1, None)


@pytest.mark.parametrize("data", [{(1, 2): 1}, {"a": {1.5j: 1}}])
def test_data_that_json_cannot_encode_is_refused(data: Any) -> None:
    with pytest.raises(app.ResultError, match=r"^pgsched.Result: data must be a dict that JSON can encode .*TypeError"):
        pgsched.Result(data=data).encoded()


def test_lease_and_catch_up_settings_default_like_add_job() -> None:
    @pgsched.job(every="1 minute", name="plain")
    def plain(run: pgsched.Run) -> None: ...

    spec = app.REGISTRY["plain"]
    assert (spec.catch_up_window, spec.max_plans_per_tick, spec.schedule_delay, spec.allow_stale_reentry) == (
        None, 100, "00:00:00", False)
    row = spec.catalog_row()
    assert {k: row[k] for k in ("catch_up_window", "max_plans_per_tick", "schedule_delay", "allow_stale_reentry")} \
        == {"catch_up_window": None, "max_plans_per_tick": 100, "schedule_delay": "00:00:00",
            "allow_stale_reentry": False}


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"catch_up_window": "2 hours", "max_plans_per_tick": 5, "schedule_delay": "90 seconds",
      "allow_stale_reentry": True}, ("02:00:00", 5, "00:01:30", True)),
    ({"catch_up_window": timedelta(days=1, minutes=30), "schedule_delay": timedelta(minutes=10)},
     ("1 day 00:30:00", 100, "00:10:00", False)),
    ({"catch_up_window": None, "schedule_delay": "365 days", "max_plans_per_tick": 2**31 - 1},
     (None, 2**31 - 1, "365 days", False)),
    ({"schedule_delay": "0 seconds", "max_plans_per_tick": 1}, (None, 1, "00:00:00", False)),
    ({"catch_up_window": "1 second", "schedule_delay": timedelta(0)}, ("00:00:01", 100, "00:00:00", False)),
    # the window counts from the time a plan becomes eligible, so it may be shorter than the delay
    ({"catch_up_window": "1 minute", "schedule_delay": "1 hour"}, ("00:01:00", 100, "01:00:00", False)),
])
def test_lease_and_catch_up_settings_are_declared(kwargs: dict[str, Any], expected: tuple[Any, ...]) -> None:
    @pgsched.job(cron="*/5 * * * *", name="declared", **kwargs)
    def declared(run: pgsched.Run) -> None: ...

    row = app.REGISTRY["declared"].catalog_row()
    assert (row["catch_up_window"], row["max_plans_per_tick"], row["schedule_delay"],
            row["allow_stale_reentry"]) == expected


def test_scope_query_defaults_to_none() -> None:
    @pgsched.job(every="1 minute", name="plain")
    def plain(run: pgsched.Run) -> None: ...

    assert app.REGISTRY["plain"].scope_query is None
    assert app.REGISTRY["plain"].catalog_row()["scope_query"] is None


@pytest.mark.parametrize("query", ["SELECT region FROM regions", "VALUES ('a'), ('b')",
                                   "-- keys\nSELECT k\n  FROM t", "SELECT '" + "x" * 9991 + "'"])
def test_scope_query_is_declared_as_written(query: str) -> None:
    @pgsched.job(every="1 minute", name="scoped", scope_query=query)
    def scoped(run: pgsched.Run) -> None: ...

    # stored as written: the deploy plans it, as add_job does (the database knows the tables)
    assert app.REGISTRY["scoped"].catalog_row()["scope_query"] == query


@pytest.mark.parametrize(("given", "stored"), [
    (None, "00:00:00"), ("30 seconds", "00:00:30"), (timedelta(minutes=2), "00:02:00"), ("1 day", "1 day"),
])
def test_jitter_is_declared_as_add_job_reads_it(given: str | timedelta | None, stored: str) -> None:
    def spread(run: pgsched.Run) -> None: ...

    if given is None:
        pgsched.job(every="1 minute", name="spread")(spread)
    else:
        pgsched.job(every="1 minute", name="spread", jitter=given)(spread)

    assert app.REGISTRY["spread"].catalog_row()["jitter"] == stored


def test_a_concurrency_key_is_declared_as_written() -> None:
    def heavy(run: pgsched.Run) -> None: ...

    pgsched.job(every="1 minute", name="heavy", concurrency_key="nightly-heavy")(heavy)
    assert app.REGISTRY["heavy"].catalog_row()["concurrency_key"] == "nightly-heavy"


def test_after_names_jobs_by_name_id_or_handler_and_has_no_schedule_of_its_own() -> None:
    def extract(run: pgsched.Run) -> None: ...

    def load(run: pgsched.Run) -> None: ...

    def check(run: pgsched.Run) -> None: ...

    pgsched.job(every="1 hour", name="extract")(extract)
    pgsched.job(after=[extract, "other.job", 1042], name="load")(load)
    pgsched.job(every="5 minutes", after=["load"], name="check")(check)
    row = app.REGISTRY["load"].catalog_row()
    assert (row["schedule"], row["depends_on"]) == ("@after", ["extract", "other.job", "1042"])
    row = app.REGISTRY["check"].catalog_row()
    assert (row["schedule"], row["depends_on"]) == ("00:05:00", ["load"])
    assert app.REGISTRY["extract"].catalog_row()["depends_on"] is None


def test_the_deploy_order_puts_each_job_after_the_declared_jobs_it_depends_on() -> None:
    # by name a, b, c, d; c runs after d and b after c: d, c, b go in that order, a stays first
    for name, after in (("a", None), ("b", ["c"]), ("c", ["d", "elsewhere"]), ("d", None)):
        def h(run: pgsched.Run) -> None: ...
        h.__qualname__ = f"h_{name}"
        pgsched.job(every="1 hour", name=name, after=after)(h)
    assert [s.name for s in app.registered()] == ["a", "d", "c", "b"]


@pytest.mark.parametrize(("given", "stored"), [
    ({}, ("all", None, None)),
    ({"history": "failures", "success_retention": "2 days", "failure_retention": "3 mons"},
     ("failures", "2 days", "3 mons")),
    ({"history": "none", "success_retention": timedelta(hours=12)}, ("none", "12:00:00", None)),
])
def test_history_and_retentions_are_declared_as_add_job_reads_them(given: dict[str, Any],
                                                                   stored: tuple[str, str | None, str | None]) -> None:
    def kept(run: pgsched.Run) -> None: ...

    pgsched.job(every="1 minute", name="kept", **given)(kept)

    row = app.REGISTRY["kept"].catalog_row()
    assert (row["history"], row["success_retention"], row["failure_retention"]) == stored


def test_the_package_gives_the_declaration_api_but_a_worker_imports_none_of_it() -> None:
    """`import pgsched` leaves pgsched.app to the first use of one of its names: each worker
    imports the package, and one that runs SQL jobs never declares one."""
    import subprocess
    import sys

    probe = ("import sys, pgsched.worker; print('pgsched.app' in sys.modules); "
             "from pgsched import job, Run; print('pgsched.app' in sys.modules, job.__module__, Run.__module__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "pgsched.app", "pgsched.app"]
    assert pgsched.job is app.job and pgsched.Result is app.Result and pgsched.LeaseLost is app.LeaseLost
    assert {"job", "Run", "Result", "__version__"} <= set(dir(pgsched))
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(pgsched, "no_such_name")  # noqa: B009


def test_a_job_declared_in_a_module_no_app_names_is_reported_naming_it(tmp_path: Path) -> None:
    """`--app pkg` whose __init__ imports pkg.jobs: the jobs were declared in pkg.jobs, which the
    deploy and the claim go by, so nothing was deployed nor claimed, silently (review of
    2026-11-29). The import now says which module to name; naming it works."""
    import sys
    import uuid

    from pgsched import pyjob

    pkg = f"pkgapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("from . import jobs  # noqa: F401\n")
    (tmp_path / pkg / "jobs.py").write_text(
        "import pgsched\n\n@pgsched.job(every='1 hour', name='nightly_in_pkg')\ndef nightly(run): pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert pyjob.import_apps([pkg]) == [
            f"--app {pkg}: importing it declared job 'nightly_in_pkg' ({pkg}.jobs.nightly) in module {pkg}.jobs, "
            f"which no --app names: this instance neither deploys nor runs it (add --app {pkg}.jobs if it should)"]
        assert app.registered([pkg]) == []
        assert pyjob.import_apps([pkg, f"{pkg}.jobs"]) == []
        assert [s.name for s in app.registered([pkg, f"{pkg}.jobs"])] == ["nightly_in_pkg"]
    finally:
        sys.path.remove(str(tmp_path))
        app.forget(f"{pkg}.jobs")
