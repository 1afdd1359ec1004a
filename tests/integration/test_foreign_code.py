"""Code a role wrote never runs with another role's rights: a check_config stored by a job's owner
runs only in the owner's own session, and pgsched's own sessions resolve no name in `public`
(docs/security.md lists both)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgsched.clock import DbClock
from pgsched.store import Store
from tests.conftest import PgServer
from tests.integration.helpers import scalar
from tests.integration.test_security import OwnerDb, owner_database


@pytest.fixture(scope="module")
def odb(pg_server: PgServer) -> Iterator[OwnerDb]:
    with owner_database(pg_server) as found:
        yield found


def test_a_stored_check_config_runs_only_in_its_owners_own_session(odb: OwnerDb) -> None:
    """bob's check could do anything with the rights of whoever runs it (ALTER ROLE bob SUPERUSER
    as a superuser): an administrator's change of bob's config, even after SET ROLE bob (the check
    could RESET ROLE), does not run it, and says so."""
    with odb.connect() as admin, odb.connect(odb.bob) as bob:
        admin.execute("CREATE FUNCTION public.bob_check(config jsonb) RETURNS void LANGUAGE sql "
                      "AS $$ INSERT INTO public.ran VALUES (NULL, current_user, session_user) $$")
        admin.execute(sql.SQL("ALTER FUNCTION public.bob_check(jsonb) OWNER TO {}").format(sql.Identifier(odb.bob)))
        notices: list[str] = []
        admin.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
        try:
            job = scalar(bob, "SELECT pgsched.add_job('public.job_ok', '1 hour', config => '{}', "
                              "check_config => 'public.bob_check')")
            bob.execute("SELECT * FROM pgsched.alter_job(%s, config => '{\"a\": 1}')", (job,))
            admin.execute("SELECT * FROM pgsched.alter_job(%s, config => '{\"b\": 2}')", (job,))
            admin.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(odb.bob)))
            admin.execute("SELECT * FROM pgsched.alter_job(%s, config_merge => '{\"c\": 3}')", (job,))
            admin.execute("RESET ROLE")
            ran = admin.execute("SELECT who, via FROM public.ran WHERE job_id IS NULL").fetchall()
            config = scalar(admin, "SELECT config FROM pgsched.job WHERE job_id = %s", (job,))
        finally:
            admin.execute("RESET ROLE")
            admin.execute("DELETE FROM pgsched.job")
            admin.execute("DELETE FROM public.ran")
            admin.execute("DROP FUNCTION public.bob_check(jsonb)")
    assert ran == [(odb.bob, odb.bob), (odb.bob, odb.bob)]  # bob's add and bob's alter, nobody else's
    assert config == {"b": 2, "c": 3}  # the administrator's changes were made, unchecked
    assert len(notices) == 2 and all("bob_check not run" in n and odb.bob in n for n in notices), notices


def test_the_schedulers_session_resolves_no_name_in_public(odb: OwnerDb) -> None:
    """A role that may create in `public` defines public.pg_cancel_backend(smallint): for a pid
    psycopg sends as smallint, a better match than pg_catalog's (integer). The scheduler cancels
    a run with pg_catalog's, and its session has no `public` in its search path at all."""
    with odb.connect() as admin, odb.connect(odb.scheduler) as victim:
        admin.execute("CREATE TABLE public.hijacked (who text)")
        admin.execute("GRANT INSERT ON public.hijacked TO PUBLIC")
        admin.execute("CREATE FUNCTION public.pg_cancel_backend(pid smallint) RETURNS boolean LANGUAGE sql "
                      "AS $$ INSERT INTO public.hijacked VALUES (current_user) RETURNING true $$")
        try:
            store = Store(odb.dsn(odb.scheduler), DbClock())
            try:
                row = store.conn.execute("SELECT current_setting('search_path') AS p").fetchone()
                path = row["p"] if row else None
                cancelled = store.cancel_backend(victim.info.backend_pid)
                # any unqualified call on the scheduler's session with an argument of that type (pid 1
                # is no backend: pg_catalog's says so and returns false)
                store.conn.execute("SELECT pg_cancel_backend(1::smallint)")
            finally:
                store.close()
            hijacked = scalar(admin, "SELECT count(*) FROM public.hijacked")
        finally:
            admin.execute("DROP FUNCTION public.pg_cancel_backend(smallint)")
            admin.execute("DROP TABLE public.hijacked")
    assert path == "pg_catalog, pg_temp"
    assert cancelled is True
    assert hijacked == 0


def test_the_launchers_sessions_resolve_no_name_in_public(odb: OwnerDb, monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --all-databases` looks through the cluster's databases with sessions of its own: each
    has pg_catalog's path before its first statement (pgsched.multidb.installed_databases)."""
    from pgsched import multidb

    seen: list[str] = []
    real_connect = psycopg.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = real_connect(*args, **kwargs)
        real_execute = conn.execute

        def execute(query: Any, *rest: Any, **kw: Any) -> Any:
            if "search_path" not in str(query):
                seen.append(str(real_execute("SELECT current_setting('search_path')").fetchone()[0]))  # type: ignore[index]
            return real_execute(query, *rest, **kw)

        conn.execute = execute  # type: ignore[method-assign]
        return conn

    monkeypatch.setattr(psycopg, "connect", connect)  # the module multidb calls it through
    assert odb.dbname in multidb.installed_databases(odb.dsn(odb.scheduler))
    assert seen and set(seen) == {"pg_catalog, pg_temp"}, seen
