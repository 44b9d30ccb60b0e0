"""A real headless Chromium for the viewer's tests (design.md 13): Debian's chromium and
chromedriver, the driver started on a free port; absent, the tests that need it are skipped
(`.ci/run` installs both)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None, reason="needs chromium and chromedriver (apt install chromium chromium-driver)"
)


@contextmanager
def chromium(width: int = 1280, height: int = 900) -> Iterator[object]:
    """A WebDriver on a new headless Chromium; quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=options)
    try:
        yield driver
    finally:
        driver.quit()
