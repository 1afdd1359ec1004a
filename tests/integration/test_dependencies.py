"""Dependencies (issue 14, sql/api/07_dependencies.sql): jobs that run after other jobs. The rule with
explicit time (no sleeping, no scheduler): claims and closes at chosen instants decide when a
dependent gets a run, with which plan time, and what it waits for; fan-in and fan-out; scheduled
dependents that skip plans; what deleting or pausing an upstream does; cycles, invisible jobs and
other bad input refused with nothing written; two closes on two connections racing for one fan-in.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgsched import migrate
from tests.integration.helpers import (
    Conn,
    as_new_role,
    collect_notifications,
    in_thread,
    rows,
    scalar,
    snapshot,
    wait_for_a_lock_wait,
)
from tests.integration.test_core_sql_time import S, T, add_job, claim, register

FORM = "job ids or names of jobs the job's owner may see"


def after(api: Conn, upstreams: list[Any], **settings: Any) -> int:
    """A job with no schedule of its own, run after `upstreams` (ids or names)."""
    extra = "".join(f", {k} => %({k})s" for k in settings)
    return int(scalar(api, f"SELECT pgsched.add_job('ok_fn', NULL, depends_on => %(up)s{extra})",
                      {"up": [str(u) for u in upstreams], **settings}))


def end(api: Conn, run_id: int, at: datetime, outcome: str = "success", *, after_job: bool = False) -> None:
    """Close a run at `at`; its job's next plan an hour later (none for an '@after' job, as the scheduler
    computes it: pgsched.state.end_of_run)."""
    assert scalar(api, "SELECT pgsched._mark_end_v2(%s, %s, NULL, NULL, %s, finished_at => %s)",
                  (run_id, outcome, None if after_job else at + timedelta(hours=1), at)) is True


def run_once(api: Conn, me: int, at: datetime, outcome: str = "success") -> list[dict[str, Any]]:
    """Claim what is due at `at` and end every claimed run with `outcome` a second later."""
    got = claim(api, me, at, workers=16)
    for r in got:
        end(api, r["run_id"], at + S, outcome, after_job=r["schedule"] == "@after")
    return got


def planned(api: Conn) -> list[tuple[int, datetime]]:
    """The plans '@after' jobs were given and have not started (pending, then waiting behind it)."""
    return [(r["job_id"], r["plan_time"]) for r in rows(
        api, "SELECT job_id, plan_time FROM pgsched._upstream_plans ORDER BY job_id, position")]


def waiting(api: Conn, job_id: int) -> str | None:
    w = scalar(api, "SELECT waiting_for FROM pgsched.job_stats WHERE job_id = %s", (job_id,))
    return None if w is None else str(w)


def test_a_dependent_runs_once_after_each_success_of_its_upstream_with_its_plan_time(api: Conn) -> None:
    up = add_job(api, T, job_name="rollup")
    down = after(api, ["rollup"])
    assert scalar(api, "SELECT schedule FROM pgsched.jobs WHERE job_id = %s", (down,)) == "@after"
    assert scalar(api, "SELECT depends_on FROM pgsched.jobs WHERE job_id = %s", (down,)) == [up]
    assert scalar(api, "SELECT next_start FROM pgsched.job_stat WHERE job_id = %s", (down,)) is None
    assert waiting(api, down) == f"upstream job(s) not succeeded since its last run: {up} (rollup)"
    me = register(api, T - S)
    [r] = run_once(api, me, T)
    assert r["job_id"] == up
    # planned in the upstream's close, with the upstream's plan time, due at once
    assert planned(api) == [(down, T)]
    assert scalar(api, "SELECT next_start FROM pgsched.job_stat WHERE job_id = %s", (down,)) == T
    assert waiting(api, down) is not None  # consumed: the next run needs the next success
    assert scalar(api, "SELECT next_due FROM pgsched._next_due_v2('{}', now => %s)", (T + 2 * S,)) == T
    [d] = claim(api, me, T + 2 * S, workers=4)
    assert (d["job_id"], d["plan_time"], d["scope"]) == (down, T, "")
    assert scalar(api, "SELECT trigger FROM pgsched.job_run WHERE run_id = %s", (d["run_id"],)) == "upstream"
    end(api, d["run_id"], T + 3 * S, after_job=True)
    s = rows(api, "SELECT state, total_runs, total_successes, next_start FROM pgsched.job_stats WHERE job_id = %s",
             (down,))[0]
    assert s == {"state": "scheduled", "total_runs": 1, "total_successes": 1, "next_start": None}
    # the upstream's next plan: one more run; a failure: none
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 60 * S, up))
    run_once(api, me, T + 60 * S, "failure")
    assert planned(api) == []
    assert "failing (1 in a row)" in str(waiting(api, down))
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 120 * S, up))
    run_once(api, me, T + 120 * S)
    assert planned(api) == [(down, T + 120 * S)]


def test_fan_in_waits_for_every_upstream_and_passes_on_the_latest_plan(api: Conn) -> None:
    a = add_job(api, T)
    b = add_job(api, T + 10 * S)
    down = after(api, [a, b])
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == []
    assert waiting(api, down) == f"upstream job(s) not succeeded since its last run: {b} (ok_fn [{b}])"
    # a succeeds again: still one run to come, not two
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 5 * S, a))
    run_once(api, me, T + 5 * S)
    assert planned(api) == []
    run_once(api, me, T + 10 * S)
    assert planned(api) == [(down, T + 10 * S)]
    assert waiting(api, down) is not None


def test_fan_out_and_a_chain_share_one_plan_time(api: Conn) -> None:
    up = add_job(api, T)
    left, right = after(api, [up]), after(api, [up])
    last = after(api, [left, right])
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == [(left, T), (right, T)]
    got = run_once(api, me, T + 5 * S)
    assert sorted((r["job_id"], r["plan_time"]) for r in got) == [(left, T), (right, T)]
    assert planned(api) == [(last, T)]
    [r] = run_once(api, me, T + 9 * S)
    assert (r["job_id"], r["plan_time"]) == (last, T)


def test_a_scheduled_dependent_skips_plans_until_its_upstreams_succeeded(api: Conn) -> None:
    up = add_job(api, T + 30 * S)
    down = add_job(api, T, depends_on=[str(up)])
    me = register(api, T - S)
    [r] = claim(api, me, T)
    assert r["job_id"] == down and r["depends_on"] == [up]
    why = scalar(api, "SELECT pgsched._take_upstreams(%s)", (r["run_id"],))
    assert why == f"upstream job(s) not succeeded since its last run: {up} (ok_fn [{up}])"
    run_once(api, me, T + 30 * S)
    assert planned(api) == []  # a scheduled dependent is not planned by them: its schedule runs it
    assert waiting(api, down) is None
    # its next plan may run, and takes the upstream's success: the plan after that waits again
    assert scalar(api, "SELECT pgsched._take_upstreams(%s)", (r["run_id"],)) is None
    assert waiting(api, down) is not None


def test_deleting_an_upstream_disables_its_dependents_with_the_reason(api: Conn) -> None:
    up = add_job(api, T, job_name="source")
    other = add_job(api, T)
    down = after(api, [up, other])
    further = after(api, [down])
    api.execute("SELECT pgsched.delete_job(%s)", (up,))
    s = rows(api, "SELECT state, disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (down,))[0]
    assert s["state"] == "disabled"
    assert s["disabled_reason"].startswith(f"upstream job {up} (source) deleted")
    assert scalar(api, "SELECT depends_on FROM pgsched.jobs WHERE job_id = %s", (down,)) == [other]
    # its own dependents follow
    s = rows(api, "SELECT state, disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (further,))[0]
    assert s["state"] == "disabled" and s["disabled_reason"].startswith(f"upstream job {down} ")
    # resumed, it runs after the upstream it has left
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (down,))
    assert rows(api, "SELECT state, disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (down,))[0] == {
        "state": "scheduled", "disabled_reason": None}
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == [(down, T)]


def test_deleting_the_only_upstream_leaves_a_dependent_that_cannot_be_resumed_without_one(api: Conn) -> None:
    up = add_job(api, T)
    down = after(api, [up])
    api.execute("SELECT pgsched.delete_job(%s)", (up,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="'@after' without depends_on"):
        api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (down,))


def test_pausing_an_upstream_disables_its_dependents_and_a_failure_disable_says_why(api: Conn) -> None:
    up = add_job(api, T, job_name="src", max_retries=0)
    down = after(api, ["src"])
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (up,))
    s = rows(api, "SELECT state, disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (down,))[0]
    assert s == {"state": "disabled", "disabled_reason": f"upstream job {up} (src) is disabled (paused): "
                                                         "resume it, then this job"}
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (up,))
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (down,))
    # disabled by its scheduler (a close with a reason): the reason is passed on
    me = register(api, T - S)
    [r] = claim(api, me, T)
    assert scalar(api, "SELECT pgsched._mark_end_v2(%s, 'failure', '22012', 'boom', NULL, finished_at => %s, "
                       "disable_reason => 'max_retries 0 reached')", (r["run_id"], T + S)) is True
    s = rows(api, "SELECT state, disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (down,))[0]
    assert s["state"] == "disabled" and "max_retries 0 reached" in s["disabled_reason"]


def test_a_paused_dependent_is_not_planned_and_keeps_its_upstreams_success(api: Conn) -> None:
    up = add_job(api, T)
    down = after(api, [up], scheduled=False)
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == []
    assert waiting(api, down) is None  # disabled: nothing to wait for
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (down,))
    assert waiting(api, down) is None  # the success is still there for its next run


def test_two_closes_racing_for_one_fan_in_plan_exactly_one_run(api: Conn, db: str) -> None:
    for _ in range(20):
        api.execute("DELETE FROM pgsched.job")
        a, b = add_job(api, T), add_job(api, T)
        down = after(api, [a, b])
        me = register(api, T - S)
        runs = claim(api, me, T, workers=4)
        assert len(runs) == 2
        barrier = threading.Barrier(2)

        def close(run_id: int, barrier: threading.Barrier = barrier) -> None:
            with psycopg.connect(db, autocommit=True) as c:
                barrier.wait()
                end(c, run_id, T + S)

        threads = [threading.Thread(target=close, args=(r["run_id"],)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert planned(api) == [(down, T)]


def test_cycles_and_self_dependency_are_refused_and_nothing_is_written(api: Conn) -> None:
    a = add_job(api, T)
    b = after(api, [a])
    c = after(api, [b])
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="would depend on itself") as e:
        api.execute("SELECT pgsched.alter_job(%s, depends_on => %s)", (a, [str(a)]))
    assert FORM in str(e.value.diag.message_hint)
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=rf"it would make a cycle: job {c} already runs after job {a} \(directly or through"):
        api.execute("SELECT pgsched.alter_job(%s, depends_on => %s)", (a, [str(c)]))
    # a direct write of the catalog is held to the same rule
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"job {c} already runs after job {a}"):
        api.execute("UPDATE pgsched.job SET depends_on = %s WHERE job_id = %s", ([c], a))
    assert snapshot(api) == before


@pytest.mark.parametrize(("refs", "problem"), [
    (["no_such_job"], "no job 'no_such_job' that role"),
    (["999999"], "no job '999999' that role"),
    (["99999999999999999999"], "no job '99999999999999999999' that role"),
    ([""], "'' is not a job"),
    ([None], "NULL is not a job"),
])
def test_unknown_upstreams_are_refused_naming_the_argument(api: Conn, refs: list[Any], problem: str) -> None:
    add_job(api, T)
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"invalid depends_on: {problem}") as e:
        api.execute("SELECT pgsched.add_job('ok_fn', NULL, depends_on => %s)", (refs,))
    assert FORM in str(e.value.diag.message_hint)
    assert snapshot(api) == before


def test_after_without_upstreams_and_a_missing_schedule_are_refused(api: Conn) -> None:
    before = snapshot(api)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="'@after' without depends_on"):
        api.execute("SELECT pgsched.add_job('ok_fn', '@after')")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="invalid schedule: NULL"):
        api.execute("SELECT pgsched.add_job('ok_fn', NULL)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="has no start times to preview"):
        api.execute("SELECT * FROM pgsched.next_runs('@after')")
    assert snapshot(api) == before


def test_a_scheduler_disable_passes_its_reason_on_and_leaving_after_drops_its_plans(api: Conn) -> None:
    up = add_job(api, T, job_name="src")
    down = after(api, ["src"])
    scalar(api, "SELECT pgsched._disable_job_v2(%s, 'the owner role was dropped')", (up,))
    reason = scalar(api, "SELECT disabled_reason FROM pgsched.job_stats WHERE job_id = %s", (down,))
    assert reason == f"upstream job {up} (src) is disabled (the owner role was dropped): resume it, then this job"
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (up,))
    api.execute("SELECT pgsched.alter_job(%s, scheduled => true)", (down,))
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == [(down, T)]
    run_once(api, me, T + 60 * S)  # runs the dependent (its upstream is due again only later)
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 70 * S, up))
    run_once(api, me, T + 70 * S)
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 80 * S, up))
    got = claim(api, me, T + 80 * S, workers=2)  # the dependent's plan and its upstream's next
    end(api, next(r["run_id"] for r in got if r["job_id"] == up), T + 81 * S)
    assert planned(api) == [(down, T + 80 * S)]  # behind the one running
    # given a schedule of its own, the plans its upstream gave it would run beside it: they go
    api.execute("SELECT pgsched.alter_job(%s, schedule => '1 hour')", (down,))
    assert planned(api) == []
    assert scalar(api, "SELECT upstream_backlog FROM pgsched.job_stat WHERE job_id = %s", (down,)) is None


def test_a_job_another_role_owns_and_the_owner_cannot_see_is_refused(api: Conn, db: str) -> None:
    up = add_job(api, T, job_name="private")
    with as_new_role(api, db, "dep"):
        for ref in (str(up), "private"):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"no job .* that role"):
                api.execute("SELECT pgsched.add_job('ok_fn', NULL, depends_on => %s)", ([ref],))
        assert scalar(api, "SELECT count(*) FROM pgsched.job") == 0
        # nor by writing the catalog, nor by asking the cycle check about it
        mine = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour')"))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"no job '{up}' that role"):
            api.execute("UPDATE pgsched.job SET depends_on = %s WHERE job_id = %s", ([up], mine))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            api.execute("SELECT pgsched._check_upstreams(%s, %s)", (up, [mine]))
        assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0
        # A direct INSERT may name an id that does not exist (yet: pg_restore inserts in any order);
        # one it may not see is taken alike, so the answer does not tell which ids exist, and it
        # gets no edge: the hidden job's runs never reach the new one.
        for upstream in (up, 999999):
            api.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule, depends_on) "
                        "VALUES (%s, 'command', 'SELECT 1', '@after', %s)", (f"after_{upstream}", [upstream]))
        assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0
        # ... nor does deleting the hidden job: its name stays, as that of an id that never existed.
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute("DELETE FROM pgsched.job WHERE job_id = %s", (up,))
        assert api.execute("SELECT j.job_name, j.depends_on, j.scheduled, s.disabled_reason FROM pgsched.job j "
                           "JOIN pgsched.job_stat s USING (job_id) WHERE j.job_name LIKE 'after_%%' ORDER BY 1"
                           ).fetchall() == [(f"after_{up}", [up], True, None), ("after_999999", [999999], True, None)]


def test_an_upstream_is_deleted_with_every_constraint_immediate(api: Conn) -> None:
    """The edges go with their upstream whatever SET CONSTRAINTS says (their foreign key cascades, and
    is not deferrable), and its dependents are disabled. (A deferred foreign key, tried on 2026-11-28
    so that the deletion's trigger could read the edges first, failed here.)"""
    up = add_job(api, T, job_name="gone_now")
    down = after(api, [up])
    api.execute("BEGIN")
    api.execute("SET CONSTRAINTS ALL IMMEDIATE")
    api.execute("SELECT pgsched.delete_job(%s)", (up,))
    api.execute("COMMIT")
    assert api.execute("SELECT j.depends_on, j.scheduled FROM pgsched.job j WHERE job_id = %s",
                       (down,)).fetchone() == (None, False)
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0


def test_a_paused_upstream_is_named_only_to_dependents_whose_owner_may_see_it(api: Conn, db: str) -> None:
    """Pausing an upstream disables its dependents with the reason; one whose owner lost sight of
    the upstream since naming it is told its id, not its name nor why it is disabled."""
    with as_new_role(api, db, "upown2") as upown:
        up = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'secret_name')"))
        api.execute("RESET ROLE")
        with as_new_role(api, db, "dep2") as dep:
            api.execute("RESET ROLE")
            api.execute(f"GRANT {upown} TO {dep}")
            api.execute(f"SET ROLE {dep}")
            seeing, blind = after(api, [up]), after(api, [up])
            api.execute("RESET ROLE")
            api.execute(f"REVOKE {upown} FROM {dep}")
            # one of the two dependents changes hands to a role that still sees the upstream
            api.execute("UPDATE pgsched.job SET owner = %s::regrole WHERE job_id = %s", (upown, seeing))
            api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (up,))
            reasons: dict[Any, Any] = {r[0]: r[1] for r in api.execute(
                "SELECT job_id, disabled_reason FROM pgsched.job_stats WHERE job_id IN (%s, %s)", (seeing, blind))}
            assert reasons[seeing] == (f"upstream job {up} (secret_name) is disabled (paused): resume it, "
                                       "then this job")
            assert reasons[blind] == f"upstream job {up} is disabled: resume it, then this job"


