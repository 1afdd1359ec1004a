"""One owner for a job's state (issue 10): every write of job_stat.state passes the
database's transition table (pgsched._state_allowed, enforced by a trigger), and the
scheduler's functions report the states they wrote instead of the scheduler assuming them.

pgsched/state.py's ALLOWED is only a mirror of that table: checked here against it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgsched.state import ALLOWED, JobState
from tests.integration.helpers import Conn, add_job, one, rows, scalar, stats

STATES = [str(s) for s in JobState]
# A legal way from a new job (scheduled) to each state, written by hand.
PATH = {"scheduled": [], "starting": ["starting"], "terminating": ["starting", "terminating"],
        "disabled": ["disabled"]}


def error_of(conn: Conn, query: str, params: tuple[Any, ...] | None = None) -> psycopg.Error:
    """The error `query` raises, in a savepoint so that the test's transaction goes on."""
    with pytest.raises(psycopg.Error) as e, conn.transaction():
        conn.execute(query, params)
    return e.value


def state_of(conn: Conn, job_id: int) -> str:
    return str(scalar(conn, "SELECT state FROM pgsched.job_stat WHERE job_id = %s", (job_id,)))


def test_the_database_table_is_the_one_python_mirrors(module_api: Conn) -> None:
    found = rows(module_api, """
        SELECT f.s AS src, t.s AS dst, pgsched._state_allowed(f.s, t.s) AS ok
          FROM unnest(%(states)s::text[]) f(s), unnest(%(states)s::text[]) t(s)
        UNION ALL
        SELECT NULL, t.s, pgsched._state_allowed(NULL, t.s) FROM unnest(%(states)s::text[]) t(s)""",
                 {"states": STATES})
    assert len(found) == 20
    changes = {(r["src"], r["dst"]) for r in found if r["ok"] and r["src"] is not None and r["src"] != r["dst"]}
    assert changes == {(str(s), str(d)) for s in ALLOWED for d in ALLOWED[s]}
    # Writing the state a job already has is no transition; a new row begins scheduled or disabled.
    assert all(r["ok"] for r in found if r["src"] == r["dst"])
    assert {r["dst"] for r in found if r["src"] is None and r["ok"]} == {"scheduled", "disabled"}
    # Nothing unknown passes, not even by way of a NULL.
    assert scalar(module_api, "SELECT pgsched._state_allowed('scheduled', 'running')") is False
    assert scalar(module_api, "SELECT pgsched._state_allowed('scheduled', NULL)") is False


@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in STATES for d in STATES])
def test_a_write_of_the_state_by_hand_passes_only_the_table(api_tx: Conn, src: str, dst: str) -> None:
    job_id = add_job(api_tx, "'ok_fn', '1 hour'")
    for step in PATH[src]:
        api_tx.execute("UPDATE pgsched.job_stat SET state = %s WHERE job_id = %s", (step, job_id))
    assert state_of(api_tx, job_id) == src
    if src == dst or JobState(dst) in ALLOWED[JobState(src)]:
        assert api_tx.execute("UPDATE pgsched.job_stat SET state = %s WHERE job_id = %s",
                              (dst, job_id)).rowcount == 1
        assert state_of(api_tx, job_id) == dst
        return
    e = error_of(api_tx, "UPDATE pgsched.job_stat SET state = %s WHERE job_id = %s", (dst, job_id))
    assert e.sqlstate == "55000"
    assert e.diag.message_primary == f"job {job_id} cannot go from state {src} to {dst}"
    allowed = [s for s in STATES if JobState(s) in ALLOWED[JobState(src)]]
    assert e.diag.message_detail == f"from {src} a job goes to {', '.join(allowed)}"
    assert e.diag.message_hint is not None and "alter_job" in e.diag.message_hint
    assert state_of(api_tx, job_id) == src


def test_a_job_stat_row_begins_scheduled_or_disabled(api_tx: Conn) -> None:
    job_id = add_job(api_tx, "'ok_fn', '1 hour'")
    api_tx.execute("DELETE FROM pgsched.job_stat WHERE job_id = %s", (job_id,))
    for state in ("starting", "terminating"):
        e = error_of(api_tx, "INSERT INTO pgsched.job_stat (job_id, state) VALUES (%s, %s)", (job_id, state))
        assert e.sqlstate == "55000"
        assert e.diag.message_primary == f"job {job_id} cannot begin in state {state}"
        assert e.diag.message_detail == "a job begins scheduled, disabled"
    api_tx.execute("INSERT INTO pgsched.job_stat (job_id, state) VALUES (%s, 'disabled')", (job_id,))
    assert state_of(api_tx, job_id) == "disabled"
    # add_job and a row inserted into pgsched.job by hand get theirs the same way.
    assert state_of(api_tx, add_job(api_tx, "'ok_fn', '1 hour', scheduled => false")) == "disabled"
    # A NULL state is the NOT NULL constraint's to refuse, with its own error.
    assert error_of(api_tx, "UPDATE pgsched.job_stat SET state = NULL WHERE job_id = %s",
                    (job_id,)).sqlstate == "23502"


