"""Raw messages -> canonical, typed change records per table, plus the quarantine, DDL and control
records, with Spark functions only. One entry: ``normalize(raw, source, known, staging)``.

- ``parse``: the format's parse, the total order (``sequence``), typing in the same pass;
- ``plan``: each table's name, key and types, in plain Python over the batch's schema groups;
- ``typed``: a table's changes typed by its plan, and why a change cannot be applied;
- ``split``: the typed records per table, and everything that fails as quarantine rows;
- ``columns``: the columns of the quarantine, DDL and control outputs.

Whatever cannot be parsed, keyed or typed becomes a quarantine row with its reason, raw bytes
and coordinates. Writing the outputs, and doing so exactly once, is the step's job
(``steps.changelog``)."""

from dataclasses import dataclass

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.normalize.columns import control_records, ddl_records
from cdc_platform.normalize.parse import TYPED, parse_messages, predict_plans, with_plans
from cdc_platform.normalize.plan import Known, TablePlan, routed_name, table_name
from cdc_platform.normalize.split import split_parsed
from cdc_platform.timings import phase


@dataclass
class Normalized:
    """A batch normalized: frames to write (``parsed`` is kept in staging, the others read it)
    and the messages counted by kind."""

    parsed: DataFrame
    kinds: dict[str, int]  # messages by kind (change, control, ddl, error)
    tables: list[tuple[TablePlan, DataFrame]]  # each table's change records
    quarantine: DataFrame

    @property
    def messages(self) -> int:
        return sum(self.kinds.values())

    def ddl(self) -> DataFrame:
        return ddl_records(self.parsed)

    def control(self) -> DataFrame:
        return control_records(self.parsed)


def normalize(
    raw: DataFrame, source: SourceConfig, known: Known, staging: lake.Staging
) -> Normalized:
    """Parse, plan, type and split ``raw`` (``known``: the change logs' keys and types,
    ``lake.changelog_facts``). Frames read more than once are kept in ``staging``."""
    with phase("normalize.parse"):  # built once: a parse is thousands of column calls
        messages = parse_messages(raw, source)
    with phase("normalize.predict_plans"):
        typed = predict_plans(messages, source, known)
    # Messages by kind, and changes the parse did not type (planned and typed afterwards):
    # observed while the parsed messages are kept, with no job of their own.
    untyped = F.col(TYPED).isNull() if typed else F.lit(True)
    counts = Observation()
    with phase("normalize.parse"):
        parsed = staging.keep(
            with_plans(messages, typed).observe(
                counts,
                *[F.count_if(F.col("kind") == kind).alias(kind) for kind in C.KINDS],
                F.count_if((F.col("kind") == C.KIND_CHANGE) & untyped).alias("untyped"),
            )
        )
        observed = counts.get
    kinds = {kind: int(observed[kind]) for kind in C.KINDS if observed[kind]}
    rest = bool(observed["untyped"])
    with phase("normalize.split"):
        split = split_parsed(parsed, source, staging, known, typed, rest)
    return Normalized(parsed, kinds, split.tables, split.quarantine)


__all__ = ["Known", "Normalized", "TablePlan", "normalize", "routed_name", "table_name"]
