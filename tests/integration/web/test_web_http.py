"""`pgsched web` over HTTP (Starlette's TestClient) against a real PostgreSQL: sign-in as a
PostgreSQL role, what each role sees, CSRF, confirmations, actions and PostgreSQL's
refusals, the pages' contents, the timeline's bars and buckets, session expiry, live."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'pgsched[web]') is not installed")

from click.testing import CliRunner
from starlette.testclient import TestClient

from pgsched import commands
from pgsched.embedded import free_port
from pgsched.errors import ConfigError
from pgsched.web import app as web_app
from pgsched.web import server
from pgsched.web.throttle import SignInThrottle
from tests.integration.helpers import Conn, scalar
from tests.integration.web.conftest import PASSWORD, WebDb, add_runs, fail_once, schedule_as


@pytest.fixture
def client(webdb: WebDb) -> Iterator[TestClient]:
    with TestClient(web_app.create_app(webdb.dsn), follow_redirects=False) as c:
        yield c


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


def sign_in(c: TestClient, role: str, password: str = PASSWORD) -> None:
    token = csrf_of(c.get("/signin").text)
    r = c.post("/signin", data={"role": role, "password": password, "csrf": token, "next": "/jobs"})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == "/jobs"


def test_pages_need_a_session(client: TestClient) -> None:
    for path in ("/", "/jobs", "/jobs/1", "/timeline"):
        r = client.get(path)
        assert r.status_code == 303 and r.headers["location"].startswith("/signin"), path
    assert client.get("/live").status_code == 401


def test_wrong_password_is_refused_and_never_shown_or_logged(webdb: WebDb, client: TestClient,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    if not webdb.passwords_checked:
        pytest.skip("an external PGSCHED_TEST_DSN cluster: its pg_hba.conf is not ours to change")
    caplog.set_level(logging.DEBUG)
    token = csrf_of(client.get("/signin").text)
    wrong = "Wrong-Secret-4711"
    r = client.post("/signin", data={"role": webdb.odb.alice, "password": wrong, "csrf": token})
    assert r.status_code == 401
    assert "password authentication failed" in r.text
    assert wrong not in r.text and wrong not in caplog.text
    assert "pgsched_session" not in r.headers.get("set-cookie", "")
    assert client.get("/jobs").status_code == 303
    assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]


def test_refused_sign_ins_are_throttled_without_asking_postgresql(webdb: WebDb) -> None:
    """After five refused sign-ins for one role from one address, the next (right password or not)
    is answered 429 with Retry-After and no session (the right password opened none: PostgreSQL was
    not asked); other roles still sign in; when the window has passed the role signs in again."""
    if not webdb.passwords_checked:
        pytest.skip("an external PGSCHED_TEST_DSN cluster: its pg_hba.conf is not ours to change")
    now = [0.0]
    throttle = SignInThrottle(clock=lambda: now[0])
    with TestClient(web_app.create_app(webdb.dsn, throttle=throttle), follow_redirects=False) as client:
        def attempt(role: str, password: str) -> Any:
            token = csrf_of(client.get("/signin").text)
            return client.post("/signin", data={"role": role, "password": password, "csrf": token})

        for _ in range(5):
            assert attempt(webdb.odb.alice, "Wrong-Secret-4711").status_code == 401
        r = attempt(webdb.odb.alice, PASSWORD)
        assert r.status_code == 429 and "too many refused sign-ins" in r.text
        assert r.headers["retry-after"] == "300"
        assert "pgsched_session" not in r.headers.get("set-cookie", "")
        assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]
        sign_in(client, webdb.odb.bob)  # another role from the same address
        now[0] = 301.0
        # refusals that are not a guess are not counted: a form without a password
        for _ in range(10):
            assert attempt(webdb.odb.alice, "").status_code == 401
        sign_in(client, webdb.odb.alice)


def test_sign_ins_refused_by_a_server_that_is_down_are_not_counted(webdb: WebDb) -> None:
    """A person retrying while PostgreSQL cannot be reached is not throttled for it afterwards."""
    down = f"host=127.0.0.1 port={free_port()} dbname=postgres connect_timeout=2"
    with TestClient(web_app.create_app(down), follow_redirects=False) as client:
        for _ in range(8):
            token = csrf_of(client.get("/signin").text)
            r = client.post("/signin", data={"role": webdb.odb.alice, "password": PASSWORD, "csrf": token})
            assert r.status_code == 401 and "sign-in refused" in r.text, r.text


def test_sign_in_without_its_csrf_token_is_refused(webdb: WebDb, client: TestClient) -> None:
    client.get("/signin")
    r = client.post("/signin", data={"role": webdb.odb.alice, "password": PASSWORD})
    assert r.status_code == 403 and "CSRF" in r.text
    r = client.post("/signin", data={"role": webdb.odb.alice, "password": PASSWORD, "csrf": "forged"})
    assert r.status_code == 403


def test_the_session_cookie_is_httponly_strict_and_sessions_expire(webdb: WebDb, client: TestClient) -> None:
    token = csrf_of(client.get("/signin").text)
    r = client.post("/signin", data={"role": webdb.odb.alice, "password": PASSWORD, "csrf": token})
    cookie = r.headers["set-cookie"].lower()
    assert "pgsched_session=" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    assert PASSWORD.lower() not in cookie
    assert client.get("/jobs").status_code == 200
    sessions = client.app.state.sessions  # type: ignore[attr-defined]
    sessions.idle = 0.0
    assert client.get("/jobs").status_code == 303  # expired: back to sign-in
    assert len(sessions) == 0


def test_alice_sees_her_jobs_and_not_bobs(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    mine = schedule_as(webdb, webdb.odb.alice, "alice-report")
    theirs = schedule_as(webdb, webdb.odb.bob, "bob-secret-job")
    sign_in(client, webdb.odb.alice)
    page = client.get("/jobs").text
    assert "alice-report" in page and "bob-secret-job" not in page
    assert f'id="role">{webdb.odb.alice}<' in page
    assert client.get(f"/jobs/{mine}").status_code == 200
    r = client.get(f"/jobs/{theirs}")
    assert r.status_code == 404 and "bob-secret-job" not in r.text
    assert "bob-secret-job" not in client.get("/timeline?window=7d").text
    assert "bob-secret-job" not in client.get("/").text


def test_a_failing_jobs_error_is_on_its_page_and_the_overview(webdb: WebDb, wadmin: Conn,
                                                              client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "breaks", "CALL public.job_fail(0, NULL)")
    fail_once(webdb, webdb.odb.alice, j)
    sign_in(client, webdb.odb.alice)
    page = client.get(f"/jobs/{j}").text
    assert "failed on purpose" in page and "PS009" in page
    assert len(re.findall(r"<tr class=\"run failure\"", page)) == 1
    overview = client.get("/").text
    assert "failed on purpose" in overview and f"/jobs/{j}" in overview
    assert 'id="runs-chart"' in overview and 'class="failure"' in overview  # the minute's bar


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(webdb: WebDb, wadmin: Conn,
                                                                      client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "keep-running")
    sign_in(client, webdb.odb.alice)
    assert client.post(f"/jobs/{j}/pause").status_code == 403
    assert client.post(f"/jobs/{j}/pause", data={"csrf": "not-the-token"}).status_code == 403
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is True


def test_pause_and_resume_need_a_confirmation_and_change_the_job(webdb: WebDb, wadmin: Conn,
                                                                 client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "pausable")
    sign_in(client, webdb.odb.alice)
    before = client.get("/live").json()["v"]
    confirm = client.get(f"/jobs/{j}/pause")
    assert confirm.status_code == 200 and "Pause job" in confirm.text
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is True  # a GET does nothing
    r = client.post(f"/jobs/{j}/pause", data={"csrf": csrf_of(confirm.text)})
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{j}"
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is False
    page = client.get(f"/jobs/{j}").text
    assert f"job {j} paused" in page and 'id="scheduled">no<' in page
    assert client.get("/live").json()["v"] != before
    r = client.post(f"/jobs/{j}/resume", data={"csrf": csrf_of(page)})
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is True


def test_trigger_and_cancel_go_through_the_sql_api(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "on-demand")
    sign_in(client, webdb.odb.alice)
    wadmin.execute("LISTEN pgsched_catalog")
    token = csrf_of(client.get(f"/jobs/{j}/trigger").text)
    client.post(f"/jobs/{j}/trigger", data={"csrf": token})
    assert "a run was requested" in client.get(f"/jobs/{j}").text
    # trigger_job's request to the schedulers (a row, and a notification that names it: sql/api/50_requests.sql)
    asks = [n.payload for n in wadmin.notifies(timeout=2, stop_after=1)]
    [request] = wadmin.execute("SELECT request_id FROM pgsched.request WHERE kind = 'trigger' AND job_id = %s",
                               (j,)).fetchall()
    assert asks == [f"request:{request[0]}"], asks
    client.post(f"/jobs/{j}/cancel", data={"csrf": token})
    assert "has no run in progress to cancel" in client.get(f"/jobs/{j}").text


def test_postgresqls_refusal_is_shown(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    theirs = schedule_as(webdb, webdb.odb.bob, "bobs")
    sign_in(client, webdb.odb.alice)
    token = csrf_of(client.get("/jobs").text)
    r = client.post(f"/jobs/{theirs}/pause", data={"csrf": token})
    assert r.status_code == 303
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (theirs,)) is True
    # alice cannot see the job, so its page is not hers either: the refusal is shown on the next page.
    shown = client.get("/jobs").text
    assert re.search(r"PostgreSQL refused \([0-9A-Z]{5}\)", shown), shown


def test_jobs_search_sort_and_pages(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    with webdb.odb.connect(webdb.odb.alice) as c:
        for i in range(60):
            c.execute("SELECT pgsched.schedule(%s, '*/5 * * * *', 'SELECT 1')", (f"job-{i:02d}",))
        c.execute("SELECT pgsched.schedule('nightly_100%', '30 2 * * *', 'SELECT 1')")
    sign_in(client, webdb.odb.alice)
    first = client.get("/jobs").text
    assert first.count('<tr class="job"') == 50 and "page 1 of 2" in first
    assert "every 5 minutes" in first and "*/5 * * * *" in first
    assert client.get("/jobs?page=2").text.count('<tr class="job"') == 11
    found = client.get("/jobs", params={"q": "100%"}).text
    assert found.count('<tr class="job"') == 1 and "daily at 02:30" in found
    # wildcards are literal: as a pattern "job_0" would match job-00..job-09 (and "_5" the owner
    # alice_<hex> whenever the hex starts with 5)
    assert client.get("/jobs", params={"q": "job_0"}).text.count('<tr class="job"') == 0
    desc = client.get("/jobs", params={"sort": "name", "dir": "desc"}).text
    names = re.findall(r'<a href="/jobs/\d+">([^<]+)</a>', desc)
    assert names[:2] == ["nightly_100%", "job-59"]
    evil = client.get("/jobs", params={"sort": "job_id; DROP TABLE pgsched.job", "dir": "sideways"})
    assert evil.status_code == 400 and "sort: &#39;job_id; DROP TABLE" in evil.text
    assert scalar(wadmin, "SELECT count(*) FROM pgsched.job") == 61


def test_a_jobs_page_shows_its_settings_next_starts_and_history(webdb: WebDb, wadmin: Conn,
                                                                 client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "hourly", every="1 hour")
    now = scalar(wadmin, "SELECT now()")
    add_runs(wadmin, j, now - timedelta(hours=2), 4, timedelta(minutes=20))
    sign_in(client, webdb.odb.alice)
    page = client.get(f"/jobs/{j}").text
    starts = re.findall(r"<li>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)</li>", page)
    assert len(starts) == 10 and len(set(starts)) == 10 and starts == sorted(starts)
    assert "every 1 hour" in page and "boom 1" in page
    assert page.count('<tr class="run ') == 4
    assert page.count('class="run ') - page.count('<tr class="run ') == 4  # and four bars on its timeline


def test_a_jobs_next_starts_leave_out_its_exclusion_window(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "mornings off", every="1 hour")
    wadmin.execute("SELECT pgsched.alter_job(%s, exclude => '* 0-11 * * *')", (j,))  # the job's zone: UTC
    sign_in(client, webdb.odb.alice)
    page = client.get(f"/jobs/{j}").text
    assert "<code>* 0-11 * * *</code>" in page
    starts = re.findall(r"<li>\d{4}-\d\d-\d\d (\d\d):\d\d:\d\d</li>", page)
    assert len(starts) == 10 and all(int(h) >= 12 for h in starts), starts


def test_a_jobs_page_shows_its_jitter_and_next_due(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "spread out", every="1 hour")
    wadmin.execute("SELECT pgsched.alter_job(%s, jitter => '10 minutes')", (j,))
    due = scalar(wadmin, "SELECT next_due FROM pgsched.job_stats WHERE job_id = %s", (j,))
    sign_in(client, webdb.odb.alice)
    page = client.get(f"/jobs/{j}").text
    assert f'<td id="jitter">up to 0:10:00 (next due {due:%Y-%m-%d %H:%M:%S})</td>' in page, page


def test_a_jobs_page_shows_its_concurrency_key_and_what_it_waits_for(webdb: WebDb, wadmin: Conn,
                                                                      client: TestClient) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "keyed", every="1 hour")
    wadmin.execute("SELECT pgsched.alter_job(%s, concurrency_key => 'heavy')", (j,))
    sign_in(client, webdb.odb.alice)
    assert '<td id="concurrency"><code>heavy</code></td>' in client.get(f"/jobs/{j}").text
    wadmin.execute("SELECT pgsched.set_concurrency_limit('heavy', 0)")
    try:
        wadmin.execute("UPDATE pgsched.job_stat SET next_start = now() - interval '1 minute' WHERE job_id = %s", (j,))
        page = client.get(f"/jobs/{j}").text
        assert ('<td id="concurrency"><code>heavy</code> &mdash; waiting: concurrency limit of &#39;heavy&#39;: '
                '0 of 0 running</td>') in page, page
    finally:
        wadmin.execute("SELECT pgsched.set_concurrency_limit('heavy', NULL)")


def test_a_jobs_page_shows_the_jobs_it_runs_after_and_what_it_waits_for(webdb: WebDb, wadmin: Conn,
                                                                         client: TestClient) -> None:
    up = schedule_as(webdb, webdb.odb.alice, "upstream", every="1 hour")
    j = schedule_as(webdb, webdb.odb.alice, "downstream", every="1 hour")
    wadmin.execute("SELECT pgsched.alter_job(%s, schedule => '@after', depends_on => %s)", (j, [str(up)]))
    sign_in(client, webdb.odb.alice)
    page = client.get(f"/jobs/{j}").text
    assert (f'<td id="depends_on"><a href="/jobs/{up}">job {up}</a> (each time they all succeeded) &mdash; '
            f'waiting: upstream job(s) not succeeded since its last run: {up} (upstream)</td>') in page, page
    assert '<td id="depends_on">-</td>' in client.get(f"/jobs/{up}").text


def test_the_timeline_draws_one_bar_per_run(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    a = schedule_as(webdb, webdb.odb.alice, "tl-a")
    b = schedule_as(webdb, webdb.odb.alice, "tl-b")
    now = scalar(wadmin, "SELECT now()")
    add_runs(wadmin, a, now - timedelta(minutes=50), 25, timedelta(minutes=2))
    add_runs(wadmin, b, now - timedelta(hours=3), 30, timedelta(minutes=10))
    sign_in(client, webdb.odb.alice)
    page = client.get("/timeline?window=1h").text
    in_window = scalar(wadmin, "SELECT count(*) FROM pgsched.job_run WHERE coalesce(started_at, plan_time) "
                               "< now() AND coalesce(finished_at, now()) >= now() - interval '1 hour'")
    bars = re.findall(r'<rect [^>]*class="run (\w+)', page)
    assert len(bars) == in_window and in_window > 25
    assert bars.count("skipped") > 0 and 'class="run skipped mark"' in page
    assert f"{in_window} runs, one bar each" in page


def test_a_crowded_timeline_is_bucketed_and_says_so(webdb: WebDb, wadmin: Conn, client: TestClient,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_app, "MAX_BARS", 20)
    a = schedule_as(webdb, webdb.odb.alice, "busy")
    now = scalar(wadmin, "SELECT now()")
    add_runs(wadmin, a, now - timedelta(minutes=50), 100, timedelta(seconds=29))
    sign_in(client, webdb.odb.alice)
    page = client.get("/timeline?window=1h").text
    assert "more than 20 bars: bucketed by 60 s" in page
    assert 'class="run ' not in page
    counted = sum(int(n) for n in re.findall(r": (\d+) runs \(", page))
    assert counted == 100  # every run is in a bucket: none dropped


def test_a_bad_window_is_refused_with_the_accepted_form(webdb: WebDb, client: TestClient) -> None:
    sign_in(client, webdb.odb.alice)
    for bad in ("10s", "8d", "soon"):
        r = client.get("/timeline", params={"window": bad})
        assert r.status_code == 400 and "window:" in r.text, bad


def test_security_headers(webdb: WebDb, client: TestClient) -> None:
    sign_in(client, webdb.odb.alice)
    r = client.get("/")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["cache-control"] == "no-store"
    assert client.get("/static/live.js").status_code == 200


def test_single_user_uses_the_dsns_role_and_only_on_loopback(webdb: WebDb) -> None:
    with TestClient(web_app.create_app(webdb.odb.dsn(webdb.odb.alice), single_user=True),
                    base_url="http://127.0.0.1", follow_redirects=False) as c:
        page = c.get("/jobs")
        assert page.status_code == 200 and f'id="role">{webdb.odb.alice}<' in page.text
        assert c.get("/signin").status_code == 303
        assert c.post("/jobs/1/pause").status_code == 403  # CSRF still applies
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert server.is_loopback(host)
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        assert not server.is_loopback(host)
    with pytest.raises(ConfigError, match=r"--single-user: refusing to listen on 0\.0\.0\.0"):
        server.serve(webdb.dsn, "0.0.0.0:8080", single_user=True, idle=60, lifetime=600)
    with pytest.raises(ConfigError, match=r"--listen: 'nowhere' is not HOST:PORT"):
        server.parse_listen("nowhere")
    r = CliRunner().invoke(commands.main, ["web", "--dsn", webdb.dsn, "--single-user", "--listen", "[::]:8080"])
    assert r.exit_code == 1 and "refusing to listen on ::" in r.output


def test_the_timeline_pages_through_jobs_and_says_so(webdb: WebDb, wadmin: Conn, client: TestClient,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_app, "MAX_ROWS", 2)
    now = scalar(wadmin, "SELECT now()")
    ids = [schedule_as(webdb, webdb.odb.alice, f"row-{i}") for i in range(3)]
    for j in ids:
        add_runs(wadmin, j, now - timedelta(minutes=30), 3, timedelta(minutes=5))
    sign_in(client, webdb.odb.alice)
    first = client.get("/timeline?window=1h").text
    assert "jobs 1-2 of 3 (page 1 of 2)" in first and "6 runs, one bar each" in first
    assert f"{ids[0]} row-0" in first and "row-2" not in first
    second = client.get("/timeline?window=1h&page=2").text
    assert "jobs 3-3 of 3 (page 2 of 2)" in second and f"{ids[2]} row-2" in second
    assert len(re.findall(r'<rect [^>]*class="run ', second)) == 3


def test_a_role_the_server_lets_in_without_a_password_cannot_sign_in(webdb: WebDb, client: TestClient) -> None:
    if not webdb.passwords_checked:
        pytest.skip("an external PGSCHED_TEST_DSN cluster: its pg_hba.conf is not ours to change")
    # The test cluster trusts local connections; only alice's and bob's lines ask for a password.
    token = csrf_of(client.get("/signin").text)
    r = client.post("/signin", data={"role": webdb.odb.team, "password": "anything", "csrf": token})
    assert r.status_code == 401 and "without checking its password" in r.text
    assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]


def test_pgsched_web_serves_as_a_command(webdb: WebDb) -> None:
    """The real command (`python -m pgsched web`), as a subprocess, on a free loopback port."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-m", "pgsched", "web", "--dsn", webdb.odb.dsn(webdb.odb.alice),
                             "--single-user", "--listen", f"127.0.0.1:{port}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "pgsched web did not answer"
                time.sleep(0.2)
        assert f'id="role">{webdb.odb.alice}<' in body
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0].decode()
    assert PASSWORD not in out  # the DSN's password is not in the server's log


