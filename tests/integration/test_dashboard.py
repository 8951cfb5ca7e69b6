"""`fencepost dashboard` in a real headless Chromium: it loads without console errors, shows the
leader, a dead task's error as text, the workers, and the new leader within seconds of a leader SIGKILL;
its charts are drawn after load, mark the leader change of a SIGKILL (still after a reload), and its
retry is refused without an admin key and done with one;
on a 2-shard dev cluster, a row per shard, queues and dead tasks of both shards, the worker once, and
the failover of the shard whose leader was killed, in the list and on the charts."""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from broker.admin.dashboard.view import cluster_snapshot
from broker.api.client import Client
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from election.leader import read_leader
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task
from election.zk import close as zk_close
from election.zk import connect as zk_connect
from tests.support.browser import chromium
from tests.support.harness import START_TIMEOUT_S, call, wait_for
from tests.support.http_api import api_keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def browser(tmp_path):
    yield from chromium(tmp_path)


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
    # SIGTERM: its threads stopped, exit 0 (not the default action of the signal uvicorn raises again).
    assert dash.terminate() == 0, dash.output()[-3000:]


CHARTS = ("chart-submit", "chart-complete", "chart-dead", "chart-depth", "chart-commit")


def _points(driver, chart: str) -> int:
    from selenium.webdriver.common.by import By

    return int(driver.find_element(By.ID, chart).get_attribute("data-points") or 0)


def _act(driver, button_css: str, key: str) -> str:
    """Type ``key``, press the button (rows are redrawn each second: pressed again if it was replaced),
    confirm, and return the outcome the page shows once it has one."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    field = driver.find_element(By.ID, "admin-key")
    field.clear()
    field.send_keys(key)
    driver.execute_script("document.getElementById('action-result').removeAttribute('data-outcome')")

    def pressed(d) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, button_css).click()
        except StaleElementReferenceException:
            return False
        return d.find_element(By.ID, "confirm-dialog").is_displayed()

    WebDriverWait(driver, 10).until(pressed)
    driver.find_element(By.ID, "confirm-yes").click()
    WebDriverWait(driver, 30).until(
        lambda d: d.find_element(By.ID, "action-result").get_attribute("data-outcome")
    )
    return driver.find_element(By.ID, "action-result").text


def test_dashboard_charts_mark_a_leader_change_and_actions_need_an_admin_key(
    browser, cluster, procs, tmp_path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 2)
    leader = wait_for(lambda: read_leader(cluster.zk, cluster.paths), 30, "a leader")
    keys = api_keys(tmp_path / "api.keys", admin="ops", producer="shop")
    assert call(leader["address"], "submit", queue="doomed", payload=b"x", max_attempts=1)["ok"]
    [task] = call(leader["address"], "lease", worker="w-dash", queues=["doomed"], max_tasks=1)["tasks"]
    assert call(leader["address"], "fail", task_id=task["task_id"], attempt=task["attempt"], error="boom")[
        "ok"
    ]
    dash = procs.start(
        "dashboard",
        [
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "0.5",
            "--api-keys-file",
            str(tmp_path / "api.keys"),
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
        ],
        ready=lambda proc: "dashboard of cluster" in proc.output(),
    )
    url = re.search(r"on (http://\S+)", dash.output()).group(1)
    stop = threading.Event()
    load = threading.Thread(target=_submit_until, args=(cluster, stop), daemon=True)
    load.start()
    try:
        browser.get(url)
        # Every chart drawn from at least two samples' worth of points (a rate needs two samples), and
        # the submit chart's points joined in a line: on a loaded machine a missed sample leaves a gap,
        # and two points a gap apart are drawn as two dots.
        WebDriverWait(browser, 30).until(
            lambda d: (
                all(_points(d, chart) >= 2 for chart in CHARTS)
                and d.find_elements(By.CSS_SELECTOR, "#chart-submit path.series")
            )
        )
        assert browser.find_elements(By.CSS_SELECTOR, "#chart-submit path.series")
        assert "mail" in browser.find_element(By.ID, "chart-submit-legend").text
        assert browser.find_element(By.ID, "chart-commit-legend").text.split() == ["p50", "p99"]
        assert not browser.find_elements(By.CSS_SELECTOR, "svg line.leader-change")

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
        marked = f"broker {new['broker_id']} leads epoch"
        WebDriverWait(browser, 30).until(lambda d: marked in d.find_element(By.ID, "leader-changes").text)
        for chart in CHARTS:  # the change is marked on every chart
            assert browser.find_elements(By.CSS_SELECTOR, f"#{chart} line.leader-change")
        # The history is the dashboard process's: a reload draws it again, the change still marked.
        browser.refresh()
        WebDriverWait(browser, 15).until(
            lambda d: (
                d.find_elements(By.CSS_SELECTOR, "#chart-submit line.leader-change")
                and _points(d, "chart-submit") >= 2
            )
        )
        title = browser.find_element(By.CSS_SELECTOR, "#chart-submit line.leader-change title")
        assert marked in title.get_attribute("textContent")

        retry = "#dead-tasks button[data-action=retry]"
        WebDriverWait(browser, 15).until(lambda d: d.find_elements(By.CSS_SELECTOR, retry))
        assert "401" in _act(browser, retry, "")
        assert "403 forbidden" in _act(browser, retry, keys["producer"])
        assert call(new["address"], "get", task_id=task["task_id"])["task"]["state"] == "dead"
        assert "is waiting again" in _act(browser, retry, keys["admin"])
        assert call(new["address"], "get", task_id=task["task_id"])["task"]["state"] == "waiting"

        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        # The refusals' 401 and 403 are logged by Chromium as failed loads; nothing else may be.
        assert all("/api/actions/retry" in entry["message"] for entry in errors), errors
    finally:
        stop.set()
        load.join(30)


def _submit_until(cluster, stop: threading.Event) -> None:
    """A trickle of submits to queue mail (through the Client, so across the failover) until ``stop``."""
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=10) as client:
        while not stop.wait(0.05):
            try:
                client.submit("mail", b"x")
            except Exception:  # the failover's refusals: the next submit goes to the new leader
                continue


SHARDED = "dashshards"


def _shard_leaders(zk) -> dict[int, dict]:
    """Both shards' leader nodes (empty while one is missing)."""
    found = {n: read_leader(zk, ClusterPaths(SHARDED, shard=n)) for n in range(2)}
    return found if all(found.values()) else {}