def test_deleting_an_upstream_decides_by_its_edges_not_by_who_sees_it_now(api: Conn, db: str) -> None:
    """A dependent whose owner saw the upstream when it named it (it has its edge, and waits for it)
    and lost sight of it since is disabled, told the id only; one that named it without an edge (it
    could not see it then) and came to see it since is left as it is. Before 2026-11-29 the deletion
    asked who might see the upstream at that moment, and did each the other way round."""
    with as_new_role(api, db, "upown3") as upown:
        up = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'gone_source')"))
        api.execute("RESET ROLE")
        with as_new_role(api, db, "depa3") as depa, _sibling_role(api, depa, "depb3") as depb:
            api.execute(f"GRANT {upown} TO {depa}")
            api.execute(f"SET ROLE {depa}")
            lost_sight = after(api, [up])
            api.execute("RESET ROLE")
            api.execute(f"REVOKE {upown} FROM {depa}")
            api.execute(f"SET ROLE {depb}")
            named_blind = int(scalar(api, "INSERT INTO pgsched.job (job_name, kind, command, schedule, depends_on) "
                                          "VALUES ('blind', 'command', 'SELECT 1', '@after', %s) RETURNING job_id",
                                     ([up],)))
            api.execute("RESET ROLE")
            api.execute(f"GRANT {upown} TO {depb}")
            assert api.execute("SELECT job_id FROM pgsched.job_dependency WHERE upstream_id = %s",
                               (up,)).fetchall() == [(lost_sight,)]
            api.execute("SELECT pgsched.delete_job(%s)", (up,))
            got = {r[0]: r[1:] for r in api.execute(
                "SELECT j.job_id, j.depends_on, j.scheduled, s.disabled_reason FROM pgsched.job j "
                "JOIN pgsched.job_stat s USING (job_id) WHERE j.job_id IN (%s, %s)", (lost_sight, named_blind))}
            assert got[named_blind] == ([up], True, None)
            assert got[lost_sight] == (None, False, f"upstream job {up} deleted: give the job other upstreams "
                                                    "(alter_job depends_on) or a schedule, then resume it")