def test_a_lost_connection_ends_the_session_and_single_user_reconnects(webdb: WebDb, wadmin: Conn,
                                                                         client: TestClient) -> None:
    sign_in(client, webdb.odb.alice)
    kill = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsched web' "
            "AND usename = %s")
    wadmin.execute(kill, (webdb.odb.alice,))
    r = client.get("/jobs")
    assert r.status_code in (303, 503)  # lost during the request (503) or found closed first (to sign-in)
    assert client.get("/jobs").status_code == 303
    assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]
    with TestClient(web_app.create_app(webdb.odb.dsn(webdb.odb.alice), single_user=True),
                    base_url="http://127.0.0.1", follow_redirects=False) as c:
        assert c.get("/jobs").status_code == 200
        wadmin.execute(kill, (webdb.odb.alice,))
        statuses = [c.get("/jobs").status_code for _ in range(2)]
        assert statuses[-1] == 200 and statuses[0] in (200, 503)


def test_a_page_slower_than_the_statement_timeout_says_so(webdb: WebDb, wadmin: Conn, client: TestClient) -> None:
    sign_in(client, webdb.odb.alice)
    session = next(iter(client.app.state.sessions._by_id.values()))  # type: ignore[attr-defined]
    assert session.conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == \
        web_app.STATEMENT_TIMEOUT
    # The jobs page's count and page of 60 jobs take more than a millisecond.
    with webdb.odb.connect(webdb.odb.alice) as c:
        for i in range(60):
            c.execute("SELECT pgsched.schedule(%s, '1 hour', 'SELECT 1')", (f"slow-{i}",))
    session.conn.execute("SET statement_timeout = '1ms'")
    r = client.get("/jobs?q=x")
    assert r.status_code == 503 and "statement_timeout" in r.text
    session.conn.execute("RESET statement_timeout")
    assert client.get("/jobs").status_code == 200


def test_sign_out_needs_the_csrf_token_and_ends_the_session(webdb: WebDb, client: TestClient) -> None:
    sign_in(client, webdb.odb.alice)
    assert client.post("/signout").status_code == 403
    assert client.get("/jobs").status_code == 200  # still signed in
    r = client.post("/signout", data={"csrf": csrf_of(client.get("/jobs").text)})
    assert r.status_code == 303 and r.headers["location"] == "/signin"
    assert len(client.app.state.sessions) == 0  # type: ignore[attr-defined]
    assert client.get("/jobs").status_code == 303
