"""The dashboard's defects found by the review of 2026-11-29, each against a real PostgreSQL:
sign-in with a NUL in the password or role, a password file, --single-user and DNS rebinding,
sessions per role and in all, expiry without a request, times in one zone, Secure cookies, a
DSN's application_name, bad input in the URL and the search, schedules beyond the years the
page can show, the live fingerprint read before the data, a schema of another release at
sign-in, a database away under --single-user, crashes in a row, config as JSON."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from pgsched import migrate
from pgsched.ops import dashboard
from pgsched.web import app as web_app
from pgsched.web import sessions as web_sessions
from tests.integration.helpers import Conn, scalar
from tests.integration.web.conftest import PASSWORD, WebDb, fail_once, schedule_as
from tests.integration.web.test_web_http import csrf_of, sign_in

LOOPBACK = "http://127.0.0.1"


@pytest.fixture
def client(webdb: WebDb) -> Iterator[TestClient]:
    with TestClient(web_app.create_app(webdb.dsn), follow_redirects=False) as c:
        yield c


def need_passwords(webdb: WebDb) -> None:
    if not webdb.passwords_checked:
        pytest.skip("an external PGSCHED_TEST_DSN cluster: its pg_hba.conf is not ours to change")


def attempt(c: TestClient, role: str, password: str) -> Any:
    token = csrf_of(c.get("/signin").text)
    return c.post("/signin", data={"role": role, "password": password, "csrf": token})


def dashboard_sessions(admin: Conn, role: str) -> int:
    return int(scalar(admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s "
                             "AND application_name = 'pgsched web'", (role,)))


def test_a_nul_in_the_password_or_role_is_refused_and_no_password_file_is_read(
        webdb: WebDb, wadmin: Conn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A password of a NUL reached libpq as an empty one, which then took alice's password from the
    dashboard user's password file: anyone signed in as alice. A NUL after the role cut off the
    DSN's host and database."""
    need_passwords(webdb)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{webdb.odb.alice}:{PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with TestClient(web_app.create_app(webdb.dsn), follow_redirects=False) as c:
        for password in ("\0", "\0anything"):
            r = attempt(c, webdb.odb.alice, password)
            assert r.status_code == 401 and "cannot hold a NUL character" in r.text, r.text
        r = attempt(c, webdb.odb.alice + "\0", PASSWORD)
        assert r.status_code == 401 and "no control characters" in r.text
        assert len(c.app.state.sessions) == 0  # type: ignore[attr-defined]
        assert c.get("/jobs").status_code == 303
    # Nor does a sign-in's connection read the file when the password is empty.
    with pytest.raises(psycopg.OperationalError, match=r"no password supplied|password authentication failed"):
        web_sessions.connect(webdb.dsn, webdb.odb.alice, "")
    assert dashboard_sessions(wadmin, webdb.odb.alice) == 0


def test_single_user_answers_only_requests_for_a_loopback_host(webdb: WebDb, wadmin: Conn) -> None:
    """DNS rebinding: a page whose name now points at 127.0.0.1 sends its own name as Host."""
    job = schedule_as(webdb, webdb.odb.alice, "rebound")
    app = web_app.create_app(webdb.odb.dsn(webdb.odb.alice), single_user=True)
    with TestClient(app, base_url="http://evil.attacker.example:8392", follow_redirects=False) as c:
        r = c.get(f"/jobs/{job}/pause")
        assert r.status_code == 400 and "loopback host only" in r.text and "csrf" not in r.text
        assert c.post(f"/jobs/{job}/pause", data={"csrf": "x"}).status_code == 400
    for base in (LOOPBACK, "http://localhost:8080", "http://[::1]:8080"):
        with TestClient(app, base_url=base, follow_redirects=False) as c:
            page = c.get(f"/jobs/{job}/pause")
            assert page.status_code == 200, base
    with TestClient(app, base_url=LOOPBACK, follow_redirects=False) as c:
        r = c.post(f"/jobs/{job}/pause", data={"csrf": csrf_of(c.get(f"/jobs/{job}/pause").text)})
        assert r.status_code == 303
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (job,)) is False


