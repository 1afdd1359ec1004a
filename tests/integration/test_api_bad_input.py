"""Every API entry point rejects bad input with a fitting SQLSTATE, a message naming the
argument, and no write at all (the catalog tables are compared before and after)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest

from tests.integration.helpers import Conn, add_job, scalar, snapshot

# The job every case may refer to as 1000 (ids start there), named 'existing', with a
# check_config so that config changes are checked.
EXISTING = """'ok_fn', '1 hour', config => '{}', check_config => 'check_ok', job_name => 'existing'"""


@dataclass(frozen=True)
class Bad:
    id: str
    statement: str
    sqlstate: str
    names: str  # what the message must contain: the argument (or the offending name)


CRON_CASES = [
    ("61 * * * *", "minute"), ("* 24 * * *", "hour"), ("0 0 32 * *", "day-of-month"), ("0 0 * 13 *", "month"),
    ("0 0 * * 8", "day-of-week"), ("60 * * * * *", "second"), ("0 0 0 1 1 * 1969", "year"),
    ("5-1 * * * *", "reversed"), ("*/0 * * * *", "step 0"), ("1,,2 * * * *", "empty"),
    ("*/5 * * * * junk", "schedule"), ("* * * *", "schedule"), ("* * * * * * * *", "schedule"),
    ("*-5 * * * *", "schedule"), ("0 0 L-x * *", "schedule"),
    # pg_cron refuses these too (issue 19): a step above the field's largest value
    ("*/60 10 * * *", "step 60 in the minute field is larger than its largest value 59"),
    ("*/5000000000 10 * * *", "step 5000000000 in the minute field"), ("0 0 */32 * *", "day-of-month"),
    ("0 0 * * 1/8", "step 8 in the day-of-week field"),
]

CASES: list[Bad] = [
    # add_job: proc and check_config
    Bad("unknown proc", "SELECT add_job('no_such_fn', '5 minutes')", "42883", "no_such_fn"),
    Bad("wrong proc arity", "SELECT add_job('wrong_sig', '5 minutes')", "42883", "proc"),
    Bad("wrong proc types", "SELECT add_job('wrong_types', '5 minutes')", "42883", "proc"),
    Bad("NULL proc", "SELECT pgsched.add_job(NULL, '5 minutes')", "22004", "proc"),
    Bad("unknown check_config", "SELECT add_job('ok_fn', '5 minutes', check_config => 'nope_check')", "42883",
        "nope_check"),
    Bad("wrong check_config", "SELECT add_job('ok_fn', '5 minutes', check_config => 'check_wrong')", "42883",
        "check_config"),
    Bad("failing check_config", "SELECT add_job('ok_fn', '5 minutes', config => '{\"bad\": 1}', "
        "check_config => 'check_ok')", "PC001", "config rejected by check_ok"),
    Bad("failing check_config procedure", "SELECT add_job('ok_fn', '5 minutes', config => '{\"bad\": 1}', "
        "check_config => 'check_proc')", "PC002", "config rejected by check_proc"),
    # add_job: schedule
    Bad("NULL schedule", "SELECT add_job('ok_fn', NULL)", "22004", "schedule"),
    Bad("NULL schedule_interval", "SELECT add_job('ok_fn', NULL::interval)", "22004", "schedule_interval"),
    Bad("NULL named schedule_interval", "SELECT add_job('ok_fn', schedule_interval => NULL)", "22004",
        "schedule_interval"),
    Bad("zero interval", "SELECT add_job('ok_fn', '0 minutes')", "22023", "schedule"),
    Bad("zero interval typed", "SELECT add_job('ok_fn', interval '0')", "22023", "schedule_interval"),
    Bad("negative interval", "SELECT add_job('ok_fn', '-5 minutes')", "22023", "schedule"),
    Bad("negative interval typed", "SELECT add_job('ok_fn', interval '-1 hour')", "22023", "schedule_interval"),
    Bad("partly negative interval", "SELECT add_job('ok_fn', '1 day -1 hour')", "22023", "schedule"),
    Bad("not a schedule", "SELECT add_job('ok_fn', 'every tuesday')", "22023", "schedule"),
    Bad("interval under 1 ms", "SELECT add_job('ok_fn', '1 microsecond')", "22023",
        "invalid schedule: 00:00:00.000001 is shorter than 1 millisecond"),
    Bad("interval under 1 ms typed", "SELECT add_job('ok_fn', interval '0.5 milliseconds')", "22023",
        "invalid schedule_interval: 00:00:00.0005 is shorter than 1 millisecond"),
    Bad("schedule interval under 1 ms", "SELECT schedule('j', '999 us', 'SELECT 1')", "22023",
        "shorter than 1 millisecond"),
    # Words cron does not know, in what is otherwise a cron expression: the field is named.
    Bad("cron month name", "SELECT add_job('ok_fn', '0 0 1 JANUARY *')", "22023",
        "field 'month' has bad value 'JANUARY'"),
    Bad("cron day name", "SELECT add_job('ok_fn', '0 0 * * MONDAY')", "22023",
        "field 'day-of-week' has bad value 'MONDAY'"),
    Bad("cron with seconds day name", "SELECT add_job('ok_fn', '0 0 0 * * Sunday')", "22023",
        "field 'day-of-week' has bad value 'SUNDAY'"),
    # PostgreSQL's interval input would read these as 50 seconds / 1 hour (pg_cron refuses them)
    Bad("junk after an interval", "SELECT add_job('ok_fn', '50 seconds c')", "22023",
        "'c' after '50 seconds' is not a number with a unit"),
    Bad("unknown word in an interval", "SELECT add_job('ok_fn', '1 hour ago')", "22023", "'ago' after '1 hour'"),
    Bad("unit glued to junk", "SELECT add_job('ok_fn', '5 secondc')", "22023", "schedule"),
    Bad("schedule junk after interval", "SELECT schedule('j', '50 seconds c', 'SELECT 1')", "22023",
        "'c' after '50 seconds'"),
    Bad("empty schedule", "SELECT add_job('ok_fn', '')", "22023", "schedule"),
    Bad("mixed month day fixed", "SELECT add_job('ok_fn', '1 month 1 day')", "22023", "schedule"),
    Bad("mixed month time fixed typed", "SELECT add_job('ok_fn', interval '1 month 2 hours')", "22023",
        "schedule_interval"),
    *[Bad(f"cron {expr!r}", f"SELECT add_job('ok_fn', '{expr}')", "22023", word) for expr, word in CRON_CASES],
    # add_job: other settings
    Bad("unknown timezone", "SELECT add_job('ok_fn', '5 minutes', timezone => 'Mars/Olympus')", "22023",
        "timezone"),
    Bad("negative max_runtime", "SELECT add_job('ok_fn', '5 minutes', max_runtime => '-1 minute')", "22023",
        "max_runtime"),
    Bad("zero max_runtime", "SELECT add_job('ok_fn', '5 minutes', max_runtime => '0')", "22023", "max_runtime"),
    Bad("max_retries below -1", "SELECT add_job('ok_fn', '5 minutes', max_retries => -2)", "22023",
        "max_retries"),
    Bad("zero retry_period", "SELECT add_job('ok_fn', '5 minutes', retry_period => '0')", "22023",
        "retry_period"),
    Bad("bad catch_up", "SELECT add_job('ok_fn', '5 minutes', catch_up => 'sometimes')", "22023", "catch_up"),
    Bad("NULL catch_up", "SELECT add_job('ok_fn', '5 minutes', catch_up => NULL)", "22004", "catch_up"),
    Bad("NULL max_retries", "SELECT add_job('ok_fn', '5 minutes', max_retries => NULL)", "22004", "max_retries"),
    Bad("NULL retry_period", "SELECT add_job('ok_fn', '5 minutes', retry_period => NULL)", "22004",
        "retry_period"),
    Bad("NULL scheduled", "SELECT add_job('ok_fn', '5 minutes', scheduled => NULL)", "22004", "scheduled"),
    Bad("NULL fixed_schedule", "SELECT add_job('ok_fn', '5 minutes', fixed_schedule => NULL)", "22004",
        "fixed_schedule"),
    Bad("empty job_name", "SELECT add_job('ok_fn', '5 minutes', job_name => ' ')", "22023", "job_name"),
    Bad("NULL if_not_exists", "SELECT add_job('ok_fn', '5 minutes', job_name => 'existing', if_not_exists => NULL)",
        "22004", "invalid if_not_exists: NULL"),
    Bad("empty database", "SELECT add_job('ok_fn', '5 minutes', database => '')", "22023", "invalid database: empty"),
    Bad("duplicate job_name", "SELECT add_job('ok_fn', '5 minutes', job_name => 'existing')", "42710",
        "job_name"),
    # add_job: the lease and catch-up settings (migration 0004)
    Bad("zero catch_up_window", "SELECT add_job('ok_fn', '5 minutes', catch_up_window => '0')", "22023",
        "catch_up_window"),
    Bad("negative catch_up_window", "SELECT add_job('ok_fn', '5 minutes', catch_up_window => '-1 hour')", "22023",
        "catch_up_window"),
    Bad("zero max_plans_per_tick", "SELECT add_job('ok_fn', '5 minutes', max_plans_per_tick => 0)", "22023",
        "max_plans_per_tick"),
    Bad("negative max_plans_per_tick", "SELECT add_job('ok_fn', '5 minutes', max_plans_per_tick => -3)", "22023",
        "max_plans_per_tick"),
    Bad("NULL max_plans_per_tick", "SELECT add_job('ok_fn', '5 minutes', max_plans_per_tick => NULL)", "22004",
        "max_plans_per_tick"),
    Bad("NULL schedule_delay", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => NULL)", "22004",
        "schedule_delay"),
    Bad("negative schedule_delay", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '-1 second')", "22023",
        "schedule_delay"),
    Bad("partly negative schedule_delay", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '1 day -25 hours')",
        "22023", "schedule_delay"),
    Bad("schedule_delay in months", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '1 month')", "22023",
        "schedule_delay"),
    Bad("schedule_delay in years", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '1 year')", "22023",
        "schedule_delay"),
    Bad("schedule_delay over 365 days", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '365 days 1 second')",
        "22023", "schedule_delay"),
    Bad("huge schedule_delay", "SELECT add_job('ok_fn', '5 minutes', schedule_delay => '100000000 hours')", "22023",
        "schedule_delay"),
    Bad("NULL allow_stale_reentry", "SELECT add_job('ok_fn', '5 minutes', allow_stale_reentry => NULL)", "22004",
        "allow_stale_reentry"),
    Bad("typed zero max_plans_per_tick", "SELECT add_job('ok_fn', interval '1 hour', max_plans_per_tick => 0)",
        "22023", "max_plans_per_tick"),
    Bad("typed negative schedule_delay", "SELECT pgsched.add_job('ok_fn', schedule_interval => '1 hour', "
        "schedule_delay => '-5 minutes')", "22023", "schedule_delay"),
    Bad("typed zero catch_up_window", "SELECT add_job('ok_fn', interval '1 hour', catch_up_window => '0')", "22023",
        "catch_up_window"),
    Bad("typed NULL allow_stale_reentry", "SELECT add_job('ok_fn', interval '1 hour', allow_stale_reentry => NULL)",
        "22004", "allow_stale_reentry"),
    # add_job: scope_query (migration 0005), planned as SELECT s.* FROM (<query>) AS s, never run
    Bad("empty scope_query", "SELECT add_job('ok_fn', '5 minutes', scope_query => '')", "22023", "scope_query"),
    Bad("blank scope_query", "SELECT add_job('ok_fn', '5 minutes', scope_query => E' \\n\\t ')", "22023",
        "scope_query"),
    Bad("scope_query too long", "SELECT add_job('ok_fn', '5 minutes', scope_query => "
        "'SELECT ''' || repeat('x', 9992) || '''')", "22023", "scope_query"),
    Bad("scope_query syntax error", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'SELECT job_id FROM')",
        "22023", "scope_query"),
    Bad("scope_query of no column", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'SELECT')", "22023",
        "invalid scope_query: it returns no column"),
    Bad("scope_query of no column from a table", "SELECT add_job('ok_fn', '5 minutes', "
        "scope_query => 'SELECT FROM pgsched.job')", "22023", "invalid scope_query: it returns no column"),
    Bad("scope_query unknown table", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'SELECT k FROM nope')",
        "22023", "scope_query"),
    Bad("scope_query unknown column", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'SELECT nope FROM ran')",
        "22023", "scope_query"),
    Bad("scope_query two statements", "SELECT add_job('ok_fn', '5 minutes', scope_query => "
        "'SELECT 1; DROP TABLE ran')", "22023", "scope_query"),
    Bad("scope_query escaping its parentheses", "SELECT add_job('ok_fn', '5 minutes', scope_query => "
        "'SELECT 1) AS s; DROP TABLE ran; SELECT * FROM (SELECT 1')", "22023", "scope_query"),
    Bad("scope_query trailing semicolon", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'TABLE ran;')",
        "22023", "scope_query"),
    Bad("scope_query a command", "SELECT add_job('ok_fn', '5 minutes', scope_query => 'DELETE FROM ran')", "22023",
        "scope_query"),
    Bad("scope_query writing CTE", "SELECT add_job('ok_fn', '5 minutes', scope_query => "
        "'WITH d AS (DELETE FROM ran RETURNING job_id) SELECT job_id FROM d')", "22023", "scope_query"),
    Bad("typed scope_query unknown table", "SELECT add_job('ok_fn', interval '1 hour', scope_query => 'TABLE nope')",
        "22023", "scope_query"),
    Bad("typed blank scope_query", "SELECT pgsched.add_job('ok_fn', schedule_interval => '1 hour', "
        "scope_query => ' ')", "22023", "scope_query"),
    Bad("scope_query with a bad schedule", "SELECT add_job('ok_fn', '0 minutes', scope_query => 'TABLE ran')",
        "22023", "schedule"),
    # alter_job
    Bad("alter missing job", "SELECT * FROM alter_job(999, max_retries => 1)", "42704", "999"),
    Bad("alter NULL job", "SELECT * FROM alter_job(NULL, max_retries => 1)", "22004", "job_id"),
    Bad("alter bad schedule", "SELECT * FROM alter_job(1000, schedule => '61 * * * *')", "22023", "schedule"),
    Bad("alter zero interval", "SELECT * FROM alter_job(1000, interval '0')", "22023", "schedule"),
    Bad("alter negative interval", "SELECT * FROM alter_job(1000, interval '-1 hour')", "22023",
        "invalid schedule_interval: -01:00:00 is not positive"),
    Bad("alter interval under 1 ms", "SELECT * FROM alter_job(1000, interval '1 microsecond')", "22023",
        "invalid schedule_interval: 00:00:00.000001 is shorter than 1 millisecond"),
    Bad("alter schedule under 1 ms", "SELECT * FROM alter_job(1000, schedule => '100 us')", "22023",
        "invalid schedule: 00:00:00.0001 is shorter than 1 millisecond"),
    Bad("alter schedule and interval", "SELECT * FROM alter_job(1000, interval '1 hour', schedule => '1 day')",
        "22023", "schedule"),
    Bad("alter mixed interval", "SELECT * FROM alter_job(1000, schedule => '1 month 1 day')", "22023",
        "schedule"),
    Bad("alter fixed on mixed", "SELECT * FROM alter_job(1000, schedule => '1 month 1 day', "
        "fixed_schedule => true)", "22023", "schedule"),
    Bad("alter unknown timezone", "SELECT * FROM alter_job(1000, timezone => 'Nowhere/Land')", "22023",
        "timezone"),
    Bad("alter negative max_runtime", "SELECT * FROM alter_job(1000, max_runtime => '-1 second')", "22023",
        "max_runtime"),
    Bad("alter max_retries", "SELECT * FROM alter_job(1000, max_retries => -5)", "22023", "max_retries"),
    Bad("alter retry_period", "SELECT * FROM alter_job(1000, retry_period => '-1 second')", "22023",
        "retry_period"),
    Bad("alter catch_up", "SELECT * FROM alter_job(1000, catch_up => 'never')", "22023", "catch_up"),
    Bad("alter config_merge", "SELECT * FROM alter_job(1000, config_merge => '[1]')", "22023", "config_merge"),
    Bad("alter failing check", "SELECT * FROM alter_job(1000, config => '{\"bad\": 1}')", "PC001",
        "config rejected"),
    Bad("alter failing check merge", "SELECT * FROM alter_job(1000, config_merge => '{\"bad\": 1}')", "PC001",
        "config rejected"),
    Bad("alter new failing check", "SELECT * FROM alter_job(1000, config => '{\"bad\": 1}', "
        "check_config => 'check_proc')", "PC002", "config rejected"),
    Bad("alter wrong check", "SELECT * FROM alter_job(1000, check_config => 'check_wrong')", "42883",
        "check_config"),
    Bad("alter empty job_name", "SELECT * FROM alter_job(1000, job_name => '')", "22023", "job_name"),
    Bad("alter negative catch_up_window", "SELECT * FROM alter_job(1000, catch_up_window => '-1 minute')", "22023",
        "catch_up_window"),
    Bad("alter negative schedule_delay with a window", "SELECT * FROM alter_job(1000, catch_up_window => '1 hour', "
        "schedule_delay => '-2 hours')", "22023", "schedule_delay"),
    Bad("alter zero max_plans_per_tick", "SELECT * FROM alter_job(1000, max_plans_per_tick => 0)", "22023",
        "max_plans_per_tick"),
    Bad("alter negative schedule_delay", "SELECT * FROM alter_job(1000, schedule_delay => '-1 minute')", "22023",
        "schedule_delay"),
    Bad("alter schedule_delay in months", "SELECT * FROM alter_job(1000, schedule_delay => '2 mons')", "22023",
        "schedule_delay"),
    Bad("alter schedule_delay over 365 days", "SELECT * FROM alter_job(1000, schedule_delay => '400 days')",
        "22023", "schedule_delay"),
    Bad("alter qualified negative max_plans_per_tick",
        "SELECT * FROM pgsched.alter_job(1000, max_plans_per_tick => -1)", "22023", "max_plans_per_tick"),
    Bad("alter blank scope_query", "SELECT * FROM alter_job(1000, scope_query => '   ')", "22023", "scope_query"),
    Bad("alter scope_query too long",
        "SELECT * FROM alter_job(1000, scope_query => repeat(' ', 10001) || 'TABLE ran')", "22023", "scope_query"),
    Bad("alter scope_query syntax error", "SELECT * FROM alter_job(1000, scope_query => 'SELECT 1 FROM')", "22023",
        "scope_query"),
    Bad("alter scope_query unknown table", "SELECT * FROM alter_job(1000, scope_query => 'SELECT k FROM nope')",
        "22023", "scope_query"),
    Bad("alter scope_query two statements", "SELECT * FROM pgsched.alter_job(1000, scope_query => "
        "'SELECT 1; DELETE FROM ran')", "22023", "scope_query"),
    Bad("alter scope_query with other changes", "SELECT * FROM alter_job(1000, max_retries => 3, "
        "scope_query => 'SELECT nope FROM ran')", "22023", "scope_query"),
    # delete_job, run_job, schedule, unschedule
    Bad("delete missing job", "SELECT delete_job(999)", "42704", "999"),
    Bad("delete NULL job", "SELECT delete_job(NULL)", "22004", "job_id"),
    Bad("run missing job", "CALL pgsched.run_job(999)", "42704", "999"),
    Bad("run missing job unqualified", "CALL run_job(999)", "42704", "999"),
    Bad("run NULL job", "CALL pgsched.run_job(NULL)", "22004", "job_id"),
    Bad("schedule bad cron", "SELECT schedule('n', '61 * * * *', 'SELECT 1')", "22023", "schedule"),
    Bad("schedule NULL schedule", "SELECT schedule('n', NULL, 'SELECT 1')", "22004", "schedule"),
    Bad("schedule NULL command", "SELECT schedule('n', '1 day', NULL)", "22004", "command"),
    Bad("schedule empty command", "SELECT schedule('n', '1 day', ' ')", "22023", "command"),
    Bad("schedule unnamed bad", "SELECT schedule('1 month 1 day', 'SELECT 1')", "22023", "schedule"),
    Bad("schedule NULL name", "SELECT schedule(NULL, '1 day', 'SELECT 1')", "22004", "job_name"),
    Bad("reschedule bad cron", "SELECT schedule('existing', '* * * * * * * *', 'SELECT 1')", "22023",
        "schedule"),
    Bad("reschedule NULL command", "SELECT schedule('existing', '1 day', NULL)", "22004", "command"),
    Bad("unschedule missing name", "SELECT unschedule('nobody')", "42704", "nobody"),
    Bad("unschedule missing id", "SELECT unschedule(999)", "42704", "999"),
    Bad("unschedule huge id", "SELECT unschedule(99999999999)", "42704", "99999999999"),
    Bad("unschedule NULL id", "SELECT unschedule(NULL::bigint)", "22004", "job_id"),
    Bad("unschedule NULL name", "SELECT unschedule(NULL::text)", "22004", "job_name"),
    # times a plan cannot be computed with: not finite, or beyond Python's datetime
    Bad("initial_start infinity", "SELECT add_job('ok_fn', '1 hour', initial_start => 'infinity')", "22023",
        "initial_start"),
    Bad("initial_start -infinity", "SELECT add_job('ok_fn', '1 hour', initial_start => '-infinity')", "22023",
        "initial_start"),
    Bad("initial_start after 9999", "SELECT add_job('ok_fn', '1 hour', initial_start => '294276-12-31 00:00+00')",
        "22023", "initial_start"),
    Bad("interval beyond 9999", "SELECT add_job('ok_fn', '178000000 years')", "22023", "schedule"),
    Bad("interval beyond 9999, not fixed", "SELECT add_job('ok_fn', '100000 years', fixed_schedule => false)",
        "22023", "schedule"),
    Bad("alter interval beyond 9999", "SELECT * FROM alter_job(1000, schedule_interval => '8000 years')", "22023",
        "schedule"),
    Bad("alter initial_start infinity", "SELECT * FROM alter_job(1000, initial_start => 'infinity')", "22023",
        "initial_start"),
    Bad("alter next_start infinity", "SELECT * FROM alter_job(1000, next_start => 'infinity')", "22023",
        "next_start"),
    Bad("alter next_start -infinity", "SELECT * FROM alter_job(1000, next_start => '-infinity')", "22023",
        "next_start"),
    Bad("alter next_start after 9999", "SELECT * FROM alter_job(1000, next_start => '294276-12-31 00:00+00')",
        "22023", "next_start"),
]


@pytest.fixture(scope="module")
def existing(module_api: Conn) -> Conn:
    assert add_job(module_api, EXISTING) == 1000
    return module_api


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_rejected_and_writes_nothing(existing: Conn, case: Bad) -> None:
    before = snapshot(existing)
    with pytest.raises(psycopg.Error) as e:
        existing.execute(case.statement)
    diag = e.value.diag
    assert (e.value.sqlstate, case.names in (diag.message_primary or "")) == (case.sqlstate, True), \
        (diag.message_primary, diag.message_hint)
    if e.value.sqlstate in ("22023", "22004"):
        # our own argument errors also say what is accepted
        assert diag.message_hint, diag.message_primary
    assert snapshot(existing) == before


@pytest.mark.parametrize("expr", ["*/5 * * * *", "0 */5 * * * *", "0 0 12 * * * 2099", "0 0 L * *",
                                  "0 9 * * MON-FRI", "0 0 1 JAN,JUL *", "@daily", "0 0 * * 5L",
                                  "0 0 * * 1#2", "15,45 8-18/2 * * *"])
def test_good_cron_is_accepted(api: Conn, expr: str) -> None:
    job_id = add_job(api, "'ok_fn', %s", (expr,))
    assert job_id == 1000


def test_config_merge_into_a_config_that_is_not_an_object_is_refused(api: Conn) -> None:
    """jsonb's || would make an array of the two: [1, 2, {"a": 1}]."""
    job = add_job(api, "'ok_fn', '1 hour', config => '[1, 2]'")
    before = snapshot(api)
    with pytest.raises(psycopg.Error) as e:
        api.execute("SELECT * FROM alter_job(%s, config_merge => '{\"a\": 1}')", (job,))
    assert e.value.sqlstate == "22023" and "config_merge" in (e.value.diag.message_primary or "")
    assert e.value.diag.message_hint
    assert snapshot(api) == before


