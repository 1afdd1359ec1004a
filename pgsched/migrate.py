"""Installing and upgrading the pgsched schema.

Owns the rule of TimescaleDB's upgrades: tables change only through numbered,
forward-only migrations (sql/migrations/NNNN_name.sql), each recorded with its
checksum; functions, views and triggers (sql/api/*.sql, then plpython/*.sql when
the server has PL/Python) are CREATE OR REPLACE files re-applied whenever their
combined checksum changes. Everything happens in one transaction under an
advisory lock, so concurrent `pgsched init` runs serialize and a failure leaves
the database as it was; a second run with nothing new is a no-op.

Instances of the previous release keep running through an upgrade (pgsched/api.py),
so re-applying the files replaces functions in place (_apply_api), leaves the views and
triggers whose text did not change (pgsched._replace_if_changed: a replacement locks them
until the commit), gives way to the running schedulers' statements instead of
deadlocking with them (_giving_way), and
then drops the internal functions the files no longer define (_drop_leftovers): the
files of a release define its own API and the previous one it still serves, so what
they do not define, no release in the window calls. check_version is what `pgsched
serve` asks on every (re)connect: whether the schema serves this code's API.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgsched import __version__, api, compat
from pgsched.config import pin_search_path
from pgsched.errors import MigrationChecksumMismatch, SchemaVersionMismatch

T = TypeVar("T")

# Any fixed number: the lock only has to be the same for every pgsched init.
MIGRATION_LOCK_KEY = 7_401_295_310
MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# Where each migration is recorded. Release 0.1.0 checks on every (re)connect that the highest
# version in pgsched.migration is its own, 5, and refuses the schema otherwise: so that its
# instances keep running through a rolling upgrade (pgsched/api.py), the migrations after
# its five are recorded in a second ledger it does not read, pgsched.schema_migration.
# Read together, the two are the schema's migrations (_applied).
RELEASE_0_1_0_MIGRATIONS = 5
LEDGERS = ("pgsched.migration", "pgsched.schema_migration")


# The oldest PostgreSQL pgsched runs on: its views are security_invoker (new in PostgreSQL 15).
MIN_SERVER = 15


def check_server_version(version_text: str) -> int:
    """The major version in PostgreSQL's `version()` text (or pg_config --version); an error that
    names it when pgsched does not support it."""
    m = re.search(r"PostgreSQL (\d+)", version_text)
    if m is None:
        raise SchemaVersionMismatch(f"server version: cannot read {version_text!r} (expected 'PostgreSQL N.N')")
    major = int(m.group(1))
    if major < MIN_SERVER:
        raise SchemaVersionMismatch(f"PostgreSQL {major}, which pgsched does not support: it needs PostgreSQL "
                                    f"{MIN_SERVER} or later")
    return major


def ledger(version: int) -> str:
    """The table a migration of this version is recorded in."""
    return LEDGERS[0] if version <= RELEASE_0_1_0_MIGRATIONS else LEDGERS[1]


def _find_source_dir(name: str) -> Path | None:
    """sql/ and plpython/ sit beside the package in a checkout, inside it in a wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / name, here / f"_{name}"):
        if candidate.is_dir():
            return candidate
    return None


def _source_dir(name: str) -> Path:
    found = _find_source_dir(name)
    if found is None:
        raise FileNotFoundError(f"pgsched's {name}/ directory is missing from the installation")
    return found


def sql_dir() -> Path:
    """This installation's sql/ (migrations, API files, compat), whatever the layout."""
    return _source_dir("sql")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def migrations(sql_dir: Path | None = None) -> list[Migration]:
    """The migrations of sql/ (of this installation, or of another tree's `sql_dir`)."""
    found = []
    for path in sorted(((sql_dir or _source_dir("sql")) / "migrations").glob("*.sql")):
        m = MIGRATION_FILE.match(path.name)
        if not m:
            raise ValueError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(m.group(1)), m.group(2), path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


