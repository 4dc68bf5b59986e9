"""Headless Chromium for the browser tests (Debian's ``chromium`` and ``chromium-driver``),
driven with Selenium through the system's chromedriver: never a downloaded browser."""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


@dataclass
class Loaded:
    """What a page did: seconds from navigation to its charts drawn, its own error list,
    and the browser console's SEVERE entries (script errors, CSP refusals, failed loads)."""

    seconds: float
    page_errors: list[str]
    console_errors: list[str]


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[webdriver.Chrome]:
    profile = tempfile.mkdtemp(prefix="vllm-triage-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which("chromedriver") or CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def severe(driver: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def load(driver: webdriver.Chrome, url: str, *, renders: int = 1, timeout: float = 30) -> Loaded:
    """Open ``url`` and wait until the page says it has drawn ``renders`` times."""
    severe(driver)  # drop what an earlier page logged
    began = time.perf_counter()
    driver.get(url)
    deadline = began + timeout
    state: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        state = driver.execute_script("return window.vtPage || {}") or {}
        if state.get("errors") or (state.get("renders") or 0) >= renders:
            break
        time.sleep(0.05)
    seconds = driver.execute_script(
        "var p = window.vtPage; return p && p.renderedAt !== null ? p.renderedAt / 1000 : null"
    )
    return Loaded(
        seconds=seconds if seconds is not None else time.perf_counter() - began,
        page_errors=list(state.get("errors") or []),
        console_errors=severe(driver),
    )


def full_page_screenshot(driver: webdriver.Chrome, path: Path, width: int = 1280) -> Path:
    """The whole page, not only the window: the window is resized to the page's height."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(int(height) + 40, 12000))
    time.sleep(0.3)  # the charts redraw at the new size
    driver.save_screenshot(str(path))
    return path


def clipped_screenshot(
    driver: webdriver.Chrome, path: Path, *, until: str, width: int = 1200, scale: float = 0.75
) -> Path:
    """The page from its top to the bottom of the element ``until`` (a CSS selector),
    ``scale`` times its size: a picture small enough for the README."""
    driver.set_window_size(width, 12000)
    time.sleep(0.3)
    bottom = driver.execute_script(
        "return document.querySelector(arguments[0]).getBoundingClientRect().bottom", until
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "clip": {"x": 0, "y": 0, "width": width, "height": bottom + 12, "scale": scale},
        },
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


if __name__ == "__main__":
    # docs/report-tour.png: python tests/support/browser.py REPORT.html docs/report-tour.png
    import sys

    with chromium() as driver:
        loaded = load(driver, Path(sys.argv[1]).resolve().as_uri())
        assert not loaded.page_errors and not loaded.console_errors, loaded
        clipped_screenshot(driver, Path(sys.argv[2]), until=".vt-charts")