@contextlib.contextmanager
def _sibling_role(api: Conn, like: str, prefix: str) -> Iterator[str]:
    """Another login role beside as_new_role's `like`; `api` is reset to the session's own role."""
    api.execute("RESET ROLE")
    role = f"{prefix}_{like.rsplit('_', 1)[1]}"
    api.execute(f"DROP ROLE IF EXISTS {role}")
    api.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role
    finally:
        api.execute("RESET ROLE")
        api.execute("DELETE FROM pgsched.job")
        api.execute(f"DROP ROLE {role}")


def test_an_upstream_and_its_dependent_deleted_together(api: Conn) -> None:
    """One statement deletes an upstream and a dependent of it (the row trigger finds the dependent
    gone already), and another dependent of both is disabled, naming both."""
    up = add_job(api, T, job_name="up_together")
    down = after(api, [up])
    further = after(api, [up, down])
    other = add_job(api, T)
    api.execute("DELETE FROM pgsched.job WHERE job_id IN (%s, %s)", (up, down))
    assert scalar(api, "SELECT count(*) FROM pgsched.job WHERE job_id IN (%s, %s)", (up, down)) == 0
    st = rows(api, "SELECT j.depends_on, j.scheduled, s.state, s.disabled_reason FROM pgsched.job j "
                   "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (further,))[0]
    assert (st["depends_on"], st["scheduled"], st["state"]) == (None, False, "disabled"), st
    reason = st["disabled_reason"]
    assert reason.startswith("upstream job ") and reason.endswith(
        " deleted: give the job other upstreams (alter_job depends_on) or a schedule, then resume it"), reason
    assert f"{up} (up_together)" in reason and f"{down} (ok_fn [{down}])" in reason, reason
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0
    assert scalar(api, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (other,)) is True


def test_a_deletion_in_repeatable_read_that_missed_a_new_edge_fails_with_40001(api: Conn, db: str) -> None:
    """The deletion's trigger reads the edges in its transaction's snapshot; an edge committed after it
    is found by the foreign key's cascade, which refuses the deletion (40001) rather than remove the
    edge of a dependent left waiting with nothing said."""
    up = add_job(api, T, job_name="rr_up")
    with psycopg.connect(db) as deleter:
        deleter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        deleter.execute("SELECT count(*) FROM pgsched.job").fetchone()  # the snapshot
        down = after(api, [up])  # committed by the other session
        with pytest.raises(psycopg.errors.SerializationFailure):
            deleter.execute("SELECT pgsched.delete_job(%s)", (up,))
        deleter.rollback()
    assert scalar(api, "SELECT depends_on FROM pgsched.job WHERE job_id = %s", (down,)) == [up]
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency WHERE upstream_id = %s", (up,)) == 1


@pytest.mark.parametrize("change", ["add_job", "alter_job", "direct update"])
def test_a_change_naming_an_upstream_deleted_meanwhile_is_refused_with_40001(api: Conn, db: str,
                                                                            change: str) -> None:
    """add_job, alter_job or a direct UPDATE of depends_on names an upstream whose deletion commits
    while the change waits for it: refused with 40001, nothing written, where it failed with a
    foreign key violation (the deletion in progress when the edge was made) or kept the id with no
    edge (the deletion committed before)."""
    up = add_job(api, T, job_name="racing_up")
    target = add_job(api, T) if change != "add_job" else None
    jobs_before = scalar(api, "SELECT count(*) FROM pgsched.job")
    statement = {"add_job": ("SELECT pgsched.add_job('ok_fn', '@after', depends_on => %s)", ([str(up)],)),
                 "alter_job": ("SELECT pgsched.alter_job(%s, depends_on => %s)", (target, [str(up)])),
                 "direct update": ("UPDATE pgsched.job SET depends_on = %s WHERE job_id = %s", ([up], target))}[change]
    with psycopg.connect(db, autocommit=True) as deleter:
        deleter.execute("BEGIN")
        deleter.execute("SELECT pgsched.delete_job(%s)", (up,))
        t, errors = in_thread(db, *statement)
        wait_for_a_lock_wait(api, "depends_on")  # it has read the upstream, and waits for the deletion
        deleter.execute("COMMIT")
        t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.SerializationFailure), errors
    assert f"job {up} was deleted" in str(errors[0])
    assert scalar(api, "SELECT count(*) FROM pgsched.job") == jobs_before - 1
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0
    if target is not None:
        assert scalar(api, "SELECT depends_on FROM pgsched.job WHERE job_id = %s", (target,)) is None


