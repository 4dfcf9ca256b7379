"""End to end: a real headless Chromium force-unlocks a lock held by another process.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package; skipped only
when no Chromium binary is installed. No browser or driver is ever downloaded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.django.conftest import DJANGO_REDIS_DB
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Without these Chromium phones Google (updates, sync, field trials); the machine is offline.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,1000")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary found (apt-get install chromium "
                                                 "chromium-driver); CI installs it"),
    pytest.mark.django_db(transaction=True),
]

HOLDER = r"""
import sys, time, redis
from django_rlock.engine import RLock
socket, db, prefix, name = sys.argv[1:]
lock = RLock(redis.Redis(unix_socket_path=socket, db=int(db)), name, prefix=prefix, watchdog_timeout=3)
lock.lock()  # watchdog mode: a 3 s lease renewed every second while this process lives
print("locked", flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    monkeypatch.setenv("SE_AVOID_STATS", "true")
    profile = tempfile.mkdtemp(prefix="rlock-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def holder_process(redis_server: RedisServer) -> Iterator[Any]:
    """``start(name)``: another process takes the lock and keeps holding it until killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(name: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, redis_server.socket, str(DJANGO_REDIS_DB), "demo:rlock:", name],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


def test_force_unlock_in_the_browser(browser: Any, live_server: Any, django_user_model: Any,
                                     holder_process: Any, db1: redis.Redis) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 15)
    django_user_model.objects.create_superuser("root", "root@example.com", "s3cret-pw")
    name = "reports/daily:2024-01-01"
    proc = holder_process(name)
    owner = db1.hkeys(f"demo:rlock:{name}")[0].decode()

    browser.get(f"{live_server.url}/admin/")
    wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("root")
    browser.find_element(By.ID, "id_password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

    wait.until(ec.element_to_be_clickable((By.LINK_TEXT, "Locks"))).click()
    row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'tr.lock-row[data-name="{name}"]')))
    assert row.find_element(By.CSS_SELECTOR, "td.holders").text == owner
    assert row.find_element(By.CSS_SELECTOR, "td.hold-count").text == "1"
    assert row.find_element(By.CSS_SELECTOR, "td.ttl").text.endswith(" s")
    # Where it is held, from the index entry the holder process's acquire wrote.
    assert row.find_element(By.CSS_SELECTOR, "td.pid").text == str(proc.pid)
    assert row.find_element(By.CSS_SELECTOR, "td.host").text == socket.gethostname()
    assert row.find_element(By.CSS_SELECTOR, "td.thread").text == "MainThread"
    assert row.find_element(By.CSS_SELECTOR, "td.held").text.endswith(" s")

    row.find_element(By.CSS_SELECTOR, "a.force-unlock").click()
    confirm = wait.until(ec.element_to_be_clickable((By.ID, "confirm-force-unlock")))
    assert name in browser.find_element(By.ID, "content").text
    assert db1.exists(f"demo:rlock:{name}")  # the confirmation page changed nothing
    confirm.click()

    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success")))
    assert name in message.text
    assert browser.find_elements(By.CSS_SELECTOR, "tr.lock-row") == []
    assert "No locks are held." in browser.find_element(By.ID, "result_list").text
    assert not db1.exists(f"demo:rlock:{name}")
    assert proc.poll() is None  # the holder was not stopped, only its lock taken away


def test_a_task_mark_keeps_force_unlock_on_screen_at_1366px(browser: Any, live_server: Any,
                                                             django_user_model: Any,
                                                             db1: redis.Redis) -> None:
    """A de-dup mark with a long task name (#23 section 7): its row reads as a queued task, the
    name is cut with its full text in the tooltip, and TTL and Force unlock stay in view."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from django_rlock.engine import taskmark
    from django_rlock.engine.clients import index_for
    from django_rlock.engine.scripts import MARK_CLAIM_SCRIPT, call

    task = "shop.reporting.tasks.regenerate_the_monthly_sales_report_for_every_region_and_currency"
    name = f"dedupe:{task}:0123456789abcdef01234567"
    task_id = "5b0e2f4c-1d2a-4c3b-9e8f-7a6b5c4d3e2f"
    key = f"demo:rlock:{name}"
    field = f"{task_id}:0"
    # What LockedTask.delay() writes (django_rlock.celery), without a broker.
    assert call(db1, MARK_CLAIM_SCRIPT, (key, index_for(db1, "demo:rlock:", key)),
                (field, 60_000, taskmark.entry(field, taskmark.QUEUED, task))) is None

    browser.set_window_size(1366, 768)
    wait = WebDriverWait(browser, 15)
    django_user_model.objects.create_superuser("root", "root@example.com", "s3cret-pw")
    browser.get(f"{live_server.url}/admin/login/?next=/admin/django_rlock/lock/")
    wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("root")
    browser.find_element(By.ID, "id_password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "#login-form [type=submit]").click()

    row = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'tr.lock-row[data-name="{name}"]')))
    assert row.find_element(By.CSS_SELECTOR, "td.kind").text == "task"
    details = row.find_element(By.CSS_SELECTOR, "td.details span")
    assert details.get_attribute("title") == f"queued {task} [{task_id}]"
    assert row.find_element(By.CSS_SELECTOR, "th.field-name a").get_attribute("title") == name
    viewport = browser.execute_script("return document.documentElement.clientWidth")
    assert viewport <= 1366
    for selector in ("td.ttl", "a.force-unlock"):
        right = browser.execute_script("return arguments[0].getBoundingClientRect().right",
                                       row.find_element(By.CSS_SELECTOR, selector))
        assert right <= viewport, f"{selector} is off-screen ({right} > {viewport} px)"
