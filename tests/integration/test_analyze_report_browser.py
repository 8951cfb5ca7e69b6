"""The analyze report in a real headless Chromium (as the dashboard's test): it loads from a file with no
console error, every chart decodes, the summary in words is on top and shows times in UTC as ISO 8601 (no
raw ms), the per-shard section shows, and wide tables scroll in their box instead of widening the page."""

from __future__ import annotations

import pytest

from pipeline.report import CHARTS, SHARD_CHART, write_report
from tests.support.browser import chromium
from tests.support.report_tables import RAW_MS, history_summary, history_tables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def browser(tmp_path):
    yield from chromium(tmp_path, extra=("--window-size=1200,900",))


def test_the_report_reads_in_a_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By

    tables = history_tables()
    path = write_report(tmp_path, tables, history_summary(tables))

    browser.get(path.as_uri())

    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.id, i.complete, i.naturalWidth, i.naturalHeight])"
    )
    assert sorted(i[0] for i in images) == sorted(f"chart-{name}" for name, _ in (*CHARTS, SHARD_CHART))
    assert all(complete and width > 100 and height > 100 for _, complete, width, height in images), images
    summary = browser.find_element(By.ID, "summary")
    assert summary.is_displayed()
    first_chart = browser.find_element(By.TAG_NAME, "img")
    assert summary.location["y"] < first_chart.location["y"]
    assert "2026-11-27T17:21:35.000Z" in summary.text and "1 failover" in summary.text
    body = browser.find_element(By.TAG_NAME, "body").text
    assert not RAW_MS.findall(body), "a time is shown as ms since the epoch"
    assert browser.find_element(By.ID, "shards").is_displayed()
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