def test_a_dependent_that_drops_its_upstream_while_it_is_deleted_is_left_alone(api: Conn, db: str) -> None:
    """An alter_job removing the upstream, not yet committed when the upstream's deletion reads the
    edges: the deletion waits for the dependent's row, reads the edges again, and leaves the job
    (which no longer names it) scheduled."""
    up = add_job(api, T, job_name="dropped_up")
    down = add_job(api, T, depends_on=[str(up)])
    with psycopg.connect(db, autocommit=True) as changer:
        changer.execute("BEGIN")
        changer.execute("SELECT pgsched.alter_job(%s, depends_on => '{}')", (down,))
        t, errors = in_thread(db, "SELECT pgsched.delete_job(%s) /* dropped_up */", (up,))
        wait_for_a_lock_wait(api, "dropped_up")
        changer.execute("COMMIT")
        t.join(10)
    assert errors == []
    assert rows(api, "SELECT j.depends_on, j.scheduled, s.state, s.disabled_reason FROM pgsched.job j "
                     "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (down,)) == [
        {"depends_on": None, "scheduled": True, "state": "scheduled", "disabled_reason": None}]


def test_a_deletion_and_an_alter_job_of_its_dependent_do_not_deadlock(api: Conn, db: str) -> None:
    """A transaction holds a dependent's row (its first change), then changes what its job_stat row
    holds (priority), while the upstream is deleted: the deletion waits for the dependent's row before
    it takes any job_stat row, as alter_job takes them (row first), so both finish."""
    up = add_job(api, T, job_name="locked_up")
    down = add_job(api, T, depends_on=[str(up)])
    with psycopg.connect(db, autocommit=True) as changer:
        changer.execute("BEGIN")
        changer.execute("SELECT pgsched.alter_job(%s, job_name => 'renamed')", (down,))
        t, errors = in_thread(db, "SELECT pgsched.delete_job(%s) /* locked_up */", (up,))
        wait_for_a_lock_wait(api, "locked_up")
        changer.execute("SELECT pgsched.alter_job(%s, priority => 3)", (down,))
        changer.execute("COMMIT")
        t.join(10)
    assert errors == []
    st = rows(api, "SELECT j.job_name, j.priority, j.depends_on, j.scheduled, s.disabled_reason FROM pgsched.job j "
                   "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (down,))[0]
    assert (st["job_name"], st["priority"], st["depends_on"], st["scheduled"]) == ("renamed", 3, None, False), st
    assert st["disabled_reason"].startswith(f"upstream job {up} (locked_up) deleted"), st


def test_a_reason_passed_on_from_a_deleted_upstream_is_not_merged_with_a_later_deletion(api: Conn) -> None:
    """D2 runs after D and V; D runs after U. U deleted: D is disabled for it, and D2 for D (the
    reason passed on names U inside). V deleted next: D2's reason names V alone."""
    u, v = add_job(api, T, job_name="u"), add_job(api, T, job_name="v")
    d = after(api, [u])
    d2 = after(api, [d, v])
    api.execute("SELECT pgsched.delete_job(%s)", (u,))
    assert scalar(api, "SELECT disabled_reason FROM pgsched.job_stat WHERE job_id = %s", (d2,)).startswith(
        f"upstream job {d} ")
    api.execute("SELECT pgsched.delete_job(%s)", (v,))
    assert scalar(api, "SELECT disabled_reason FROM pgsched.job_stat WHERE job_id = %s", (d2,)) == (
        f"upstream job {v} (v) deleted: give the job other upstreams (alter_job depends_on) or a schedule, "
        "then resume it")


def test_alter_job_replaces_and_removes_dependencies(api: Conn) -> None:
    a, b = add_job(api, T, job_name="a"), add_job(api, T, job_name="b")
    down = add_job(api, T, depends_on=["a"])
    api.execute("SELECT pgsched.alter_job(%s, depends_on => %s)", (down, ["b", str(a), "b"]))
    assert scalar(api, "SELECT depends_on FROM pgsched.jobs WHERE job_id = %s", (down,)) == [a, b]
    assert scalar(api, "SELECT array_agg(upstream_id ORDER BY upstream_id) FROM pgsched.job_dependency "
                       "WHERE job_id = %s", (down,)) == [a, b]
    api.execute("SELECT pgsched.alter_job(%s, depends_on => '{}')", (down,))
    assert scalar(api, "SELECT depends_on FROM pgsched.jobs WHERE job_id = %s", (down,)) is None
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency") == 0
    assert waiting(api, down) is None


def test_the_close_of_a_job_nothing_depends_on_plans_nothing(api: Conn) -> None:
    up = add_job(api, T)
    me = register(api, T - S)
    run_once(api, me, T)
    assert planned(api) == []
    assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s", (up,)) == 1


def test_plans_that_come_while_one_is_pending_or_running_wait_and_each_runs_once_in_order(api: Conn) -> None:
    """One run per upstream success, however far the dependent falls behind: a plan that comes while
    the dependent has one pending or running waits behind it, and its run's close makes the next
    due. A run by hand in between takes none of them."""
    up = add_job(api, T)
    down = after(api, [up])
    me = register(api, T - S)
    run_once(api, me, T)
    [d] = claim(api, me, T + 5 * S, workers=1)
    assert (d["job_id"], d["plan_time"]) == (down, T)
    for t in (10, 20):  # the dependent is running: its upstream's plans wait
        api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + t * S, up))
        [r] = claim(api, me, T + t * S, workers=1)
        assert r["job_id"] == up
        end(api, r["run_id"], T + (t + 1) * S)
    assert planned(api) == [(down, T + 10 * S), (down, T + 20 * S)]
    end(api, d["run_id"], T + 25 * S, after_job=True)
    assert scalar(api, "SELECT next_start FROM pgsched.job_stat WHERE job_id = %s", (down,)) == T + 10 * S
    assert scalar(api, "SELECT upstream_backlog FROM pgsched.job_stat WHERE job_id = %s", (down,)) == [T + 20 * S]
    api.execute("CALL pgsched.run_job(%s)", (down,))  # by hand: the plans stay
    assert planned(api) == [(down, T + 10 * S), (down, T + 20 * S)]
    got = []
    for t in (40, 50, 60):
        got += [(r["job_id"], r["plan_time"], scalar(api, "SELECT trigger FROM pgsched.job_run WHERE run_id = %s",
                                                     (r["run_id"],))) for r in claim(api, me, T + t * S)]
        for r in rows(api, "SELECT run_id FROM pgsched.job_run WHERE job_id = %s AND outcome = 'running'", (down,)):
            end(api, r["run_id"], T + (t + 1) * S, after_job=True)
    assert got == [(down, T + 10 * S, "upstream"), (down, T + 20 * S, "upstream")]
    assert planned(api) == []
    assert rows(api, "SELECT trigger, count(*) FROM pgsched.job_run WHERE job_id = %s GROUP BY 1 ORDER BY 1",
                (down,)) == [{"trigger": "manual", "count": 1}, {"trigger": "upstream", "count": 3}]


