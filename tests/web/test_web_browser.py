"""zeroth-pg web in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium), clicking through the flows an operator uses: overview → runs → filter → run → cancel;
bulk cancel through its confirmation; redrive a dead letter; page older and back newer; live
updates that keep the page (no reload) and pause; a read-only dashboard with no action and a
refused forged POST; a page of another origin that cannot post; the token leaving the address
bar; and every page of the route table rendered, refreshing itself, with no browser error.

Marked ``browser`` (``python -m pytest -m browser``). Every wait is a WebDriverWait on a
condition (30 s is a failure bound only); nothing sleeps a fixed time or asserts on elapsed time.
Screenshots go to ZEROTH_PG_TEST_REPORTS/web/, or to ZEROTH_PG_SCREENSHOTS (the docs' images:
``python -m tests.web.screenshots``).
"""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import shutil
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import make_run
from test_web_pages import _dead_letter, _now, _status

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
#: CI (.ci/run as root) sets it: without a browser the module fails instead of skipping.
REQUIRED = os.environ.get("ZEROTH_PG_REQUIRE_BROWSER") == "1"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.xdist_group("browser"),  # one worker, one Chromium
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER) and not REQUIRED,
        reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
               "chromium-driver; .ci/run installs them)"),
]
WAIT = 30  # a failure bound for every wait on the browser, never a pace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, dsn: str, token: str | None = None, **kwargs: Any) -> None:
        import uvicorn

        from zeroth_pg.web import create_app

        self.port = _free_port()
        kwargs.setdefault("enable_actions", True)
        self.app = create_app(dsn, token=token, **kwargs)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:  # startup, not a timed assertion
            threading.Event().wait(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (each test starts with no cookies)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (CHROMIUM and DRIVER):
        pytest.fail("ZEROTH_PG_REQUIRE_BROWSER=1 but chromium or chromedriver is missing "
                    "(apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def driver(browser: Any) -> Any:
    browser.delete_all_cookies()
    browser.set_window_size(1280, 900)
    return browser


def _shots() -> Path:
    out = os.environ.get("ZEROTH_PG_SCREENSHOTS")
    path = Path(out) if out else Path(
        os.environ.get("ZEROTH_PG_TEST_REPORTS", "build/test-reports")) / "web"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _shoot(driver: Any, path: Path) -> None:
    """The whole page: the window grown to the document's height."""
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1280, min(4000, max(900, int(height) + 140)))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)


def _click_and_wait(driver: Any, by: str, value: str) -> None:
    """Click the element found by (by, value) and wait until the page it leads to has replaced
    this one (a POST answered, a GET loaded): the old document carries a mark the new one has
    not. Found again if a live refresh swapped it just before the click (chromedriver says so
    either as a stale element or as a node that "does not belong to the document")."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def clicked(d: Any) -> bool:
        try:
            d.find_element(by, value).click()
        except StaleElementReferenceException:
            return False
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc.msg):
                raise
            return False
        return True

    driver.execute_script("window.zpOld = true")
    WebDriverWait(driver, WAIT).until(clicked)
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
        "return !window.zpOld && document.readyState === 'complete'"))


def _ids(driver: Any, table: str) -> list[str]:
    """The run ids a table lists, read in one script (a live refresh may swap the table between
    two WebDriver calls)."""
    hrefs = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(function (a) { return a.getAttribute('href'); })",
        f"#{table} tbody td:first-child a")
    return [h.rsplit("/", 1)[1].split("?", 1)[0] for h in hrefs]  # the id, not its scope


def _text(driver: Any, element_id: str) -> str | None:
    """An element's text, read in one script (see _ids)."""
    text: str | None = driver.execute_script(
        "var e = document.getElementById(arguments[0]); return e ? e.textContent : null",
        element_id)
    return text