def test_the_decorators_job_name_limit_is_add_jobs(api: Conn) -> None:
    """pgsched.app.MAX_JOB_NAME says at import what add_job refuses at deploy: one limit."""
    from pgsched import app

    add_job(api, f"'ok_fn', '1 hour', job_name => '{'n' * app.MAX_JOB_NAME}'")
    with pytest.raises(psycopg.Error) as e:
        add_job(api, f"'ok_fn', '1 hour', job_name => '{'n' * (app.MAX_JOB_NAME + 1)}'")
    assert e.value.sqlstate == "22023" and f"at most {app.MAX_JOB_NAME} characters" in (e.value.diag.message_hint or "")


def test_a_job_stored_with_a_period_under_1_ms_may_still_be_paused_and_altered(api: Conn) -> None:
    """The 1 ms minimum holds a schedule given anew, not one stored before the rule: such a job
    (a direct INSERT here) may be paused or have other settings changed; a new schedule is checked."""
    job = scalar(api, "INSERT INTO pgsched.job (job_name, kind, command, schedule) "
                      "VALUES ('tiny', 'command', 'SELECT 1', '500 microseconds') RETURNING job_id")
    api.execute("SELECT * FROM alter_job(%s, scheduled => false)", (job,))
    api.execute("SELECT * FROM alter_job(%s, max_runtime => '1 minute', schedule => '500 microseconds')", (job,))
    assert scalar(api, "SELECT (NOT scheduled, max_runtime) FROM pgsched.job WHERE job_id = %s",
                  (job,)) == ("t", "00:01:00")
    for change in ("schedule => '600 us'", "schedule_interval => interval '0.6 ms'"):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="shorter than 1 millisecond"):
            api.execute(f"SELECT * FROM alter_job(%s, {change})", (job,))
    api.execute("SELECT * FROM alter_job(%s, schedule => '1 minute')", (job,))