def test_a_dependent_is_due_at_its_upstreams_plan_and_starts_before_jobs_due_later(api: Conn) -> None:
    """A dependent's plan is due like a scheduled one: the claim starts due jobs most overdue first,
    so a dependent whose upstream ran long starts before jobs due since."""
    ups = [add_job(api, T) for _ in range(3)]
    downs = [after(api, [u]) for u in ups]
    me = register(api, T - S)
    run_once(api, me, T)
    assert [q for q, _ in planned(api)] == downs
    busy = [add_job(api, T + S) for _ in range(10)]
    got = claim(api, me, T + 2 * S, workers=4)
    assert sorted(r["job_id"] for r in got) == sorted([*downs, busy[0]])
    # not a catch-up case, however old its upstream's plan: every one of them runs
    assert rows(api, "SELECT job_id FROM pgsched._behind_v2('1 second', 100, now => %s) "
                     "WHERE job_id = ANY (%s)", (T + 3600 * S, downs)) == []


def test_a_claim_says_when_a_dependent_is_due_and_only_a_dependent_due_alone_wakes_the_schedulers(
        api: Conn, db: str) -> None:
    ups = [add_job(api, T) for _ in range(3)]
    downs = [after(api, [u]) for u in ups]
    me = register(api, T - S)
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN pgsched_catalog")
        [first, *rest] = claim(api, me, T, workers=4)
        end(api, first["run_id"], T + S)
        # nothing else was due: the plan it gave wakes every instance
        assert "job_run:upstream" in collect_notifications(listener, api)
        for r in rest:
            end(api, r["run_id"], T + S)
        # a dependent was due already: no notification each (an instance is about to claim)
        assert "job_run:upstream" not in collect_notifications(listener, api)
    got = claim(api, me, T + 2 * S, workers=2)
    assert sorted(r["job_id"] for r in got) == downs[:2]
    # one dependent is left due: the claim says so, and the scheduler claims again
    assert {r["next_due"] for r in got} == {T}


def test_runs_an_earlier_release_queued_for_after_jobs_become_their_plans_on_upgrade(api: Conn) -> None:
    """Migration 0013: the dependents' queued runs of the release before it (one per upstream success)
    become the dependent's pending plan and the ones waiting behind it; nothing is lost or doubled, and
    queued scope runs stay queued."""
    up = add_job(api, T)
    down, idle = after(api, [up]), after(api, [up])
    sharded = add_job(api, T + 3600 * S, scope_query="SELECT 1")
    # the layout before 0013
    api.execute("DROP VIEW pgsched._upstream_plans")
    api.execute("ALTER TABLE pgsched.job_stat DROP COLUMN upstream_backlog")
    api.execute(sql.SQL("DELETE FROM {} WHERE version = 13").format(sql.SQL(migrate.ledger(13))))
    for job, scope, plan in ((down, "", T + 20 * S), (down, "", T), (down, "", T + 10 * S), (sharded, "k", T)):
        api.execute("INSERT INTO pgsched.job_run (job_id, scope, plan_time, trigger, outcome) "
                    "VALUES (%s, %s, %s, 'upstream', 'queued')", (job, scope, plan))
    assert migrate.init(api).applied == [13]
    assert rows(api, "SELECT job_id, next_start, upstream_backlog FROM pgsched.job_stat WHERE job_id IN (%s, %s) "
                     "ORDER BY job_id", (down, idle)) == [
        {"job_id": down, "next_start": T, "upstream_backlog": [T + 10 * S, T + 20 * S]},
        {"job_id": idle, "next_start": None, "upstream_backlog": None}]
    assert planned(api) == [(down, T), (down, T + 10 * S), (down, T + 20 * S)]
    assert rows(api, "SELECT job_id, scope FROM pgsched.job_run WHERE outcome = 'queued'") == [
        {"job_id": sharded, "scope": "k"}]
    api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T + 3600 * S, up))
    me = register(api, T - S)
    for t in (1, 2, 3):
        [r] = claim(api, me, T + t * 30 * S)
        assert (r["job_id"], r["plan_time"]) == (down, T + (t - 1) * 10 * S)
        end(api, r["run_id"], T + (t * 30 + 1) * S, after_job=True)
    assert planned(api) == []