async def _seed(conn: asyncpg.Connection) -> dict[str, Any]:
    """A dashboard with something on every page: an hour of history, pending, running (with a
    step), waiting (for an event), failed with a traceback, a dead letter, a schedule. Returns
    the values a page's path parameters are filled with (see :data:`PATH_SAMPLES`)."""
    now = await _now(conn)
    for k in range(45):
        await make_run(conn, "failed" if k % 7 == 3 else "completed",
                       deployment_ref=("mail", "billing", "search")[k % 3],
                       now=now - timedelta(minutes=(k * 5) % 58, seconds=k), payload={"n": k})
    for i in range(6):
        await make_run(conn, "completed" if i % 2 else "pending", deployment_ref="mail",
                       now=now, payload={"to": f"user{i}@example.com"})
    running = await make_run(conn, "running", deployment_ref="reports", now=now,
                             worker_id="host-a:worker-1", lease_seconds=600,
                             payload={"report": "q3"})
    assert await conn.fetchval(
        """SELECT s.recorded FROM zeroth_test.record_step(run_id => $1, worker_id => $2,
               generation => $3, step_key => 'render-pdf', result => '{"pages": 12}',
               now_override => $4) s""",
        running.run_id, running.worker_id, running.generation, now)
    waiting = await make_run(conn, "running", deployment_ref="approvals", now=now,
                             worker_id="host-b:worker-1", lease_seconds=600,
                             tenant_id="acme", payload={"invoice": 42})
    assert await conn.fetchval(
        """SELECT w.outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
               generation => $3, step_key => '#event:approved', name => 'approved',
               timeout_seconds => 3600, tenant_id => 'acme', now_override => $4) w""",
        waiting.run_id, waiting.worker_id, waiting.generation, now) == "waiting"
    dead = await _dead_letter(conn, "mail", now)
    schedule = await conn.fetchval(
        "SELECT s.schedule_id FROM zeroth.create_schedule(name => 'nightly-report', "
        "deployment_ref => 'reports', cron => '0 2 * * *') s")
    return {"run": running.run_id, "waiting": waiting.run_id, "dead": dead,
            "schedule": schedule, "now": now}


#: A value for each path parameter a page of the route table may take ({name} in its path),
#: from _seed's runs; a page with a parameter not listed here is reported, not skipped silently.
PATH_SAMPLES = {
    "run_id": "run", "deployment_ref": "reports", "deployment": "reports", "ref": "reports",
    "name": "nightly-report", "schedule": "nightly-report", "schedule_id": "schedule",
    "schedule_name": "nightly-report", "worker_id": "host-a:worker-1", "tenant_id": "acme",
    "tenant": "acme", "event": "approved", "event_name": "approved",
}
#: The query a page needs to show something (a page not listed gets none).
PAGE_QUERIES = {"/bulk": "?op=cancel&source=runs&deployment=mail",
                "/deployments/scope": "?deployment=reports&tenant=default"}


