"""SQL models (dbt_like_models) as assets ``models/<name>``, their YAML tests as asset checks."""

import dagster as dg

from cdc_platform import lake
from cdc_platform.catalog import Catalog
from cdc_platform.defs.automation import automation_sensor
from cdc_platform.defs.keys import model_key
from cdc_platform.defs.metadata import table_schema
from cdc_platform.defs.resources import LakeResource, SparkResource
from cdc_platform.defs.runs import MODELS
from cdc_platform.defs.transient import retried_if_transient
from cdc_platform.models.build import build_model
from cdc_platform.models.checks import run_tests
from cdc_platform.models.project import (
    Model,
    Project,
    catalog_tables,
    default_models_dir,
    display_path,
    load_project,
)

GROUP = "models"
# A model rebuilds when anything it reads updates. Not eager(): eager also runs an asset that is
# merely missing, and waits while any parent partition is missing, which a model over a daily
# change log would do forever. A model is built first when its inputs update (or by hand).
_INPUTS_UPDATED = (
    dg.AutomationCondition.any_deps_updated().since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("rebuild when an input updates")
# ... and not before every current table it reads has been written: a build over a table that
# does not exist fails (the demo's first models run did: orders updated before customers had
# any rows). Change logs are left out (a day without changes leaves its partition missing for
# good), and models too (one requested in the same tick is built first, in the same run).
_INPUTS_EXIST = ~(
    dg.AutomationCondition.any_deps_match(dg.AutomationCondition.missing())
    .allow(dg.AssetSelection.key_prefixes([lake.CURRENT], include_sources=True))
    .with_label("a current table it reads is missing")
)
# ... and never while a blocking (ERROR) check of an input has failed, as for current and history
# (automation.py): a model must not be rebuilt from an input its checks rejected. The update
# stays unhandled meanwhile, so the model is rebuilt once the checks pass.
REBUILD_WHEN_INPUTS_UPDATE = (
    _INPUTS_UPDATED & _INPUTS_EXIST & dg.AutomationCondition.all_deps_blocking_checks_passed()
)


def _spaced(condition: dg.AutomationCondition, cron: str | None) -> dg.AutomationCondition:
    """``condition``, with ``cron`` (``models.rebuild_cron``) at most once per tick of it: a
    tick must have passed since the model (or check) was last requested or built."""
    if cron is None:
        return condition
    tick = dg.AutomationCondition.cron_tick_passed(cron).since_last_handled()
    return condition & tick.with_label(f"at most once per tick of {cron}")


def rebuild_condition(cron: str | None) -> dg.AutomationCondition:
    """When a model is rebuilt: after an input updated, at most once per tick of ``cron``."""
    return _spaced(REBUILD_WHEN_INPUTS_UPDATE, cron)


class ModelBuildConfig(dg.Config):
    full_refresh: bool = False
    """Rebuild an incremental model from all rows instead of merging the changed ones."""


def _column_schema(model: Model, schema: object | None = None) -> dg.TableSchema:
    if schema is None:  # before a build: the documented columns
        return dg.TableSchema(
            columns=[
                dg.TableColumn(n, "unknown until built", description=d)
                for n, d in model.columns.items()
            ]
        )
    built = table_schema(schema)
    return dg.TableSchema(
        columns=[
            dg.TableColumn(c.name, c.type, description=model.columns.get(c.name))
            for c in built.columns
        ]
    )


def build_model_asset(project: Project, model: Model, cron: str | None) -> dg.AssetsDefinition:
    view = model.materialized == "view"
    description = (model.description or f"SQL model {model.name}.").strip()
    config = f"materialized: {model.materialized}"
    if model.unique_key:
        config += f", unique_key: {', '.join(model.unique_key)}"
    if model.partition_by:
        config += f", partition_by: {', '.join(model.partition_by)}"

    @dg.asset(
        key=model_key(model.name),
        deps=[dg.AssetKey(r.key_path) for r in model.inputs],
        group_name=GROUP,
        kinds={"spark", "sql"} if view else {"spark", "delta"},
        automation_condition=rebuild_condition(cron),
        code_version=model.code_version,
        description=f"{description}\n\n`{display_path(model.path)}` ({config})",
        metadata={"dagster/column_schema": _column_schema(model)} if model.columns else None,
    )
    def sql_model(
        context: dg.AssetExecutionContext,
        config: ModelBuildConfig,
        spark: SparkResource,
        lake: LakeResource,
    ) -> dg.MaterializeResult:
        with retried_if_transient(context, spark):  # a Spark server restarted under the build
            built = build_model(
                spark.spark_session,
                lake.warehouse_uri,
                project,
                model.name,
                full_refresh=config.full_refresh,
            )
        metadata: dict[str, object] = {
            "dagster/row_count": built.rows,
            "dagster/column_schema": _column_schema(model, built.schema),
            "materialized": built.materialized,
        }
        if built.uri:
            metadata |= {
                "delta_version": built.version,
                "dagster/uri": dg.MetadataValue.path(built.uri),
            }
        if model.materialized == "incremental":
            metadata |= {
                "merged": built.merged,
                "changed_input_rows": dg.MetadataValue.json(built.input_rows),
            }
        return dg.MaterializeResult(metadata=metadata)

    return sql_model


def build_model_checks(
    project: Project, model: Model, cron: str | None
) -> dg.AssetChecksDefinition:
    """The model's tests as checks. A test of a relationship to another table also runs when
    that table updates, spaced like the model's rebuilds (``cron``)."""
    key = model_key(model.name)
    specs = [
        dg.AssetCheckSpec(
            t.name,
            asset=key,
            description=f"{t.kind} on column {t.column}"
            + (f" ({t.severity})" if t.severity == "warn" else ""),
            additional_deps=[dg.AssetKey(t.to.key_path)] if t.to else None,
            automation_condition=_spaced(dg.AutomationCondition.eager(), cron),
        )
        for t in model.tests
    ]
    by_name = {t.name: t for t in model.tests}

    @dg.multi_asset_check(specs=specs, name=f"{model.name}__tests", can_subset=True)
    def model_tests(
        context: dg.AssetCheckExecutionContext, spark: SparkResource, lake: LakeResource
    ):
        only = {k.name for k in context.selected_asset_check_keys}
        with retried_if_transient(context, spark):
            outcomes = run_tests(spark.spark_session, lake.warehouse_uri, project, model.name, only)
        for o in outcomes:
            yield dg.AssetCheckResult(
                asset_key=key,
                check_name=o.name,
                passed=o.passed,
                severity=dg.AssetCheckSeverity.WARN
                if by_name[o.name].severity == "warn"
                else dg.AssetCheckSeverity.ERROR,
                metadata={
                    "failing_rows": o.failing_rows,
                    "failing_values": o.failing_values,
                    "sample": dg.MetadataValue.json([str(v) for v in o.sample]),
                    "sql": dg.MetadataValue.md(f"```sql\n{o.sql}\n```"),
                },
            )

    return model_tests


def build_models_defs(catalog: Catalog) -> dg.Definitions:
    """One asset per model of the catalog's ``dbt_like_models`` folder, its checks, and the
    automation sensor of the models."""
    project = load_project(default_models_dir(catalog.base_dir), catalog_tables(catalog))
    cron = catalog.models.rebuild_cron
    assets = [build_model_asset(project, m, cron) for m in project.models.values()]
    sensors = []
    if assets:
        sensors.append(
            automation_sensor(
                f"{MODELS}__automation",
                dg.AssetSelection.assets(*assets),
                MODELS,
                "Rebuilds the SQL models whose inputs updated, with their tests.",
            )
        )
    return dg.Definitions(
        assets=assets,
        asset_checks=[
            build_model_checks(project, m, cron) for m in project.models.values() if m.tests
        ],
        sensors=sensors,
    )