def test_closes_of_a_chain_on_two_connections_lock_in_one_order_and_never_deadlock(api: Conn, db: str) -> None:
    """A -> B -> C. One close ends A's run and C's, another B's, at once. Each plans its upstream's
    dependent (B, C) and so writes a job_stat row the other's close also writes: without one lock
    order (the close locks every row it will write first, by job_id) the two deadlock, and
    PostgreSQL cancels one. Counted in pg_stat_database.deadlocks, 30 times over."""
    def deadlocks() -> int:
        api.execute("SELECT pg_stat_clear_snapshot()")
        return int(scalar(api, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))

    before = deadlocks()
    for i in range(30):
        api.execute("DELETE FROM pgsched.job")
        a = add_job(api, T)
        b = after(api, [a])
        c = after(api, [b])
        # B and C have a plan each (their upstreams succeeded earlier)
        api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T - S, b))
        api.execute("UPDATE pgsched.job_stat SET next_start = %s WHERE job_id = %s", (T - 2 * S, c))
        me = register(api, T - S)
        runs = {r["job_id"]: r for r in claim(api, me, T, workers=3)}
        assert set(runs) == {a, b, c}
        barrier = threading.Barrier(2)

        def close(jobs: list[int], barrier: threading.Barrier = barrier,
                  runs: dict[int, dict[str, Any]] = runs) -> None:
            ends = [{"run_id": runs[j]["run_id"], "outcome": "success", "next_start": None,
                     "finished_at": (T + S).isoformat(), "lease_token": runs[j]["lease_token"]} for j in jobs]
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("SET deadlock_timeout = '20ms'")
                barrier.wait()
                conn.execute("SELECT * FROM pgsched._close_runs(%s)", (Jsonb(ends),))
                conn.execute("SELECT pg_stat_force_next_flush()")
                conn.execute("SELECT 1")

        threads = [threading.Thread(target=close, args=(jobs,)) for jobs in ([a, c], [b])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # every run closed, each success planned its dependent once
        assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE outcome = 'success'") == 3, i
        assert sorted(planned(api)) == [(b, T), (c, T - S)], i
    assert deadlocks() == before


def test_a_job_made_after_its_upstreams_during_a_run_keeps_the_plan_they_gave_it(api: Conn) -> None:
    """The run's scheduler still computes the next start of the schedule the job had when the run
    started; the close keeps the plan its upstreams gave it meanwhile instead."""
    up = add_job(api, T + 10 * S)
    down = add_job(api, T, depends_on=[str(up)])
    me = register(api, T - S)
    [r] = claim(api, me, T)
    api.execute("SELECT pgsched.alter_job(%s, schedule => '@after')", (down,))
    run_once(api, me, T + 10 * S)  # the upstream succeeds: a plan for the dependent
    assert planned(api) == [(down, T + 10 * S)]
    end(api, r["run_id"], T + 20 * S)  # as its scheduler computes it: the old schedule's next start
    assert planned(api) == [(down, T + 10 * S)]
    assert scalar(api, "SELECT next_start FROM pgsched.job_stat WHERE job_id = %s", (down,)) == T + 10 * S


def test_a_close_under_repeatable_read_fails_rather_than_miss_another_close_s_mark(api: Conn, db: str) -> None:
    """A close in a REPEATABLE READ transaction (run_job's, in a caller's session) reads its snapshot: the
    edges' lock raises a serialization failure where another upstream's close marked them since,
    instead of the dependent missing that mark."""
    a, b = add_job(api, T), add_job(api, T)
    down = after(api, [a, b])
    me = register(api, T - S)
    runs = {r["job_id"]: r for r in claim(api, me, T, workers=4)}
    with psycopg.connect(db) as rr:
        rr.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        rr.execute("SELECT 1")  # its snapshot: before b's close
        end(api, runs[b]["run_id"], T + S)
        with pytest.raises(psycopg.errors.SerializationFailure):
            rr.execute("SELECT pgsched._mark_end_v2(%s, 'success', NULL, NULL, NULL, finished_at => %s)",
                       (runs[a]["run_id"], T + S))
        rr.rollback()
    assert planned(api) == []
    end(api, runs[a]["run_id"], T + 2 * S)  # retried, reading committed: both marks are there
    assert planned(api) == [(down, T)]


def test_pg_cron_s_schedule_keeps_an_after_job_s_plans_and_a_new_schedule_drops_them(api: Conn) -> None:
    up = add_job(api, T)
    down = int(scalar(api, "SELECT pgsched.add_job('ok_fn', NULL, depends_on => %s, job_name => 'down')",
                      ([str(up)],)))
    me = register(api, T - S)
    run_once(api, me, T)  # the first plan is pending
    # a second success of the upstream (as its close reports it): that plan waits behind the first
    assert scalar(api, "SELECT pgsched._upstreams_succeeded(%s, %s, now => %s)", ([up], [T + 10 * S], T + 11 * S)) == 1
    assert planned(api) == [(down, T), (down, T + 10 * S)]
    api.execute("SELECT pgsched.schedule('down', '@after', 'SELECT 1')")
    assert planned(api) == [(down, T), (down, T + 10 * S)]
    api.execute("SELECT pgsched.schedule('down', '*/5 * * * *', 'SELECT 1')")
    assert planned(api) == []
    assert scalar(api, "SELECT upstream_backlog FROM pgsched.job_stat WHERE job_id = %s", (down,)) is None


def test_an_ordinary_role_moves_its_after_job_to_a_schedule_and_back(api: Conn, db: str) -> None:
    """alter_job and pg_cron's schedule() write the job's waiting plans as the invoker: an owner
    without other rights can do both (and row-level security keeps it to its own jobs)."""
    with as_new_role(api, db, "dep_owner"):
        up = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'up_mine')"))
        down = int(scalar(api, "SELECT pgsched.add_job('ok_fn', NULL, depends_on => '{up_mine}', "
                               "job_name => 'down_mine')"))
        api.execute("SELECT pgsched.alter_job(%s, schedule => '5 minutes')", (down,))
        api.execute("SELECT pgsched.alter_job(%s, schedule => '@after')", (down,))
        api.execute("SELECT pgsched.schedule('down_mine', '*/5 * * * *', 'SELECT 1')")
        assert scalar(api, "SELECT schedule FROM pgsched.jobs WHERE job_id = %s", (down,)) == "*/5 * * * *"
        assert scalar(api, "SELECT depends_on FROM pgsched.jobs WHERE job_id = %s", (down,)) == [up]