def code_version() -> int:
    return len(migrations())


def works_on_every_function(f: Path) -> bool:
    """The API files numbered 90 and up (the public wrappers, the grants) work on every function there is."""
    return f.parent.name == "api" and f.name >= "90_"


def api_files(with_plpython: bool, sql_dir: Path | None = None) -> list[Path]:
    files = sorted(((sql_dir or _source_dir("sql")) / "api").glob("*.sql"))
    if with_plpython:
        # PL/Python definitions replace the plain-SQL fallbacks of the same name,
        # and must exist before the files numbered 90 and up, which work on every
        # function there is: the public wrappers (90_) and the grants (95_).
        last = [f for f in files if works_on_every_function(f)]
        files = [f for f in files if f not in last]
        files += sorted(_source_dir("plpython").glob("*.sql")) + last
    return files


@dataclass(frozen=True)
class InitResult:
    applied: list[int]
    api_reapplied: bool
    plpython: bool
    version: int
    # Internal functions of earlier releases that this release's files no longer define.
    dropped: list[str] = field(default_factory=list)
    # What pgsched._api() says after init: this release's API and the oldest it serves.
    api: api.SchemaApi | None = None
    # Whether the pg_cron compatibility schema `cron` is installed (pgsched/compat.py).
    pg_cron_compat: bool = False


def bootstrap_statements(schema: bool = True) -> list[str]:
    """The schema, the two ledgers and api_state, before any migration: what `init` runs first,
    and what an extension's install script starts with (pgsched/extension.py; CREATE EXTENSION
    makes the schema itself)."""
    return [
        *(["CREATE SCHEMA IF NOT EXISTS pgsched"] if schema else []),
        *(f"""CREATE TABLE IF NOT EXISTS {table} (
                  version    integer PRIMARY KEY,
                  name       text NOT NULL,
                  checksum   text NOT NULL,
                  applied_at timestamptz NOT NULL DEFAULT now())""" for table in LEDGERS),
        # Readable by all, as pgsched.migration is (0002_security.sql).
        "GRANT SELECT ON pgsched.schema_migration TO PUBLIC",
        """CREATE TABLE IF NOT EXISTS pgsched.api_state (
               singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
               checksum   text NOT NULL,
               plpython   boolean NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())""",
    ]


def _bootstrap(cur: psycopg.Cursor[tuple[object, ...]]) -> None:
    for statement in bootstrap_statements():
        # Constant text of this module (LEDGERS are its own names), no input in it.
        cur.execute(sql.SQL(statement))


def schema_api(cur: psycopg.Cursor[Any]) -> api.SchemaApi:
    """What the installed pgsched._api() says; a schema without it is release 0.1.0's (API 1)."""
    cur.execute("SELECT to_regprocedure('pgsched._api()') IS NOT NULL")
    row = cur.fetchone()
    if not row or not row[0]:
        return api.API_1
    cur.execute("SELECT api_version, oldest_api_served, release FROM pgsched._api()")
    row = cur.fetchone()
    assert row is not None
    return api.SchemaApi(int(row[0]), int(row[1]), str(row[2]))


def _internal_functions(cur: psycopg.Cursor[tuple[object, ...]]) -> dict[int, str]:
    """The internal (underscore) functions of schema pgsched: oid -> xmin of their pg_proc row."""
    cur.execute(r"""SELECT p.oid::bigint, p.xmin::text FROM pg_catalog.pg_proc p
                     WHERE p.pronamespace = 'pgsched'::regnamespace AND p.proname LIKE '\_%'""")
    return {int(str(oid)): str(xmin) for oid, xmin in cur.fetchall()}


