"""Named automation conditions."""

import dagster as dg

# `current` reads every daily change-log partition, and most past dates never had data. Plain
# eager() waits while any parent partition is missing, i.e. forever; this one only waits for
# parents in progress, and merges as soon as any change-log partition is updated.
MERGE_WHEN_CHANGELOG_UPDATES = (
    dg.AutomationCondition.eager()
    .without(~dg.AutomationCondition.any_deps_missing())
    .with_label("eager, ignoring never-materialized change-log dates")
)