def claim(conn: Conn, instance: int, n: int = 1) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM pgsched._claim_v2(%s, %s, %s)",
                (instance, list(range(1, n + 1)), list(range(101, 101 + n))))


def close(conn: Conn, *ends: dict[str, Any]) -> list[dict[str, Any]]:
    return rows(conn, "SELECT * FROM pgsched._close_runs(%s) ORDER BY run_id", (Jsonb(list(ends)),))


def end(run: dict[str, Any], outcome: str = "success", **more: Any) -> dict[str, Any]:
    return {"run_id": run["run_id"], "outcome": outcome, "finished_at": "now", "lease_token": run["lease_token"],
            **more}


@pytest.fixture
def instance(api_tx: Conn) -> int:
    return int(scalar(api_tx, "SELECT instance_id FROM pgsched._register_instance_v2('test', 1, 'test', 4)"))


def due(conn: Conn, args: str = "'ok_fn', '1 hour'") -> int:
    job_id = add_job(conn, args)
    conn.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 second' WHERE job_id = %s", (job_id,))
    return job_id


def test_claims_and_closes_report_the_states_they_wrote(api_tx: Conn, instance: int) -> None:
    ok, failing, paused = due(api_tx), due(api_tx), due(api_tx)
    claimed = claim(api_tx, instance, 3)
    assert sorted(c["job_id"] for c in claimed) == [ok, failing, paused]
    assert [c["job_state"] for c in claimed] == ["starting"] * 3
    by_job = {c["job_id"]: c for c in claimed}
    # A cancelled run: its job is terminating until the close.
    assert scalar(api_tx, "SELECT pgsched._set_terminating(%s)", (by_job[ok]["run_id"],)) is True
    assert state_of(api_tx, ok) == "terminating"
    api_tx.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (paused,))
    assert state_of(api_tx, paused) == "starting"  # pausing a running job waits for its run's end
    closed = close(api_tx, end(by_job[ok], "cancelled"),
                   end(by_job[failing], "failure", disable_reason="max_retries reached"), end(by_job[paused]))
    assert {(c["job_id"], c["old_state"], c["new_state"]) for c in closed} == {
        (ok, "terminating", "scheduled"), (failing, "starting", "disabled"), (paused, "starting", "disabled")}
    assert stats(api_tx, failing)["disabled_reason"] == "max_retries reached"
    # A second close of the same runs is refused and reports nothing.
    assert close(api_tx, end(by_job[ok]), end(by_job[failing])) == []


def test_release_0_1_0_reads_the_closes_as_it_did(api_tx: Conn, instance: int) -> None:
    """0.1.0 calls `SELECT pgsched._finish_runs(%s) AS id`, _disable_job and _set_terminating:
    kept with their arguments and the results it reads, beside the new _close_runs."""
    first, second = due(api_tx), due(api_tx)
    runs = claim(api_tx, instance, 2)
    ids = [int(str(r[0])) for r in api_tx.execute("SELECT pgsched._finish_runs(%s) AS id",
                                                   (Jsonb([end(r) for r in runs]),)).fetchall()]
    assert sorted(ids) == sorted(r["run_id"] for r in runs)
    assert state_of(api_tx, first) == state_of(api_tx, second) == "scheduled"
    assert scalar(api_tx, "SELECT pgsched._disable_job(%s, 'bad schedule')", (first,)) is None  # void, as in 0.1.0
    assert state_of(api_tx, first) == "disabled"
    assert scalar(api_tx, "SELECT pgsched._disable_job_v2(%s, 'bad schedule')", (second,)) == "disabled"
    assert scalar(api_tx, "SELECT pgsched._set_terminating(%s)", (runs[0]["run_id"],)) is False