def _drop_leftovers(cur: psycopg.Cursor[tuple[object, ...]], before: dict[int, str]) -> list[str]:
    """Drop the internal functions that were there before the API files ran and that they left untouched.

    CREATE OR REPLACE rewrites a function's pg_proc row (a new xmin), and one dropped first
    comes back with a new oid, so a function whose (oid, xmin) did not change is one this release's
    files do not define (this runs before the grants, which rewrite every row): an earlier
    release's, which no API in the window calls (a kept function of the previous API is
    defined by this release's files, so it stays). This needs no list of what to drop, and
    is what lets a file of kept functions go away in the release after. Spared: a function
    something else depends on (the row-security policies' _catalog_admin, made by a
    migration) and one that belongs to an extension. So a function belongs in sql/api/,
    unless a table's policy, default or trigger made by a migration depends on it.
    """
    cur.execute(
        r"""SELECT p.oid::bigint, p.xmin::text, p.oid::regprocedure::text
              FROM pg_catalog.pg_proc p
             WHERE p.pronamespace = 'pgsched'::regnamespace AND p.proname LIKE '\_%'
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                WHERE d.refclassid = 'pg_catalog.pg_proc'::regclass AND d.refobjid = p.oid
                                  AND d.deptype IN ('n', 'a'))
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                                WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
                                  AND d.deptype = 'e')
             ORDER BY 3"""
    )
    dropped = []
    for oid, xmin, signature in cur.fetchall():
        if before.get(int(str(oid))) == str(xmin):
            # The signature comes from the catalog (regprocedure output is quoted as needed).
            cur.execute(sql.SQL("DROP ROUTINE {}").format(sql.SQL(str(signature))))
            dropped.append(str(signature))
    return dropped


def _try_plpython(cur: psycopg.Cursor[tuple[object, ...]], want: bool) -> bool:
    """Make PL/Python usable if the server has it and we may create it; never fail init over it."""
    if not want or _find_source_dir("plpython") is None:
        return False
    cur.execute("SELECT 1 FROM pg_extension WHERE extname = 'plpython3u'")
    if cur.fetchone() is None:
        cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'plpython3u'")
        if cur.fetchone() is None:
            return False
        cur.execute("SAVEPOINT plpython")
        try:
            cur.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
        except psycopg.Error:
            cur.execute("ROLLBACK TO SAVEPOINT plpython")
            return False
        cur.execute("RELEASE SAVEPOINT plpython")
    # The language exists; the schedule code must also import in the server.
    cur.execute("SAVEPOINT probe")
    try:
        cur.execute(
            "DO LANGUAGE plpython3u $$import pgsched.schedule$$"
        )
    except psycopg.Error:
        cur.execute("ROLLBACK TO SAVEPOINT probe")
        return False
    cur.execute("RELEASE SAVEPOINT probe")
    return True


def _drop_plpython_functions(cur: psycopg.Cursor[tuple[object, ...]]) -> None:
    """Remove what plpython/ installed, so the plain-SQL fallbacks are what remains."""
    cur.execute(
        """SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.pronamespace = 'pgsched'::regnamespace AND l.lanname = 'plpython3u'"""
    )
    for (fn,) in cur.fetchall():
        cur.execute(sql.SQL("DROP FUNCTION {} CASCADE").format(sql.SQL(str(fn))))
    # next_runs stays: sql/api/05_cron.sql gives it a plain-SQL body when the files are applied next.


def _applied(cur: psycopg.Cursor[Any]) -> dict[int, str]:
    """The schema's migrations (both ledgers), version -> checksum."""
    cur.execute("SELECT to_regclass('pgsched.schema_migration') IS NOT NULL")
    row = cur.fetchone()
    # A schema that release 0.1.0 installed has the first ledger only.
    both = bool(row and row[0])
    cur.execute("SELECT version, checksum FROM pgsched.migration"
                + (" UNION ALL SELECT version, checksum FROM pgsched.schema_migration" if both else ""))
    return {int(str(v)): str(c) for v, c in cur.fetchall()}


