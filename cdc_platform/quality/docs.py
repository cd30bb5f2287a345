"""Great Expectations Data Docs: the HTML report people read, in a reports folder.

A file-backed GX context lives only in the reports folder (``<reports>/gx``): the suites and
validation results of the runs are stored there and the site is (re)built from them. The
warehouse never holds anything of Great Expectations. The site's entry page is
``<reports>/data_docs/index.html``: the latest validation of each suite (``pages``). Each page
loads its styles and scripts from the site itself (``vendor``), and a validation page says what
it validated in Dagster's terms (``Subject``) and links there (``links``). Each suite keeps its
newest ``CDC_REPORTS_KEEP`` validations (``KEEP``): live operation validates every batch, and
without a limit the folder and the time of each publish grow with every run. With
``CDC_REPORTS_SITE`` (``s3://bucket/prefix``), each publish then copies what changed in the site
there (``lake.mirror``): the GX context stays in the reports folder, the site is read from
the bucket.
"""

import copy
import datetime as dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from cdc_platform.lake import storage
from cdc_platform.lake.mirror import mirror
from cdc_platform.quality import pages, vendor
from cdc_platform.quality.validate import SuiteRun

SITE = "local_site"
RUN_NAME = "quality-report"  # the run name of validations outside Dagster
SUBJECT = "cdc_subject"  # the result's meta key of its Subject
KEEP = 50  # validations kept per suite, unless CDC_REPORTS_KEEP says otherwise


@dataclass(kw_only=True)
class Subject:
    """What a validation validated, in Dagster's terms: shown on its page."""

    asset: str  # the asset key as a path: changelog/shop/customers
    batch: str  # the partition(s), or what the run read
    run_id: str | None = None  # the Dagster run; None outside Dagster (quality-report)
    details: dict[str, Any] = field(default_factory=dict)  # more on the batch (Batch Spec)


def reports_dir(warehouse: str) -> Path:
    """``CDC_REPORTS``, else ``reports`` beside the warehouse (``var/reports`` in the demo)."""
    if os.environ.get("CDC_REPORTS"):
        return Path(os.environ["CDC_REPORTS"])
    # Beside a local warehouse; a warehouse in a store keeps them in var/ here.
    base = Path("var") if storage.is_remote(str(warehouse)) else Path(warehouse).parent
    return base.resolve() / "reports"


def site_dir(reports: Path) -> Path:
    return Path(reports) / "data_docs"


def site_copy() -> str | None:
    """``CDC_REPORTS_SITE``: a location (``s3://bucket/prefix``, or a local folder) that each
    publish makes hold the site, for a team to read it where the lake is; None: none."""
    location = os.environ.get("CDC_REPORTS_SITE")
    return storage.resolve(location, Path.cwd()) if location else None


def index_page(reports: Path) -> Path:
    return site_dir(reports) / "index.html"


def kept_per_suite() -> int:
    """``CDC_REPORTS_KEEP``, else ``KEEP``; ValueError naming the variable when it is not a
    whole number of at least 1."""
    text = os.environ.get("CDC_REPORTS_KEEP") or str(KEEP)
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"CDC_REPORTS_KEEP must be a whole number of at least 1, not {text!r}")
    return int(text)


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
        # No profiling here: its section would list every stored validation on each publish.
        "site_section_builders": {"profiling": "None"},
    }
    if context.get_config().data_docs_sites != {SITE: site}:
        for name in list(context.get_config().data_docs_sites or {}):
            context.delete_data_docs_site(name)
        context.add_data_docs_site(SITE, site)
    return context


def publish(
    runs: list[tuple[SuiteRun, Subject]], reports: Path, rebuild: bool = False
) -> dict[str, Path]:
    """Store ``runs`` in the reports folder and update their pages of the site (``rebuild``:
    the whole site). Returns each suite's validation page."""
    keep = kept_per_suite()
    # Runs of different sources publish at once: GX's config file, the stored results and our
    # index are shared, and a context read while another run writes its config fails to load.
    reports = Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    with FileLock(reports / ".publish.lock"):
        published = _publish(runs, reports, keep, rebuild)
        if copy_to := site_copy():
            mirror(site_dir(reports), copy_to, reports / ".site-copy.json")
        return published