def test_a_scope_run_reports_its_job_state_unchanged(api_tx: Conn, instance: int) -> None:
    job_id = due(api_tx, "'ok_fn', '1 hour', scope_query => 'SELECT 1'")
    plan = claim(api_tx, instance)[0]
    closed = close(api_tx, end(plan, scopes=["a"], next_start="2100-01-01T00:00:00Z"))
    assert [(c["old_state"], c["new_state"]) for c in closed] == [("starting", "scheduled")]
    scope = claim(api_tx, instance)[0]
    assert (scope["scope"], scope["job_state"]) == ("a", "scheduled")
    assert [(c["old_state"], c["new_state"]) for c in close(api_tx, end(scope))] == [("scheduled", "scheduled")]
    assert state_of(api_tx, job_id) == "scheduled"


def test_a_takeover_of_a_run_being_cancelled_keeps_its_job_terminating(api_tx: Conn, instance: int) -> None:
    """terminating -> starting is not in the table: the new attempt ends like the one it replaces."""
    job_id = due(api_tx, "'ok_fn', '1 hour', allow_stale_reentry => true")
    run = claim(api_tx, instance)[0]
    api_tx.execute("SELECT pgsched._set_terminating(%s)", (run["run_id"],))
    taken = rows(api_tx, "SELECT * FROM pgsched._take_over_v2(%s, %s, %s, %s, %s)",
                 (instance, [run["run_id"]], [run["lease_token"]], [2], [102]))
    assert [(t["attempt"], t["job_state"]) for t in taken] == [(2, "terminating")]
    assert close(api_tx, end(run)) == []  # the stale attempt's lease is gone
    closed = close(api_tx, end(taken[0]))
    assert [(c["old_state"], c["new_state"]) for c in closed] == [("terminating", "scheduled")]
    assert state_of(api_tx, job_id) == "scheduled"


def test_a_takeover_moves_a_starting_job_nowhere(api_tx: Conn, instance: int) -> None:
    job_id = due(api_tx, "'ok_fn', '1 hour', allow_stale_reentry => true")
    run = claim(api_tx, instance)[0]
    taken = rows(api_tx, "SELECT * FROM pgsched._take_over_v2(%s, %s, %s, %s, %s)",
                 (instance, [run["run_id"]], [run["lease_token"]], [2], [102]))
    assert [t["job_state"] for t in taken] == ["starting"]
    assert state_of(api_tx, job_id) == "starting"


def test_the_fallback_for_rows_that_cannot_be_updated_closes_through_mark_end(api_tx: Conn,
                                                                              instance: int) -> None:
    """A close that fails (a counter at its maximum, written by hand) is retried alone, without the
    counters: the run is closed and the job disabled by _mark_end, the only writer of both."""
    broken, fine, fenced = due(api_tx), due(api_tx), due(api_tx)
    api_tx.execute("UPDATE pgsched.job_stat SET consecutive_failures = 2147483647 WHERE job_id IN (%s, %s)",
                   (broken, fenced))
    runs = {r["job_id"]: r for r in claim(api_tx, instance, 3)}
    before = stats(api_tx, broken)
    closed = close(api_tx, end(runs[broken], "failure", sqlstate="P0001", message="boom"), end(runs[fine]),
                   {**end(runs[fenced], "failure"), "lease_token": runs[fenced]["lease_token"] + 1000})
    assert {(c["job_id"], c["old_state"], c["new_state"]) for c in closed} == {
        (broken, "starting", "disabled"), (fine, "starting", "scheduled")}
    run = one(api_tx, "SELECT outcome, sqlstate, message, finished_at FROM pgsched.job_run WHERE run_id = %s",
              (runs[broken]["run_id"],))
    assert (run["outcome"], run["sqlstate"]) == ("failure", "P0001") and run["finished_at"] is not None
    assert run["message"].startswith("boom [the catalog rows of this job cannot be updated (")
    assert "integer out of range" in run["message"]
    after = stats(api_tx, broken)
    assert (after["state"], after["current_run_id"]) == ("disabled", None)
    assert after["disabled_reason"] in run["message"] and "integer out of range" in after["disabled_reason"]
    counters = ("total_runs", "total_failures", "total_crashes", "consecutive_failures", "last_finish")
    assert [after[k] for k in counters] == [before[k] for k in counters]
    assert scalar(api_tx, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (broken,)) is False
    # The close of a run whose lease is not ours writes nothing to its run or its job's state.
    assert scalar(api_tx, "SELECT outcome FROM pgsched.job_run WHERE run_id = %s",
                  (runs[fenced]["run_id"],)) == "running"
    assert state_of(api_tx, fenced) == "starting"