def init(conn: psycopg.Connection[tuple[object, ...]], *, plpython: bool = True,
         pg_cron_compat: bool = False) -> InitResult:
    """Install or upgrade the schema on `conn` (which must not be in a transaction).

    Instances of the previous release keep running through it (a rolling upgrade): its DDL
    gives way to their statements instead of deadlocking with them (_giving_way), and the
    files replace functions in place (_apply_api).

    pg_cron_compat installs the pg_cron compatibility schema (pgsched/compat.py), refused while
    the pg_cron extension is installed; once installed, every init re-applies it.
    """
    # init runs as an administrator: no name in its files may resolve to `public`. An autocommit
    # caller's session (every caller's) gets its own search path back.
    row = conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()
    assert row is not None
    pin_search_path(conn)
    try:
        return _init(conn, plpython=plpython, pg_cron_compat=pg_cron_compat)
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.execute("SELECT pg_catalog.set_config('search_path', %s, false)", (row[0],))


def _init(conn: psycopg.Connection[tuple[object, ...]], *, plpython: bool, pg_cron_compat: bool) -> InitResult:
    todo = migrations()
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_catalog.version()")
        row = cur.fetchone()
        assert row is not None
        check_server_version(str(row[0]))  # before anything is written
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        if pg_cron_compat:
            compat.check_can_install(cur)  # before anything is written
        cur.execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pgsched'")
        row = cur.fetchone()
        if row is not None:
            raise SchemaVersionMismatch(
                f"pgsched is installed in this database as an extension (version {row[0]}): `pgsched init` "
                "does not change it; upgrade it with `pgsched extension install` on the server and "
                "ALTER EXTENSION pgsched UPDATE")
        _bootstrap(cur)
        applied = _applied(cur)
        newest = max(applied, default=0)
        if newest > len(todo):
            raise SchemaVersionMismatch(
                f"the database's pgsched schema is version {newest}, newer than this pgsched "
                f"(which knows versions up to {len(todo)}): upgrade pgsched before using it on this database"
            )
        installed = schema_api(cur) if applied else None
        if installed is not None and installed.api_version > api.API_VERSION:
            # Its functions would be replaced by older ones that no longer serve its instances.
            raise SchemaVersionMismatch(
                f"{installed.describe()}, newer than this pgsched {__version__} (API {api.API_VERSION}): "
                "upgrade pgsched before using it on this database"
            )
        if installed is not None and installed.oldest_api_served < api.OLDEST_API_SERVED:
            _check_no_instance_left_behind(cur)  # before anything is written
        for m in todo:
            if m.version in applied and applied[m.version] != m.checksum:
                raise MigrationChecksumMismatch(
                    f"migration {m.version:04d}_{m.name} differs from the one applied to this database"
                )
        pending = [m for m in todo if m.version not in applied]
        has_plpython = _try_plpython(cur, plpython)
        files = api_files(has_plpython)
        # The mode is part of the checksum: switching PL/Python on or off re-applies the API
        # (and records the new mode) even when no file changed.
        digest = hashlib.sha256(b"plpython=%d\0" % has_plpython)
        for f in files:
            digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        checksum = digest.hexdigest()
        cur.execute("SELECT checksum, plpython FROM pgsched.api_state")
        row = cur.fetchone()
        reapply = row is None or row[0] != checksum or bool(pending)

        def upgrade() -> list[str]:
            for m in pending:
                cur.execute(sql.SQL(m.text))
                cur.execute(
                    sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(
                        sql.SQL(ledger(m.version))),
                    (m.version, m.name, m.checksum),
                )
            if not reapply:
                return []
            if not has_plpython:
                _drop_plpython_functions(cur)
            dropped = _apply_api(cur, files, replace_all=bool(pending))
            cur.execute(
                """INSERT INTO pgsched.api_state (checksum, plpython) VALUES (%s, %s)
                   ON CONFLICT (singleton) DO UPDATE
                   SET checksum = excluded.checksum, plpython = excluded.plpython, applied_at = now()""",
                (checksum, has_plpython),
            )
            return dropped

        dropped = _giving_way(cur, upgrade) if reapply else []
        now_api = schema_api(cur)
        with_compat = pg_cron_compat or compat.installed(cur)
        if with_compat:
            compat.install(cur, (_source_dir("sql") / "compat" / "pg_cron.sql").read_text())
    return InitResult(applied=[m.version for m in pending], api_reapplied=reapply, plpython=has_plpython,
                      version=len(todo), dropped=dropped, api=now_api, pg_cron_compat=with_compat)


