"""The Data Docs in a real headless browser with every request off this machine blocked: the
pages are styled by Bootstrap and Font Awesome served from the site itself, a validation page
names its asset and run, and a check in the Dagster UI links to its page."""

from urllib.parse import quote

import dagster as dg
import pytest
from playwright.sync_api import Page, sync_playwright

from cdc_platform.catalog import load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.resources import build_resources
from cdc_platform.demo import write_demo_traffic
from cdc_platform.quality import docs
from tests.quality.data_docs import CHANGELOG, RUN_ID, build_site
from tests.ui.servers import CHROMIUM_ARGS, ROOT, chromium, reports_server

pytestmark = [pytest.mark.browser, pytest.mark.spark]
DAY = "2026-03-01"
LOCAL = ("http://127.0.0.1", "file://", "data:", "blob:")
# Bootstrap 4's .badge-danger background (#dc3545): an unstyled span has none.
BOOTSTRAP_DANGER = "rgb(220, 53, 69)"


def _offline(page: Page) -> list[str]:
    """Abort every request that would leave this machine; returns the list of them."""
    blocked: list[str] = []

    def route(r) -> None:
        if r.request.url.startswith(LOCAL):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return blocked


def _style(page: Page, selector: str, prop: str) -> str:
    return page.locator(selector).first.evaluate(f"e => getComputedStyle(e).{prop}")


def test_the_site_is_styled_offline_and_says_what_it_validated(spark, tmp_path):
    pages = build_site(spark, tmp_path)
    site = docs.site_dir(tmp_path / "reports")
    with reports_server(site, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            blocked = _offline(page)
            page.goto(f"{url}/index.html", wait_until="networkidle")
            assert _style(page, ".badge-danger", "backgroundColor") == BOOTSTRAP_DANGER
            assert _style(page, ".navbar", "display") == "flex"
            assert _style(page, ".table td", "padding") == "4.8px"  # .table-sm
            font = "async () => (await document.fonts.load('900 16px \"Font Awesome 6 Free\"'))"
            assert page.evaluate(font + ".length") > 0  # the icons' webfont, from the site

            page.goto(f"{url}/{quote(pages['changelog.shop.customers'].relative_to(site).as_posix())}",
                      wait_until="networkidle")  # fmt: skip
            body = page.inner_text("body")
            assert f"Data asset: {CHANGELOG}" in body and RUN_ID in body
            assert _style(page, ".navbar", "display") == "flex"
            # Bootstrap's script (with jQuery) runs: "Show more info..." opens the run's info.
            page.get_by_text("Show more info...").click()
            page.get_by_text("Batch Spec").wait_for(state="visible")
            page.screenshot(path=tmp_path / "validation.png", full_page=True)
            assert blocked == []
        finally:
            browser.close()


def test_a_check_in_the_dagster_ui_links_to_its_page(spark, ui_stack, tmp_path, monkeypatch):
    for k, v in ui_stack.env.items():
        monkeypatch.setenv(k, v)
    # One ingest of the demo's shop source, its checks included, in the webserver's instance.
    catalog = load_catalog(ROOT / "sources.yaml")
    write_demo_traffic(catalog.landing_uri, batch=0, date=DAY)
    defs = dg.Definitions.merge(
        build_source_defs(catalog.source("shop"), catalog),
        dg.Definitions(resources=build_resources(catalog)),
    )
    job = defs.resolve_job_def("shop__ingest")
    result = job.execute_in_process(partition_key=DAY, instance=dg.DagsterInstance.get())
    assert result.success
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            _follow_the_report_link(browser, ui_stack.dagster_url, ui_stack.reports_url,
                                    result.run_id, tmp_path)  # fmt: skip
        finally:
            browser.close()


def _follow_the_report_link(browser, dagster_url, reports_url, run_id, tmp_path) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    # The UI invites a first-time visitor to "Join the Dagster community" after a while; the
    # dialog's backdrop takes every click until it is skipped.
    invitation = page.get_by_text("Join the Dagster community")
    page.add_locator_handler(invitation, lambda: page.get_by_role("button", name="Skip").click())
    page.goto(f"{dagster_url}/assets/{CHANGELOG}?view=checks", timeout=120_000)
    link = page.locator(f'a[href^="{reports_url}/validations/"]').first
    try:
        link.wait_for(timeout=120_000)
    finally:
        page.screenshot(path=tmp_path / "checks.png")
    with page.context.expect_page() as opened:
        link.click()
    report = opened.value
    report.wait_for_load_state("networkidle")
    body = report.inner_text("body")
    assert f"Data asset: {CHANGELOG}" in body and run_id in body
    assert report.locator(f'a[href="{dagster_url}/runs/{run_id}"]').count() == 1