def test_sessions_are_bounded_per_role_and_in_all_and_a_sign_in_ends_the_browsers_last(
        webdb: WebDb, wadmin: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    need_passwords(webdb)
    monkeypatch.setattr(web_sessions, "MAX_PER_ROLE", 2)
    monkeypatch.setattr(web_sessions, "MAX_SESSIONS", 3)
    app = web_app.create_app(webdb.dsn)
    with TestClient(app, follow_redirects=False) as c:
        for _ in range(4):  # one browser signing in again and again holds one session
            sign_in(c, webdb.odb.alice)
        assert dashboard_sessions(wadmin, webdb.odb.alice) == 1
        # A refused sign-in (a mistyped password when switching roles) keeps the session it had.
        assert attempt(c, webdb.odb.bob, "Wrong-Secret-4711").status_code == 401
        assert c.get("/jobs").status_code == 200 and dashboard_sessions(wadmin, webdb.odb.alice) == 1
    browsers = [TestClient(app, follow_redirects=False) for _ in range(4)]
    with browsers[0], browsers[1], browsers[2], browsers[3]:
        for b in browsers[:3]:
            sign_in(b, webdb.odb.alice)
        # alice's third session ended her oldest: two at most
        assert dashboard_sessions(wadmin, webdb.odb.alice) == 2
        assert browsers[0].get("/jobs").status_code == 303
        assert [b.get("/jobs").status_code for b in browsers[1:3]] == [200, 200]
        sign_in(browsers[3], webdb.odb.bob)
        r = attempt(TestClient(app, follow_redirects=False), webdb.odb.bob, PASSWORD)
        assert r.status_code == 401 and "holds 3 sessions, its most" in r.text
        assert dashboard_sessions(wadmin, webdb.odb.bob) == 1


def test_an_expired_session_closes_its_connection_without_a_request(
        webdb: WebDb, wadmin: Conn, monkeypatch: pytest.MonkeyPatch) -> None:
    need_passwords(webdb)
    monkeypatch.setattr(web_app, "EXPIRE_EVERY", 0.05)
    with TestClient(web_app.create_app(webdb.dsn), follow_redirects=False) as c:
        sign_in(c, webdb.odb.alice)
        assert dashboard_sessions(wadmin, webdb.odb.alice) == 1
        c.app.state.sessions.idle = 0.0  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while dashboard_sessions(wadmin, webdb.odb.alice):
            assert time.monotonic() < deadline, "the expired session's connection stayed open"
            time.sleep(0.05)
        assert len(c.app.state.sessions) == 0  # type: ignore[attr-defined]


def test_every_time_on_a_page_is_in_the_sessions_zone(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    """The next starts (pgsched's schedule code, in UTC) and the database's times (in the
    session's TimeZone) were printed side by side without a zone."""
    need_passwords(webdb)
    with webdb.odb.connect(webdb.odb.alice) as c:
        job = int(scalar(c, "SELECT pgsched.add_job('public.job_ok', '0 9 * * *', timezone => 'Asia/Tokyo')"))
    wadmin.execute(f'ALTER ROLE "{webdb.odb.alice}" SET timezone = \'America/New_York\'')
    try:
        sign_in(client, webdb.odb.alice)
        page = client.get(f"/jobs/{job}").text
    finally:
        wadmin.execute(f'ALTER ROLE "{webdb.odb.alice}" RESET timezone')
    starts = re.findall(r"<li>(\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d))</li>", page)
    assert len(starts) == 10
    # 09:00 in Tokyo is 19:00 or 20:00 in New York (EST or EDT), never 00:00 (UTC)
    assert {t for _, t in starts} <= {"19:00:00", "20:00:00"}, starts
    assert "times in America/New_York" in page


def test_secure_cookies_and_a_dsns_own_application_name(webdb: WebDb, wadmin: Conn) -> None:
    need_passwords(webdb)
    # Behind an https proxy the dashboard sees http: --secure-cookies marks them all the same (and a
    # browser then sends them back over https only).
    with TestClient(web_app.create_app(webdb.dsn, secure_cookies=True), base_url="https://dashboard.example",
                    follow_redirects=False) as c:
        signin = c.get("/signin")
        assert "secure" in signin.headers["set-cookie"].lower()
        r = c.post("/signin", data={"role": webdb.odb.alice, "password": PASSWORD, "csrf": csrf_of(signin.text)})
        assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()
    with TestClient(web_app.create_app(webdb.dsn), follow_redirects=False) as c:
        assert "secure" not in c.get("/signin").headers["set-cookie"].lower()
    with TestClient(web_app.create_app(webdb.dsn + " application_name=ops-dashboard"),
                    follow_redirects=False) as c:
        sign_in(c, webdb.odb.alice)
        assert c.get("/jobs").status_code == 200
        assert scalar(wadmin, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s "
                              "AND application_name = 'ops-dashboard'", (webdb.odb.alice,)) == 1


def test_bad_ids_and_search_text_get_a_clear_answer(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    need_passwords(webdb)
    assert client.get("/jobs/" + "9" * 5000).status_code == 303  # no session: to sign-in, no 500
    sign_in(client, webdb.odb.alice)
    for path in ("/jobs/" + "9" * 5000, "/jobs/3000000000", "/jobs/abc", "/jobs/²", "/jobs/3000000000/pause"):
        r = client.get(path)
        assert r.status_code == 404 and "not found" in r.text, path
    token = csrf_of(client.get("/jobs").text)
    r = client.post("/jobs/3000000000/pause", data={"csrf": token})
    assert r.status_code == 404 and "id is a number up to 2147483647" in r.text
    for q in ("\0", "a\0b"):
        r = client.get("/jobs", params={"q": q})
        assert r.status_code == 400 and "q: the search text cannot hold a NUL character" in r.text


def test_a_bad_page_runs_sort_or_dir_is_a_400_naming_it(webdb: WebDb, client: TestClient,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """They fell back to the default silently (README "Not yet" until 2026-12-01)."""
    need_passwords(webdb)
    sign_in(client, webdb.odb.alice)
    job_id = schedule_as(webdb, webdb.odb.alice, "bad_params")
    for path, params, said in (
            ("/jobs", {"page": "0"}, "page: '0' is not a whole number from 1 to 1000000"),
            ("/jobs", {"page": "x"}, "page: 'x' is not a whole number from 1 to 1000000"),
            ("/jobs", {"page": "1" * 5000}, "page: '11111111111111111111' is not a whole number"),
            ("/jobs", {"page": "-1"}, "page: '-1' is not a whole number"),
            ("/jobs", {"sort": "job_id; drop"}, "sort: 'job_id; drop' is not one of id, name, owner, state, "
                                                "next_start, last_outcome"),
            ("/jobs", {"dir": "up"}, "dir: 'up' is not one of asc, desc"),
            ("/timeline", {"page": "²"}, "page: '²' is not a whole number"),
            (f"/jobs/{job_id}", {"runs": "1001"}, "runs: '1001' is not a whole number from 1 to 1000"),
            (f"/jobs/{job_id}", {"runs": "2.5"}, "runs: '2.5' is not a whole number")):
        r = client.get(path, params=params)
        assert r.status_code == 400 and "Bad request" in r.text, (path, params, r.status_code)
        assert said.replace("'", "&#39;") in r.text, (path, params, r.text[-600:])
    # The accepted forms, and an empty value for the default, still answer.
    for path, params in (("/jobs", {"page": "2", "sort": "name", "dir": "desc"}), ("/jobs", {"page": ""}),
                         ("/timeline", {"page": "1"}), (f"/jobs/{job_id}", {"runs": "1000"})):
        assert client.get(path, params=params).status_code == 200, (path, params)
    # The job page's "older runs" link asks for no more than it accepts.
    for _ in range(2):
        fail_once(webdb, webdb.odb.alice, job_id)
    assert f'href="/jobs/{job_id}?runs=4"' in client.get(f"/jobs/{job_id}", params={"runs": "1"}).text
    monkeypatch.setattr(web_app, "MAX_RUNS", 2)
    assert f'href="/jobs/{job_id}?runs=2"' in client.get(f"/jobs/{job_id}", params={"runs": "1"}).text
    assert "older runs" not in client.get(f"/jobs/{job_id}", params={"runs": "2"}).text


def test_an_open_page_left_alone_idles_out(webdb: WebDb, client: TestClient) -> None:
    """The live refresh polled /live every second, and each poll counted as the person's request:
    an open tab kept its session until the 8-hour lifetime (README "Not yet" until 2026-12-01).
    Its polls and the reloads it makes (marked with REFRESH_HEADER) now leave the idle time alone."""
    need_passwords(webdb)
    sessions = client.app.state.sessions  # type: ignore[attr-defined]
    now = [1000.0]
    sessions.clock = lambda: now[0]
    sign_in(client, webdb.odb.alice)
    for _ in range(5):  # polls and reloads for 25 minutes of an idle of 30
        now[0] += 300
        assert client.get("/live").status_code == 200
        assert client.get("/jobs", headers={web_app.REFRESH_HEADER: "1"}).status_code == 200
    now[0] += 301  # 30 minutes and a second since the person's last request
    assert client.get("/live").status_code == 401
    assert client.get("/jobs").status_code == 303
    # A request of the person's own renews it.
    sign_in(client, webdb.odb.alice)
    now[0] += 1700
    assert client.get("/jobs").status_code == 200
    now[0] += 1700
    assert client.get("/live").status_code == 200


def test_a_job_whose_starts_leave_the_years_python_reads_has_its_page(
        webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    need_passwords(webdb)
    job = schedule_as(webdb, webdb.odb.alice, "millennium", every="1000 years")
    sign_in(client, webdb.odb.alice)
    r = client.get(f"/jobs/{job}")
    assert r.status_code == 200 and "no start within the years 1 to 9999" in r.text


def test_the_live_fingerprint_is_read_before_the_pages_data(
        webdb: WebDb, wadmin: Conn, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change that lands while the page reads its data shows at the next poll."""
    need_passwords(webdb)
    job = schedule_as(webdb, webdb.odb.alice, "raced")
    sign_in(client, webdb.odb.alice)
    read = dashboard.jobs_page

    def read_then_change(*args: Any, **kwargs: Any) -> Any:
        result = read(*args, **kwargs)
        wadmin.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (job,))
        return result

    monkeypatch.setattr(dashboard, "jobs_page", read_then_change)
    page = client.get("/jobs").text
    shown = re.search(r'data-live="([^"]+)"', page)
    assert shown is not None
    assert client.get("/live").json()["v"] != shown.group(1)  # the poll sees the change and reloads


def test_a_schema_of_another_release_at_sign_in_is_a_refusal_not_a_500(
        webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    need_passwords(webdb)
    n = migrate.code_version()
    wadmin.execute("INSERT INTO pgsched.schema_migration (version, name, checksum) VALUES (%s, 'next', 'x')",
                   (n + 1,))
    try:
        r = attempt(client, webdb.odb.alice, PASSWORD)
    finally:
        wadmin.execute("DELETE FROM pgsched.schema_migration WHERE version = %s", (n + 1,))
    assert r.status_code == 401 and "sign-in refused" in r.text and "upgrade pgsched" in r.text
    assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]


def test_single_user_with_its_database_away_answers_503_until_it_is_back(webdb: WebDb, wadmin: Conn) -> None:
    app = web_app.create_app(webdb.odb.dsn(webdb.odb.alice), single_user=True)
    kill = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsched web' "
            "AND usename = %s")
    with TestClient(app, base_url=LOOPBACK, follow_redirects=False) as c:
        assert c.get("/jobs").status_code == 200
        wadmin.execute(f'ALTER ROLE "{webdb.odb.alice}" NOLOGIN')
        try:
            wadmin.execute(kill, (webdb.odb.alice,))
            statuses = [c.get(path).status_code for path in ("/jobs", "/live", "/", "/live")]
            assert statuses[0] in (503, 200) and statuses[1:] == [503, 503, 503], statuses
        finally:
            wadmin.execute(f'ALTER ROLE "{webdb.odb.alice}" LOGIN')
        assert c.get("/jobs").status_code == 200


def test_the_overview_shows_crashes_in_a_row_and_a_job_its_config_as_json(
        webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    need_passwords(webdb)
    with webdb.odb.connect(webdb.odb.alice) as c:
        job = int(scalar(c, "SELECT pgsched.add_job('public.job_ok', '1 hour', "
                            "config => '{\"on\": true, \"off\": null}')"))
    wadmin.execute("UPDATE pgsched.job_stat SET consecutive_crashes = 3 WHERE job_id = %s", (job,))
    sign_in(client, webdb.odb.alice)
    assert "0 failures, 3 crashes" in client.get("/").text
    page = client.get(f"/jobs/{job}").text
    assert "{&#34;on&#34;: true, &#34;off&#34;: null}" in page and "True" not in page