SEE_STATE = """CREATE OR REPLACE FUNCTION public.see_state(job_id integer, config jsonb) RETURNS void
    LANGUAGE sql AS $$ INSERT INTO public.ran SELECT s.job_id, to_jsonb(s.state), 'state'
                         FROM pgsched.job_stat s WHERE s.job_id = see_state.job_id $$"""


def test_a_paused_job_run_by_hand_stays_disabled_and_a_scheduled_one_is_starting(api: Conn) -> None:
    """disabled -> starting is not in the table: run_job of a paused job leaves it disabled."""
    api.execute(SEE_STATE)
    paused = add_job(api, "'see_state', '1 hour', scheduled => false")
    active = add_job(api, "'see_state', '1 hour'")
    for job_id in (paused, active):
        api.execute("CALL pgsched.run_job(%s)", (job_id,))
    seen = {r["job_id"]: r["config"] for r in rows(api, "SELECT job_id, config FROM public.ran WHERE via = 'state'")}
    assert seen == {paused: "disabled", active: "starting"}
    assert (state_of(api, paused), state_of(api, active)) == ("disabled", "scheduled")
    assert stats(api, paused)["total_successes"] == 1


def test_a_paused_job_run_by_hand_is_not_run_twice_nor_claimable_when_resumed(api: Conn) -> None:
    job_id = add_job(api, "'ok_fn', '1 hour', scheduled => false")
    run_id = scalar(api, "SELECT pgsched._mark_start(%s, now(), 'manual')", (job_id,))
    assert (state_of(api, job_id), stats(api, job_id)["current_run_id"]) == ("disabled", run_id)
    with pytest.raises(psycopg.errors.ObjectInUse, match=f"job {job_id} is already running \\(run {run_id}\\)"):
        api.execute("CALL pgsched.run_job(%s)", (job_id,))
    # Resumed during the run: disabled (no scheduler may claim it) until the run ends.
    api.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' WHERE job_id = %s", (job_id,))
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (job_id,))
    assert state_of(api, job_id) == "disabled"
    instance = scalar(api, "SELECT instance_id FROM pgsched._register_instance_v2('test', 1, 'test', 1)")
    assert claim(api, instance) == []
    assert scalar(api, "SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, NULL)", (run_id,)) is True
    assert state_of(api, job_id) == "scheduled"
    assert [c["job_id"] for c in claim(api, instance)] == [job_id]


def test_resuming_an_idle_paused_job_schedules_it(api: Conn) -> None:
    """The guard above is only for a run in progress: a stale current_run_id does not hold a job back."""
    job_id = add_job(api, "'ok_fn', '1 hour', scheduled => false")
    api.execute("UPDATE pgsched.job_stat SET current_run_id = 999999 WHERE job_id = %s", (job_id,))
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (job_id,))
    assert state_of(api, job_id) == "scheduled"
    api.execute("CALL pgsched.run_job(%s)", (job_id,))
    assert stats(api, job_id)["total_successes"] == 1


def test_closing_runs_is_the_schedulers_and_the_state_table_everyones(api_tx: Conn) -> None:
    """_close_runs stays private like _finish_runs; whoever may write the state (a definer function
    acting for a job's owner, a superuser, the schema owner) must be able to evaluate the table."""
    api_tx.execute("CREATE ROLE pgsched_test_someone")
    may = {r["f"]: r["may"] for r in rows(api_tx, """
        SELECT f, has_function_privilege('pgsched_test_someone', f, 'EXECUTE') AS may
          FROM unnest(ARRAY['pgsched._close_runs(jsonb)', 'pgsched._finish_runs(jsonb)',
                            'pgsched._state_allowed(text, text)']) f""")}
    assert may == {"pgsched._close_runs(jsonb)": False, "pgsched._finish_runs(jsonb)": False,
                   "pgsched._state_allowed(text, text)": True}


def test_the_moves_the_trigger_lets_through_unchecked_are_in_the_table(api_tx: Conn) -> None:
    """The state trigger skips the two moves of every run for speed: each must be allowed by _state_allowed."""
    import re

    when = str(scalar(api_tx, "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'job_stat_state_update'"))
    skipped = re.findall(r"old\.state = '(\w+)'::text\) AND \(new\.state = '(\w+)'::text", when)
    assert sorted(skipped) == [("scheduled", "starting"), ("starting", "scheduled")], when
    for old, new in skipped:
        assert scalar(api_tx, "SELECT pgsched._state_allowed(%s, %s)", (old, new)) is True
