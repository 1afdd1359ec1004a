"""The dashboard's URLs: each page reads through pgsched/ops (query, dashboard, upcoming) on
the signed-in session's connection, and each action calls the same ops function as the CLI
(alter_job, trigger_job, cancel_job), so PostgreSQL decides and its refusal is shown.

Every POST carries the session's CSRF token; an action needs a confirmation page first;
responses carry a strict Content-Security-Policy (no inline script: static/live.js)."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta, tzinfo
from math import ceil
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import anyio.from_thread
import anyio.to_thread
import jinja2
import psycopg
import psycopg.errors
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pgsched import __version__, schedule
from pgsched.errors import PgschedError, first_line
from pgsched.model import INT4_MAX
from pgsched.ops import dashboard, query, upcoming
from pgsched.web import charts, words
from pgsched.web.server import is_loopback
from pgsched.web.sessions import COOKIE, LOGIN_COOKIE, Session, Sessions, SignInRefused, same
from pgsched.web.throttle import SignInThrottle, client_of

HERE = Path(__file__).parent
PAGE_SIZE = 50
MAX_BARS = 2000          # runs drawn one by one up to this many; beyond, bucketed
MAX_BUCKETS = 100        # buckets per row when bucketed (24 h: 15 minutes each)
MAX_ROWS = 100           # jobs (rows) on one timeline
STATEMENT_TIMEOUT = "30s"  # a page's query may not hold its session's connection longer
MIN_WINDOW, MAX_WINDOW = timedelta(minutes=5), timedelta(days=7)
MAX_JOB_ID = INT4_MAX   # job_id is an integer
MAX_PAGE = 1_000_000     # the highest ?page= a list takes
MAX_RUNS = 1000          # the most runs a job's page lists (?runs=)
EXPIRE_EVERY = 5.0       # seconds between two sweeps of expired sessions (their connections close)
REFRESH_HEADER = "X-Pgsched-Refresh"  # set by static/live.js on the reloads it makes by itself
ACTIONS = {"pause": "Pause", "resume": "Resume", "trigger": "Run now", "cancel": "Cancel the running run of"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request, Session], Response]


@jinja2.pass_context
def _when(ctx: jinja2.runtime.Context, t: datetime | None) -> str:
    """A time in the page's zone (the session's TimeZone, `tz`), whether PostgreSQL or pgsched's
    schedule code gave it."""
    if t is None:
        return "-"
    tz = ctx.get("tz")
    return (t.astimezone(tz) if tz is not None else t).strftime("%Y-%m-%d %H:%M:%S")


def _json(value: object) -> str:
    """A jsonb value as JSON (true, null), not as Python's repr."""
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def create_app(dsn: str, *, single_user: bool = False, idle: float = 1800.0, lifetime: float = 8 * 3600.0,
               throttle: SignInThrottle | None = None, secure_cookies: bool = False) -> Starlette:
    sessions = Sessions(dsn, idle=idle, lifetime=lifetime, statement_timeout=STATEMENT_TIMEOUT)
    throttle = throttle or SignInThrottle()
    # --single-user: one session on the DSN's own connection (opened again if it is lost).
    only: list[Session] = [sessions.single()] if single_user else []
    single = only[0] if only else None
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["version"] = __version__
    templates.env.globals["outcomes"] = charts.OUTCOMES
    templates.env.filters["when"] = _when
    templates.env.filters["json"] = _json
    templates.env.filters["secs"] = lambda s: "-" if s is None else f"{s:.3f}s"

    def cookie(request: Request, resp: Response, name: str, value: str, max_age: int) -> None:
        resp.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=secure_cookies or request.url.scheme == "https")

    def secure(resp: Response) -> Response:
        for k, v in HEADERS.items():
            resp.headers[k] = v
        return resp

    def render(request: Request, name: str, session: Session | None, status: int = 200, **ctx: Any) -> Response:
        flash = list(session.flash) if session else []
        if session:
            session.flash.clear()
        return secure(templates.TemplateResponse(request, name, {
            "session": session, "single": single is not None, "flash": flash,
            "tz": _zone(session), **ctx}, status_code=status))

    def session_of(request: Request) -> Session | None:
        if not only:
            # The live refresh's polls and page reloads (static/live.js) are the page's own doing,
            # not the person's: an open tab left alone idles out like a closed one.
            by_page = request.url.path == "/live" or request.headers.get(REFRESH_HEADER) == "1"
            return sessions.get(request.cookies.get(COOKIE), seen=not by_page)
        if only[0].conn.closed or only[0].conn.broken:
            csrf = only[0].csrf  # pages already open keep working
            sessions.end(only[0].sid)
            only[0] = sessions.single()
            only[0].csrf = csrf
        return only[0]

    def page(handler: Handler) -> Callable[[Request], Response]:
        """A handler that needs a session (else: to sign-in), on the session's connection, one
        request at a time; a lost connection ends the session."""
        def endpoint(request: Request) -> Response:
            if single is not None and not is_loopback(request.url.hostname or ""):
                # --single-user has no sign-in: a request that names another host is a page that
                # pointed its own name at loopback (DNS rebinding) to act as the DSN's role.
                return secure(PlainTextResponse("refused: --single-user answers requests for a loopback "
                                                "host only (127.0.0.1, ::1, localhost)", status_code=400))
            try:
                s = session_of(request)
            except (psycopg.OperationalError, PgschedError) as e:
                # --single-user's connection could not be opened again: the database is away.
                return secure(PlainTextResponse(f"the database connection was lost: {first_line(e)}",
                                                status_code=503))
            if s is None:
                if request.url.path == "/live":
                    return secure(JSONResponse({"signin": True}, status_code=401))
                return secure(RedirectResponse("/signin?" + urlencode({"next": request.url.path}), 303))
            if request.method == "POST":
                # Starlette caches the parsed form; the handler reads it again for free.
                form = _form_sync(request)
                if not same(form.get("csrf"), s.csrf):
                    return secure(PlainTextResponse("refused: the form's CSRF token is missing or wrong "
                                                    "(reload the page and try again)", status_code=403))
            with s.lock:
                try:
                    return handler(request, s)
                except psycopg.errors.QueryCanceled:
                    return render(request, "error.html", s, status=503, title="Unavailable", message=(
                        f"the page's query took longer than the dashboard's statement_timeout "
                        f"({STATEMENT_TIMEOUT}); try a smaller window or a narrower search"))
                except psycopg.OperationalError as e:
                    if s.conn.broken or s.conn.closed:
                        sessions.end(s.sid)
                        return secure(PlainTextResponse(f"the database connection was lost: {first_line(e)}",
                                                        status_code=503))
                    raise
                except query.JobNotFound as e:
                    return render(request, "error.html", s, status=404, message=str(e))
                except BadParameter as e:
                    return render(request, "error.html", s, status=400, title="Bad request", message=str(e))
        return endpoint

    # --- sign-in -------------------------------------------------------------------------------

    def signin(request: Request) -> Response:
        if single is not None:
            return secure(RedirectResponse("/", 303))
        nxt = _safe_next(request.query_params.get("next"))
        if request.method == "GET":
            token = secrets.token_urlsafe(32)
            resp = render(request, "signin.html", None, token=token, next=nxt, error=None, role="")
            cookie(request, resp, LOGIN_COOKIE, token, max_age=3600)
            return resp
        form = _form_sync(request)
        nxt = _safe_next(str(form.get("next") or "/"))
        if not same(form.get("csrf"), request.cookies.get(LOGIN_COOKIE)):
            return secure(PlainTextResponse("refused: the sign-in form's CSRF token is missing or wrong",
                                            status_code=403))
        role, password = str(form.get("role") or ""), str(form.get("password") or "")

        def refused(error: str, status: int = 401) -> Response:
            """The sign-in form again, with why, and a new CSRF token."""
            token = secrets.token_urlsafe(32)
            resp = render(request, "signin.html", None, status=status, token=token, next=nxt, error=error, role=role)
            cookie(request, resp, LOGIN_COOKIE, token, max_age=3600)
            return resp

        try:
            sessions.check_form(role, password)  # before the throttle: a form error is no guess
        except SignInRefused as e:
            return refused(str(e))
        client = client_of(request.client.host if request.client else None)
        wait = throttle.begin(client, role)
        if wait > 0:
            # Not even tried: PostgreSQL is not asked, so the password is not checked.
            resp = refused(f"too many refused sign-ins from this address: try again in {ceil(wait)} s", 429)
            resp.headers["Retry-After"] = str(ceil(wait))
            return resp
        try:
            s = sessions.sign_in(role, password, replacing=request.cookies.get(COOKIE))
        except SignInRefused as e:
            if not e.guess:
                throttle.forgive(client, role)
            return refused(str(e))
        except BaseException:
            # Not a refusal of the credentials (the schema's version, after the password was
            # taken): not counted against the client.
            throttle.forgive(client, role)
            raise
        throttle.accepted(client, role)
        resp = secure(RedirectResponse(nxt, 303))
        cookie(request, resp, COOKIE, s.sid, max_age=int(lifetime))
        resp.delete_cookie(LOGIN_COOKIE, path="/")
        return resp

    def signout(request: Request, s: Session) -> Response:
        if single is None:
            sessions.end(s.sid)
        resp = secure(RedirectResponse("/signin", 303))
        resp.delete_cookie(COOKIE, path="/")
        return resp

    # --- pages ---------------------------------------------------------------------------------

    # Each page reads its live fingerprint before its data: a change that lands between the two
    # then shows at the next poll, instead of being taken as already on the page.

    def overview(request: Request, s: Session) -> Response:
        c = s.conn
        live = dashboard.fingerprint(c)
        now, per_minute = dashboard.runs_per_minute(c)
        return render(request, "overview.html", s, live=live, now=now,
                      instances=query.instances(c), chart=charts.runs_per_minute(per_minute, now),
                      problems=dashboard.problems(c), errors=query.last_errors(c, 10))

    def jobs(request: Request, s: Session) -> Response:
        p = request.query_params
        q = p.get("q", "").strip()[:200]
        if "\0" in q:
            raise BadParameter("q: the search text cannot hold a NUL character")
        sort = _choice(p, "sort", "id", list(dashboard.SORTS))
        desc = _choice(p, "dir", "asc", ["asc", "desc"]) == "desc"
        page_no = _number(p, "page", 1, 1, MAX_PAGE)
        live = dashboard.fingerprint(s.conn)
        result = dashboard.jobs_page(s.conn, search=q, sort=sort, descending=desc, limit=PAGE_SIZE,
                                     offset=(page_no - 1) * PAGE_SIZE)
        pages = max(1, -(-result.total // PAGE_SIZE))

        def link(**kw: Any) -> str:
            args = {"q": q, "sort": sort, "dir": "desc" if desc else "asc", "page": page_no, **kw}
            return "/jobs?" + urlencode({k: v for k, v in args.items() if v not in ("", None)})

        for r in result.rows:
            r["words"] = words.describe(r["schedule"], r["timezone"])
        return render(request, "jobs.html", s, live=live, rows=result.rows,
                      total=result.total, page=page_no, pages=pages, q=q, sort=sort, desc=desc, link=link,
                      sorts=list(dashboard.SORTS))

    def job(request: Request, s: Session) -> Response:
        job_id = _job_id(request)
        c = s.conn
        live = dashboard.fingerprint(c)
        j = dashboard.job(c, job_id)
        now = query.db_now(c)
        try:
            starts: list[datetime] = upcoming.job_starts(query.job_schedule(c, job_id), now=now, n=10)
            starts_error = None
        except schedule.ScheduleError as e:
            starts, starts_error = [], str(e)
        except (ValueError, OverflowError, psycopg.DataError):
            # A schedule whose starts leave Python's years (the API takes '1000 years'), or a
            # catalog row written by hand past what the client reads.
            starts, starts_error = [], "no start within the years 1 to 9999 can be shown for this schedule"
        runs = _number(request.query_params, "runs", 25, 1, MAX_RUNS)
        hist = query.history(c, job_id=job_id, limit=runs)
        window = timedelta(hours=24)
        tl, note, _ = _timeline(c, now.astimezone(UTC) - window, now, job_id)
        return render(request, "job.html", s, live=live, job=j, starts=starts,
                      starts_error=starts_error, history=hist, words=words.describe(j["schedule"], j["timezone"]),
                      timeline=tl, timeline_note=note, runs=runs, max_runs=MAX_RUNS)

    def timeline(request: Request, s: Session) -> Response:
        c = s.conn
        text = request.query_params.get("window", "1h")
        error = None
        try:
            window = query.parse_duration(text, "window")
            if not MIN_WINDOW <= window <= MAX_WINDOW:
                raise ValueError(f"window: {text!r} is out of range; give 5m to 7d")
        except ValueError as e:
            error, window = str(e), timedelta(hours=1)
        live = dashboard.fingerprint(c)
        now = query.db_now(c)
        page_no = _number(request.query_params, "page", 1, 1, MAX_PAGE)
        # The window in UTC: an aware datetime's arithmetic in its own zone is by the wall clock,
        # an hour off across a DST change.
        tl, note, pages = _timeline(c, now.astimezone(UTC) - window, now, None, page_no)
        return render(request, "timeline.html", s, status=400 if error else 200, live=live,
                      timeline=tl, note=note, window=text, error=error, page=page_no, pages=pages,
                      choices=["5m", "15m", "1h", "6h", "24h", "7d"])

    def _timeline(c: query.Conn, start: datetime, end: datetime, job_id: int | None,
                  page_no: int = 1) -> tuple[charts.Timeline, str, int]:
        """The timeline of one job, or of a page of MAX_ROWS jobs; its note; the number of pages."""
        if job_id is not None:
            jobs_, total = [{"job_id": job_id, "job_name": dashboard.job(c, job_id)["job_name"]}], 1
        else:
            jobs_, total = dashboard.timeline_jobs(c, MAX_ROWS, (page_no - 1) * MAX_ROWS)
        ids = [j["job_id"] for j in jobs_]
        # The buckets come first and count the runs: a wide window needs only them (one read of
        # its runs), a narrow one reads its few runs once more to draw each.
        size = charts.bucket_size(end - start, MAX_BUCKETS)
        buckets = dashboard.timeline_buckets(c, start, end, ids, size)
        runs = sum(int(b["n"]) for b in buckets)
        pages = max(1, -(-total // MAX_ROWS))
        notes = []
        if total > len(jobs_) or page_no > 1:
            first = (page_no - 1) * MAX_ROWS + 1
            notes.append(f"jobs {first}-{first + len(jobs_) - 1} of {total} (page {page_no} of {pages})")
        if runs > MAX_BARS:
            tl = charts.bucketed(start, end, jobs_, buckets, size)
            notes.append(f"{runs} runs are more than {MAX_BARS} bars: bucketed by "
                         f"{int(size.total_seconds())} s, each bar counts its runs (hover for the counts)")
        else:
            tl = charts.timeline(start, end, jobs_, dashboard.timeline_runs(c, start, end, ids))
            notes.append(f"{runs} runs, one bar each")
        return tl, "; ".join(notes), pages

    def confirm(request: Request, s: Session) -> Response:
        action = request.path_params["action"]
        if action not in ACTIONS:
            return render(request, "error.html", s, status=404, message=f"no action {action!r}")
        j = dashboard.job(s.conn, _job_id(request))
        return render(request, "confirm.html", s, job=j, action=action, label=ACTIONS[action])

    def act(request: Request, s: Session) -> Response:
        action = request.path_params["action"]
        job_id = _job_id(request)
        if action not in ACTIONS:
            return render(request, "error.html", s, status=404, message=f"no action {action!r}")
        try:
            if action in ("pause", "resume"):
                query.set_scheduled(s.conn, job_id, action == "resume")
                s.flash.append(("ok", f"job {job_id} {'resumed' if action == 'resume' else 'paused'}"))
            elif action == "trigger":
                plan = query.trigger(s.conn, job_id)
                s.flash.append(("ok", f"job {job_id}: a run was requested (plan time {plan:%Y-%m-%d %H:%M:%S})"))
            else:
                ids = query.cancel(s.conn, job_id)
                s.flash.append(("ok", f"job {job_id}: cancel requested for run(s) {', '.join(map(str, ids))}"
                                if ids else f"job {job_id} has no run in progress to cancel"))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            s.flash.append(("refused", f"PostgreSQL refused ({e.sqlstate}): {first_line(e)}"))
        return secure(RedirectResponse(f"/jobs/{job_id}", 303))

    def live(request: Request, s: Session) -> Response:
        return secure(JSONResponse({"v": dashboard.fingerprint(s.conn)}))

    routes = [
        Route("/", page(overview)),
        Route("/jobs", page(jobs)),
        Route("/jobs/{job_id}", page(job)),
        Route("/jobs/{job_id}/{action}", page(confirm), methods=["GET"]),
        Route("/jobs/{job_id}/{action}", page(act), methods=["POST"]),
        Route("/timeline", page(timeline)),
        Route("/live", page(live)),
        Route("/signin", signin, methods=["GET", "POST"]),
        Route("/signout", page(signout), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def sweep() -> None:
            # An expired session's connection closes on time, not at the next request.
            while True:
                await anyio.sleep(EXPIRE_EVERY)
                await anyio.to_thread.run_sync(sessions.expire)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sweep)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
                sessions.close_all()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.sessions = sessions
    return app


def _form_sync(request: Request) -> dict[str, str]:
    """The urlencoded form of a request, read in a sync handler (Starlette runs those in a
    thread; the body is read on the event loop through anyio's portal)."""
    cached = request.scope.get("pgsched.form")
    if cached is None:
        async def read() -> dict[str, str]:
            form = await request.form()
            return {k: v for k, v in form.items() if isinstance(v, str)}

        cached = anyio.from_thread.run(read)
        request.scope["pgsched.form"] = cached
    return dict(cached)


def _zone(session: Session | None) -> tzinfo | None:
    """The session's TimeZone, in which PostgreSQL gives it times (None: no session)."""
    return session.conn.info.timezone if session is not None and not session.conn.closed else None


def _job_id(request: Request) -> int:
    """The job id of the URL; a path that cannot be one (not ASCII digits, beyond an integer) is
    a job not found, as the id of a job the role may not see is."""
    text = request.path_params["job_id"]
    if not (text.isascii() and text.isdigit() and len(text) <= 10 and int(text) <= MAX_JOB_ID):
        raise query.JobNotFound(f"job {text[:20]!r} not found: a job's id is a number up to {MAX_JOB_ID}")
    return int(text)


def _safe_next(nxt: str | None) -> str:
    """Only a path of this site (no open redirect)."""
    if not nxt or not nxt.startswith("/") or nxt.startswith("//") or "\\" in nxt:
        return "/"
    return nxt


class BadParameter(ValueError):
    """A query parameter the page cannot take: answered 400, naming it and what it accepts."""


def _number(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """The whole number `name` of the URL's query, from lo to hi; absent or empty: default."""
    text = params.get(name, "")
    if text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(hi)) and lo <= int(text) <= hi):
        raise BadParameter(f"{name}: {text[:20]!r} is not a whole number from {lo} to {hi}")
    return int(text)


def _choice(params: Mapping[str, str], name: str, default: str, accepted: list[str]) -> str:
    """The value `name` of the URL's query, one of accepted; absent or empty: default."""
    text = params.get(name, "") or default
    if text not in accepted:
        raise BadParameter(f"{name}: {text[:20]!r} is not one of {', '.join(accepted)}")
    return text
