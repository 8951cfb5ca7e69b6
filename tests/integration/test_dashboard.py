"""`fencepost dashboard` in a real headless Chromium: it loads without console errors, shows the
leader, a dead task's error as text, the workers, and the new leader within seconds of a leader SIGKILL."""

from __future__ import annotations

import re
import shutil

import pytest

from election.leader import read_leader
from tests.support.harness import call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Without the background-networking flags Chromium reaches for external hosts at start.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        return (
            "no Chromium: install the Debian packages chromium and chromium-driver "
            "(`make test` run as root installs them)"
        )
    return None


@pytest.fixture
def browser(tmp_path):
    reason = _browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(
        executable_path=shutil.which("chromedriver"), log_output=str(tmp_path / "chromedriver.log")
    )
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_dashboard_shows_the_leader_and_a_failover(browser, cluster, procs):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 2)
    leader = wait_for(lambda: read_leader(cluster.zk, cluster.paths), 30, "a leader")
    assert call(leader["address"], "submit", queue="mail", payload=b"x", max_attempts=1)["ok"]
    [task] = call(leader["address"], "lease", worker="w-dash", queues=["mail"], max_tasks=1)["tasks"]
    error = "<b>boom</b> & <script>alert(1)</script>"  # shown as text, never as markup
    assert call(leader["address"], "fail", task_id=task["task_id"], attempt=task["attempt"], error=error)[
        "ok"
    ]
    dash = procs.start(
        "dashboard",
        ["dashboard", "--listen", "127.0.0.1:0", "--zk", cluster.hosts, "--cluster", cluster.name],
        ready=lambda proc: "dashboard of cluster" in proc.output(),
    )
    url = re.search(r"on (http://\S+)", dash.output()).group(1)

    browser.get(url)

    def shown_leader(driver) -> str:
        return driver.find_element(By.ID, "leader").get_attribute("data-broker-id")

    WebDriverWait(browser, 15).until(lambda d: shown_leader(d) == str(leader["broker_id"]))
    WebDriverWait(browser, 10).until(lambda d: "mail" in d.find_element(By.ID, "queues").text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#brokers tr")) == 2
    WebDriverWait(browser, 10).until(lambda d: error in d.find_element(By.ID, "dead-tasks").text)
    assert not browser.find_elements(By.CSS_SELECTOR, "#dead-tasks b, #dead-tasks script")
    WebDriverWait(browser, 10).until(lambda d: "w-dash" in d.find_element(By.ID, "workers").text)

    next(p for p in brokers if p.address == leader["address"]).kill()
    new = wait_for(
        lambda: (
            (info := read_leader(cluster.zk, cluster.paths))
            and info["broker_id"] != leader["broker_id"]
            and info
        ),
        30,
        "a new leader",
    )
    WebDriverWait(browser, 10).until(lambda d: shown_leader(d) == str(new["broker_id"]))
    WebDriverWait(browser, 10).until(
        lambda d: f"broker {new['broker_id']} leads" in d.find_element(By.ID, "failovers").text
    )

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
