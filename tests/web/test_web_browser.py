"""zeroth-pg web in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium): every page loads, runs are filtered, a run is opened, a dead letter redriven and a run
cancelled, and the database changed. Screenshots go to ZEROTH_PG_TEST_REPORTS/web/."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from helpers import make_run
from test_web_pages import _dead_letter, _now, _status

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
           "chromium-driver; .ci/run installs them)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, dsn: str, token: str | None = None) -> None:
        import uvicorn

        from zeroth_pg.web import create_app

        self.port = _free_port()
        config = uvicorn.Config(create_app(dsn, enable_actions=True, token=token),
                                host="127.0.0.1", port=self.port, log_level="warning")
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


async def test_browse_filter_open_redrive_cancel(database_dsn):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.expected_conditions import staleness_of
    from selenium.webdriver.support.ui import WebDriverWait

    shots = Path(os.environ.get("ZEROTH_PG_TEST_REPORTS", "build/test-reports")) / "web"
    shots.mkdir(parents=True, exist_ok=True)
    conn = await asyncpg.connect(database_dsn)
    try:
        now = await _now(conn)
        # An hour of history for the chart: completions and some failures, minute by minute.
        for k in range(45):
            await make_run(conn, "failed" if k % 7 == 3 else "completed",
                           deployment_ref=("mail", "billing", "search")[k % 3],
                           now=now - timedelta(minutes=(k * 5) % 58, seconds=k),
                           payload={"n": k})
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
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--window-size=1280,900"):
            options.add_argument(arg)
        with _Server(database_dsn) as base:
            driver = webdriver.Chrome(service=Service(DRIVER), options=options)
            try:
                def page(path: str, name: str) -> None:
                    driver.get(base + path)
                    assert "zeroth-pg" in driver.title
                    shoot(name)

                def shoot(name: str) -> None:
                    # The whole page: the window grown to the document's height.
                    height = driver.execute_script("return document.body.scrollHeight")
                    driver.set_window_size(1280, max(900, int(height) + 140))
                    driver.save_screenshot(str(shots / f"{name}.png"))
                    driver.set_window_size(1280, 900)

                page("/", "overview")
                assert "reports" in driver.find_element(By.ID, "overview").text
                page(f"/runs/{waiting.run_id}", "run-waiting")
                assert "approved" in driver.find_element(By.TAG_NAME, "main").text
                page("/workers", "workers")
                assert "host-a:worker-1" in driver.page_source
                page("/runs", "runs")
                # Filter: deployment reports only.
                box = driver.find_element(By.NAME, "deployment")
                box.send_keys("reports")
                driver.find_element(By.CSS_SELECTOR, ".filters button").click()
                WebDriverWait(driver, 30).until(lambda d: "deployment=reports" in d.current_url)
                rows = driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
                assert len(rows) == 1
                assert "reports" in rows[0].text
                shoot("runs-filtered")
                rows[0].find_element(By.TAG_NAME, "a").click()
                WebDriverWait(driver, 30).until(lambda d: str(running.run_id) in d.current_url)
                assert str(running.run_id) in driver.page_source
                assert "render-pdf" in driver.find_element(By.TAG_NAME, "main").text
                shoot("run-detail")
                cancel = driver.find_element(By.ID, "cancel")
                cancel.click()
                # The POST answered once the page it came from is gone (a title check passed
                # at once and let the next page abort the POST).
                WebDriverWait(driver, 30).until(staleness_of(cancel))
                WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.TAG_NAME, "h1"))
                page("/dead-letters", "dead-letters")
                driver.find_element(By.CSS_SELECTOR, "button.redrive-one").click()
                WebDriverWait(driver, 30).until(lambda d: str(dead) in d.current_url)
                assert str(dead) in driver.page_source  # redirected to the run
                shoot("redriven")
            finally:
                driver.quit()
        # The database changed: the dead letter is pending again; the running run, whose
        # lease is live, has its cancel requested (its holder stops it).
        assert await _status(conn, dead) == "pending"
        cancel_at = await conn.fetchval(
            "SELECT cancel_requested_at FROM zeroth.runs WHERE run_id = $1", running.run_id)
        assert cancel_at is not None
    finally:
        await conn.close()
    await asyncio.sleep(0)


def test_the_token_leaves_the_address_bar_and_the_cookie_carries_on(database_dsn):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    with _Server(database_dsn, token="s3cret-t0ken") as base:
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        try:
            driver.get(base + "/runs?status=failed&token=s3cret-t0ken#top")
            WebDriverWait(driver, 30).until(lambda d: "s3cret" not in d.current_url)
            address = driver.current_url
            driver.get(base + "/workers")
            workers = driver.title
        finally:
            driver.quit()
    assert address == base + "/runs?status=failed#top"
    assert "zeroth-pg" in workers  # the cookie, not the URL, carries the token now


async def test_a_page_on_another_local_port_cannot_post_an_action(database_dsn):
    # Another local web app in the operator's browser: same site as the dashboard (a cookie
    # ignores the port), so its form carries the session cookie; its Origin gives it away.
    import http.server

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    conn = await asyncpg.connect(database_dsn)
    try:
        pending = await make_run(conn, "pending", deployment_ref="mail", now=await _now(conn))
        with _Server(database_dsn) as base:
            attack = (f'<form method="post" action="{base}/actions/cancel">'
                      f'<input name="run_id" value="{pending.run_id}">'
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
            options = webdriver.ChromeOptions()
            options.binary_location = CHROMIUM
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
                options.add_argument(arg)
            driver = webdriver.Chrome(service=Service(DRIVER), options=options)
            try:
                driver.get(base + "/")  # the operator's session cookie
                driver.get(f"http://127.0.0.1:{other.server_address[1]}/")
                WebDriverWait(driver, 30).until(lambda d: d.current_url.startswith(base))
                answer = driver.find_element("tag name", "body").text
            finally:
                driver.quit()
                other.shutdown()
        assert "Origin" in answer
        assert await _status(conn, pending.run_id) == "pending"
    finally:
        await conn.close()
