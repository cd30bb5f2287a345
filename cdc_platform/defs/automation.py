"""Named automation conditions."""

import dagster as dg

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
