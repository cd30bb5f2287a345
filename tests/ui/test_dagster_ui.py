"""The Dagster UI in a real headless browser (Debian's chromium, driven by Playwright): the
webserver serves the demo code location and a demo table's lineage shows its three layers."""

import pytest
from playwright.sync_api import sync_playwright

from tests.ui.servers import CHROMIUM_ARGS, chromium

pytestmark = pytest.mark.browser


def test_the_lineage_of_a_demo_table_shows_raw_changelog_and_current(ui_stack, tmp_path):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(
                f"{ui_stack.dagster_url}/assets/current/shop/customers"
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
