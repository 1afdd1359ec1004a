"""Who is signed in: a session is a PostgreSQL connection opened with the role and password
a person typed, so every query of theirs runs as that role and row-level security decides
what they see. It also owns which refused sign-ins count as guesses (is_guess), for the
throttle (pgsched/web/throttle.py). The password goes to libpq and nowhere else: not kept,
not logged, not in an error message, and only the typed one is checked (never a password
file's). Sessions end after `idle` seconds without a request or `lifetime` seconds in all,
and their connection is closed; a role keeps at most MAX_PER_ROLE of them (its oldest ends)
and the process MAX_SESSIONS, since each holds a connection of the server's. Each session has
its own CSRF token, which every POST must carry (checked with a constant-time comparison)."""

from __future__ import annotations

import contextlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgsched import migrate
from pgsched.errors import PgschedError, first_line
from pgsched.ops.query import Conn, tolerate_edge_times
from pgsched.worker import PASSING_REFUSALS

COOKIE = "pgsched_session"
LOGIN_COOKIE = "pgsched_signin"


# Refusals that say nothing of the credentials: the server could not be reached, or was full,
# starting or stopping (worker.PASSING_REFUSALS). Every other refusal counts as a guess for the
# sign-in throttle: the server's messages are in its own lc_messages, so a credential refusal
# cannot be told by its words, and one that is not known for certain to be something else must
# count. A connect_timeout is a guess too: PostgreSQL's auth_delay holds a wrong password's
# refusal, so a guess answered after the client's timeout would otherwise never count.
NOT_A_GUESS = (*PASSING_REFUSALS, "could not connect", "no such file or directory",
               "could not translate host name")

# Sessions a role may hold at once (a new sign-in ends its oldest), and sessions in all (a
# sign-in beyond is refused): each holds one of the server's connections.
MAX_PER_ROLE = 8
MAX_SESSIONS = 64

# A sign-in checks the password typed, and nothing else: libpq would take an empty one (or one
# cut short by a NUL) from a password file of the dashboard's user.
NO_PASSFILE = "/nonexistent/pgsched-web-reads-no-password-file"
# psycopg tries each host (and address) of a DSN in turn, and joins the failures of all of them.
ATTEMPTS_JOINED = "Multiple connection attempts failed. All failures were:"


def is_guess(e: psycopg.Error) -> bool:
    """Whether a refused connection counts as a guess of the credentials: one of its attempts was
    refused for something not known to say nothing of them (NOT_A_GUESS). Each attempt on its own:
    `host=localhost` refused on ::1 and asked for a password on 127.0.0.1 is a guess."""
    text = str(e)
    _, joined, rest = text.partition(ATTEMPTS_JOINED)
    attempts = re.split(r"\n- host: ", rest)[1:] if joined else [text]
    return any(not any(words in a.lower() for words in NOT_A_GUESS) for a in attempts)


class SignInRefused(PgschedError):
    """PostgreSQL (or the form) refused the sign-in; the message never holds the password.
    `guess`: the credentials were refused (not the form, nor a server down or full)."""

    def __init__(self, message: str, *, guess: bool = False) -> None:
        super().__init__(message)
        self.guess = guess


@dataclass
class Session:
    sid: str
    role: str
    conn: Conn
    csrf: str
    created: float
    seen: float
    # One request at a time on the session's connection (Starlette runs handlers in threads).
    lock: threading.Lock = field(default_factory=threading.Lock)
    flash: list[tuple[str, str]] = field(default_factory=list)

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.conn.close()


def same(a: str | None, b: str | None) -> bool:
    """Constant-time equality of two tokens; a missing one is never equal."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a), str(b))


def open_connection(dsn: str, role: str | None = None, password: str | None = None,
                    statement_timeout: str | None = None) -> Conn:
    """A connection for a session: the DSN's, with `role` and `password` in place of its own."""
    return set_up(connect(dsn, role, password), statement_timeout)


def connect(dsn: str, role: str | None = None, password: str | None = None) -> Conn:
    """The DSN's connection, with `role` and `password` in place of its own (and no password
    file); not yet set up."""
    params: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(dsn)
    if role is not None:
        params["user"] = role
        params["password"] = password
        params["passfile"] = NO_PASSFILE
    params.setdefault("connect_timeout", 10)
    params.setdefault("application_name", "pgsched web")
    conn: Conn = psycopg.connect(autocommit=True, row_factory=dict_row,
                                 **{k: v for k, v in params.items() if v is not None})
    return conn


def set_up(conn: Conn, statement_timeout: str | None) -> Conn:
    """A new session's settings, and the check that the schema serves this release (closed if not)."""
    tolerate_edge_times(conn)
    try:
        if statement_timeout is not None:
            conn.execute("SELECT pg_catalog.set_config('statement_timeout', %s, false)", (statement_timeout,))
        migrate.check_version(conn)
    except BaseException:
        conn.close()
        raise
    return conn


