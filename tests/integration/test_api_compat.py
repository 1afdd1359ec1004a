"""The compatibility rule (pgsched/api.py) checked against the previous release itself.

Release 0.1.0 (API 1, reached through git: tests/previous_release.py) installs its schema;
the internal functions its Python calls are read from its source and their definitions
from its schema; then `init` of this code runs over it, as in a rolling upgrade. Each call
of the previous release must still resolve, to exactly one function, with exactly the same
result (a running instance's prepared `SELECT *` fails if the result's shape changes: "cached
plan must not change result type", at every claim in release 0.1.0's pipelined claim), and be
the same function as before init (its oid: see the last test).

This is the static half; tests/acceptance/test_rolling_upgrade.py runs the old instances.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from pgsched import api, migrate
from tests import previous_release
from tests.integration.helpers import Conn, rows


@dataclass(frozen=True)
class Signature:
    name: str
    args: tuple[str, ...]
    defaults: int  # how many trailing arguments may be left out
    result: str  # pg_get_function_result (TABLE(...), SETOF a type, a type), and a row type's columns

    @property
    def required(self) -> int:
        return len(self.args) - self.defaults

    def serves(self, old: Signature) -> bool:
        """Every call `old` accepted (positional, as the scheduler calls) reaches this with the same result."""
        return (self.name == old.name and self.args[:len(old.args)] == old.args and self.required <= old.required
                and self.result == old.result)


def signatures(conn: Conn, names: set[str]) -> list[Signature]:
    # A function returning a composite type (SETOF pgsched._launch_row) shows only the type's
    # name: its columns are the result's shape too.
    return [Signature(r["proname"], tuple(r["args"]), r["pronargdefaults"], r["result"]) for r in rows(
        conn, """SELECT p.proname, p.proargtypes::oid[]::regtype[]::text[] AS args, p.pronargdefaults,
                        pg_get_function_result(p.oid) || coalesce(' (' || (
                            SELECT string_agg(format('%%I %%s', a.attname, format_type(a.atttypid, a.atttypmod)),
                                              ', ' ORDER BY a.attnum)
                              FROM pg_attribute a
                             WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) || ')', '')
                            AS result
                   FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype
                  WHERE p.pronamespace = 'pgsched'::regnamespace AND p.proname = ANY (%s)
                  ORDER BY 1, 2""", (sorted(names),))]


def called_by_previous_release() -> set[str]:
    """The internal functions the previous release's Python calls (its side of the contract)."""
    found: set[str] = set()
    for path in (previous_release.source() / "pgsched").glob("*.py"):
        found |= set(re.findall(r"pgsched\.(_[a-z0-9_]+)\(", path.read_text()))
    return found


