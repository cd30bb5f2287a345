"""Named automation conditions and the automation sensors that evaluate them."""

import dagster as dg

from cdc_platform.defs.runs import source_tags

# `current` reads every daily change-log partition, and most past dates never had data. Plain
# eager() waits while any parent partition is missing, i.e. forever; this one only waits for
# parents in progress, and merges as soon as any change-log partition is updated.
# ... and never while a blocking (ERROR) data-quality check of the change log has failed: a
# merge run started by this sensor must not apply what a run's checks rejected.
MERGE_WHEN_CHANGELOG_UPDATES = (
    dg.AutomationCondition.eager()
    .without(~dg.AutomationCondition.any_deps_missing())
    .with_label("eager, ignoring never-materialized change-log dates")
) & dg.AutomationCondition.all_deps_blocking_checks_passed()


def automation_sensor(
    name: str, target: dg.AssetSelection, source: str, description: str
) -> dg.AutomationConditionSensorDefinition:
    """The automation sensor of one source (or of the models): its runs carry the source's run
    tag, so the run queue never runs them beside another run of the same source."""
    return dg.AutomationConditionSensorDefinition(
        name,
        target=target,
        run_tags=source_tags(source),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=15,
        description=description,
    )
