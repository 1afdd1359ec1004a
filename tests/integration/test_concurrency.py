"""Concurrency limits (issue 14): jobs sharing a concurrency_key run at most the key's limit at
once over every instance (sql/api/25_concurrency.sql, enforced by the claim). With explicit time
(no sleeping): the claim, the wait shown in job_stats, the scheduler's wake-up, two claims racing,
the settings and bad input; with a real scheduler: scope runs of a sharded job sharing a key.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.integration.helpers import Conn, collect_notifications, rows, scalar, snapshot
from tests.integration.test_core_sql_time import S, T, add_job, claim, register
from tests.integration.test_scheduler import serve


def end(api: Conn, run_id: int, at: datetime) -> None:
    """The run succeeded at `at`; its job's next plan is an hour later."""
    assert scalar(api, "SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, %s, finished_at => %s)",
                  (run_id, at + timedelta(hours=1), at)) is True


def claimed(api: Conn, instance: int, at: datetime, workers: int) -> list[int]:
    return sorted(int(r["job_id"]) for r in claim(api, instance, at, workers))


def test_a_key_without_a_limit_runs_one_at_a_time_and_the_others_wait_visibly(api: Conn) -> None:
    heavy = [add_job(api, T, concurrency_key="heavy") for _ in range(3)]
    free = [add_job(api, T) for _ in range(2)]
    me = register(api, T - S)
    [first] = [r for r in claim(api, me, T, workers=8) if r["job_id"] in heavy]
    # the first heavy job in claim order, and every job without a key: workers are not held back
    assert first["job_id"] == heavy[0] and first["concurrency_key"] == "heavy"
    assert sorted(int(r["job_id"]) for r in rows(api, "SELECT job_id FROM pgsched.job_run")) == [heavy[0], *free]
    # job_stats reads the wall clock: plans due now, the same wait
    api.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' WHERE job_id = ANY(%s)",
                (heavy[1:],))
    waits = {r["job_id"]: r["waiting_for"] for r in rows(api, "SELECT job_id, waiting_for FROM pgsched.job_stats")}
    assert waits[heavy[1]] == waits[heavy[2]] == "concurrency limit of 'heavy': 1 of 1 running"
    assert waits[heavy[0]] is None and waits[free[0]] is None
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = ANY(%s)", (T, heavy[1:]))
    # held back, not lost: while the key is full nothing more is claimed; its end frees it
    assert claim(api, me, T + S, workers=8) == []
    end(api, first["run_id"], T + S)
    assert claimed(api, me, T + 2 * S, workers=8) == [heavy[1]]
    api.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' WHERE job_id = %s",
                (heavy[2],))
    assert rows(api, "SELECT concurrency_key, max_running, is_default, running, jobs, waiting "
                     "FROM pgsched.concurrency_limits") == [
        {"concurrency_key": "heavy", "max_running": 1, "is_default": True, "running": 1, "jobs": 3, "waiting": 1}]


def test_a_limit_of_n_takes_n_in_one_claim_and_zero_holds_them_all(api: Conn) -> None:
    assert scalar(api, "SELECT pgsched.set_concurrency_limit('bulk', 2)") == 2
    bulk = [add_job(api, T, concurrency_key="bulk") for _ in range(4)]
    me = register(api, T - S)
    assert claimed(api, me, T, workers=8) == bulk[:2]
    api.execute("SELECT pgsched.set_concurrency_limit('bulk', 0)")
    for r in rows(api, "SELECT run_id FROM pgsched.job_run WHERE outcome = 'running'"):
        end(api, r["run_id"], T + S)
    assert claim(api, me, T + 2 * S, workers=8) == []
    # NULL: back to the default, 1
    assert scalar(api, "SELECT pgsched.set_concurrency_limit('bulk', NULL)") == 1
    assert claimed(api, me, T + 3 * S, workers=8) == [bulk[2]]


def test_the_scheduler_sleeps_past_jobs_waiting_for_their_key(api: Conn) -> None:
    a = add_job(api, T, concurrency_key="k")
    b = add_job(api, T, concurrency_key="k")
    later = add_job(api, T + 60 * S)
    me = register(api, T - S)
    [run] = claim(api, me, T)
    assert run["job_id"] == a
    # b is due but waits: the next due instant is the later job's, not b's (no busy loop)
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + S,)) == T + 60 * S
    # a job of the full key that is not due yet is a wake-up like any other: when it comes due the
    # key may be free again, and nobody would say so (the end of a run notifies only for waiters)
    soon = add_job(api, T + 30 * S, concurrency_key="k")
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + S,)) == T + 30 * S
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + 31 * S,)) == T + 60 * S
    api.execute("DELETE FROM pgsched.job WHERE job_id = %s", (soon,))
    end(api, run["run_id"], T + 2 * S)
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + 2 * S,)) == T
    assert [r["job_id"] for r in claim(api, me, T + 2 * S, workers=4)] == [b]
    assert later not in [a, b]