def _check_no_instance_left_behind(cur: psycopg.Cursor[tuple[object, ...]]) -> None:
    """Refuse to narrow the window under a live instance of a release it would no longer serve.

    Such an instance (release 0.1.0 predates the API check) would meet the new functions with
    SQL errors at every call instead of stopping. Alive is pgsched.instances' rule (a recent
    heartbeat and its connection still there), so a killed or stopped instance does not count.
    """
    cur.execute("SELECT instance_id, host, pid, version FROM pgsched.instances WHERE alive ORDER BY instance_id")
    live = [api.LiveInstance(int(str(r[0])), str(r[1]), int(str(r[2])), str(r[3])) for r in cur.fetchall()]
    left = api.instances_left_behind(live, api.OLDEST_API_SERVED)
    if left:
        named = ", ".join(f"instance {i.instance_id} (release {i.release}, host {i.host}, pid {i.pid})" for i in left)
        raise SchemaVersionMismatch(
            f"pgsched {__version__} serves API {api.OLDEST_API_SERVED} to {api.API_VERSION}, and these running "
            f"instances speak an older one: {named}; upgrade them to a release in that window first, one "
            "release at a time (README, Upgrading), then run this init again (nothing was changed)")


# How long init keeps giving way to other sessions' statements (see _giving_way) before it
# waits for its locks like any statement, and how long it waits for one lock before it does.
GIVE_WAY_FOR = 30.0
GIVE_WAY_LOCK_TIMEOUT = "100ms"


def _giving_way(cur: psycopg.Cursor[tuple[object, ...]], ddl: Callable[[], T]) -> T:
    """Run `ddl` so that it never blocks running schedulers for long nor deadlocks with them.

    The DDL takes its locks one at a time (ALTER TABLE, CREATE OR REPLACE TRIGGER or VIEW),
    holding each to the commit, and a scheduler's statement may hold one of them and wait for
    another: a deadlock, which PostgreSQL breaks after deadlock_timeout (1 s) by cancelling
    one of the two, or the scheduler's lock_timeout (1 s) cancels its statement first, an SQL
    error in its log either way. So the DDL waits at most GIVE_WAY_LOCK_TIMEOUT for any lock;
    when that runs out, it is rolled back to a savepoint (releasing every lock it took, so the
    waiting statements go on) and tried again a moment later. Only after GIVE_WAY_FOR seconds
    of that (a session keeps a lock for long) does it wait in line like any statement.
    """
    cur.execute("SELECT current_setting('lock_timeout')")
    row = cur.fetchone()
    assert row is not None
    session_timeout = str(row[0])
    deadline = time.monotonic() + GIVE_WAY_FOR
    while True:
        giving_way = time.monotonic() < deadline
        timeout = GIVE_WAY_LOCK_TIMEOUT if giving_way else session_timeout
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
        cur.execute("SAVEPOINT give_way")
        try:
            result = ddl()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            # (A deadlock only where deadlock_timeout is set below GIVE_WAY_LOCK_TIMEOUT.)
            cur.execute("ROLLBACK TO SAVEPOINT give_way")
            if not giving_way:
                raise
            time.sleep(random.uniform(0.02, 0.1))
            continue
        cur.execute("RELEASE SAVEPOINT give_way")
        cur.execute("SELECT set_config('lock_timeout', %s, true)", (session_timeout,))
        return result


