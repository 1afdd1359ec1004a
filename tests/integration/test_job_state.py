"""One owner for a job's state (issue 10): every write of job_stat.state passes the
database's transition table (pgsched._state_allowed, enforced by a trigger), and the
scheduler's functions report the states they wrote instead of the scheduler assuming them.

pgsched/state.py's ALLOWED is only a mirror of that table: checked here against it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgsched.state import ALLOWED, JobState
from tests.integration.helpers import Conn, add_job, rows, scalar, snapshot, stats

STATES = [str(s) for s in JobState]
# A legal way from a new job (scheduled) to each state, written by hand.
PATH = {"scheduled": [], "starting": ["starting"], "terminating": ["starting", "terminating"],
        "disabled": ["disabled"]}


@pytest.fixture
def api_tx(module_api: Conn) -> Iterator[Conn]:
    """The module's database, with everything a test writes rolled back."""
    before = snapshot(module_api)
    with module_api.transaction(force_rollback=True):
        yield module_api
    assert snapshot(module_api) == before


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
    return rows(conn, "SELECT * FROM pgsched._claim(%s, %s, %s)",
                (instance, list(range(1, n + 1)), list(range(101, 101 + n))))


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
    instance = scalar(api, "SELECT instance_id FROM pgsched._register_instance('test', 1, 'test', 1)")
    assert claim(api, instance) == []
    assert scalar(api, "SELECT pgsched._mark_end(%s, 'success', NULL, NULL, NULL)", (run_id,)) is True
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
