"""The code location: per catalog source its assets, checks, job, sensor and automation sensor;
the SQL models and theirs; the freshness schedule, the maintenance job and its schedule, the
resources and the in-process executor."""

import dagster as dg

from cdc_platform.catalog import default_catalog_path, load_catalog
from cdc_platform.defs.cdc_tables import build_source_defs
from cdc_platform.defs.freshness import build_freshness_schedule
from cdc_platform.defs.maintenance import build_maintenance_defs
from cdc_platform.defs.models import build_models_defs
from cdc_platform.defs.resources import build_resources


@dg.definitions
def defs() -> dg.Definitions:
    catalog = load_catalog(default_catalog_path())
    sources = [build_source_defs(s, catalog) for s in catalog.sources]
    freshness_checks = [c for d in sources for c in d.asset_checks or []]
    return dg.Definitions.merge(
        *sources,
        build_models_defs(catalog),
        build_maintenance_defs(catalog.maintenance),
        dg.Definitions(
            schedules=[build_freshness_schedule(freshness_checks)] if freshness_checks else [],
            resources=build_resources(catalog),
            # One process, one JVM: a multiprocess executor would start Spark in every step.
            executor=dg.in_process_executor,
        ),
    )