# PostgreSQL's hint when CREATE OR REPLACE cannot replace a function (another result type, a
# renamed argument): "Use DROP FUNCTION pgsched._f(integer) first." The command is not translated.
_DROP_HINT = re.compile(r"\bDROP (?:FUNCTION|PROCEDURE) (\S.*\))")


def _apply_api(cur: psycopg.Cursor[tuple[object, ...]], files: list[Path], *, replace_all: bool) -> list[str]:
    """Apply the API files, replacing each function in place; what no file defines is dropped after.

    A function dropped and created again gets a new oid, and a running scheduler's statement
    that looked the old one up just before the commit then fails ("cache lookup failed for
    function", or "could not open relation" for a composite type): an SQL error in an
    instance that a rolling upgrade must leave working. CREATE OR REPLACE keeps the oid. So
    the files' own _drop_functions calls are switched off (pgsched.replace_in_place); a
    function PostgreSQL refuses to replace in place (its result or an argument name changed:
    which the compatibility rule of pgsched/api.py rules out for what the previous API calls)
    makes the files fail with a hint naming it, and it alone is dropped before they run
    again. Returns what _drop_leftovers dropped.

    Views and triggers are replaced only where their text changed (pgsched._replace_if_changed:
    a replacement locks them, or the table, until the commit), unless replace_all: with a
    migration, which may change what the same text gives.
    """
    cur.execute("SELECT set_config('pgsched.replace_in_place', 'on', true)")
    cur.execute("SELECT set_config('pgsched.replace_all', %s, true)", ("on" if replace_all else "off",))
    before = _internal_functions(cur)
    refused: list[str] = []
    while True:
        cur.execute("SAVEPOINT api_files")
        try:
            dropped: list[str] | None = None
            for f in files:
                if dropped is None and works_on_every_function(f):
                    # Before the grants, which rewrite every function's row, and the wrappers.
                    dropped = _drop_leftovers(cur, before)
                cur.execute(sql.SQL(f.read_text()))
            if dropped is None:
                dropped = _drop_leftovers(cur, before)
        except psycopg.errors.InvalidFunctionDefinition as e:
            cur.execute("ROLLBACK TO SAVEPOINT api_files")
            found = _DROP_HINT.search(e.diag.message_hint or "")
            cur.execute("SELECT to_regprocedure(%s)::text", (found.group(1) if found else None,))
            row = cur.fetchone()
            signature = str(row[0]) if row and row[0] is not None else None
            if signature is None or signature in refused:
                raise
            refused.append(signature)
            # The signature is the catalog's own text of an existing pgsched function.
            cur.execute(sql.SQL("DROP ROUTINE {}").format(sql.SQL(signature)))
            continue
        cur.execute("RELEASE SAVEPOINT api_files")
        cur.execute("SELECT set_config('pgsched.replace_in_place', 'off', true), "
                    "set_config('pgsched.replace_all', 'off', true)")
        return dropped


def check_version(conn: psycopg.Connection[Any]) -> int:
    """The schema version if this code may work on the schema; SchemaVersionMismatch otherwise.

    `pgsched serve` asks this on connect and on every reconnect. What decides is the API
    window (pgsched/api.py): the schema must serve this code's API. The migrations are
    checked too: fewer than this code's means `init` of this release has not run; more
    are accepted only from a newer API that still serves this one (the release that added
    them bumped the API), so that rolling upgrades work across a migration.
    """
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT to_regclass('pgsched.migration') IS NOT NULL")
        row = cur.fetchone()
        if not row or not row[0]:
            raise SchemaVersionMismatch("pgsched is not installed in this database: run `pgsched init` first")
        have = max(_applied(cur), default=0)
        schema = schema_api(cur)
    api.check(schema)
    want = code_version()
    if have < want or (have > want and schema.api_version == api.API_VERSION):
        hint = "run `pgsched init` to upgrade it" if have < want else "upgrade pgsched"
        raise SchemaVersionMismatch(
            f"the database's pgsched schema is version {have}, this pgsched {__version__} needs {want}: {hint}")
    return have
