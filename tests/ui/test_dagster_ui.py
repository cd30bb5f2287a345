"""The Dagster UI in a real headless browser (Debian's chromium, driven by Playwright): the
webserver serves the demo code location and a demo table's lineage shows its three layers."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from cdc_platform.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless in a closed network: no sandbox as root, no background connections to Google.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@pytest.fixture(scope="module")
def webserver(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ui")
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp),
        "CDC_WAREHOUSE": str(tmp / "warehouse"),
        "CDC_LANDING": str(tmp / "landing"),
    }
    bin_dir = Path(sys.executable).parent
    log = (tmp / "webserver.log").open("wb")
    proc = subprocess.Popen(
        [str(bin_dir / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1",
         "-p", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"{url}/server_info", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"dagster-webserver did not start: see {log.name}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_lineage_of_a_demo_table_shows_raw_changelog_and_current(webserver, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: `make test` installs it (make browser)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(
                f"{webserver}/assets/current/shop/customers"
                "?view=lineage&lineageScope=upstream&lineageDepth=2",
                timeout=120_000,
            )
            # Each node of the graph links to its asset; wait until all three are drawn.
            for key in ("raw/shop", "changelog/shop/customers", "current/shop/customers"):
                page.locator(f'a[href^="/assets/{key}?"]').first.wait_for(timeout=120_000)
            page.screenshot(path=tmp_path / "lineage.png")
            titles = page.locator("text=customers").count()
            assert titles >= 2  # the change log and the current table
            assert page.locator("text=shop").count() >= 1  # raw/shop
            assert "Spark" in page.inner_text("body")
        finally:
            browser.close()