@pytest.fixture
def old_schema(empty_db: str) -> Iterator[Conn]:
    """A database with the previous release's schema, as its own `pgsched init` left it."""
    previous_release.init(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as c:
        yield c


def test_this_release_serves_the_previous_ones_calls(old_schema: Conn) -> None:
    assert api.API_VERSION == previous_release.API + 1
    calls = called_by_previous_release()
    # What the scheduler of 0.1.0 lives on: if this list came out empty or short, the scan is broken.
    assert {"_claim", "_heartbeat", "_abandoned_runs", "_finish_runs", "_register_instance", "_next_due",
            "_take_over", "_catch_up", "_deploy_code_jobs", "_renew_lease", "_mark_start", "_mark_end"} <= calls
    old = signatures(old_schema, calls)
    assert {s.name for s in old} == calls  # each exists in its own schema
    result = migrate.init(old_schema)
    # 0.1.0's instances refuse a pgsched.migration not exactly theirs: later ones go to the second ledger.
    assert all(migrate.ledger(v) == "pgsched.schema_migration" for v in result.applied)
    assert result.api is not None and result.api.serves(previous_release.API)
    new = signatures(old_schema, calls)
    problems = []
    for o in old:
        serving = [n for n in new if n.name == o.name and n.args[:len(o.args)] == o.args
                   and n.required <= o.required]
        if len(serving) != 1:
            problems.append(f"{o}: {len(serving)} functions accept its calls ({serving})")
        elif not serving[0].serves(o):
            problems.append(f"{o}: now {serving[0]}")
    assert not problems, "\n".join(problems)
    assert migrate.check_version(old_schema) == migrate.code_version()


def test_migrations_after_release_0_1_0_leave_its_instances_working(
        old_schema: Conn, empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Release 0.1.0's instances refuse, on every reconnect, a schema whose pgsched.migration is not
    exactly theirs: its five migrations are recorded there, every later one in pgsched.schema_migration."""
    theirs = sorted(p.name for p in (previous_release.source() / "sql" / "migrations").glob("*.sql"))
    assert len(theirs) == migrate.RELEASE_0_1_0_MIGRATIONS
    assert [f"{m.version:04d}_{m.name}.sql" for m in migrate.migrations()][:len(theirs)] == theirs
    real = migrate.migrations()
    later = migrate.Migration(len(real) + 1, "later", "CREATE TABLE pgsched.later_table (id integer)")
    monkeypatch.setattr(migrate, "migrations", lambda: [*real, later])
    result = migrate.init(old_schema)
    assert later.version in result.applied
    assert rows(old_schema, "SELECT max(version) AS v FROM pgsched.migration")[0]["v"] == len(theirs)
    assert rows(old_schema, "SELECT version FROM pgsched.schema_migration WHERE name = 'later'") == [
        {"version": later.version}]
    assert previous_release.check_version(empty_db) == ""  # 0.1.0's own check, from its own code
    assert migrate.check_version(old_schema) == later.version
    assert migrate.init(old_schema).applied == []  # recorded: not applied twice


# Reached from release 0.1.0's calls but not kept (README "Upgrading", the race that remains):
# _finish_run, called only in _finish_runs' loop of 0.1.0, whose API 2 body no longer calls it (a
# close of an old instance in that loop at init's commit fails once, and 0.1.0 writes it again with
# the new body); _check_settings and _as_elapsed, the job API's helpers, reached from 0.1.0's deploy
# of Python jobs (only when an instance starts with --app: a start in flight at init's commit
# fails, and its service manager starts it again); the job API takes new settings in them.
GONE_FROM_RELEASE_0_1_0 = {"_finish_run", "_check_settings", "_as_elapsed"}


def reached_from(conn: Conn, names: set[str]) -> set[str]:
    """`names` and the pgsched functions their bodies call, and theirs, in this schema."""
    found, todo = set(names), list(names)
    while todo:
        for r in rows(conn, "SELECT p.prosrc FROM pg_proc p WHERE p.pronamespace = 'pgsched'::regnamespace "
                            "AND p.proname = %s", (todo.pop(),)):
            for name in set(re.findall(r"pgsched\.(_[a-z0-9_]+)\(", r["prosrc"])) - found:
                found.add(name)
                todo.append(name)
    return found


def test_the_previous_releases_functions_keep_their_identity(old_schema: Conn) -> None:
    """Each function the previous release calls, and each its own bodies call, is the same function
    (its oid) after `init`.

    A statement of an old instance that looked a function up and then waited on init's locks
    fails at init's commit if that function was dropped ("cache lookup failed for function N"):
    in 0.1.0's reconnect path (its heartbeat) that error is not caught and the instance exits
    (the CI of 2026-11-29: two of three old instances, init taking 1.8 s). So a function API 1
    calls is replaced in place, never dropped for one with more arguments; so is one its bodies
    call, for a statement that began such a body before init's commit."""
    calls = called_by_previous_release()
    reached = reached_from(old_schema, calls) - GONE_FROM_RELEASE_0_1_0
    assert reached > calls  # the scan of the bodies found the functions they call
    old = {r["oid"]: r["sig"] for r in rows(
        old_schema, "SELECT p.oid::int8 AS oid, p.oid::regprocedure::text AS sig FROM pg_proc p "
                    "WHERE p.pronamespace = 'pgsched'::regnamespace AND p.proname = ANY (%s)", (sorted(reached),))}
    assert len(old) >= len(reached)
    migrate.init(old_schema)
    now = {r["oid"]: r["sig"] for r in rows(
        old_schema, "SELECT p.oid::int8 AS oid, p.oid::regprocedure::text AS sig FROM pg_proc p "
                    "WHERE p.oid = ANY (%s::oid[])", (list(old),))}
    changed = sorted(sig for oid, sig in old.items() if now.get(oid) != sig)
    assert not changed, "\n".join(changed)
