"""Debian's headless Chromium driven through selenium, for the browser-page tests.

The browser is the system's (``/usr/bin/chromium`` and ``/usr/bin/chromedriver``,
installed by ``.ci/run``); selenium is told both paths, so it never looks for or
downloads a browser or driver of its own. Screenshots go to ``artifacts_dir()``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest
from tests.utils.paths import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1200,900")


def need_browser() -> None:
    """Skip where no browser is installed; fail under CI, whose .ci/run installs it."""
    pytest.importorskip("selenium")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        msg = f"{missing} missing: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def artifacts_dir() -> str:
    path = os.environ.get("PAGEDJAX_TEST_ARTIFACTS") or str(REPO_ROOT / "build" / "test-artifacts")
    os.makedirs(path, exist_ok=True)
    return path


class Browser:
    """One Chromium with a fresh profile; ``quit()`` removes the profile."""

    def __init__(self):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="pagedjax-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in FLAGS + (f"--user-data-dir={self.profile}",):
            opts.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def wait(self, predicate, timeout: float = 60.0, what: str = "condition", every: float = 0.05):
        deadline = time.time() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(every)

    def screenshot(self, name: str) -> str:
        path = os.path.join(artifacts_dir(), name)
        self.driver.save_screenshot(path)
        return path
