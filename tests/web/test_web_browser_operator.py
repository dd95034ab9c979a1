"""The operator's pages in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium), clicked through as an operator does: a scope paused and resumed and its concurrency
set on its deployment page, a schedule paused and fired now, the event a run waits for emitted
from the events page, the workers page and a run's timeline read; the database changed each
time. Screenshots of every page go to ZEROTH_PG_TEST_REPORTS/web/."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from helpers import make_run
from test_web_browser import (  # noqa: F401 (the skip; the browser fixtures)
    _click_and_wait,
    _Server,
    browser,
    driver,
    pytestmark,
)
from test_web_pages import _now


async def test_deployments_schedules_events_workers_and_the_timeline(
        database_dsn, driver):  # noqa: F811 (the fixture imported above: the module's browser)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = Path(os.environ.get("ZEROTH_PG_TEST_REPORTS", "build/test-reports")) / "web"
    shots.mkdir(parents=True, exist_ok=True)
    conn = await asyncpg.connect(database_dsn)
    try:
        now = await _now(conn)
        for i in range(4):
            await make_run(conn, "pending", deployment_ref="mail", now=now, payload={"i": i})
        await make_run(conn, "running", deployment_ref="mail", now=now,
                       worker_id="host-a:worker-1", lease_seconds=600)
        await make_run(conn, "running", deployment_ref="billing", now=now - timedelta(hours=1),
                       worker_id="host-b:worker-9", lease_seconds=5)
        await make_run(conn, "completed", deployment_ref="billing", now=now,
                       worker_id="host-c:worker-2")
        waiting = await make_run(conn, "running", deployment_ref="approvals", now=now,
                                 worker_id="host-a:worker-1", lease_seconds=600)
        assert await conn.fetchval(
            """SELECT w.outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
                   generation => $3, step_key => 'approve', name => 'invoice-42-approved',
                   timeout_seconds => 3600, now_override => $4) w""",
            waiting.run_id, waiting.worker_id, waiting.generation, now) == "waiting"
        await conn.execute(
            """SELECT zeroth.create_schedule(name => 'nightly-report', deployment_ref => 'reports',
                   cron => '0 2 * * *')""")
        await conn.execute("SELECT zeroth.set_rate_limit(name => 'smtp', max_starts => 100, "
                           "period_seconds => 60)")
        with _Server(database_dsn) as base:
            def shoot(name: str) -> None:
                height = driver.execute_script("return document.body.scrollHeight")
                driver.set_window_size(1280, max(900, int(height) + 140))
                driver.save_screenshot(str(shots / f"{name}.png"))
                driver.set_window_size(1280, 900)

            def click(selector: str) -> None:
                # Answered once the page it came from is gone (found again if the page's
                # live refresh swapped the button just before the click).
                _click_and_wait(driver, By.CSS_SELECTOR, selector)
                WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.TAG_NAME, "h1"))

            async def paused() -> Any:
                return await conn.fetchval(
                    "SELECT paused FROM zeroth.scope_limits WHERE deployment_ref = 'mail'")

            # Deployments → the mail scope → pause, concurrency, resume.
            driver.get(base + "/deployments")
            shoot("deployments")
            next(a for a in driver.find_elements(By.CSS_SELECTOR, "a.scope-link")
                 if a.text == "mail").click()
            WebDriverWait(driver, 30).until(lambda d: "/deployments/scope" in d.current_url)
            click("#pause-scope")
            assert await paused() is True
            assert "paused" in driver.find_element(By.ID, "scope-state").text
            box = driver.find_element(By.NAME, "max_concurrency")
            box.clear()
            box.send_keys("2")
            driver.find_element(By.CSS_SELECTOR, "#scope-limits-form select").send_keys(
                "smtp")
            click("#scope-limits-form button")
            shoot("deployment-scope")
            click("#resume-scope")
            assert tuple(await conn.fetchrow(
                """SELECT paused, max_concurrency, rate_limit FROM zeroth.scope_limits
                    WHERE deployment_ref = 'mail'""")) == (False, 2, "smtp")
            # The deployment's retry policy and lease, set through the same page's form.
            for field, value in (("retry_base_seconds", "30"), ("lease_seconds", "300")):
                box = driver.find_element(By.CSS_SELECTOR,
                                          f"#deployment-defaults-form input[name={field}]")
                box.clear()
                box.send_keys(value)
            click("#deployment-defaults-form button")
            assert "300 s" in driver.find_element(By.ID, "deployment-defaults").text
            assert tuple(await conn.fetchrow(
                """SELECT retry_base_seconds, retry_max_seconds, lease_seconds
                     FROM zeroth.deployments WHERE deployment_ref = 'mail'""")) == (
                30, None, 300)
            # Schedules: pause, then fire now (opens the new run).
            driver.get(base + "/schedules")
            click("button.schedule-pause")
            assert await conn.fetchval("SELECT paused FROM zeroth.schedules") is True
            shoot("schedules")
            click("button.schedule-fire")
            assert "/runs/" in driver.current_url
            assert await conn.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = 'reports'") == 1
            # Events: the waiting run and its event, emitted with a payload.
            driver.get(base + "/events")
            assert "invoice-42-approved" in driver.find_element(By.ID, "waiting").text
            shoot("events")
            driver.find_element(By.CSS_SELECTOR, "form.emit-one input[name=payload]"
                                ).send_keys('{"by": "ops"}')
            click("form.emit-one button")
            assert "runs woken: 1" in driver.find_element(By.ID, "emitted").text
            assert await conn.fetchval(
                "SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                waiting.run_id) == "pending"
            # Workers as the database sees them.
            driver.get(base + "/workers")
            table = driver.find_element(By.ID, "workers").text
            assert "host-a:worker-1 live" in table
            assert "host-b:worker-9 expired" in table
            assert "host-c:worker-2 gone" in table
            shoot("workers-db")
            # The run page's timeline, its emitted event in it.
            driver.get(base + f"/runs/{waiting.run_id}")
            timeline = driver.find_element(By.ID, "timeline").text
            assert "waits for event invoice-42-approved" in timeline
            assert "event invoice-42-approved emitted" in timeline
            shoot("run-timeline")
    finally:
        await conn.close()


async def test_the_schedules_and_events_pages_page_by_clicking_older_and_newer(
        database_dsn, driver, monkeypatch):  # noqa: F811 (the fixture imported above)
    """issue 31: an operator pages the schedules and the waiting runs as the runs: "older →"
    and "← newer" (on the events page "more recent →" and "← longer waiting"), the total shown,
    and back on the first page after walking back."""
    from selenium.webdriver.common.by import By

    monkeypatch.setattr("zeroth_pg.web.pages_schedules.PAGE_SIZE", 3)
    monkeypatch.setattr("zeroth_pg.web.pages_events.PAGE_SIZE", 3)
    conn = await asyncpg.connect(database_dsn)
    try:
        for i in range(7):
            await conn.execute("SELECT zeroth.create_schedule(name => $1, deployment_ref => "
                               "'reports', interval_seconds => 3600)", f"sched-{i}")
        now = await _now(conn)
        for i in range(4):
            lease = await make_run(conn, "running", deployment_ref="approvals",
                                   now=now + timedelta(seconds=i), lease_seconds=600)
            assert await conn.fetchval(
                """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
                       generation => $3, step_key => 'approve', name => $4,
                       timeout_seconds => NULL, now_override => $5)""",
                lease.run_id, lease.worker_id, lease.generation, f"ev-{i}",
                now + timedelta(seconds=i)) == "waiting"
    finally:
        await conn.close()

    def names(table: str, column: str) -> list[str]:
        found: list[str] = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".map(function (e) { return e.textContent; })", f"#{table} tbody {column}")
        return found

    def schedule_names() -> list[str]:
        return [n.split(" ")[0] for n in names("schedules", "td:first-child")]

    with _Server(database_dsn) as base:
        driver.get(base + "/schedules")
        assert driver.find_element(By.ID, "total").text == "7"
        assert not driver.find_elements(By.ID, "prev")
        pages = [schedule_names()]
        for _ in range(2):
            _click_and_wait(driver, By.ID, "next")
            pages.append(schedule_names())
        assert not driver.find_elements(By.ID, "next")
        assert pages == [["sched-6", "sched-5", "sched-4"], ["sched-3", "sched-2", "sched-1"],
                         ["sched-0"]]
        for expected in (pages[1], pages[0]):
            _click_and_wait(driver, By.ID, "prev")
            assert schedule_names() == expected
        assert not driver.find_elements(By.ID, "prev")

        driver.get(base + "/events")
        assert driver.find_element(By.ID, "total").text == "4"
        assert names("waiting", "td:nth-child(5) .mono") == ["ev-0", "ev-1", "ev-2"]
        _click_and_wait(driver, By.ID, "next")
        assert names("waiting", "td:nth-child(5) .mono") == ["ev-3"]
        _click_and_wait(driver, By.ID, "prev")
        assert names("waiting", "td:nth-child(5) .mono") == ["ev-0", "ev-1", "ev-2"]
        assert not driver.find_elements(By.ID, "prev")
