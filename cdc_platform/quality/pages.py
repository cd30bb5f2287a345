"""The HTML the platform adds to the Data Docs site: the index page and a validation page's
links to Dagster. Rendered server-side (GX's own index needs bootstrap-table, which no Python
package ships; see ``vendor``)."""

import re
from dataclasses import dataclass
from functools import cache

import jinja2

from cdc_platform.quality import links, vendor

BODY = re.compile(r"<body\b[^>]*>")


@dataclass(frozen=True, kw_only=True)
class Latest:
    """One suite's latest validation, a row of the index page."""

    suite: str
    page: str  # relative to the site
    suite_page: str
    asset: str | None
    batch: str
    run: str
    run_id: str | None  # a Dagster run (None: e.g. ``cdc-platform quality-report``)
    time: str
    success: bool
    evaluated: int
    met: int


@cache
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cdc_platform.quality", "templates"), autoescape=True
    )
    return env.get_template(name)


def index(rows: list[Latest]) -> str:
    return _template("index.html").render(
        rows=[
            {
                **vars(r),
                "asset_url": r.asset and links.asset_url(r.asset),
                "run_url": r.run_id and links.run_url(r.run_id),
            }
            for r in sorted(rows, key=lambda r: (r.success, r.suite))  # failures first
        ],
        failed=sum(not r.success for r in rows),
        dagster=links.dagster_url(),
        bootstrap_css=vendor.BOOTSTRAP_CSS.as_posix(),
        font_awesome_css=vendor.FONT_AWESOME_CSS.as_posix(),
    )


def with_dagster_links(html: str, asset: str, batch: str, run_id: str | None) -> str:
    """A validation page with a bar on top linking its asset and run in the Dagster UI."""
    bar = _template("dagster_links.html").render(
        asset=asset,
        asset_url=links.asset_url(asset),
        batch=batch,
        run_id=run_id,
        run_url=run_id and links.run_url(run_id),
    )
    return BODY.sub(lambda m: m.group(0) + bar, html, count=1)
