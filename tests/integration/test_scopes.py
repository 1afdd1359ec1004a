"""Scoped (sharded) jobs: each (job, scope, plan_time) is its own run, history row and lease."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.integration.test_scheduler import Conn, one, serve


@pytest.fixture
def shards(conn: Conn) -> Conn:
    conn.execute("CREATE TABLE shards (k text)")
    conn.execute("INSERT INTO shards VALUES ('eu'), ('us'), ('ap'), (NULL), ('eu')")
    conn.execute("CREATE TABLE effects (job_id int, scope text, setting text, plan_time timestamptz)")
    conn.execute("""CREATE PROCEDURE public.per_shard(job_id int, config jsonb) LANGUAGE sql AS $$
                    INSERT INTO effects VALUES (job_id, config->>'scope', current_setting('pgsched.scope'),
                                                current_setting('pgsched.plan_time')::timestamptz) $$""")
    return conn


def scoped_job(conn: Conn, query: str, schedule: str = "2 seconds", config: str = "'{\"batch\": 10}'") -> int:
    job = int(one(conn, f"SELECT add_job('per_shard', '{schedule}', config => {config})"))
    conn.execute("UPDATE pgsched.job SET scope_query = %s WHERE job_id = %s", (query, job))
    return job


def history(conn: Conn, job: int) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT scope, plan_time, outcome, result, message FROM pgsched.job_history "
                        "WHERE job_id = %s ORDER BY plan_time, scope", (job,)).fetchall()


def test_each_scope_of_each_plan_runs_once_with_its_key(db: str, shards: Conn) -> None:
    job = scoped_job(shards, "SELECT k FROM shards")

    def two_plans_done() -> bool:
        rows = history(shards, job)
        plans = {p for s, p, o, *_ in rows if s == "" and o == "success"}
        done = Counter(p for s, p, o, *_ in rows if s and o == "success")
        return sum(1 for p in plans if done[p] == 3) >= 2

    serve(db, two_plans_done, timeout=20)
    rows = history(shards, job)
    plans = sorted({p for s, p, *_ in rows if s == ""})
    for plan in plans[:2]:
        mine = [(s, o, r) for s, p, o, r, _ in rows if p == plan]
        # The plan run found three distinct keys (NULL and the duplicate are dropped) and queued one run each.
        assert mine[0] == ("", "success", {"scopes": 3}), mine
        assert sorted((s, o) for s, o, _ in mine[1:]) == [("ap", "success"), ("eu", "success"), ("us", "success")]
    effects = shards.execute("SELECT scope, setting, plan_time, count(*) FROM effects GROUP BY 1, 2, 3").fetchall()
    assert all(n == 1 for *_, n in effects), effects  # no (scope, plan) ran twice
    assert all(scope == setting for scope, setting, _, _ in effects)  # config and pgsched.scope agree
    done = {(s, p) for s, p, o, *_ in rows if s and o == "success"}
    assert done <= {(s, p) for s, _, p, _ in effects}
    # The job's totals count plan runs and scope runs; nothing is left running or queued once it stops.
    st = shards.execute("SELECT total_runs, total_successes, total_crashes, state FROM pgsched.job_stats "
                        "WHERE job_id = %s", (job,)).fetchone()
    finished = [o for _, _, o, *_ in history(shards, job) if o not in ("queued", "running")]
    assert st is not None and st[0] == st[1] == len(finished) and st[2] == 0, (st, finished)


def test_the_scope_key_is_merged_into_the_config(db: str, shards: Conn) -> None:
    shards.execute("CREATE TABLE configs (c jsonb)")
    shards.execute("""CREATE PROCEDURE public.keep_config(job_id int, config jsonb) LANGUAGE sql
                      AS $$ INSERT INTO configs VALUES (config) $$""")
    job = int(one(shards, "SELECT add_job('keep_config', '1 hour', config => '{\"batch\": 10}')"))
    shards.execute("UPDATE pgsched.job SET scope_query = 'VALUES (''x'')' WHERE job_id = %s", (job,))
    serve(db, lambda: one(shards, "SELECT count(*) FROM configs") >= 1, timeout=10)
    assert one(shards, "SELECT c FROM configs") == {"batch": 10, "scope": "x"}


@pytest.mark.parametrize(("query", "sqlstate", "text"), [
    ("SELECT nope FROM shards", "42703", "nope"),
    # Two statements cannot hide in the subquery the scheduler wraps the query in.
    ("SELECT k FROM shards; DELETE FROM shards", "42601", "syntax"),
    # The query runs read-only: a function with side effects cannot write.
    ("SELECT k FROM shards, LATERAL (SELECT pg_catalog.nextval('effects_seq')) AS x", "25006", "read-only"),
])
def test_a_bad_scope_query_fails_the_plan_and_writes_nothing(db: str, shards: Conn, query: str, sqlstate: str,
                                                              text: str) -> None:
    shards.execute("CREATE SEQUENCE effects_seq")
    job = scoped_job(shards, query, schedule="1 hour")
    serve(db, lambda: any(o == "failure" for _, _, o, *_ in history(shards, job)), timeout=10)
    rows = history(shards, job)
    assert [(s, o) for s, _, o, *_ in rows] == [("", "failure")], rows
    assert text in rows[0][4] and rows[0][4].startswith("scope_query: "), rows
    assert one(shards, "SELECT sqlstate FROM pgsched.job_history WHERE job_id = %s", job) == sqlstate
    assert one(shards, "SELECT count(*) FROM shards") == 5
    assert one(shards, "SELECT count(*) FROM effects") == 0
