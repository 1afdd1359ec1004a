"""`pgsched web` in a real browser: Playwright driving Debian's Chromium (headless, launched
by path, no browser download) against a real uvicorn server and a real PostgreSQL. Saves a
screenshot of each page under docs/ (shown in the README)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'pgsched[web]') is not installed")
pytest.importorskip("playwright", reason="playwright is not installed (pip install playwright)")
CHROMIUM = os.environ.get("PGSCHED_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set PGSCHED_CHROMIUM)",
                allow_module_level=True)

import uvicorn  # noqa: E402
from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

from pgsched.embedded import free_port  # noqa: E402
from pgsched.web.app import create_app  # noqa: E402
from tests.integration.helpers import Conn, scalar  # noqa: E402
from tests.integration.web.conftest import PASSWORD, WebDb, add_runs, fail_once, schedule_as  # noqa: E402

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.fixture(scope="module")
def base_url(webdb: WebDb) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(webdb.dsn), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser, base_url: str) -> Iterator[Page]:
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    p = context.new_page()
    yield p
    context.close()


def sign_in(page: Page, role: str, password: str = PASSWORD) -> None:
    page.goto("/signin")
    page.get_by_label("Role").fill(role)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_alice_signs_in_and_sees_her_jobs_not_bobs(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    schedule_as(webdb, webdb.odb.alice, "alice-nightly", every="1 day")
    schedule_as(webdb, webdb.odb.bob, "bob-private")
    page.goto("/jobs")
    assert "/signin" in page.url
    page.get_by_label("Role").fill(webdb.odb.alice)
    page.screenshot(path=str(DOCS / "web-signin.png"))
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#jobs")).to_contain_text("alice-nightly")
    expect(page.locator("#role")).to_have_text(webdb.odb.alice)
    assert "bob-private" not in page.content()


def test_a_wrong_password_is_refused(webdb: WebDb, page: Page) -> None:
    if not webdb.passwords_checked:
        pytest.skip("an external PGSCHED_TEST_DSN cluster: its pg_hba.conf is not ours to change")
    sign_in(page, webdb.odb.alice, "not-the-password")
    expect(page.locator("#signin-error")).to_contain_text("password authentication failed")
    assert "/signin" in page.url
    assert "not-the-password" not in page.content()
    page.goto("/jobs")
    assert "/signin" in page.url  # still not signed in


def test_a_failing_jobs_error_appears_on_its_page(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "load-invoices", "CALL public.job_fail(0, NULL)", every="15 minutes")
    now = scalar(wadmin, "SELECT now()")
    add_runs(wadmin, j, now - timedelta(hours=20), 60, timedelta(minutes=15),
             ("success", "success", "success", "failure"))
    fail_once(webdb, webdb.odb.alice, j)
    sign_in(page, webdb.odb.alice)
    page.goto(f"/jobs/{j}")
    expect(page.locator("#history")).to_contain_text("failed on purpose")
    expect(page.locator("#history")).to_contain_text("PS009")
    expect(page.locator("#starts li")).to_have_count(10)
    page.screenshot(path=str(DOCS / "web-job.png"), full_page=True)


def test_pause_in_the_browser_disables_the_job_in_the_database(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "to-pause")
    sign_in(page, webdb.odb.alice)
    page.goto(f"/jobs/{j}")
    page.locator("#action-pause").click()
    expect(page.locator("h1")).to_contain_text(f"Pause job {j}")
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is True  # not before confirming
    page.locator("#confirm").click()
    expect(page.locator(".flash.ok")).to_contain_text(f"job {j} paused")
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is False
    expect(page.locator("#scheduled")).to_have_text("no")


def test_the_page_follows_a_change_within_two_seconds(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "watched")
    sign_in(page, webdb.odb.alice)
    page.goto(f"/jobs/{j}")
    expect(page.locator("#scheduled")).to_have_text("yes")
    with webdb.odb.connect(webdb.odb.alice) as alice:
        alice.execute("SELECT pgsched.alter_job(%s, scheduled => false)", (j,))
    expect(page.locator("#scheduled")).to_have_text("no", timeout=2000)  # no reload


def test_the_timeline_draws_one_bar_per_run(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    now = scalar(wadmin, "SELECT now()")
    for i, (every, outcomes) in enumerate([
            (timedelta(minutes=3), ("success",)),
            (timedelta(minutes=5), ("success", "success", "failure")),
            (timedelta(minutes=10), ("success", "skipped", "timeout")),
            (timedelta(minutes=7), ("success", "crash", "success", "missed"))]):
        j = schedule_as(webdb, webdb.odb.alice, f"etl-step-{i + 1}")
        add_runs(wadmin, j, now - timedelta(hours=1, minutes=30),
                 int(timedelta(hours=1, minutes=29) / every), every, outcomes)
    sign_in(page, webdb.odb.alice)
    page.goto("/timeline?window=1h")
    bars = page.locator("svg.timeline rect.run").count()
    in_window = scalar(wadmin, "SELECT count(*) FROM pgsched.job_run WHERE coalesce(started_at, plan_time) "
                               "< now() AND coalesce(finished_at, now()) >= now() - interval '1 hour'")
    assert bars == in_window and bars > 30
    assert page.locator("svg.timeline rect.run.failure").count() > 0
    page.screenshot(path=str(DOCS / "web-timeline.png"), full_page=True)


def test_a_post_without_the_csrf_token_is_refused(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    j = schedule_as(webdb, webdb.odb.alice, "guarded")
    sign_in(page, webdb.odb.alice)
    status = page.evaluate("""async (id) => (await fetch(`/jobs/${id}/pause`, {method: 'POST',
        headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body: ''})).status""", j)
    assert status == 403
    assert scalar(wadmin, "SELECT scheduled FROM pgsched.job WHERE job_id = %s", (j,)) is True


def test_screenshots_of_the_overview_and_jobs(webdb: WebDb, wadmin: Conn, page: Page) -> None:
    now = scalar(wadmin, "SELECT now()")
    # A stand-in for a running scheduler (the instances view wants a live backend: this one).
    wadmin.execute("INSERT INTO pgsched.instance (host, pid, version, backend_pid, max_workers) "
                   "VALUES ('db-worker-1', 4242, '0.2.0', pg_backend_pid(), 8)")
    try:
        for i, name in enumerate(["refresh-mv-sales", "vacuum-events", "rollup-hourly", "expire-sessions",
                                  "sync-crm", "purge-audit-log"]):
            j = schedule_as(webdb, webdb.odb.alice, name, every=["5 minutes", "1 hour", "0 * * * *",
                                                                  "*/10 * * * *", "30 2 * * *", "1 day"][i])
            n = 30 + 7 * i
            add_runs(wadmin, j, now - timedelta(minutes=59), n, timedelta(seconds=3500 / n),
                     ("success",) * (3 + i) + ("failure",) * (i % 3) + ("timeout",) * (i % 2))
        bad = schedule_as(webdb, webdb.odb.alice, "import-feed", "CALL public.job_fail(0, NULL)")
        fail_once(webdb, webdb.odb.alice, bad)
        sign_in(page, webdb.odb.alice)
        page.goto("/")
        expect(page.locator("#runs-chart rect").first).to_be_visible()
        expect(page.locator("#instances")).to_contain_text("db-worker-1")
        page.screenshot(path=str(DOCS / "web-overview.png"), full_page=True)
        page.goto("/jobs")
        expect(page.locator("#jobs")).to_contain_text("refresh-mv-sales")
        page.screenshot(path=str(DOCS / "web-jobs.png"), full_page=True)
    finally:
        wadmin.execute("DELETE FROM pgsched.instance")
