"""Jobs written in Python: the `@pgsched.job` decorator, the registry, and what a handler sees.

Declaring checks everything it can before anything is written: the handler must
accept one positional argument (the Run), the schedule must parse (an interval
or a cron expression, with the same rules as SQL jobs), durations must be
durations. A mistake raises JobDeclarationError naming the function, at import
time. `pgsched serve --app MODULE` imports the modules, deploys the registered
jobs to the catalog (deploy.py) and runs them in its workers (worker.py).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pgsched import exclusion, schedule
from pgsched.errors import PgschedError, text_of
from pgsched.model import INT4_MAX, INT8_MAX, INT8_MIN, MAX_CONCURRENCY_KEY, PRIORITY_MAX, PRIORITY_MIN

if TYPE_CHECKING:
    import psycopg

# A result is stored in the run's history row: it must stay small.
MAX_RESULT_BYTES = 8192
# schedule_delay's bounds, as add_job checks them (sql/api/10_jobs.sql).
NO_DELAY = timedelta(0)
MAX_SCHEDULE_DELAY = timedelta(days=365)
# jitter's bounds, as add_job checks them (sql/api/10_jobs.sql).
MAX_JITTER = timedelta(days=1)
_MAX_INT4 = INT4_MAX
# history's levels, as add_job checks them (sql/api/45_history.sql, pgsched._history_form).
HISTORY_LEVELS = ("all", "failures", "none")
# scope_query's length limit, as add_job checks it (sql/api/10_jobs.sql); the deploy plans the query.
MAX_SCOPE_QUERY = 10_000


class JobDeclarationError(PgschedError):
    """A @pgsched.job declaration is invalid; the message names the function."""


class LeaseLost(PgschedError):
    """The run's lease is gone (another scheduler closed or took over the run): stop now."""


# rows_affected is stored as a bigint (job_history.rows_affected).
MIN_ROWS_AFFECTED, MAX_ROWS_AFFECTED = INT8_MIN, INT8_MAX


class ResultError(PgschedError):
    """A handler returned a Result that cannot be stored: its run fails, and its work is rolled back."""


@dataclass(frozen=True)
class Result:
    """What a handler may return: stored in job_history (rows_affected, result)."""

    rows_affected: int | None = None
    data: dict[str, Any] | None = None

    def encoded(self) -> tuple[int | None, Any]:
        """(rows_affected, result) for the history row; an oversized result is replaced by a note.

        Raises ResultError for what cannot be stored: called before the run's commit, so that a bad
        Result fails the run with its work rolled back rather than after its work is committed.
        """
        rows = _rows_affected(self.rows_affected)
        if self.data is None:
            return rows, None
        try:
            text = json.dumps(self.data, default=str)
        except Exception as e:  # default=str runs the __str__ of the handler's objects: anything
            # A key that is not text or a number, a circular reference, an int too long for text, a
            # value whose str() raises.
            raise ResultError(f"pgsched.Result: data must be a dict that JSON can encode (text keys; values "
                              f"that are JSON, or that str() turns into text), or None; "
                              f"{type(e).__name__}: {text_of(e)}") from None
        if len(text.encode()) > MAX_RESULT_BYTES:
            return rows, {"truncated": True, "bytes": len(text.encode()), "limit": MAX_RESULT_BYTES}
        return rows, json.loads(text)


