"""pgsched init: migrations recorded with checksums, re-applied API, advisory lock, version checks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgsched import migrate
from pgsched.errors import MigrationChecksumMismatch, SchemaVersionMismatch
from tests.conftest import PgServer
from tests.integration.helpers import SETUP_SQL, Conn, mark_changed, rows, scalar


@pytest.fixture
def bare(empty_db: str) -> Iterator[Conn]:
    """Autocommit connection to a database without pgsched."""
    with psycopg.connect(empty_db, autocommit=True) as c:
        yield c


def state(conn: Conn) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    # Both ledgers (migrate.LEDGERS): release 0.1.0's migrations, and those after them.
    return (conn.execute("SELECT * FROM pgsched.migration UNION ALL SELECT * FROM pgsched.schema_migration "
                         "ORDER BY version").fetchall(),
            conn.execute("SELECT * FROM pgsched.api_state").fetchall())


def test_init_installs(bare: Conn) -> None:
    result = migrate.init(bare)
    n = len(migrate.migrations())
    assert n >= 1
    assert (result.applied, result.api_reapplied, result.version) == (list(range(1, n + 1)), True, n)
    assert migrate.code_version() == n
    assert [r[:3] for r in state(bare)[0]] == [(m.version, m.name, m.checksum) for m in migrate.migrations()]
    assert all(r["version"] <= migrate.RELEASE_0_1_0_MIGRATIONS
               for r in rows(bare, "SELECT version FROM pgsched.migration"))
    assert migrate.check_version(bare) == n
    assert scalar(bare, "SELECT plpython FROM pgsched.api_state") is result.plpython
    for view in ("jobs", "job_stats", "job_history"):
        assert scalar(bare, "SELECT to_regclass(%s) IS NOT NULL", (f"public.{view}",)) is True


def test_second_init_is_a_noop(bare: Conn) -> None:
    first = migrate.init(bare)
    before = state(bare)
    again = migrate.init(bare)
    assert (again.applied, again.api_reapplied, again.version, again.plpython) == \
        ([], False, first.version, first.plpython)
    assert state(bare) == before


def test_concurrent_init_applies_once(bare: Conn, empty_db: str) -> None:
    barrier = threading.Barrier(3)
    results: list[migrate.InitResult] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with psycopg.connect(empty_db, autocommit=True) as c:
                barrier.wait(timeout=10)
                results.append(migrate.init(c))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    n = migrate.code_version()
    assert sorted(len(r.applied) for r in results) == [0, 0, n]
    assert sum(r.api_reapplied for r in results) == 1
    assert len(state(bare)[0]) == n


def test_newer_schema_is_refused(bare: Conn) -> None:
    migrate.init(bare)
    bare.execute("INSERT INTO pgsched.migration (version, name, checksum) VALUES (999, 'future', 'x')")
    before = state(bare)
    with pytest.raises(SchemaVersionMismatch) as e:
        migrate.init(bare)
    assert "999" in str(e.value) and "newer" in str(e.value) and "upgrade pgsched" in str(e.value)
    assert state(bare) == before
    with pytest.raises(SchemaVersionMismatch, match="999"):
        migrate.check_version(bare)


def test_edited_migration_is_refused(bare: Conn) -> None:
    migrate.init(bare)
    bare.execute("UPDATE pgsched.migration SET checksum = 'edited' WHERE version = 1")
    before = state(bare)
    with pytest.raises(MigrationChecksumMismatch) as e:
        migrate.init(bare)
    first = migrate.migrations()[0]
    assert f"{first.version:04d}_{first.name}" in str(e.value)
    assert state(bare) == before


def test_upgrade_applies_only_the_new_migration(bare: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.init(bare)
    before = state(bare)[0]
    known = migrate.migrations()
    extra = migrate.Migration(len(known) + 1, "test_extra", "CREATE TABLE pgsched.test_extra (x int);")
    monkeypatch.setattr(migrate, "migrations", lambda: [*known, extra])
    result = migrate.init(bare)
    assert (result.applied, result.api_reapplied, result.version) == ([extra.version], True, extra.version)
    assert state(bare)[0][:-1] == before
    assert scalar(bare, "SELECT to_regclass('pgsched.test_extra') IS NOT NULL") is True
    assert migrate.check_version(bare) == extra.version


def test_failed_migration_leaves_nothing(bare: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    known = migrate.migrations()
    broken = migrate.Migration(len(known) + 1, "broken", "SELECT 1/0;")
    monkeypatch.setattr(migrate, "migrations", lambda: [*known, broken])
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate.init(bare)
    assert scalar(bare, "SELECT to_regnamespace('pgsched') IS NULL") is True


def test_init_without_plpython_gives_a_working_api(bare: Conn) -> None:
    result = migrate.init(bare, plpython=False)
    assert result.plpython is False
    assert scalar(bare, "SELECT plpython FROM pgsched.api_state") is False
    assert scalar(bare, "SELECT pgsched.plpython_available()") is False
    bare.execute(SETUP_SQL)
    with bare.transaction():
        job_id = scalar(bare, "SELECT add_job('ok_fn', '5 minutes')")
        assert scalar(bare, "SELECT next_start = now() FROM job_stats WHERE job_id = %s", (job_id,)) is True
    cron_id = scalar(bare, "SELECT add_job('ok_fn', '*/5 * * * *')")
    assert scalar(bare, "SELECT schedule FROM jobs WHERE job_id = %s", (cron_id,)) == "*/5 * * * *"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="schedule"):
        bare.execute("SELECT add_job('ok_fn', '61 * * * *')")
    bare.execute("CALL run_job(%s)", (job_id,))
    assert scalar(bare, "SELECT total_successes FROM job_stats WHERE job_id = %s", (job_id,)) == 1


def test_switching_plpython_off_reapplies_the_api(bare: Conn) -> None:
    first = migrate.init(bare)
    second = migrate.init(bare, plpython=False)
    assert second.api_reapplied is first.plpython
    assert scalar(bare, "SELECT plpython FROM pgsched.api_state") is False


def test_check_version_without_schema(bare: Conn) -> None:
    with pytest.raises(SchemaVersionMismatch, match="pgsched init"):
        migrate.check_version(bare)


def test_check_version_of_an_old_schema(bare: Conn) -> None:
    migrate.init(bare)
    newest = migrate.code_version()
    bare.execute(sql.SQL("DELETE FROM {} WHERE version = %s").format(sql.SQL(migrate.ledger(newest))), (newest,))
    with pytest.raises(SchemaVersionMismatch, match="run `pgsched init` to upgrade"):
        migrate.check_version(bare)


def test_init_in_a_connection_that_is_not_autocommit(empty_db: str) -> None:
    with psycopg.connect(empty_db) as c:
        result = migrate.init(c)
        assert result.version == migrate.code_version()
    with psycopg.connect(empty_db, autocommit=True) as c:
        assert migrate.check_version(c) == result.version


PUBLIC_SQL = Path(migrate.__file__).resolve().parent.parent / "sql" / "api" / "90_public.sql"
WRAPPERS = "SELECT oid, oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1"


def test_public_wrappers_survive_reapply_and_stale_ones_go(conn: Conn) -> None:
    wrappers = conn.execute(WRAPPERS).fetchall()
    assert len(wrappers) >= 8  # add_job x2, alter_job, delete_job, run_job, schedule x2, unschedule x2
    conn.execute(PUBLIC_SQL.read_text())
    assert conn.execute(WRAPPERS).fetchall() == wrappers
    # an older pgsched's wrapper with another signature, and a user's own function
    conn.execute("CREATE FUNCTION public.add_job(proc regproc, schedule text, old_arg integer DEFAULT 0) "
                 "RETURNS integer LANGUAGE sql AS 'SELECT 0'")
    conn.execute("COMMENT ON FUNCTION public.add_job(regproc, text, integer) IS 'pgsched API wrapper'")
    conn.execute("CREATE FUNCTION public.delete_job(job_id integer, force boolean) RETURNS void "
                 "LANGUAGE sql AS 'SELECT'")
    conn.execute(PUBLIC_SQL.read_text())
    assert conn.execute(WRAPPERS).fetchall()[:-1] == wrappers
    assert scalar(conn, "SELECT to_regprocedure('public.add_job(regproc, text, integer)')") is None
    assert scalar(conn, "SELECT to_regprocedure('public.delete_job(integer, boolean)') IS NOT NULL") is True
    conn.execute(SETUP_SQL)
    assert scalar(conn, "SELECT add_job('ok_fn', '5 minutes')") == 1000


def test_user_object_with_an_api_name_is_left_alone(bare: Conn) -> None:
    bare.execute("CREATE VIEW public.jobs AS SELECT 1 AS mine")
    warnings: list[str] = []
    bare.add_notice_handler(lambda d: warnings.append(d.message_primary or ""))
    migrate.init(bare)
    assert scalar(bare, "SELECT mine FROM public.jobs") == 1
    assert any("public.jobs exists" in w for w in warnings), warnings
    assert scalar(bare, "SELECT count(*) FROM pgsched.jobs") == 0


@pytest.mark.plpython
def test_switching_plpython_off_removes_the_plpython_functions(bare: Conn, pg_server: PgServer) -> None:
    if not pg_server.plpython:
        pytest.skip("PL/Python is not installed in the test cluster")
    assert migrate.init(bare).plpython
    assert scalar(bare, "SELECT to_regprocedure('pgsched.next_runs(text, integer, text, timestamptz)')") is not None
    assert migrate.init(bare, plpython=False).plpython is False
    assert scalar(bare, "SELECT pgsched.plpython_available()") is False
    assert scalar(bare, "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                        "WHERE l.lanname = 'plpython3u'") == 0
    # next_runs stays, now the plain-SQL one (sql/api/05_cron.sql), and works
    assert scalar(bare, "SELECT count(*) FROM pgsched.next_runs('*/5 * * * *', 3)") == 3
    bare.execute(SETUP_SQL)
    assert scalar(bare, "SELECT add_job('ok_fn', '*/5 * * * *')") >= 1000


def test_upgrade_replaces_internal_functions_whose_arguments_or_result_changed(bare: Conn) -> None:
    """An older release's internal functions (another result type, an extra overload) are replaced,
    not kept beside the new ones nor refused by CREATE OR REPLACE."""
    migrate.init(bare)
    with bare.transaction():
        bare.execute("DROP FUNCTION pgsched._unplanned(integer)")
        bare.execute("""CREATE FUNCTION pgsched._unplanned(max_rows integer)
                        RETURNS TABLE (job_id integer, schedule text) LANGUAGE sql AS $$ SELECT 1, 'x' $$""")
        bare.execute("""CREATE FUNCTION pgsched._mark_start(job_id integer, plan_time timestamptz)
                        RETURNS bigint LANGUAGE sql AS $$ SELECT -1::bigint $$""")
        bare.execute("UPDATE pgsched.api_state SET checksum = 'an older release'")
    assert migrate.init(bare).api_reapplied is True
    assert scalar(bare, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgsched'::regnamespace "
                        "AND proname = '_mark_start'") == 1
    out = scalar(bare, "SELECT proargnames[array_length(proargnames, 1)] FROM pg_proc "
                       "WHERE oid = 'pgsched._unplanned'::regproc")
    assert out == "infinite"  # this release's result, not the old one
    # The API works on top: a job can be added and its run marked.
    bare.execute(SETUP_SQL)
    job = scalar(bare, "SELECT pgsched.add_job('ok_fn', '5 minutes')")
    assert scalar(bare, "SELECT pgsched._mark_start(%s, now(), 'manual')", (job,)) > 0


@pytest.fixture
def schedulers_hold(empty_db: str) -> Iterator[Callable[[], None]]:
    """Take, in another session, the locks running schedulers hold while they claim and close: ROW
    EXCLUSIVE on every pgsched table (they write job, job_stat, the history, instance, ...), ACCESS
    SHARE on every pgsched view (a claim reads _job_launch), until the test ends."""
    with psycopg.connect(empty_db) as holder:
        def relations(kinds: str) -> sql.Composable:
            names = [str(r[0]) for r in holder.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'pgsched'::regnamespace "
                "AND relkind = ANY (string_to_array(%s, ',')::char[]) AND NOT relispartition", (kinds,))]
            assert names
            return sql.SQL(", ").join(sql.Identifier("pgsched", n) for n in names)

        def hold() -> None:
            holder.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(relations("r,p")))
            holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(relations("v")))
        yield hold
        holder.rollback()


def _reapply_waiting_in_line(bare: Conn, monkeypatch: pytest.MonkeyPatch) -> migrate.InitResult:
    """init's re-apply of the API, waiting for a lock at most 1 s and not giving way first (so a
    lock it needs and cannot have fails it: LockNotAvailable)."""
    monkeypatch.setattr(migrate, "GIVE_WAY_FOR", 0.0)
    bare.execute("SET lock_timeout = '1s'")
    bare.execute("UPDATE pgsched.api_state SET checksum = 'another release'")
    return migrate.init(bare)


def test_a_reapply_that_changes_no_view_or_trigger_waits_for_no_running_scheduler(
        bare: Conn, schedulers_hold: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing a trigger locks its table against every write, a view against every read, until
    init commits: a reapply whose views and triggers are as they were leaves them alone
    (pgsched._replace_if_changed), so it takes no lock a running scheduler's claim or close waits
    for (before, the first file's triggers locked job and job_stat for the whole reapply)."""
    migrate.init(bare)
    views = scalar(bare, "SELECT count(*) FROM pg_class WHERE relnamespace = 'pgsched'::regnamespace "
                         "AND relkind = 'v'")
    assert views >= 10
    schedulers_hold()
    assert _reapply_waiting_in_line(bare, monkeypatch).api_reapplied is True


