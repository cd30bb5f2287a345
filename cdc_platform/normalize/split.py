"""Splitting: parsed messages sorted out into each keyed table's typed change records and the
quarantine rows (parse errors, unkeyed tables, values that do not fit their type)."""

import functools
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.lake.tables import ChangelogFacts
from cdc_platform.normalize.columns import QUARANTINE_COLUMNS, to_quarantine
from cdc_platform.normalize.parse import TYPED, schema_groups, typed_parts
from cdc_platform.normalize.plan import Known, TablePlan, joined_plan, plan_tables
from cdc_platform.normalize.typed import rejected_table, type_changes, typed_records


@dataclass
class SplitChanges:
    tables: list[tuple[TablePlan, DataFrame]]  # each table's change records, typed
    quarantine: DataFrame


def split_parsed(
    parsed: DataFrame,
    source: SourceConfig,
    staging: lake.Staging,
    known: Known,
    typed: list[TablePlan] | None = None,
    rest: bool = True,
) -> SplitChanges:
    """Plan, key and type the change records of ``parsed`` per table (keys and types ``known``
    from the change logs are kept); everything that fails goes to the quarantine rows.

    ``typed``: the plans ``parsed`` was made with (``parse.with_plans``), whose rows it typed
    already; only the other changes are planned and typed here, each table once (kept in
    ``staging``). ``rest``: false when there are none (then nothing is planned)."""
    typed = typed or []
    changes = parsed.where(F.col("kind") == C.KIND_CHANGE)
    known = dict(known)
    if typed:
        changes = changes.where(F.col(TYPED).isNull())
        for p in typed:  # the rest of a typed table is typed as the table it joins
            types = known[p.qualified].types if p.qualified in known else {}
            known[p.qualified] = ChangelogFacts(
                p.key, {**types, **{c: s.type for c, s in p.specs.items()}}
            )
    plans = plan_tables(schema_groups(changes, source.infers_any), source, known) if rest else {}
    quarantine = [to_quarantine(parsed.where(F.col("kind") == C.KIND_ERROR))]
    tables: list[tuple[TablePlan, DataFrame]] = []

    def add(plan: TablePlan, records: DataFrame) -> None:
        # The rows with a reason are the table's rejects.
        bad = records.where(F.col("reason").isNotNull()).drop("key")
        quarantine.append(bad.withColumnRenamed("raw_key", "key").select(*QUARANTINE_COLUMNS))
        data = records.where(F.col("reason").isNull()).drop(
            "reason", "timestamp", "qualified_table", "raw_key", "value"
        )
        tables.append((plan, data))

    for i, plan in enumerate(typed):
        later = plans.pop(plan.qualified, None)  # the plan of its rows the parse did not type
        if later is not None and later.problem:
            quarantine.append(rejected_table(changes, later))
            later = None
        final = joined_plan(plan, later)
        fitted = parsed.where(F.col(TYPED) == i)
        records = typed_records(fitted, typed_parts(i), plan, final)
        if later is not None:
            records = records.unionByName(staging.keep(type_changes(changes, final)))
        add(final, records)
    for plan in plans.values():
        if plan.problem:
            # No key: nothing of it can be applied; its rows wait in quarantine.
            quarantine.append(rejected_table(changes, plan))
            continue
        # One pass types the table's changes (kept for both outputs).
        add(plan, staging.keep(type_changes(changes, plan)))
    union = functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), quarantine)
    return SplitChanges(tables, union)
