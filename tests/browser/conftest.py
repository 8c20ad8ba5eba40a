"""Headless Chromium for the browser tests: Debian's ``chromium`` package (installed here when
``which chromium`` finds none: ``playwright install`` cannot download in this workplace),
driven by Playwright through its executable path, with JavaScript off (the dashboard reads
and writes without it).

Screenshots go to ``$POSTROOM_ARTIFACTS`` or ``tests/browser/artifacts/`` (git-ignored); the
session prints the folder. Under ``CI=true`` a browser still missing after the install
attempt fails the tests; elsewhere it skips them, visibly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _chromium() -> str | None:
    found = shutil.which("chromium")
    # A fresh machine may have no package lists yet: install, and if that fails, update first.
    for steps in ([["apt-get", "install", "-y", "-q", "chromium"]],
                  [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]]):
        if found is not None or shutil.which("apt-get") is None:
            break
        for step in steps:
            subprocess.run(step, check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.STDOUT, timeout=900)
        found = shutil.which("chromium")
    return found


@pytest.fixture(scope="session")
def chromium() -> str:
    found = _chromium()
    if found is None:
        problem = "no chromium after `apt-get install -y chromium`"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{problem} (CI requires the browser tests)", pytrace=False)
        pytest.skip(problem)
    return found


@pytest.fixture(scope="session")
def artifacts() -> Path:
    folder = Path(os.environ.get("POSTROOM_ARTIFACTS")
                  or Path(__file__).resolve().parent / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {folder}")
    return folder


# Module-scoped: sync_playwright keeps an event loop running in the main thread, and every
# later test in this process that calls asyncio.run() would fail while it lives.
@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=ARGS,
                                              headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    context = browser.new_context(java_script_enabled=False,
                                  viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    yield opened
    context.close()