def _rows_affected(value: object) -> int | None:
    """rows_affected as the bigint it is stored as: a bool, float, text or Decimal is refused, not cast."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and MIN_ROWS_AFFECTED <= value <= MAX_ROWS_AFFECTED:
        return int(value)  # an int subclass (an IntEnum) as a plain int, which JSON writes as a number
    raise ResultError(f"pgsched.Result: rows_affected must be a whole number (int) from {MIN_ROWS_AFFECTED} to "
                      f"{MAX_ROWS_AFFECTED}, or None; the handler gave {_shown(value)} ({type(value).__name__})")


def _shown(value: object) -> str:
    """repr(value), shortened, and never an exception of its own (a handler's object may have any repr)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__} object>"
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Run:
    """What a handler receives: the run's identity, its job's config, a connection and a heartbeat."""

    job_id: int
    job_name: str
    run_id: int
    plan_time: datetime
    attempt: int
    scope: str
    config: Any
    # Autocommit off: committed when the handler returns, rolled back when it raises.
    connection: psycopg.Connection[Any]
    _heartbeat: Callable[[], bool] = field(repr=False, default=lambda: True)

    def heartbeat(self) -> None:
        """Renew the run's lease; raises LeaseLost when the run is no longer ours."""
        if not self._heartbeat():
            raise LeaseLost(f"run {self.run_id} of job {self.job_name!r} lost its lease: stop")


Handler = Callable[[Run], "Result | None"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class JobSpec:
    """A declared job, as deploy writes it to the catalog."""

    name: str
    module: str
    function: str
    handler: Callable[[Run], Result | None]
    schedule: str  # canonical text: an interval as PostgreSQL reads it, or the cron expression
    fixed_schedule: bool
    timezone: str | None
    initial_start: datetime | None
    max_runtime: str | None
    max_retries: int
    retry_period: str
    catch_up: str
    config: Any
    scheduled: bool
    catch_up_window: str | None
    max_plans_per_tick: int
    schedule_delay: str
    allow_stale_reentry: bool
    scope_query: str | None
    database: str | None = None
    priority: int = 0
    exclude: str | None = None
    jitter: str = "00:00:00"
    concurrency_key: str | None = None
    depends_on: tuple[str, ...] | None = None  # job names or ids (README "Dependencies")
    history: str = "all"  # which ended runs keep a row (README "History and retention")
    success_retention: str | None = None  # None: the database's
    failure_retention: str | None = None

    def catalog_row(self) -> dict[str, Any]:
        return {
            "job_name": self.name, "code_module": self.module, "code_function": self.function,
            "schedule": self.schedule, "fixed_schedule": self.fixed_schedule, "timezone": self.timezone,
            "initial_start": self.initial_start.isoformat() if self.initial_start else None,
            "max_runtime": self.max_runtime, "max_retries": self.max_retries, "retry_period": self.retry_period,
            "catch_up": self.catch_up, "config": self.config, "scheduled": self.scheduled,
            "catch_up_window": self.catch_up_window, "max_plans_per_tick": self.max_plans_per_tick,
            "schedule_delay": self.schedule_delay, "allow_stale_reentry": self.allow_stale_reentry,
            "scope_query": self.scope_query, "database": self.database, "priority": self.priority,
            "exclude": self.exclude, "jitter": self.jitter, "concurrency_key": self.concurrency_key,
            "depends_on": list(self.depends_on) if self.depends_on is not None else None,
            "history": self.history, "success_retention": self.success_retention,
            "failure_retention": self.failure_retention,
        }


REGISTRY: dict[str, JobSpec] = {}


def forget(module: str) -> None:
    """Drop a module's declarations (before re-importing a new version of it)."""
    for name in [n for n, spec in REGISTRY.items() if spec.module == module]:
        del REGISTRY[name]


def registered(modules: list[str] | None = None) -> list[JobSpec]:
    """The declared jobs (of the given modules), in a stable order: by name, except that a job comes
    after the jobs among them it depends on (the deploy resolves each job's upstreams by name)."""
    specs = sorted((s for s in REGISTRY.values() if modules is None or s.module in modules), key=lambda s: s.name)
    names = {s.name for s in specs}
    placed: set[str] = set()
    ordered: list[JobSpec] = []
    while len(ordered) < len(specs):
        ready = [s for s in specs if s.name not in placed
                 and all(u in placed or u not in names for u in s.depends_on or ())]
        if not ready:  # a cycle among them: the deploy refuses it, naming the job
            ready = [s for s in specs if s.name not in placed]
        ordered.append(ready[0])
        placed.add(ready[0].name)
    return ordered


def _upstreams(after: object, fn: str) -> tuple[str, ...] | None:
    """after= as the names (or ids) the deploy resolves: a handler is named by its job's name."""
    if after is None:
        return None
    form = ("a list of 1 to 100 jobs: job names, job ids, or handlers declared with @pgsched.job "
            "(such as after=[nightly_rollup] or after=['nightly_rollup'])")
    if isinstance(after, str | bytes) or not isinstance(after, Sequence) or not 1 <= len(after) <= 100:
        raise JobDeclarationError(f"{fn}: after must be {form}, not {after!r}")
    out: list[str] = []
    for u in after:
        if isinstance(u, str) and u.strip():
            out.append(u)
        elif isinstance(u, int) and not isinstance(u, bool) and 0 < u <= _MAX_INT4:
            out.append(str(u))
        elif callable(u) and (spec := next((s for s in REGISTRY.values() if s.handler is u), None)) is not None:
            out.append(spec.name)
        else:
            raise JobDeclarationError(f"{fn}: after must be {form}; {u!r} is none of these (declare a handler "
                                      "with @pgsched.job before naming it)")
    return tuple(out)


def _interval(value: object, what: str, fn: str, form: str) -> schedule.Interval:
    """An interval string or a timedelta as an Interval; anything else names `what` and `form`."""
    if not isinstance(value, str | timedelta):
        raise JobDeclarationError(f"{fn}: {what} must be {form}, not {value!r}")
    try:
        iv = schedule.parse_interval(value) if isinstance(value, str) else schedule.Interval.from_timedelta(value)
    except schedule.ScheduleError as e:
        # parse_interval speaks of a schedule; name the argument this value was given for
        raise JobDeclarationError(f"{fn}: invalid {what}: {e.message}") from None
    except OverflowError:  # digits beyond what a float holds
        raise JobDeclarationError(f"{fn}: {what} must be {form}, not {_shown(value)}") from None
    if not _holds(iv):
        raise JobDeclarationError(f"{fn}: {what} must be {form}; {_shown(value)} is longer than PostgreSQL's "
                                  "interval holds, or than the scheduler reads back")
    return iv


def _holds(iv: schedule.Interval) -> bool:
    """Whether PostgreSQL's interval holds `iv` (months and days in 32 bits, microseconds in 64) and the
    scheduler reads it back: psycopg loads an interval as a timedelta, whose days end at 999999999."""
    if not (-(2**31) <= iv.months < 2**31 and -(2**31) <= iv.days < 2**31 and -(2**63) <= iv.micros < 2**63):
        return False
    try:
        iv.approx_timedelta()
    except OverflowError:
        return False
    return True


def _duration(value: str | timedelta | None, what: str, fn: str, *, allow_none: bool) -> str | None:
    if value is None:
        if allow_none:
            return None
        raise JobDeclarationError(f"{fn}: {what} must be given")
    form = "a positive duration such as '2 minutes'"
    iv = _interval(value, what, fn, form)
    if iv.months or iv.days < 0 or iv.micros < 0 or not (iv.days or iv.micros):
        raise JobDeclarationError(f"{fn}: {what} must be {form}, not {value!r}")
    return str(iv)


def _retention(value: str | timedelta | None, what: str, fn: str) -> str | None:
    """success_retention and failure_retention: a positive duration (months allowed, as in SQL), or None."""
    if value is None:
        return None
    form = "a positive duration such as '7 days' or '12 hours', or None for the database's retention"
    iv = _interval(value, what, fn, form)
    if iv.months < 0 or iv.days < 0 or iv.micros < 0 or not (iv.months or iv.days or iv.micros):
        raise JobDeclarationError(f"{fn}: {what} must be {form}, not {value!r}")
    return str(iv)


def _fixed_duration(value: str | timedelta, what: str, fn: str, most: timedelta, form: str) -> schedule.Interval:
    """schedule_delay and jitter: a fixed duration from 0 up to `most` (no months: their length varies)."""
    iv = _interval(value, what, fn, form)
    if iv.months or iv.days < 0 or iv.micros < 0 or iv.approx_timedelta() > most:
        raise JobDeclarationError(f"{fn}: {what} must be {form}, not {value!r}")
    return iv


def _check_signature(func: Callable[..., Any], fn: str) -> None:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        raise JobDeclarationError(f"{fn}: cannot read its signature") from None
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in sig.parameters.values() if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_varargs = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(required) > 1 or (not positional and not takes_varargs) or any(p.kind is p.KEYWORD_ONLY
                                                                          for p in required):
        raise JobDeclarationError(
            f"{fn}: a job handler must take exactly one positional argument, the pgsched.Run "
            f"(def {func.__name__}(run: pgsched.Run) -> pgsched.Result | None); its signature is {sig}")


def _check_plain_function(func: Callable[..., Any], fn: str) -> None:
    """An async def handler or a generator function returns a coroutine or a generator without
    running its body: every run would fail (pgsched runs a handler as a plain call)."""
    call = getattr(func, "__call__", None)  # noqa: B004 - a callable object's method, not whether it is one
    for kind, test in (("an async def function", inspect.iscoroutinefunction),
                       ("an async generator function", inspect.isasyncgenfunction),
                       ("a generator function", inspect.isgeneratorfunction)):
        if test(func) or (call is not None and not inspect.isfunction(func) and test(call)):
            raise JobDeclarationError(
                f"{fn}: a job handler must be a plain function that returns a pgsched.Result or None; it is {kind}, "
                "whose call returns without running its body (every run would fail): write it with def and "
                "return (with asyncio.run(...) inside, for async code)")


def _bad_text(value: str) -> bool:
    """Text PostgreSQL cannot store: a NUL, or a lone surrogate (no UTF-8 for it, and JSON's
    \\udXXX escape of one is refused by jsonb)."""
    if "\x00" in value:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_texts(fn: str, **values: object) -> None:
    """Every text argument (and the names in after=) is text PostgreSQL can store: refused here, naming
    the argument, rather than by the deploy as "invalid input syntax for type json", naming neither."""
    for argument, value in values.items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and _bad_text(text):
                raise JobDeclarationError(f"{fn}: {argument} must be text without NUL characters or lone "
                                          f"surrogates (PostgreSQL cannot store them), not {_shown(text)}")


# The instants a plan may be at, as pgsched._plannable has them (sql/api/00_internal.sql): a later
# one could not be followed by the next in Python's datetime, which ends in 9999.
FIRST_PLAN = datetime(1, 1, 2, tzinfo=UTC)
PLANS_END = datetime(9999, 1, 1, tzinfo=UTC)
EVERY_FORM = "an interval such as '5 minutes' or '1 year' whose plans fall before the year 9999"


def _check_initial_start(fn: str, initial_start: datetime | None) -> None:
    if initial_start is None:
        return
    if initial_start.tzinfo is None:
        raise JobDeclarationError(f"{fn}: initial_start must be timezone-aware")
    try:
        plannable = FIRST_PLAN <= initial_start < PLANS_END
    except OverflowError:  # the year 1 or 9999 with an offset that moves it out of datetime's range
        plannable = False
    if not plannable:
        raise JobDeclarationError(f"{fn}: initial_start must be a finite time from the year 1 to 9998 "
                                  f"(from {FIRST_PLAN.isoformat()}, before {PLANS_END.isoformat()}), "
                                  f"not {initial_start.isoformat()}")


def _check_next_plan(fn: str, every: object, iv: schedule.Interval, initial_start: datetime | None) -> None:
    """The first plan after the start (initial_start, or now) falls before the year 9999, as the deploy
    checks it (pgsched._check_settings; it adds in the deploy's session time zone, UTC here)."""
    start = initial_start or datetime.now(UTC)
    try:
        later = _holds(iv) and schedule.add_interval(start, iv, schedule.zone(None)) < PLANS_END
    except (OverflowError, ValueError):  # past datetime's year 9999
        later = False
    if not later:
        raise JobDeclarationError(f"{fn}: every must be {EVERY_FORM}; from {start.date().isoformat()} the next "
                                  f"plan of {_shown(every)} would fall after the year 9998")


def _check_config(fn: str, config: object) -> None:
    """config as jsonb stores it: JSON without NaN or infinities, text keys, text PostgreSQL holds."""
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise JobDeclarationError(f"{fn}: config must be JSON-serialisable (without NaN or infinities): "
                                  f"{text_of(e)}") from None
    problem = _json_problem(config, "config")
    if problem is not None:
        raise JobDeclarationError(f"{fn}: config must be JSON that PostgreSQL's jsonb can store: {problem}")


def _json_problem(value: object, where: str) -> str | None:
    """What jsonb would refuse or change in JSON that json.dumps wrote, or None. (A key that is not
    text would be written as text silently: {1: 'a'} stored as {"1": "a"}, read back otherwise.)"""
    if isinstance(value, str):
        return f"{where} has a NUL character or a lone surrogate" if _bad_text(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return (f"the key {_shown(key)} in {where} is not text (a JSON object's keys are text: "
                        f"write {str(key)!r} if that is meant)")
            if _bad_text(key):
                return f"the key {_shown(key)} in {where} has a NUL character or a lone surrogate"
            if (problem := _json_problem(item, f"{where}[{key!r}]")) is not None:
                return problem
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (problem := _json_problem(item, f"{where}[{i}]")) is not None:
                return problem
    return None


# What add_job refuses for job_name (sql/api/10_jobs.sql, _check_settings), said at import instead.
MAX_JOB_NAME = 500


def _check_types(fn: str, *, every: object, cron: object, name: object, timezone: object, max_retries: object,
                 scheduled: object, fixed_schedule: object, initial_start: object) -> None:
    """The declaration's arguments of the wrong kind, refused where they are written (an int for
    every= would otherwise fail later, as an AttributeError or at deploy)."""
    wrong = [
        ("every", every, every is not None and not isinstance(every, (str, timedelta)),
         "an interval such as '5 minutes' or a timedelta"),
        ("cron", cron, cron is not None and not isinstance(cron, str), "a cron expression such as '0 3 * * *'"),
        ("name", name, name is not None and (not isinstance(name, str) or not name.strip()
                                             or len(name) > MAX_JOB_NAME),
         f"a name of 1 to {MAX_JOB_NAME} characters, or None for module.function"),
        ("timezone", timezone, timezone is not None and (not isinstance(timezone, str) or not timezone.strip()),
         "an IANA name such as 'Europe/Berlin', or None for UTC"),
        ("max_retries", max_retries, isinstance(max_retries, bool) or not isinstance(max_retries, int),
         "-1 (unlimited) or a whole number >= 0"),
        ("scheduled", scheduled, not isinstance(scheduled, bool), "True or False"),
        ("fixed_schedule", fixed_schedule, not isinstance(fixed_schedule, bool), "True or False"),
        ("initial_start", initial_start, initial_start is not None and not isinstance(initial_start, datetime),
         "a timezone-aware datetime, or None"),
    ]
    for argument, value, bad, form in wrong:
        if bad:
            raise JobDeclarationError(f"{fn}: {argument} must be {form}, not {repr(value)[:80]}")


def job(
    *,
    every: str | timedelta | None = None,
    cron: str | None = None,
    name: str | None = None,
    timezone: str | None = None,
    fixed_schedule: bool = True,
    initial_start: datetime | None = None,
    max_runtime: str | timedelta | None = None,
    max_retries: int = -1,
    retry_period: str | timedelta = "5 minutes",
    catch_up: str = "latest",
    config: Any = None,
    scheduled: bool = True,
    catch_up_window: str | timedelta | None = None,
    max_plans_per_tick: int = 100,
    schedule_delay: str | timedelta = NO_DELAY,
    allow_stale_reentry: bool = False,
    scope_query: str | None = None,
    database: str | None = None,
    priority: int = 0,
    exclude: str | None = None,
    jitter: str | timedelta = NO_DELAY,
    concurrency_key: str | None = None,
    after: Sequence[str | int | Callable[..., Any]] | None = None,
    history: str = "all",
    success_retention: str | timedelta | None = None,
    failure_retention: str | timedelta | None = None,
) -> Callable[[F], F]:
    """Declare a function as a scheduled job: `every=` an interval or `cron=` an expression, or
    `after=` the jobs it runs after (their names, ids, or handlers declared with @pgsched.job).

    The other settings are those of add_job. The job's name is the function's
    qualified name (module.function) unless `name=` is given; it must be stable.
    With `scope_query=` (a SQL query returning keys) each plan runs once per key,
    which the handler finds in `run.scope`; the deploy checks that the query plans.
    With `database=` the run's session opens in that database of the same server.
    `priority=` (seconds of precedence among due jobs) orders the claim when workers are short.
    `exclude=` (a 5-field cron expression) names minutes in which a planned start is skipped.
    `jitter=` delays each planned start by a pseudo-random amount below it, the same on every instance.
    `concurrency_key=` limits how many runs of the jobs sharing it run at once, over every instance.
    `after=` without a schedule: the job runs once each time all of those jobs have succeeded since its
    last run; with one, its planned runs are skipped until they have (README "Dependencies").
    `history=` 'all', 'failures' or 'none': which of its ended runs keep a row in job_history;
    `success_retention=` and `failure_retention=` replace the database's retention for its runs
    (README "History and retention").
    """

    def declare(func: F) -> F:
        fn = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
        _check_signature(func, fn)
        _check_plain_function(func, fn)
        _check_types(fn, every=every, cron=cron, name=name, timezone=timezone, max_retries=max_retries,
                     scheduled=scheduled, fixed_schedule=fixed_schedule, initial_start=initial_start)
        _check_texts(fn, every=every, cron=cron, name=name, timezone=timezone, max_runtime=max_runtime,
                     retry_period=retry_period, catch_up=catch_up, catch_up_window=catch_up_window,
                     schedule_delay=schedule_delay, scope_query=scope_query, database=database, exclude=exclude,
                     jitter=jitter, concurrency_key=concurrency_key, history=history,
                     success_retention=success_retention, failure_retention=failure_retention,
                     after=list(after) if isinstance(after, list | tuple) else None)
        _check_initial_start(fn, initial_start)
        upstreams = _upstreams(after, fn)
        if (every is not None and cron is not None) or (every is None and cron is None and upstreams is None):
            raise JobDeclarationError(f"{fn}: give exactly one of every= (an interval) or cron= (an expression), "
                                      "or after= (the jobs it runs after)")
        try:
            tz = schedule.zone(timezone)
            if every is None and cron is None:
                text = schedule.AFTER
            elif cron is not None:
                parsed = schedule.parse_cron(cron)
                text = parsed.expr
            else:
                iv = schedule.parse_interval(every) if isinstance(every, str) else \
                    schedule.Interval.from_timedelta(every or timedelta(0))
                schedule.check_new_interval(iv, fixed=fixed_schedule, argument="every")
                _check_next_plan(fn, every, iv, initial_start)
                text = str(iv)
        except schedule.ScheduleError as e:
            raise JobDeclarationError(f"{fn}: {e}") from None
        except OverflowError:  # digits beyond what a float holds ('1e400 years' spelt out)
            raise JobDeclarationError(f"{fn}: every must be {EVERY_FORM}, not {_shown(every)}") from None
        del tz
        if not -1 <= max_retries <= _MAX_INT4:
            raise JobDeclarationError(f"{fn}: max_retries must be -1 (unlimited) or a whole number from 0 to "
                                      f"{_MAX_INT4}, not {max_retries!r}")
        if catch_up not in ("latest", "all", "none"):
            raise JobDeclarationError(f"{fn}: catch_up must be 'latest', 'all' or 'none', not {catch_up!r}")
        if isinstance(max_plans_per_tick, bool) or not isinstance(max_plans_per_tick, int) \
                or not 1 <= max_plans_per_tick <= _MAX_INT4:
            raise JobDeclarationError(
                f"{fn}: max_plans_per_tick must be a whole number from 1 to {_MAX_INT4}, not {max_plans_per_tick!r}")
        if not isinstance(allow_stale_reentry, bool):
            raise JobDeclarationError(f"{fn}: allow_stale_reentry must be True or False, not {allow_stale_reentry!r}")
        delay = _fixed_duration(schedule_delay, "schedule_delay", fn, MAX_SCHEDULE_DELAY,
                                "a duration from 0 up to 365 days such as '90 seconds' or '2 hours' "
                                "(no months or years)")
        spread = _fixed_duration(jitter, "jitter", fn, MAX_JITTER,
                                 "a duration from 0 up to 1 day such as '30 seconds' (no months or years)")
        if scope_query is not None and (not isinstance(scope_query, str) or not scope_query.strip()
                                        or len(scope_query) > MAX_SCOPE_QUERY):
            shown = scope_query[:80] if isinstance(scope_query, str) else scope_query
            raise JobDeclarationError(
                f"{fn}: scope_query must be one SQL query of at most {MAX_SCOPE_QUERY} characters returning the "
                f"scope keys in its first column (such as 'SELECT region FROM regions'), or None for a job that "
                f"is not scoped, not {shown!r}")
        window = _duration(catch_up_window, "catch_up_window", fn, allow_none=True)
        if database is not None and (not isinstance(database, str) or not database.strip()):
            raise JobDeclarationError(f"{fn}: database must be the name of a database, or None for the "
                                      f"scheduler's own, not {database!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise JobDeclarationError(f"{fn}: priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} "
                                      f"(seconds of precedence among due jobs), not {priority!r}")
        if concurrency_key is not None and (not isinstance(concurrency_key, str) or not concurrency_key.strip()
                                            or len(concurrency_key) > MAX_CONCURRENCY_KEY):
            raise JobDeclarationError(
                f"{fn}: concurrency_key must be a name of 1 to {MAX_CONCURRENCY_KEY} characters such as 'heavy', "
                f"or None, not {concurrency_key!r}")
        if exclude is not None and not isinstance(exclude, str):
            raise JobDeclarationError(f"{fn}: exclude must be {exclusion.FORM}, or None, not {exclude!r}")
        if exclude is not None:
            try:
                excluded_minutes = exclusion.parse(exclude)
                if cron is not None:  # as SQL's _check_settings, which the declaration reaches at sync
                    exclusion.check_pair(schedule.parse_cron(cron), excluded_minutes)
            except schedule.ScheduleError as e:
                raise JobDeclarationError(f"{fn}: {e}") from None
        if history not in HISTORY_LEVELS:
            raise JobDeclarationError(f"{fn}: history must be one of {', '.join(map(repr, HISTORY_LEVELS))} "
                                      f"(which ended runs keep a row in job_history), not {history!r}")
        keep_ok = _retention(success_retention, "success_retention", fn)
        keep_failed = _retention(failure_retention, "failure_retention", fn)
        _check_config(fn, config)
        job_name = name or fn
        if not job_name.strip():
            raise JobDeclarationError(f"{fn}: name must not be empty")
        existing = REGISTRY.get(job_name)
        module, function = getattr(func, "__module__", "?"), getattr(func, "__qualname__", "?")
        if existing is not None and (existing.module, existing.function) != (module, function):
            raise JobDeclarationError(
                f"{fn}: job name {job_name!r} is already used by {existing.module}.{existing.function}")
        REGISTRY[job_name] = JobSpec(
            name=job_name, module=module, function=function, handler=func, schedule=text,
            fixed_schedule=fixed_schedule, timezone=timezone, initial_start=initial_start,
            max_runtime=_duration(max_runtime, "max_runtime", fn, allow_none=True),
            max_retries=max_retries,
            retry_period=_duration(retry_period, "retry_period", fn, allow_none=False) or "",
            catch_up=catch_up, config=config, scheduled=scheduled,
            catch_up_window=window, max_plans_per_tick=max_plans_per_tick, schedule_delay=str(delay),
            allow_stale_reentry=allow_stale_reentry, scope_query=scope_query, database=database,
            priority=priority, exclude=" ".join(exclude.split()) if exclude else None, jitter=str(spread),
            concurrency_key=concurrency_key, depends_on=upstreams, history=history,
            success_retention=keep_ok, failure_retention=keep_failed,
        )
        return func

    return declare