def test_a_close_reads_its_jobs_and_their_dependents_by_key_however_many_jobs_there_are(api: Conn) -> None:
    """The close's dependency bookkeeping (its locks in one order, _upstreams_succeeded) reads the rows
    of the runs' jobs and of their dependents, not every job_stat row and every edge. Its statements
    keep a plan for the session from their first calls, so the close measured comes after a dozen:
    with 400 jobs, half '@after' the one before, the plans they made once read every job_stat row at
    each close (434 rows a close of 8; 41 now). pg_stat_xact_user_tables counts what one transaction
    read."""
    api.execute("SELECT pgsched.add_job('ok_fn', '1 minute', job_name => 'up' || i) FROM generate_series(1, 200) i")
    api.execute("SELECT pgsched.add_job('ok_fn', NULL, depends_on => ARRAY['up' || i]) FROM generate_series(1, 200) i")
    api.execute("UPDATE pgsched.job_stat s SET next_start = %s FROM pgsched.job j "
                "WHERE j.job_id = s.job_id AND j.schedule <> '@after'", (T,))
    api.execute("ANALYZE pgsched.job_stat, pgsched.job_dependency, pgsched.job")
    me = register(api, T - S)

    def read() -> dict[str, int]:
        return {str(r["relname"]): int(r["n"]) for r in rows(
            api, "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS n "
                 "FROM pg_stat_xact_user_tables WHERE schemaname = 'pgsched' "
                 "AND relname IN ('job_stat', 'job_dependency')")}

    for i in range(13):
        at = T + i * S
        got = claim(api, me, at, workers=8)
        assert len(got) == 8, i
        ends = [{"run_id": r["run_id"], "outcome": "success", "finished_at": (at + S / 2).isoformat(),
                 "next_start": None if r["schedule"] == "@after" else (at + timedelta(hours=1)).isoformat(),
                 "lease_token": r["lease_token"]} for r in got]
        api.execute("BEGIN")
        before = read()
        closed = rows(api, "SELECT * FROM pgsched._close_runs(%s)", (Jsonb(ends),))
        after_close = read()
        api.execute("COMMIT")
        assert len(closed) == 8, i
    # The last close: its 8 runs' jobs and their dependents, a few reads each.
    assert after_close["job_stat"] - before.get("job_stat", 0) < 100, (before, after_close)
    assert after_close["job_dependency"] - before.get("job_dependency", 0) < 50, (before, after_close)
    # and each upstream's success planned its dependent (due at the upstream's plan time, behind the
    # upstreams of lower ids due then too)
    assert scalar(api, "SELECT count(*) FROM pgsched.job_stat s JOIN pgsched.job j USING (job_id) "
                       "WHERE j.schedule = '@after' AND s.next_start = %s", (T,)) == 13 * 8


def test_one_close_plans_each_of_two_thousand_dependents_of_its_upstream_once(api: Conn) -> None:
    """Fan-out at scale: an upstream with 2,000 '@after' dependents; its run's close gives each one plan,
    with its plan time, and leaves no edge marked (one upstream each: set and consumed at once). The
    statement joins its dependents by hash, by key to the tables: as nested loops it compared every
    edge with every dependent made ready (4 million pairs here)."""
    up = add_job(api, T, job_name="source")
    api.execute("SELECT pgsched.add_job('ok_fn', NULL, depends_on => '{source}') FROM generate_series(1, 2000)")
    me = register(api, T - S)
    [r] = run_once(api, me, T)
    assert r["job_id"] == up
    assert scalar(api, "SELECT count(*) FROM pgsched.job_stat s JOIN pgsched.job j USING (job_id) "
                       "WHERE j.schedule = '@after' AND s.next_start = %s AND s.upstream_backlog IS NULL", (T,)) == 2000
    assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency WHERE succeeded_plan IS NOT NULL") == 0


def test_an_upstream_is_deleted_whatever_its_dependents_name_and_whoever_owned_them(api: Conn, db: str) -> None:
    """Deleting an upstream rewrites its dependents' depends_on, whoever deletes it: neither another
    id a dependent named without an edge (unknown, or a job its owner may not see) nor a dependent's
    owner dropped since may stop the deletion."""
    hidden_role = "hider_" + str(abs(hash(db)) % 100000)
    api.execute(f"CREATE ROLE {hidden_role} LOGIN")
    try:
        api.execute(f"SET ROLE {hidden_role}")
        hidden = int(scalar(api, "SELECT pgsched.schedule('hidden', '1 hour', 'SELECT 1')"))
        api.execute("RESET ROLE")
        with as_new_role(api, db, "namer") as namer:
            visible = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'visible')"))
            for name, ids in (("with_hidden", [visible, hidden]), ("with_unknown", [visible, 999999])):
                api.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule, depends_on) "
                            "VALUES (%s, 'command', 'SELECT 1', '@after', %s)", (name, ids))
            api.execute("RESET ROLE")
            # a dependent whose owner saw the upstream (a member of its owner), and is then dropped
            gone = f"gone_{namer}"
            api.execute(f"CREATE ROLE {gone} LOGIN")
            api.execute(f"GRANT {namer} TO {gone}")
            api.execute("INSERT INTO pgsched.job (job_name, owner, kind, command, schedule, depends_on) "
                        f"VALUES ('orphan', '{gone}', 'command', 'SELECT 1', '@after', %s)", ([visible],))
            assert scalar(api, "SELECT count(*) FROM pgsched.job_dependency WHERE upstream_id = %s", (visible,)) == 3
            api.execute(f"DROP ROLE {gone}")
            api.execute("SELECT pgsched.delete_job(%s)", (visible,))
            got = api.execute("SELECT job_name, depends_on FROM pgsched.job WHERE job_name IN "
                              "('with_hidden', 'with_unknown', 'orphan') ORDER BY 1").fetchall()
            # The orphan had its edge: disabled like the others, told the upstream's id only (a dropped
            # role may see nothing). Before 2026-11-29 the deletion asked who might see the upstream
            # then, and left it as it was.
            assert got == [("orphan", None), ("with_hidden", [hidden]), ("with_unknown", [999999])]
            assert scalar(api, "SELECT s.disabled_reason FROM pgsched.job_stat s JOIN pgsched.job j USING (job_id) "
                               "WHERE j.job_name = 'orphan'").startswith(f"upstream job {visible} deleted")
            api.execute(f"SET ROLE {namer}")
    finally:
        api.execute("RESET ROLE")
        api.execute("DELETE FROM pgsched.job")
        api.execute(f"DROP ROLE {hidden_role}")


def test_an_upstream_kept_without_an_edge_gets_none_at_a_later_change(api: Conn, db: str) -> None:
    """An id a job named while it could not see it (or before it existed) has no edge. A later change
    of the job's depends_on checks what it adds, and makes edges for that only: an edge made for the
    kept id would skip the cycle check (here X already runs after A)."""
    suffix = str(abs(hash(db)) % 100000)
    ra, rb = f"cyc_a_{suffix}", f"cyc_b_{suffix}"
    for role in (ra, rb):
        api.execute(f"CREATE ROLE {role} LOGIN")
    api.execute(f"GRANT {ra} TO {rb}")  # rb sees ra's jobs, not the other way round
    try:
        insert = ("INSERT INTO pgsched.job (job_id, job_name, kind, command, schedule, depends_on) OVERRIDING "
                  "SYSTEM VALUE VALUES (%s, %s, 'command', 'SELECT 1', %s, %s)")
        api.execute(f"SET ROLE {ra}")
        api.execute(insert, (900000, "a", "@after", [900001]))  # X does not exist yet
        api.execute(insert, (900002, "y", "1 hour", None))
        api.execute(f"SET ROLE {rb}")
        api.execute(insert, (900001, "x", "@after", [900000]))  # X runs after A; A may not see X
        api.execute("RESET ROLE")
        api.execute(f"ALTER ROLE {ra} SUPERUSER")  # now A's owner sees X
        api.execute("UPDATE pgsched.job SET depends_on = '{900001,900002}' WHERE job_id = 900000")
        edges = set(api.execute("SELECT job_id, upstream_id FROM pgsched.job_dependency").fetchall())
        assert edges == {(900001, 900000), (900000, 900002)}
    finally:
        api.execute("RESET ROLE")
        api.execute("DELETE FROM pgsched.job WHERE job_id BETWEEN 900000 AND 900002")
        for role in (rb, ra):
            api.execute(f"DROP ROLE {role}")