def test_the_end_of_a_keyed_run_wakes_the_schedulers_when_a_job_waits_for_its_full_key(api: Conn, db: str) -> None:
    api.execute("SELECT pgsched.set_concurrency_limit('roomy', 5)")
    job, other, plain = add_job(api, T, concurrency_key="k"), add_job(api, T, concurrency_key="k2"), add_job(api, T)
    roomy = add_job(api, T, concurrency_key="roomy")
    me = register(api, T - S)
    runs = {r["job_id"]: r["run_id"] for r in claim(api, me, T, workers=4)}
    assert set(runs) == {job, other, plain, roomy}
    waiters = [add_job(api, T + 3600 * S, concurrency_key=k) for k in ("k", "roomy")]
    # the close reads the wall clock: plans due now wait for k and for roomy
    api.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' WHERE job_id = ANY(%s)",
                (waiters,))
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN pgsched_catalog")
        end(api, runs[plain], T + S)  # no key
        end(api, runs[other], T + S)  # nobody waits for k2
        end(api, runs[roomy], T + S)  # roomy was not full: its waiter was never held back by it
        assert "concurrency_key:free" not in collect_notifications(listener, api, timeout=5)
        end(api, runs[job], T + S)  # k was full and a plan waits for it
        assert "concurrency_key:free" in collect_notifications(listener, api, timeout=5)


def test_two_claims_at_once_never_exceed_the_limit(api: Conn, db: str) -> None:
    """The race the advisory lock closes: instance A has claimed (not yet committed) the key's
    one place; instance B's claim waits for A's commit, then sees A's run and takes none."""
    heavy = [add_job(api, T, concurrency_key="heavy") for _ in range(4)]
    plain = add_job(api, T)
    a_id, b_id = register(api, T - S), register(api, T - S)
    got: dict[str, list[int]] = {}
    with psycopg.connect(db) as a, psycopg.connect(db, autocommit=True) as b:
        got["a"] = claimed(a, a_id, T, workers=1)  # in A's open transaction
        assert got["a"] == [heavy[0]]

        def b_claims() -> None:
            got["b"] = claimed(b, b_id, T, workers=8)

        t = threading.Thread(target=b_claims)
        t.start()
        time.sleep(0.3)
        assert t.is_alive()  # B waits for A's commit, it does not count without it
        a.commit()
        t.join(10)
    assert got["b"] == [plain]
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run r JOIN pgsched.job j USING (job_id) "
                       "WHERE r.outcome = 'running' AND j.concurrency_key = 'heavy'") == 1


def test_claims_without_keyed_jobs_due_take_no_lock(api: Conn, db: str) -> None:
    add_job(api, T, concurrency_key="k")
    add_job(api, T - 60 * S)
    me = register(api, T - 2 * 60 * S)
    with psycopg.connect(db) as other:
        other.execute("SELECT pg_advisory_xact_lock(7401295312)")  # as if another claim held it
        assert len(claim(api, me, T - 30 * S, workers=4)) == 1  # not blocked: no keyed job due yet
        other.rollback()


def test_a_run_holds_the_key_it_started_with(api: Conn) -> None:
    """Altering a job's key while it runs neither frees the key its run took nor fills the new one."""
    a, b = add_job(api, T, concurrency_key="k"), add_job(api, T, concurrency_key="k")
    other = add_job(api, T, concurrency_key="k2")
    me = register(api, T - S)
    [run] = [r for r in claim(api, me, T, workers=1)]
    assert run["job_id"] == a
    api.execute("SELECT * FROM pgsched.alter_job(%s, concurrency_key => 'k2')", (a,))
    assert scalar(api, "SELECT pgsched._key_running('k')") == 1
    assert scalar(api, "SELECT pgsched._key_running('k2')") == 0
    assert claimed(api, me, T + S, workers=4) == [other]  # b still waits for k; k2 had room
    assert b not in claimed(api, me, T + S, workers=4)


