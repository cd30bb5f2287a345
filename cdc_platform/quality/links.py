"""Where the Data Docs and the Dagster UI point to each other.

Base URLs come from the environment when a page or a check result is written: the Dagster UI
(``CDC_DAGSTER_URL``, default ``http://127.0.0.1:3000``) for a page's links to its asset and
run, and the server of the Data Docs site (``CDC_REPORTS_URL``, no default: ``make demo`` sets
``http://127.0.0.1:3001``) for a check's link to its page.
"""

import os
from pathlib import Path
from urllib.parse import quote

DEFAULT_DAGSTER_URL = "http://127.0.0.1:3000"


def dagster_url() -> str:
    return (os.environ.get("CDC_DAGSTER_URL") or DEFAULT_DAGSTER_URL).rstrip("/")


def asset_url(asset: str) -> str:
    """The asset's page in the Dagster UI; ``asset`` is the key as a path (``a/b/c``)."""
    return f"{dagster_url()}/assets/{quote(asset)}"


def run_url(run_id: str) -> str:
    return f"{dagster_url()}/runs/{quote(run_id)}"


def page_url(page: Path, site: Path) -> str | None:
    """``page`` on the reports server (``CDC_REPORTS_URL`` serves ``site``), None without one."""
    base = os.environ.get("CDC_REPORTS_URL")
    if not base:
        return None
    return f"{base.rstrip('/')}/{quote(page.relative_to(site).as_posix())}"
