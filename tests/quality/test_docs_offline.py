"""The Data Docs site as built: every page loads its styles, scripts and fonts from the site
itself (copied from the XStatic packages), a validation page names the Dagster asset, run and
batch and links them, and the index lists each suite's latest validation with its status."""

import re
from pathlib import Path

import pytest

from cdc_platform.quality import docs, links, vendor
from tests.quality.data_docs import CHANGELOG, CURRENT, RUN_ID, balance_run, build_site

pytestmark = pytest.mark.spark
DAGSTER = "http://dagster.test:3000"
# A stylesheet, script or image the browser loads while rendering (not a plain <a href>).
LOADED = re.compile(r'<(?:link|script|img)\b[^>]*?\b(?:href|src)="([^"]+)"')


@pytest.fixture
def site(spark, tmp_path, monkeypatch) -> tuple[Path, dict[str, Path]]:
    monkeypatch.setenv("CDC_DAGSTER_URL", DAGSTER)
    pages = build_site(spark, tmp_path)
    return docs.site_dir(tmp_path / "reports"), pages


def _loaded(page: Path) -> list[str]:
    return LOADED.findall(page.read_text())


def test_every_page_loads_its_files_from_the_site(site):
    root, _ = site
    pages = sorted(root.rglob("*.html"))
    assert len(pages) == 5  # index, 2 suites, 2 validations
    for page in pages:
        loaded = _loaded(page)
        remote = [u for u in loaded if re.match(r"(https?:)?//", u)]
        assert not remote, (page, remote)
        # GX's favicon link on validation pages is one folder short (its template): not ours.
        missing = [u for u in loaded if "favicon" not in u and not (page.parent / u).is_file()]
        assert not missing, (page, missing)
        assert any(u.endswith(vendor.BOOTSTRAP_CSS.as_posix()) for u in loaded), page
    for font in ("fa-solid-900.woff2", "fa-regular-400.woff2"):
        assert (root / vendor.VENDOR / "font-awesome" / "webfonts" / font).is_file()


def test_a_validation_page_says_what_it_validated_and_links_dagster(site):
    root, pages = site
    page = pages["changelog.shop.customers"]
    assert page.relative_to(root).parts[:5] == ("validations", "changelog", "shop", "customers",
                                                 RUN_ID)  # fmt: skip
    html = page.read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert f"Data asset: {CHANGELOG}" in text
    assert f"Run Name {RUN_ID}" in text
    assert "batch 2026-03-01" in text and "Data asset: None" not in text
    assert "Run Time 2026-03-01T00:00:00Z" not in text  # the time it ran, not the batch's date
    assert f'href="{DAGSTER}/assets/{CHANGELOG}"' in html
    assert f'href="{DAGSTER}/runs/{RUN_ID}"' in html


def test_the_index_shows_each_suites_latest_validation(spark, site, tmp_path):
    root, pages = site
    index = (root / "index.html").read_text()
    rows = re.findall(r"<tr>(.*?)</tr>", index, re.S)[1:]
    assert len(rows) == 2
    failed = next(r for r in rows if "changelog.shop.customers" in r)
    assert "badge-danger" in failed and f'href="{DAGSTER}/runs/{RUN_ID}"' in failed
    assert pages["changelog.shop.customers"].relative_to(root).as_posix() in failed
    # A later failing merge replaces the passing one as its suite's latest.
    later = docs.Subject(asset=CURRENT, batch="merge", run_id="later-run")
    docs.publish([(balance_run(3), later)], tmp_path / "reports")
    index = (root / "index.html").read_text()
    rows = re.findall(r"<tr>(.*?)</tr>", index, re.S)[1:]
    balance = [r for r in rows if "current_rows.shop.customers" in r]
    assert len(balance) == 1 and "later-run" in balance[0] and "badge-danger" in balance[0]


def test_a_rebuild_keeps_the_links_and_the_local_files(site, tmp_path):
    root, pages = site
    docs.publish([], tmp_path / "reports", rebuild=True)  # what quality-report does
    html = pages["changelog.shop.customers"].read_text()
    assert f'href="{DAGSTER}/runs/{RUN_ID}"' in html
    assert not [u for u in _loaded(pages["changelog.shop.customers"]) if "//" in u]


def test_a_page_url_on_the_reports_server(tmp_path, monkeypatch):
    page = tmp_path / "validations" / "a" / "b c.html"
    monkeypatch.delenv("CDC_REPORTS_URL", raising=False)
    assert links.page_url(page, tmp_path) is None
    monkeypatch.setenv("CDC_REPORTS_URL", "http://127.0.0.1:3001/")
    assert links.page_url(page, tmp_path) == "http://127.0.0.1:3001/validations/a/b%20c.html"


def test_each_suite_keeps_its_newest_validations(spark, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_REPORTS_KEEP", "2")
    reports = tmp_path / "reports"
    published = []
    for live_after in (2, 3, 2):  # three validations of one suite: pass, fail, pass
        runs = [(balance_run(live_after), docs.Subject(asset=CURRENT, batch="merge"))]
        published.append(next(iter(docs.publish(runs, reports).values())))
    results = sorted((reports / "gx").rglob("validations/**/*.json"))
    assert len(results) == 2
    site = docs.site_dir(reports)
    assert not published[0].exists() and published[1].is_file() and published[2].is_file()
    assert len(list((site / "validations").rglob("*.html"))) == 2
    # the emptied folders of the removed run go too; the index shows the newest
    assert not published[0].parent.exists()
    index = docs.index_page(reports).read_text()
    assert published[2].relative_to(site).as_posix() in index
    assert published[1].relative_to(site).as_posix() not in index


def test_a_bad_keep_setting_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("CDC_REPORTS_KEEP", "all")
    with pytest.raises(ValueError, match="CDC_REPORTS_KEEP must be a whole number"):
        docs.publish([(balance_run(2), docs.Subject(asset=CURRENT, batch="merge"))], tmp_path)