def test_a_claim_skips_a_scope_run_whose_job_another_session_holds(api: Conn, db: str) -> None:
    """A close on another instance may hold a job's row while it waits for this claim's lock: the
    claim skips that job's queued scope runs instead of waiting for it (no deadlock)."""
    job = add_job(api, T + 3600 * S, concurrency_key="k")
    api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                "VALUES (%s, 'tenant-1', %s, 'schedule', 'queued')", (job, T))
    me = register(api, T - S)
    with psycopg.connect(db) as holder:
        holder.execute("SELECT 1 FROM pgsched.job_stat WHERE job_id = %s FOR UPDATE", (job,))
        api.execute("SET lock_timeout = '2s'")
        assert claim(api, me, T, workers=2) == []  # not blocked, nothing taken
        holder.rollback()
    [run] = claim(api, me, T + S, workers=2)
    assert (run["job_id"], run["scope"]) == (job, "tenant-1")
    assert scalar(api, "SELECT concurrency_key FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) == "k"


def test_a_direct_write_of_a_bad_key_is_refused(api: Conn) -> None:
    job = add_job(api, T)
    for bad in ("", " ", "k" * 201):
        with pytest.raises(psycopg.errors.CheckViolation):
            api.execute("UPDATE pgsched.job SET concurrency_key = %s WHERE job_id = %s", (bad, job))


def test_alter_job_sets_and_removes_the_key_and_the_trigger_copies_it(api: Conn) -> None:
    job = add_job(api, T)
    api.execute("SELECT * FROM pgsched.alter_job(%s, concurrency_key => 'nightly')", (job,))
    assert rows(api, "SELECT j.concurrency_key AS job, s.concurrency_key AS stat FROM pgsched.jobs j "
                     "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (job,)) == [
        {"job": "nightly", "stat": "nightly"}]
    api.execute("SELECT * FROM pgsched.alter_job(%s, max_retries => 2)", (job,))  # NULL keeps it
    assert scalar(api, "SELECT concurrency_key FROM pgsched.job_stat WHERE job_id = %s", (job,)) == "nightly"
    api.execute("SELECT * FROM pgsched.alter_job(%s, concurrency_key => '')", (job,))
    assert scalar(api, "SELECT concurrency_key FROM pgsched.job_stat WHERE job_id = %s", (job,)) is None


LIMIT_FORM = "a whole number from 0"
KEY_FORM = "a name of 1 to 200 characters"


@pytest.mark.parametrize(("call", "args", "sqlstate", "says", "hint"), [
    ("SELECT pgsched.set_concurrency_limit(%s, %s)", ("heavy", -1), "22023", "invalid max_running: -1 is negative",
     LIMIT_FORM),
    ("SELECT pgsched.set_concurrency_limit(%s, %s)", ("", 1), "22023", "invalid concurrency_key: '' is empty",
     KEY_FORM),
    ("SELECT pgsched.set_concurrency_limit(%s, %s)", (None, 1), "22004", "invalid concurrency_key: NULL", KEY_FORM),
    ("SELECT pgsched.set_concurrency_limit(%s, %s)", ("k" * 201, 1), "22023", "201 characters long", KEY_FORM),
    ("SELECT pgsched.add_job('ok_fn', '1 minute', concurrency_key => %s)", (" ",), "22023",
     "invalid concurrency_key: ' ' is empty", KEY_FORM),
    ("SELECT pgsched.add_job('ok_fn', '1 minute', concurrency_key => %s)", ("k" * 201,), "22023",
     "201 characters long", KEY_FORM),
])
def test_bad_input_is_refused_naming_the_argument_and_nothing_is_written(api: Conn, call: str, args: tuple[Any, ...],
                                                                        sqlstate: str, says: str, hint: str) -> None:
    before = snapshot(api)
    limits = rows(api, "SELECT * FROM pgsched.concurrency_limit")
    with pytest.raises(psycopg.Error) as e:
        api.execute(call, args)
    assert e.value.sqlstate == sqlstate and says in str(e.value), str(e.value)
    assert hint in (e.value.diag.message_hint or ""), e.value.diag.message_hint
    assert snapshot(api) == before and rows(api, "SELECT * FROM pgsched.concurrency_limit") == limits


def overlap(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans open at one instant."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_scope_runs_of_a_sharded_job_share_its_key(db: str, conn: Conn) -> None:
    """'At most 2 tenants at a time': six scope runs of 0.3 s each, with 4 workers and a limit of 2."""
    conn.execute("CREATE TABLE tenants (t text)")
    conn.execute("INSERT INTO tenants SELECT 't' || i FROM generate_series(1, 6) i")
    conn.execute("CREATE PROCEDURE public.per_tenant(job_id int, config jsonb) LANGUAGE sql "
                 "AS $$ SELECT pg_sleep(0.3) $$")
    conn.execute("SELECT pgsched.set_concurrency_limit('tenants', 2)")
    job = int(scalar(conn, "SELECT add_job('per_tenant', '1 hour', initial_start => now(), "
                           "scope_query => 'SELECT t FROM tenants', concurrency_key => 'tenants')"))

    def scopes_done() -> bool:
        return int(scalar(conn, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s AND scope <> '' "
                                "AND outcome = 'success'", (job,))) == 6

    serve(db, scopes_done, timeout=30, max_workers=4)
    assert scopes_done()
    spans = [(r["started_at"], r["finished_at"]) for r in rows(
        conn, "SELECT started_at, finished_at FROM pgsched.job_run WHERE job_id = %s AND scope <> ''", (job,))]
    assert overlap(spans) == 2, spans  # the limit, and it was used
    assert timedelta(0) not in [b - a for a, b in spans]