class Sessions:
    """The live sessions of one server process, by a random id (the cookie's value)."""

    def __init__(self, dsn: str, *, idle: float = 1800.0, lifetime: float = 8 * 3600.0,
                 clock: Callable[[], float] = time.monotonic, statement_timeout: str | None = None) -> None:
        self.dsn = dsn
        self.statement_timeout = statement_timeout
        self.idle = idle
        self.lifetime = lifetime
        self.clock = clock
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    @staticmethod
    def check_form(role: str, password: str) -> None:
        """Refuse a sign-in form that cannot name a role and its password (never a guess). libpq
        ends a value at a NUL: a NUL after `alice` would drop the DSN's host and database after it, and a
        password cut to nothing would be read from a password file."""
        if not role or len(role) > 63 or any(ord(c) < 32 or ord(c) == 127 for c in role):
            raise SignInRefused("role: give the name of a PostgreSQL role (1 to 63 characters, no control characters)")
        if not password or "\0" in password:
            raise SignInRefused("password: give the role's PostgreSQL password (it cannot hold a NUL character)")

    def sign_in(self, role: str, password: str, replacing: str | None = None) -> Session:
        """A new session of `role`; `replacing`: the id of the session the browser had, which ends."""
        self.check_form(role, password)
        self.expire()
        # The session it replaces ends once the new one is in (a refused sign-in keeps it), and
        # makes room for it meanwhile.
        with self._lock:
            freed = 1 if replacing and replacing in self._by_id else 0
        if len(self) - freed >= MAX_SESSIONS:
            raise SignInRefused(f"sign-in refused: the dashboard holds {MAX_SESSIONS} sessions, its most; "
                                "try again when one has ended")
        try:
            conn = connect(self.dsn, role, password)
        except psycopg.Error as e:
            # libpq's message names the role, never the password; scrub it anyway.
            raise SignInRefused("sign-in refused: " + first_line(e).replace(password, "***"),
                                guess=is_guess(e)) from None
        try:
            set_up(conn, self.statement_timeout)
        except (psycopg.Error, PgschedError) as e:
            # In, with the right password: the server refused what followed, or its schema is not
            # one this release serves (not a guess).
            raise SignInRefused("sign-in refused: " + first_line(e).replace(password, "***")) from None
        if not conn.pgconn.used_password:
            # trust (or peer, ident, cert) authentication: the password was never checked, so
            # anyone could sign in as this role. PostgreSQL must check it, or nobody signs in.
            conn.close()
            raise SignInRefused(f"sign-in refused: the server let role {role} in without checking its password "
                                "(pg_hba.conf trust, peer or similar); the dashboard signs in only where PostgreSQL "
                                "asks for the password (use --single-user on a laptop)")
        if replacing:
            self.end(replacing)
        return self._add(role, conn)

    def single(self) -> Session:
        """The one session of --single-user: the DSN's own role."""
        conn = open_connection(self.dsn, statement_timeout=self.statement_timeout)
        row = conn.execute("SELECT current_user AS u").fetchone()
        assert row is not None
        s = self._add(str(row["u"]), conn)
        s.created = s.seen = float("inf")  # never expires
        return s

    def _add(self, role: str, conn: Conn) -> Session:
        now = self.clock()
        s = Session(secrets.token_urlsafe(32), role, conn, secrets.token_urlsafe(32), now, now)
        with self._lock:
            self._by_id[s.sid] = s
            # Oldest first (dicts keep their order of insertion).
            of_role = [x for x in self._by_id.values() if x.role == role]
            gone = of_role[:max(0, len(of_role) - MAX_PER_ROLE)]
            for x in gone:
                del self._by_id[x.sid]
        for x in gone:
            x.close()
        self.expire()
        return s

    def get(self, sid: str | None, *, seen: bool = True) -> Session | None:
        """The session of this id if it is still valid (and now seen, unless `seen` is false: a
        request the page made by itself, which must not keep an unattended session alive)."""
        self.expire()
        if not sid:
            return None
        with self._lock:
            s = self._by_id.get(sid)
        if s is None:
            return None
        if s.conn.closed or s.conn.broken:
            self.end(s.sid)
            return None
        if seen and s.seen != float("inf"):
            s.seen = self.clock()
        return s

    def end(self, sid: str) -> None:
        with self._lock:
            s = self._by_id.pop(sid, None)
        if s is not None:
            s.close()

    def expire(self) -> None:
        now = self.clock()
        with self._lock:
            gone = [s for s in self._by_id.values()
                    if s.seen != float("inf") and (now - s.seen > self.idle or now - s.created > self.lifetime)]
            for s in gone:
                del self._by_id[s.sid]
        for s in gone:
            s.close()

    def close_all(self) -> None:
        with self._lock:
            all_ = list(self._by_id.values())
            self._by_id.clear()
        for s in all_:
            s.close()

    def __len__(self) -> int:
        return len(self._by_id)
