"""@pgsched.job declarations: mistakes fail at import, naming the function, before anything is written."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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
    ({"every": "1 month 2 days"}, "cannot be combined"),
    ({"every": "1 minute", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"every": "1 minute", "max_runtime": "1 month"}, "max_runtime must be a positive duration"),
    ({"every": "1 minute", "retry_period": "-5 seconds"}, "is not an interval"),
    ({"every": "1 minute", "max_retries": -2}, "max_retries"),
    ({"every": "1 minute", "catch_up": "sometimes"}, "catch_up"),
    ({"every": "1 minute", "initial_start": datetime(2026, 1, 1)}, "timezone-aware"),
    ({"every": "1 minute", "config": {"x": object()}}, "JSON"),
])
def test_bad_declarations_name_the_function(kwargs: dict[str, Any], match: str) -> None:
    def handler(run: pgsched.Run) -> None: ...

    with pytest.raises(pgsched.JobDeclarationError, match=match) as e:
        pgsched.job(**kwargs)(handler)
    assert "handler" in str(e.value)
    assert app.REGISTRY == {}


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