def _publish(
    runs: list[tuple[SuiteRun, Subject]], reports: Path, keep: int, rebuild: bool
) -> dict[str, Path]:
    import great_expectations as gx
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    context = _context(reports)
    site = site_dir(reports)
    ids: list[Any] = []
    published: dict[str, Path] = {}
    for run, subject in runs:
        if run.result is None:
            continue
        suite_id = ExpectationSuiteIdentifier(name=run.suite)
        context.suites.add_or_update(gx.ExpectationSuite(**run.expectations))
        result = _described(run, subject)
        result_id = ValidationResultIdentifier(
            expectation_suite_identifier=suite_id,
            run_id=result.meta["run_id"],
            # a path segment of the page: the batch without spaces, slashes, quotes
            batch_identifier=re.sub(r"[^\w.-]+", "_", subject.batch),
        )
        context.validation_results_store.store_validation_results(
            suite_validation_result=result,
            suite_validation_result_identifier=result_id,
            expectation_suite_identifier=suite_id,
        )
        ids += [suite_id, result_id]
        published[run.suite] = site / _page(result_id)
    if ids or rebuild:
        # GX's own index page lists every stored validation, so it costs more with each one
        # kept; ours (below) replaces it anyway.
        context.build_data_docs(
            site_names=[SITE], resource_identifiers=None if rebuild else ids, build_index=False
        )
        store = context.validation_results_store
        built = store.list_keys() if rebuild else ids
        results = [i for i in built if isinstance(i, ValidationResultIdentifier)]
        suites = {r.expectation_suite_identifier.name for r in results} | {
            i.name for i in built if isinstance(i, ExpectationSuiteIdentifier)
        }
        vendor.install(site)
        for result_id in results:
            subject = store.get(result_id).meta.get(SUBJECT)
            _rewrite(site, _page(result_id), subject)
        for suite in suites:
            _rewrite(site, _suite_page(suite), None)
        kept = _prune(store, site, keep)
        index_page(reports).write_text(pages.index(_latest(store, kept)))
    return published


def _prune(store: Any, site: Path, keep: int) -> list[Any]:
    """Remove each suite's validations but its newest ``keep`` (result and page); returns the
    stored results that remain."""
    by_suite: dict[str, list[Any]] = {}
    for key in store.list_keys():
        by_suite.setdefault(key.expectation_suite_identifier.name, []).append(key)
    kept = []
    for keys in by_suite.values():
        keys.sort(key=lambda k: k.run_id.run_time, reverse=True)
        kept += keys[:keep]
        for key in keys[keep:]:
            store.remove_key(key)
            page = site / _page(key)
            page.unlink(missing_ok=True)
            for folder in page.parents:  # the run's folders, once empty
                if folder == site or (folder.is_dir() and any(folder.iterdir())):
                    break
                if folder.is_dir():
                    folder.rmdir()
    return kept


def _described(run: SuiteRun, subject: Subject) -> Any:
    """The GX result of ``run`` with what its page shows: the asset as the data asset, the run
    as the run name, the batch in the Batch Spec."""
    from great_expectations.core.run_identifier import RunIdentifier

    result = copy.copy(run.result)
    result.meta = {
        **run.result.meta,
        # Now, not the result's validation_time: GX takes that from a run name that parses
        # as a date (validate's run name is the batch).
        "run_id": RunIdentifier(
            run_name=subject.run_id or RUN_NAME, run_time=dt.datetime.now(dt.UTC)
        ),
        "batch_spec": {
            "data_asset_name": subject.asset,
            "batch": subject.batch,
            "rows": run.rows,
            "engine": run.engine,
            **subject.details,
        },
        SUBJECT: {"asset": subject.asset, "batch": subject.batch, "run_id": subject.run_id},
    }
    return result


def _page(result_id: Any) -> Path:
    """A validation page, relative to the site (GX's layout: one folder per part)."""
    *folders, batch = result_id.to_tuple()
    return Path("validations", *folders, f"{batch}.html")


def _suite_page(suite: str) -> Path:
    *folders, name = suite.split(".")
    return Path("expectations", *folders, f"{name}.html")


def _rewrite(site: Path, page: Path, subject: dict[str, Any] | None) -> None:
    """A page GX just built, loading nothing remote and, if it says what it validated, linking
    its asset and run in Dagster."""
    path = site / page
    if not path.is_file():
        return
    html = vendor.localize(path.read_text(), len(page.parts) - 1)
    if subject:
        html = pages.with_dagster_links(html, **subject)
    path.write_text(html)


def _latest(store: Any, keys: list[Any]) -> list[pages.Latest]:
    """Each suite's latest validation of ``keys`` (by run time)."""
    latest: dict[str, Any] = {}
    for key in keys:
        suite = key.expectation_suite_identifier.name
        if suite not in latest or key.run_id.run_time > latest[suite].run_id.run_time:
            latest[suite] = key
    rows = []
    for suite, key in latest.items():
        result = store.get(key)
        subject = result.meta.get(SUBJECT) or {}
        stats = result.statistics
        rows.append(
            pages.Latest(
                suite=suite,
                page=_page(key).as_posix(),
                suite_page=_suite_page(suite).as_posix(),
                asset=subject.get("asset"),
                batch=subject.get("batch") or key.batch_identifier,
                run=key.run_id.run_name,
                run_id=subject.get("run_id"),
                time=key.run_id.run_time.strftime("%Y-%m-%d %H:%M:%S UTC"),
                success=bool(result.success),
                evaluated=int(stats.get("evaluated_expectations") or 0),
                met=int(stats.get("successful_expectations") or 0),
            )
        )
    return rows