def test_a_view_or_trigger_whose_text_changed_or_that_is_gone_is_replaced(
        bare: Conn, schedulers_hold: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.init(bare)
    mark = scalar(bare, "SELECT obj_description('pgsched.jobs'::regclass, 'pg_class')")
    assert mark.startswith("pgsched: defined by sql/api, definition sha256 ")
    # Another text (as an older release's file) and a trigger dropped by hand.
    mark_changed(bare, "VIEW pgsched.jobs")
    bare.execute("DROP TRIGGER job_touch ON pgsched.job")
    assert _reapply_waiting_in_line(bare, monkeypatch).api_reapplied is True
    assert scalar(bare, "SELECT obj_description('pgsched.jobs'::regclass, 'pg_class')") == mark
    assert scalar(bare, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgsched.job'::regclass "
                        "AND tgname = 'job_touch'") == 1
    # A view that changed is replaced even though a scheduler reads it: the reapply waits for it.
    mark_changed(bare, "VIEW pgsched._job_launch")
    schedulers_hold()
    with pytest.raises(psycopg.errors.LockNotAvailable):
        _reapply_waiting_in_line(bare, monkeypatch)


def test_an_upgrade_with_a_migration_replaces_every_view_and_trigger(
        bare: Conn, schedulers_hold: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration may change what the same text of a view gives (a column its j.* takes in): with
    one, init replaces them all, as before."""
    migrate.init(bare)
    known = migrate.migrations()
    extra = migrate.Migration(len(known) + 1, "test_extra", "SELECT 1;")
    monkeypatch.setattr(migrate, "migrations", lambda: [*known, extra])
    schedulers_hold()
    with pytest.raises(psycopg.errors.LockNotAvailable):
        _reapply_waiting_in_line(bare, monkeypatch)
