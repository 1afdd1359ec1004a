"""The internal API's version (pgsched/api.py, pgsched._api()): defined once on each side and
in agreement, the window `serve` checks, init's refusal of a newer API, the functions init
drops because no release in the window defines them, and how it replaces the others while
instances run (in place, giving way to their statements)."""

from __future__ import annotations

import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import pgsched
from pgsched import api, migrate
from pgsched.errors import SchemaVersionMismatch
from tests.conftest import PgServer
from tests.integration.helpers import Conn, mark_changed, rows, scalar

REPO = Path(migrate.__file__).resolve().parent.parent


@pytest.fixture
def bare(empty_db: str) -> Iterator[Conn]:
    with psycopg.connect(empty_db, autocommit=True) as c:
        yield c


def fake_api(conn: Conn, api_version: int, oldest: int, release: str) -> None:
    """Make the schema look like another release's (what its init would leave)."""
    conn.execute(sql.SQL("CREATE OR REPLACE FUNCTION pgsched._api(OUT api_version integer, "
                         "OUT oldest_api_served integer, OUT release text) "
                         "LANGUAGE sql AS $$ SELECT {}, {}, {} $$").format(
        sql.Literal(api_version), sql.Literal(oldest), sql.Literal(release)))


def functions(conn: Conn) -> list[str]:
    return [r["f"] for r in rows(conn, "SELECT p.oid::regprocedure::text AS f FROM pg_proc p "
                                       "WHERE p.pronamespace = 'pgsched'::regnamespace ORDER BY 1")]


def wait_until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def force_reapply(conn: Conn) -> None:
    conn.execute("UPDATE pgsched.api_state SET checksum = 'an earlier release'")


# -- one definition on each side, in agreement ----------------------------------------------

def test_the_schema_and_the_code_agree_on_the_api_and_the_release(conn: Conn) -> None:
    row = rows(conn, "SELECT * FROM pgsched._api()")[0]
    assert (row["api_version"], row["release"]) == (api.API_VERSION, pgsched.__version__)
    # Two APIs wide: this release's, and the previous one's instances keep working.
    assert row["oldest_api_served"] == api.OLDEST_API_SERVED == api.API_VERSION - 1
    assert api.RELEASE_API[pgsched.__version__] == api.API_VERSION
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # The distribution's version is __version__ itself, not a second copy of it.
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["hatch"]["version"]["path"] == "pgsched/__init__.py"
    assert migrate.schema_api(conn.cursor()) == api.SchemaApi(api.API_VERSION, api.API_VERSION - 1,
                                                               pgsched.__version__)


# -- the window serve checks ------------------------------------------------------------------

def test_a_newer_api_that_still_serves_this_one_is_accepted_with_its_migrations(conn: Conn) -> None:
    n = migrate.code_version()
    fake_api(conn, api.API_VERSION + 1, api.API_VERSION, "9.1.0")
    conn.execute("INSERT INTO pgsched.migration (version, name, checksum) VALUES (%s, 'next', 'x')", (n + 1,))
    assert migrate.check_version(conn) == n + 1


def test_a_schema_that_no_longer_serves_this_api_is_refused_naming_both_versions(conn: Conn) -> None:
    fake_api(conn, api.API_VERSION + 1, api.API_VERSION + 1, "9.1.0")
    with pytest.raises(SchemaVersionMismatch) as e:
        migrate.check_version(conn)
    assert str(e.value) == (
        f"the database's pgsched API is {api.API_VERSION + 1} (release 9.1.0, serving API {api.API_VERSION + 1} "
        f"only); this pgsched {pgsched.__version__} speaks API {api.API_VERSION}: replace this instance with "
        "pgsched 9.1.0 (or another release that speaks its API)")


def test_an_older_api_says_to_run_init(conn: Conn) -> None:
    fake_api(conn, api.API_VERSION - 1, api.API_VERSION - 2, "0.0.9")
    with pytest.raises(SchemaVersionMismatch, match=fr"API is {api.API_VERSION - 1} \(release 0\.0\.9.*"
                                                   fr"speaks API {api.API_VERSION}: run `pgsched init` of "
                                                   fr"pgsched {pgsched.__version__} on this database first"):
        migrate.check_version(conn)


def test_a_schema_without_api_function_is_release_0_1_0(conn: Conn) -> None:
    conn.execute("DROP FUNCTION pgsched._api()")
    with pytest.raises(SchemaVersionMismatch,
                       match=r"API is 1 \(release 0\.1\.0, serving API 1 only\).*run `pgsched init`"):
        migrate.check_version(conn)


def test_more_migrations_under_this_same_api_are_refused(conn: Conn) -> None:
    """A release that adds a migration bumps the API: the same API with unknown migrations is not ours."""
    n = migrate.code_version()
    conn.execute("INSERT INTO pgsched.migration (version, name, checksum) VALUES (%s, 'next', 'x')", (n + 1,))
    with pytest.raises(SchemaVersionMismatch, match=f"version {n + 1}.*needs {n}: upgrade pgsched"):
        migrate.check_version(conn)