def pages_of(app: Any, samples: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Every HTML page of the app's route table (GET routes; not /static, not *.json) as
    {screenshot name: URL path with its parameters filled}, and the paths it could not fill."""
    from starlette.routing import Route

    pages: dict[str, str] = {}
    missing: list[str] = []
    for route in app.routes:
        if not isinstance(route, Route) or "GET" not in (route.methods or ()):
            continue
        path = route.path
        if path.endswith((".json", ".txt")) or path in ("/metrics", "/healthz"):
            continue
        if path == "/runs/{run_id}/events":  # an event stream, not a page: it streams until the
            continue                          # run ends (tests/web/test_web_run_events.py)
        params = re.findall(r"{(\w+)(?::\w+)?}", path)
        if any(p not in PATH_SAMPLES for p in params):
            missing.append(path)
            continue

        def sample(match: re.Match[str]) -> str:
            value = PATH_SAMPLES[match.group(1)]
            return urllib.parse.quote(str(samples.get(value, value)), safe=":")

        filled = re.sub(r"{(\w+)(?::\w+)?}", sample, path)
        name = "overview" if path == "/" else re.sub(
            r"[^a-z0-9]+", "-", re.sub(r"{(\w+)(?::\w+)?}", "detail", path).lower()).strip("-")
        pages[name] = filled + PAGE_QUERIES.get(path, "")
    return pages, missing


async def test_every_page_of_the_route_table_renders_live_with_no_browser_error(database_dsn,
                                                                               driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    conn = await asyncpg.connect(database_dsn)
    try:
        samples = await _seed(conn)
        server = _Server(database_dsn, live_seconds=0.2)
        pages, missing = pages_of(server.app, samples)
        assert {"overview", "runs", "runs-detail", "dead-letters", "workers", "bulk"} <= set(
            pages), pages
        assert not missing, f"add a sample for these pages' parameters to PATH_SAMPLES: {missing}"
        out = _shots()
        with server as base:
            driver.get_log("browser")  # drop anything earlier
            for name, path in pages.items():
                driver.get(base + path)
                assert "zeroth-pg" in driver.title, (path, driver.page_source[:500])
                assert driver.find_elements(By.TAG_NAME, "h1"), path
                assert driver.find_elements(By.ID, "live-toggle"), path
                # Live: the page has refreshed itself in place at least once (a confirmation
                # says it never does).
                WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
                    "return !!document.querySelector('[data-static]')"
                    " || Number(document.body.dataset.refreshed || 0) > 0"))
                _shoot(driver, out / f"dashboard-{name}.png")
                errors = [e for e in driver.get_log("browser")
                          if "favicon.ico" not in e.get("message", "")]
                assert not errors, (path, errors)
            driver.get(f"{base}/runs/{samples['waiting']}")
            _shoot(driver, out / "dashboard-runs-detail-waiting.png")
    finally:
        await conn.close()


async def test_operator_flows_filter_open_cancel_bulk_cancel_redrive_and_page(
        database_dsn, driver, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    monkeypatch.setattr("zeroth_pg.web.app.PAGE_SIZE", 3)
    conn = await asyncpg.connect(database_dsn)
    try:
        samples = await _seed(conn)
        now = samples["now"]
        batch = [(await make_run(conn, "pending", deployment_ref="batch", now=now)).run_id
                 for _ in range(7)]
        out = _shots()
        with _Server(database_dsn) as base:
            # Overview → Runs (the nav) → filter → the run → Cancel.
            driver.get(base + "/")
            assert "reports" in driver.find_element(By.ID, "overview").text
            _click_and_wait(driver, By.LINK_TEXT, "Runs")
            box = driver.find_element(By.NAME, "deployment")
            box.send_keys("reports")
            _click_and_wait(driver, By.CSS_SELECTOR, ".filters button")
            assert "deployment=reports" in driver.current_url
            assert _ids(driver, "runs") == [str(samples["run"])]
            _click_and_wait(driver, By.CSS_SELECTOR, "#runs tbody a")
            assert "render-pdf" in driver.find_element(By.TAG_NAME, "main").text
            # Cancel asks first: the confirmation names this one run, then acts on it.
            _click_and_wait(driver, By.ID, "cancel")
            assert driver.find_element(By.TAG_NAME, "h1").text == "Cancel 1 run?"
            assert _ids(driver, "bulk-runs") == [str(samples["run"])]
            _click_and_wait(driver, By.ID, "bulk-confirm")
            assert "1 of 1 confirmed" in driver.find_element(By.TAG_NAME, "h1").text

            # Paging: older, older, then newer, newer: back on the first page.
            driver.get(base + "/runs?deployment=batch")
            seen = [_ids(driver, "runs")]
            assert _text(driver, "total") == "7"
            assert not driver.find_elements(By.ID, "prev")
            for _ in range(2):
                _click_and_wait(driver, By.ID, "next")
                seen.append(_ids(driver, "runs"))
            assert not driver.find_elements(By.ID, "next")
            back = []
            for _ in range(2):
                _click_and_wait(driver, By.ID, "prev")
                back.append(_ids(driver, "runs"))
            assert [len(p) for p in seen] == [3, 3, 1]
            assert sorted(i for p in seen for i in p) == sorted(str(i) for i in batch)
            assert back == [seen[1], seen[0]]
            assert not driver.find_elements(By.ID, "prev")

            # Bulk cancel: the filter, the confirmation that names them, the result.
            _click_and_wait(driver, By.ID, "bulk-cancel")
            heading = driver.find_element(By.TAG_NAME, "h1").text
            assert heading == "Cancel 7 runs?"
            listed = _ids(driver, "bulk-runs")
            assert sorted(listed) == sorted(str(i) for i in batch)
            _click_and_wait(driver, By.ID, "bulk-confirm")
            assert "7 of 7 confirmed" in driver.find_element(By.TAG_NAME, "h1").text
            _shoot(driver, out / "dashboard-bulk-done.png")

            # A dead letter, redriven from its list.
            driver.get(base + "/dead-letters")
            _click_and_wait(driver, By.CSS_SELECTOR, "button.redrive-one")
            WebDriverWait(driver, WAIT).until(lambda d: str(samples["dead"]) in d.current_url)
        assert await _status(conn, samples["dead"]) == "pending"
        assert [await _status(conn, i) for i in batch] == ["cancelled"] * 7
        assert await conn.fetchval(
            "SELECT cancel_requested_at IS NOT NULL FROM zeroth.runs WHERE run_id = $1",
            samples["run"])
    finally:
        await conn.close()
    await asyncio.sleep(0)


async def test_live_updates_keep_the_page_and_its_form_and_pause(database_dsn, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    conn = await asyncpg.connect(database_dsn)
    try:
        now = await _now(conn)
        await make_run(conn, "pending", deployment_ref="live", now=now)
        dead = await _dead_letter(conn, "live-dead", now)
        with _Server(database_dsn, live_seconds=0.2) as base:
            # A run page: the failure the operator unfolded (they start folded) stays unfolded
            # across refreshes.
            driver.get(f"{base}/runs/{dead}")
            assert driver.execute_script(
                "return document.querySelector('details.failure').open") is False
            # (Clicked in one script: a refresh may swap the element between two calls.)
            driver.execute_script("document.querySelector('details.failure summary').click()")
            assert driver.execute_script(
                "return document.querySelector('details.failure').open") is True
            seen = int(driver.execute_script("return Number(document.body.dataset.refreshed"
                                             " || 0)"))
            WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
                "return Number(document.body.dataset.refreshed || 0)") >= seen + 2)
            assert driver.execute_script(
                "return document.querySelector('details.failure').open") is True
            driver.get(base + "/runs?deployment=live")
            driver.execute_script("window.zpMark = 'same page'")
            typed = driver.find_element(By.NAME, "thread")
            typed.send_keys("half-typed")
            new = await make_run(conn, "pending", deployment_ref="live", now=now)
            WebDriverWait(driver, WAIT).until(lambda d: str(new.run_id) in _ids(d, "runs"))
            # In place: the same document (no reload), the operator's input kept.
            assert driver.execute_script("return window.zpMark") == "same page"
            assert driver.find_element(By.NAME, "thread").get_attribute("value") == "half-typed"
            assert _text(driver, "total") == "2"

            # Paused (the header's button, kept for the tab): no request at all for three
            # intervals, by the browser's own timer; then resumed, the next run shows.
            driver.find_element(By.ID, "live-toggle").click()
            WebDriverWait(driver, WAIT).until(
                lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-live-state")
                == "paused")
            fetches = driver.execute_async_script(
                """var done = arguments[arguments.length - 1], count = 0, real = window.fetch;
                   window.fetch = function () { count++; return real.apply(this, arguments); };
                   setTimeout(function () { window.fetch = real; done(count); }, 600);""")
            assert fetches == 0
            later = await make_run(conn, "pending", deployment_ref="live", now=now)
            driver.get(base + "/runs?deployment=live")  # a new page of the tab: still paused
            assert driver.find_element(By.ID, "live-toggle").text == "paused"
            driver.find_element(By.ID, "live-toggle").click()
            WebDriverWait(driver, WAIT).until(lambda d: str(later.run_id) in _ids(d, "runs"))
            assert _text(driver, "total") == "3"
    finally:
        await conn.close()


async def test_a_read_only_dashboard_shows_no_action_and_refuses_a_forged_post(database_dsn,
                                                                              driver):
    from selenium.webdriver.common.by import By

    conn = await asyncpg.connect(database_dsn)
    try:
        samples = await _seed(conn)
        pending = await make_run(conn, "pending", deployment_ref="mail", now=samples["now"])
        with _Server(database_dsn, enable_actions=False) as base:
            for path in ("/", "/runs", "/runs?deployment=mail", f"/runs/{pending.run_id}",
                         f"/runs/{samples['dead']}", "/dead-letters", "/workers"):
                driver.get(base + path)
                assert driver.find_element(By.CSS_SELECTOR, "header .mode").text == "read-only"
                assert not driver.find_elements(By.CSS_SELECTOR, "main form[method=post]"), path
                assert not driver.find_elements(
                    By.CSS_SELECTOR, "#cancel, #redrive, .redrive-one, #bulk-cancel, "
                    "#bulk-redrive, #redrive-all"), path
            # A script on the dashboard's own origin (its cookie, its Origin) posting anyway.
            answers = driver.execute_async_script(
                """var done = arguments[arguments.length - 1], run = arguments[0];
                   var post = function (path, body) {
                     return fetch(path, {method: "POST", credentials: "same-origin",
                       headers: {"Content-Type": "application/x-www-form-urlencoded"},
                       body: body}).then(function (r) {
                         return r.text().then(function (t) { return [r.status, t]; }); }); };
                   Promise.all([post("/actions/cancel", "csrf=x&run_id=" + run),
                                post("/actions/bulk", "csrf=x&op=cancel&ids=" + run),
                                fetch("/bulk?op=cancel").then(function (r) {
                                  return [r.status, ""]; })]).then(done);""",
                str(pending.run_id))
        assert [a[0] for a in answers] == [403, 403, 403]
        assert all("disabled" in a[1] for a in answers[:2])
        assert await _status(conn, pending.run_id) == "pending"
    finally:
        await conn.close()


def test_the_token_leaves_the_address_bar_and_the_cookie_carries_on(database_dsn, driver):
    from selenium.webdriver.support.ui import WebDriverWait

    with _Server(database_dsn, token="s3cret-t0ken") as base:
        driver.get(base + "/runs?status=failed&token=s3cret-t0ken#top")
        WebDriverWait(driver, WAIT).until(lambda d: "s3cret" not in d.current_url)
        address = driver.current_url
        driver.get(base + "/workers")
        workers = driver.title
    assert address == base + "/runs?status=failed#top"
    assert "zeroth-pg" in workers  # the cookie, not the URL, carries the token now


async def test_a_page_on_another_local_port_cannot_post_an_action(database_dsn, driver):
    # Another local web app in the operator's browser: same site as the dashboard (a cookie
    # ignores the port), so its form carries the session cookie; its Origin gives it away.
    from selenium.webdriver.support.ui import WebDriverWait

    conn = await asyncpg.connect(database_dsn)
    try:
        pending = await make_run(conn, "pending", deployment_ref="mail", now=await _now(conn))
        with _Server(database_dsn) as base:
            attack = (f'<form method="post" action="{base}/actions/bulk">'
                      f'<input name="ids" value="{pending.run_id}">'
                      '<input name="op" value="cancel">'
                      '<input name="csrf" value="guess"></form>'
                      "<script>document.forms[0].submit()</script>").encode()

            class Page(http.server.BaseHTTPRequestHandler):
                def do_GET(self) -> None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.end_headers()
                    self.wfile.write(attack)

                def log_message(self, *args: object) -> None:
                    pass

            other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
            threading.Thread(target=other.serve_forever, daemon=True).start()
            try:
                driver.get(base + "/")  # the operator's session cookie
                driver.get(f"http://127.0.0.1:{other.server_address[1]}/")
                WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(base))
                answer = driver.find_element("tag name", "body").text
            finally:
                other.shutdown()
        assert "Origin" in answer
        assert await _status(conn, pending.run_id) == "pending"
    finally:
        await conn.close()
