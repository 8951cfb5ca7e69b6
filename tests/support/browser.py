"""A real headless Chromium for the tests of web pages (the dashboard, the analyze report).

Example::

    @pytest.fixture
    def browser(tmp_path):
        yield from chromium(tmp_path, extra=("--window-size=1200,900",))
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

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


def browser_missing() -> str | None:
    """Why no browser test can run here, or None."""
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


def chromium(tmp_path: Path, extra: tuple[str, ...] = ()) -> Iterator:
    """A Selenium driver of Chromium with its console logged (skips the test without one); quit after."""
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (*CHROMIUM_FLAGS, *extra):
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