def test_naming_a_job_one_may_not_see_does_not_hold_up_its_deletion(api: Conn, db: str) -> None:
    """A new job naming a hidden id gets no edge, and takes no lock on that job either: its owner's
    deletion does not wait for the other transaction (nor does the namer learn it is under way)."""
    with as_new_role(api, db, "hider4") as hider:
        hidden = int(scalar(api, "SELECT pgsched.add_job('ok_fn', '1 hour', job_name => 'hidden4')"))
        with _sibling_role(api, hider, "namer4") as namer:
            with psycopg.connect(db, autocommit=True) as other:
                other.execute(f"SET ROLE {namer}")
                other.execute("BEGIN")
                other.execute("INSERT INTO pgsched.job (job_name, kind, command, schedule, depends_on) "
                              "VALUES ('names_hidden', 'command', 'SELECT 1', '@after', %s)", ([hidden],))
                api.execute("SET lock_timeout = '2s'")
                try:
                    api.execute("SELECT pgsched.delete_job(%s)", (hidden,))
                finally:
                    api.execute("RESET lock_timeout")
                other.execute("COMMIT")
            assert scalar(api, "SELECT count(*) FROM pgsched.job WHERE job_id = %s", (hidden,)) == 0
            assert scalar(api, "SELECT depends_on FROM pgsched.job WHERE job_name = 'names_hidden'") == [hidden]


def test_pausing_one_upstream_while_another_is_deleted_does_not_deadlock(api: Conn, db: str) -> None:
    """D runs after P and U. A session holds D's job_stat row; meanwhile P is paused (which disables
    D) and U deleted (which disables D too): both take D's row before its job_stat row, so when the
    session lets go both finish, and D names the deleted upstream."""
    p, u = add_job(api, T, job_name="paused_p"), add_job(api, T, job_name="deleted_u")
    d = after(api, [p, u])
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM pgsched.job_stat WHERE job_id = %s FOR UPDATE", (d,))
        pause, pause_errors = in_thread(db, "SELECT pgsched.alter_job(%s, scheduled => false) /* paused_p */", (p,))
        wait_for_a_lock_wait(api, "paused_p")
        delete, delete_errors = in_thread(db, "SELECT pgsched.delete_job(%s) /* deleted_u */", (u,))
        wait_for_a_lock_wait(api, "deleted_u")
        holder.execute("COMMIT")
        pause.join(10)
        delete.join(10)
    assert pause_errors == [] and delete_errors == [], (pause_errors, delete_errors)
    st = rows(api, "SELECT j.depends_on, j.scheduled, s.disabled_reason FROM pgsched.job j "
                   "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (d,))[0]
    assert (st["depends_on"], st["scheduled"]) == ([p], False), st
    assert st["disabled_reason"].startswith(f"upstream job {u} (deleted_u) deleted"), st


@pytest.mark.parametrize("other", ["upstream deleted", "alter_job", "job deleted"])
def test_a_close_that_disables_its_job_meanwhile_another_change_takes_the_job_s_row_does_not_deadlock(
        api: Conn, db: str, other: str) -> None:
    """D has a run open (and runs after U). A session holds D's job_stat row; meanwhile D's close
    disables it (max_retries reached, say), and U is deleted (which disables D too), D is changed by
    alter_job, or D is deleted. The close takes D's row before its run and its job_stat row, as the
    others take them, so when the session lets go both finish (before, the close took the job_stat row
    first and D's row last, the others the other way round: 40P01). D ends disabled, its run closed;
    named the deleted upstream, or with the change made and the close's reason; or gone."""
    u = add_job(api, T + 3600 * S, job_name="deleted_u")
    d = add_job(api, T, job_name="closing_d", depends_on=[str(u)] if other == "upstream deleted" else None)
    me = register(api, T - S)
    (run,) = claim(api, me, T)
    assert run["job_id"] == d
    change_sql = {"upstream deleted": ("SELECT pgsched.delete_job(%s) /* the change */", u),
                  "alter_job": ("SELECT pgsched.alter_job(%s, priority => 3) /* the change */", d),
                  "job deleted": ("SELECT pgsched.delete_job(%s) /* the change */", d)}[other]
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM pgsched.job_stat WHERE job_id = %s FOR UPDATE", (d,))
        close, close_errors = in_thread(
            db, "SELECT pgsched._mark_end_v2(%s, 'failure', NULL, 'boom', NULL, finished_at => %s, "
                "disable_reason => 'max_retries reached', lease_token => %s) /* closing_d */",
            (run["run_id"], T + S, run["lease_token"]))
        wait_for_a_lock_wait(api, "closing_d")
        change, change_errors = in_thread(db, change_sql[0], (change_sql[1],))
        wait_for_a_lock_wait(api, "the change")
        holder.execute("COMMIT")
        close.join(10)
        change.join(10)
    assert close_errors == [] and change_errors == [], (close_errors, change_errors)
    if other == "job deleted":
        assert scalar(api, "SELECT count(*) FROM pgsched.job_run WHERE job_id = %s", (d,)) == 0
        assert scalar(api, "SELECT count(*) FROM pgsched.job WHERE job_id = %s", (d,)) == 0
        return
    st = rows(api, "SELECT j.depends_on, j.scheduled, j.priority, s.state, s.disabled_reason FROM pgsched.job j "
                   "JOIN pgsched.job_stat s USING (job_id) WHERE job_id = %s", (d,))[0]
    assert (st["depends_on"], st["scheduled"], st["state"]) == (None, False, "disabled"), st
    if other == "upstream deleted":
        assert st["disabled_reason"].startswith(f"upstream job {u} (deleted_u) deleted"), st
    else:
        assert (st["priority"], st["disabled_reason"]) == (3, "max_retries reached"), st
    assert scalar(api, "SELECT outcome FROM pgsched.job_run WHERE run_id = %s", (run["run_id"],)) == "failure"


def test_watch_shows_a_running_dependent_disabled_by_its_upstream_s_pause(api: Conn, db: str) -> None:
    """Pausing an upstream disables its dependent while the dependent runs: the job stays 'starting'
    (with the reason) until its run ends, and its job_disabled event is shown by `pgsched watch`,
    which takes the reason as the views' bearing the event out."""
    import json

    from pgsched.ops import query, watch

    up = add_job(api, T + 3600 * S, job_name="paused_up")
    down = add_job(api, T, depends_on=[str(up)])
    me = register(api, T - S)
    (run,) = claim(api, me, T)
    assert run["job_id"] == down
    api.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (up,))
    with query.connect(db) as conn:
        e = watch.describe(conn, json.dumps({"event": "job_disabled", "job_id": down, "run_id": None}))
        assert e is not None and e["state"] == "starting", e
        assert e["disabled_reason"].startswith(f"upstream job {up} (paused_up) is disabled"), e
        # A job that exists, is not disabled and has no reason bears out no job_disabled event
        # (nor does one that does not exist).
        other = add_job(api, T + 3600 * S, job_name="never_paused")
        assert watch.describe(conn, json.dumps({"event": "job_disabled", "job_id": other})) is None
        assert watch.describe(conn, json.dumps({"event": "job_disabled", "job_id": other + 10_000})) is None