def _answered_snapshot(zk) -> dict | None:
    """The dashboard's snapshot of the sharded cluster once every shard's leader answers it."""
    snap = cluster_snapshot(zk, SHARDED)
    return snap if snap["shards"] and all(row["reachable"] for row in snap["shards"]) else None


def _mail_waiting(browser, by) -> str | None:
    """The waiting count of the queues table's ``mail`` row, if it has one."""
    rows = [r.text for r in browser.find_elements(by.CSS_SELECTOR, "#queues tr") if r.text.startswith("mail")]
    return rows[0].split()[1] if rows and len(rows[0].split()) > 1 else None


def _page_of_both_shards(browser, by) -> bool:
    """Whether the page shows both shards' rows, dead tasks, the worker and the mail queue's six tasks."""
    dead = browser.find_element(by.ID, "dead-tasks").text
    return (
        len(browser.find_elements(by.CSS_SELECTOR, "#shards tr")) == 2
        and browser.find_element(by.ID, "leader-label").text == "leader of shard 0"
        and "boom in shard 0" in dead
        and "boom in shard 1" in dead
        and len(browser.find_elements(by.CSS_SELECTOR, "#workers tr")) == 1
        and _mail_waiting(browser, by) == "6"
    )


@pytest.mark.timeout(300)
def test_dashboard_of_a_two_shard_cluster_covers_every_shard(browser, procs, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    dev = DevCluster(tmp_path / "dev", private=True)
    zk = None
    try:
        # No leader balancing: the shards keep the leaders read below until the kill.
        spec = DevClusterSpec(
            cluster=SHARDED, shards=2, brokers=2, bookies=3, broker_args=("--leader-balance-s", "0")
        )
        state = dev.up(spec)
        zk = zk_connect(state["zk"])
        wait_for(lambda: _shard_leaders(zk), START_TIMEOUT_S, "a leader of both shards")
        with Client(zk=state["zk"], cluster=SHARDED, timeout=60) as client:
            wait_for(lambda: client.status(), START_TIMEOUT_S, "both shards' leaders to answer")
            keys = {
                n: [k for k in (f"k{i}" for i in range(200)) if shard_of_key(k, 2) == n][:3] for n in (0, 1)
            }
            for n in (0, 1):
                for key in keys[n]:
                    client.submit("mail", b"x", key=key)
                client.submit("doomed", b"y", key=keys[n][0], max_attempts=1)
                [task] = client.call("lease", shard=n, worker="w-dash", queues=["doomed"], max_tasks=1)[
                    "tasks"
                ]
                client.call(
                    "fail", task_id=task["task_id"], attempt=task["attempt"], error=f"boom in shard {n}"
                )

        # The data the page is built from.
        snap = wait_for(lambda: _answered_snapshot(zk), 30, "both shards' leaders answering the dashboard")
        leaders = _shard_leaders(zk)
        assert [row["shard"] for row in snap["shards"]] == [0, 1]
        for row in snap["shards"]:
            assert row["leader"] == leaders[row["shard"]]["broker_id"] and row["position"] and row["insync"]
        assert snap["leader"]["id"] == leaders[0]["broker_id"]
        assert sorted(n for b in snap["brokers"] for n in b["leads"]) == [0, 1]
        assert snap["queues"]["mail"]["waiting"] == 6 and snap["queues"]["doomed"]["dead"] == 2
        assert sorted(shard_of_task(t["id"]) for t in snap["dead_tasks"]) == [0, 1]
        assert [(w["worker"], w["queues"]) for w in snap["workers"]] == [("w-dash", ["doomed"])]

        # The page: a row per shard, the sums, the merged worker.
        dash = procs.start(
            "dashboard",
            ["dashboard", "--listen", "127.0.0.1:0", "--zk", state["zk"], "--cluster", SHARDED],
            ready=lambda proc: "dashboard of cluster" in proc.output(),
        )
        browser.get(re.search(r"on (http://\S+)", dash.output()).group(1))
        # Each refresh draws what the dashboard's last sample holds: on a loaded machine the first ones may
        # lack a shard's answers, so the whole picture is waited for, its rows read as they are redrawn.
        from selenium.common.exceptions import StaleElementReferenceException

        redrawn = (StaleElementReferenceException,)  # a row replaced between its lookup and its text
        WebDriverWait(browser, 60, ignored_exceptions=redrawn).until(lambda d: _page_of_both_shards(d, By))
        assert browser.find_element(By.ID, "shards-section").is_displayed()

        # Shard 1's leader dies: the page names the shard that failed over.
        before = leaders[1]
        (victim,) = [row for row in dev.status() if row.get("broker_id") == before["broker_id"]]
        os.kill(victim["pid"], signal.SIGKILL)
        WebDriverWait(browser, 90, ignored_exceptions=redrawn).until(
            lambda d: re.search(
                r"leads shard 1, epoch \d+ \(after broker " + str(before["broker_id"]),
                d.find_element(By.ID, "failovers").text,
            )
        )
        # The charts mark it too, from the brokers' own answers, naming the shard.
        WebDriverWait(browser, 30, ignored_exceptions=redrawn).until(
            lambda d: re.search(
                r"leads shard 1, epoch \d+ \(after broker " + str(before["broker_id"]),
                d.find_element(By.ID, "leader-changes").text,
            )
        )
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        if zk is not None:
            zk_close(zk)
        dev.down()