def test_init_refuses_a_newer_api_and_changes_nothing(conn: Conn) -> None:
    fake_api(conn, api.API_VERSION + 1, api.API_VERSION, "9.1.0")
    before = functions(conn), rows(conn, "SELECT * FROM pgsched.api_state")
    with pytest.raises(SchemaVersionMismatch, match=f"API is {api.API_VERSION + 1} .*newer than this pgsched"):
        migrate.init(conn)
    assert (functions(conn), rows(conn, "SELECT * FROM pgsched.api_state")) == before
    assert scalar(conn, "SELECT release FROM pgsched._api()") == "9.1.0"


def test_init_that_narrows_the_window_refuses_while_an_instance_it_leaves_behind_runs(
        conn: Conn, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that no longer serves API 1 (0.3.0, made here by its window's constant) refuses
    to install under a live 0.1.0 instance, naming it, and changes nothing; instances of served or
    unknown (newer) releases and an instance whose connection is gone do not stop it."""
    def register(c: Conn, release: str) -> int:
        return int(scalar(c, "SELECT instance_id FROM pgsched._register_instance_v2('h1', 4242, %s, 8)", (release,)))

    with psycopg.connect(db, autocommit=True) as old, psycopg.connect(db, autocommit=True) as others:
        old_id = register(old, "0.1.0")
        register(others, pgsched.__version__)
        register(others, "9.0.0")
        monkeypatch.setattr(api, "OLDEST_API_SERVED", api.API_VERSION)
        force_reapply(conn)
        before = functions(conn), rows(conn, "SELECT * FROM pgsched.api_state")
        with pytest.raises(SchemaVersionMismatch) as refused:
            migrate.init(conn)
        assert str(refused.value) == (
            f"pgsched {pgsched.__version__} serves API {api.API_VERSION} to {api.API_VERSION}, and these running "
            f"instances speak an older one: instance {old_id} (release 0.1.0, host h1, pid 4242); upgrade them "
            "to a release in that window first, one release at a time (README, Upgrading), then run this init "
            "again (nothing was changed)")
        assert (functions(conn), rows(conn, "SELECT * FROM pgsched.api_state")) == before
    # Its session is gone: a killed instance is no longer alive, whatever its last heartbeat.
    wait_until(lambda: not scalar(conn, "SELECT alive FROM pgsched.instances WHERE instance_id = %s", (old_id,)))
    assert migrate.init(conn).api_reapplied


def test_the_api_of_a_release_this_code_does_not_know_is_taken_as_newer() -> None:
    live = [api.LiveInstance(1, "h", 1, "0.1.0"), api.LiveInstance(2, "h", 2, "0.2.0"),
            api.LiveInstance(3, "h", 3, "0.9.0"), api.LiveInstance(4, "h", 4, "0.2.0.dev1")]
    assert [i.instance_id for i in api.instances_left_behind(live, 2)] == [1]
    assert api.instances_left_behind(live, 1) == []


def test_init_reports_the_api_it_leaves(bare: Conn) -> None:
    result = migrate.init(bare)
    assert result.api == api.SchemaApi(api.API_VERSION, api.API_VERSION - 1, pgsched.__version__)
    assert migrate.init(bare).api == result.api  # also when there was nothing to do


# -- what init drops ------------------------------------------------------------------------------

def test_reapplying_the_same_release_drops_nothing(bare: Conn, pg_server: PgServer) -> None:
    """Every function the files define is re-created by them, with PL/Python and without."""
    for plpython in (True, False, False, True):
        migrate.init(bare, plpython=plpython)
        before = functions(bare)
        force_reapply(bare)
        result = migrate.init(bare, plpython=plpython)
        assert (result.api_reapplied, result.dropped) == (True, [])
        assert functions(bare) == before
    # A migration's function that the row-security policies use stays, untouched by the files.
    assert scalar(bare, "SELECT to_regprocedure('pgsched._catalog_admin()') IS NOT NULL") is True


def test_an_earlier_releases_internal_functions_are_dropped(conn: Conn) -> None:
    conn.execute("CREATE FUNCTION pgsched._only_an_old_release_called_this(x integer) RETURNS integer "
                 "LANGUAGE sql AS 'SELECT x'")
    conn.execute("CREATE PROCEDURE pgsched._old_procedure() LANGUAGE sql AS 'SELECT 1'")
    # Not ours to drop: a function without the internal prefix (someone's own), and one that
    # something else depends on.
    conn.execute("CREATE FUNCTION pgsched.someones_function() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
    conn.execute("CREATE FUNCTION pgsched._used_by_a_view() RETURNS integer LANGUAGE sql AS 'SELECT 1'")
    conn.execute("CREATE VIEW public.uses_it AS SELECT pgsched._used_by_a_view() AS x")
    force_reapply(conn)
    result = migrate.init(conn)
    assert result.dropped == ["pgsched._old_procedure()", "pgsched._only_an_old_release_called_this(integer)"]
    left = functions(conn)
    assert "pgsched._only_an_old_release_called_this(integer)" not in left
    assert {"pgsched.someones_function()", "pgsched._used_by_a_view()"} <= set(left)


def test_the_previous_apis_functions_are_kept_for_one_release(
        conn: Conn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release keeps a function only the previous API calls by defining it in a file of its
    own; the release after deletes the file, and its init drops the function."""
    compat = tmp_path / "80_api_n_minus_1.sql"
    compat.write_text("CREATE OR REPLACE FUNCTION pgsched._heartbeat_of_the_previous_api(instance_id bigint) "
                      "RETURNS integer LANGUAGE sql AS 'SELECT 1';\n")
    files = migrate.api_files

    def with_compat(with_plpython: bool) -> list[Path]:
        found = files(with_plpython)
        last = [f for f in found if migrate.works_on_every_function(f)]
        return [*(f for f in found if f not in last), compat, *last]

    monkeypatch.setattr(migrate, "api_files", with_compat)
    force_reapply(conn)
    assert migrate.init(conn).dropped == []  # release N+1: kept
    force_reapply(conn)
    assert migrate.init(conn).dropped == []  # and kept as long as the file is there
    assert scalar(conn, "SELECT pgsched._heartbeat_of_the_previous_api(1)") == 1
    monkeypatch.setattr(migrate, "api_files", files)
    result = migrate.init(conn)  # release N+2: the file is gone, so the checksum changed
    assert (result.api_reapplied, result.dropped) == (True, ["pgsched._heartbeat_of_the_previous_api(bigint)"])
    assert scalar(conn, "SELECT to_regprocedure('pgsched._heartbeat_of_the_previous_api(bigint)')") is None


# -- how init replaces: in place, giving way to running statements -------------------------------

def oids(conn: Conn) -> dict[str, int]:
    return {r["f"]: r["oid"] for r in rows(conn, "SELECT p.oid::regprocedure::text AS f, p.oid::bigint AS oid "
                                               "FROM pg_proc p WHERE p.pronamespace = 'pgsched'::regnamespace")}


def test_reapplying_replaces_functions_and_types_in_place(conn: Conn) -> None:
    """A function dropped and created again would get a new oid, which a running instance's
    statement looked up a moment before may no longer find."""
    before = oids(conn)
    launch_row = scalar(conn, "SELECT 'pgsched._launch_row'::regtype::oid")
    force_reapply(conn)
    assert migrate.init(conn).api_reapplied is True
    assert oids(conn) == before
    assert scalar(conn, "SELECT 'pgsched._launch_row'::regtype::oid") == launch_row
    # Outside init, _drop_functions still drops (a file applied by hand replaces its functions whole).
    conn.execute("SELECT pgsched._drop_functions(ARRAY['_unplanned'])")
    assert scalar(conn, "SELECT count(*) FROM pg_proc WHERE proname = '_unplanned'") == 0


def test_a_changed_composite_type_is_created_again_with_its_functions(conn: Conn) -> None:
    conn.execute("ALTER TYPE pgsched._launch_row ADD ATTRIBUTE from_an_older_release integer")
    force_reapply(conn)
    migrate.init(conn)
    assert scalar(conn, "SELECT count(*) FROM pg_attribute WHERE attrelid = 'pgsched._launch_row'::regclass "
                        "AND attname = 'from_an_older_release'") == 0
    # The functions returning it went with it and came back with it.
    assert scalar(conn, "SELECT count(*) FROM pgsched._claim(1, ARRAY[1], ARRAY[1])") == 0
    assert scalar(conn, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgsched'::regnamespace "
                        "AND proname = '_take_over' AND prorettype = 'pgsched._launch_row'::regtype") == 1


def test_init_gives_way_to_a_statement_it_would_deadlock_with(conn: Conn, db: str) -> None:
    """A session holds a lock init needs late (the view job_stats) and then wants one that init
    takes early (a trigger's on pgsched.job): init backs off rather than deadlock with it, so
    the session's statement goes on within a moment, and init succeeds after it. The view and
    the trigger are an earlier release's text, else init leaves them (_replace_if_changed)."""
    force_reapply(conn)
    mark_changed(conn, "VIEW pgsched.job_stats")
    mark_changed(conn, "TRIGGER job_notify ON pgsched.job")
    outcome: list[BaseException | migrate.InitResult] = []
    with psycopg.connect(db, autocommit=True) as session:
        session.execute("BEGIN")
        session.execute("SELECT * FROM pgsched.job_stats LIMIT 0")

        def run_init() -> None:
            try:
                with psycopg.connect(db, autocommit=True) as c:
                    outcome.append(migrate.init(c))
            except BaseException as e:  # reported below
                outcome.append(e)

        worker = threading.Thread(target=run_init)
        worker.start()
        # init takes the trigger's lock on pgsched.job and waits for the view
        wait_until(lambda: scalar(conn, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                                        "WHERE NOT l.granted AND a.datname = current_database()") > 0)
        t0 = time.monotonic()
        session.execute("SET lock_timeout = '5s'")
        session.execute("UPDATE pgsched.job SET job_name = job_name WHERE false")
        waited = time.monotonic() - t0
        session.execute("COMMIT")
        worker.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], migrate.InitResult), outcome
    # Well under deadlock_timeout (1 s), and under a scheduler's lock_timeout (1 s).
    assert waited < 0.8, waited
