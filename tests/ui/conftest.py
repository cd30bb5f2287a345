"""One Dagster webserver for the browser tests (it starts the demo code location: seconds),
beside the Data Docs server its checks link to."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdc_platform.quality import docs
from tests.ui.servers import dagster_webserver, reports_server


@dataclass(frozen=True)
class UiStack:
    home: Path  # DAGSTER_HOME, with the warehouse, landing and reports folders under it
    env: dict[str, str]  # what the webserver was started with (CDC_* paths, URLs)
    dagster_url: str
    reports_url: str


@pytest.fixture(scope="package")
def ui_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiStack]:
    home = tmp_path_factory.mktemp("ui")
    reports = home / "reports"
    site = docs.site_dir(reports)
    site.mkdir(parents=True)
    env = {
        "DAGSTER_HOME": str(home),
        "CDC_WAREHOUSE": str(home / "warehouse"),
        "CDC_LANDING": str(home / "landing"),
        "CDC_REPORTS": str(reports),
    }
    with reports_server(site, home) as reports_url:
        env["CDC_REPORTS_URL"] = reports_url
        with dagster_webserver(home, env) as dagster_url:
            yield UiStack(home, {**env, "CDC_DAGSTER_URL": dagster_url}, dagster_url, reports_url)
