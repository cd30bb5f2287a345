"""Great Expectations Data Docs: the HTML report people read, in a reports folder.

A file-backed GX context lives only in the reports folder (``<reports>/gx``): the suites and
validation results of the runs are stored there and the site is (re)built from them. The
warehouse never holds anything of Great Expectations. The site's entry page is
``<reports>/data_docs/index.html``.
"""

import os
from pathlib import Path
from typing import Any

from cdc_platform.quality.validate import SuiteRun

SITE = "local_site"


def reports_dir(warehouse: Path) -> Path:
    """``CDC_REPORTS``, else ``reports`` beside the warehouse (``var/reports`` in the demo)."""
    return Path(os.environ.get("CDC_REPORTS") or Path(warehouse).resolve().parent / "reports")


def index_page(reports: Path) -> Path:
    return Path(reports) / "data_docs" / "index.html"


def _context(reports: Path) -> Any:
    import great_expectations as gx

    reports.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(reports))
    if context.get_config().analytics_enabled is not False:
        context.enable_analytics(False)  # saved in <reports>/gx/great_expectations.yml
    site = {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            # relative to <reports>/gx: the folder can be moved or served as a whole
            "base_directory": "../data_docs/",
        },
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    }
    if context.get_config().data_docs_sites != {SITE: site}:
        for name in list(context.get_config().data_docs_sites or {}):
            context.delete_data_docs_site(name)
        context.add_data_docs_site(SITE, site)
    return context


def publish(runs: list[SuiteRun], reports: Path, rebuild: bool = False) -> Path:
    """Store ``runs`` in the reports folder and update their pages of the site (``rebuild``:
    the whole site). Returns the entry page."""
    import great_expectations as gx
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    context = _context(Path(reports))
    ids: list[Any] = []
    for run in runs:
        if run.result is None:
            continue
        suite_id = ExpectationSuiteIdentifier(name=run.suite)
        context.suites.add_or_update(gx.ExpectationSuite(**run.expectations))
        result_id = ValidationResultIdentifier(
            expectation_suite_identifier=suite_id,
            run_id=run.result.meta["run_id"],
            batch_identifier=run.batch,
        )
        context.validation_results_store.store_validation_results(
            suite_validation_result=run.result,
            suite_validation_result_identifier=result_id,
            expectation_suite_identifier=suite_id,
        )
        ids += [suite_id, result_id]
    if ids or rebuild:
        context.build_data_docs(site_names=[SITE], resource_identifiers=None if rebuild else ids)
    return index_page(Path(reports))
