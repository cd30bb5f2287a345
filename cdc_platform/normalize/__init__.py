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

import functools
from dataclasses import dataclass

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.normalize.columns import control_records, ddl_records
from cdc_platform.normalize.parse import (
    TYPED,
    parse_messages,
    predict_plans,
    typed_parts,
    with_plans,
)
from cdc_platform.normalize.plan import Known, TablePlan, routed_name, table_name
from cdc_platform.normalize.split import split_parsed
from cdc_platform.timings import phase


class Mispredicted(Exception):
    """A batch written straight from the parse as one table's changes holds more than that."""


@dataclass
class Normalized:
    """A batch normalized: frames to write, and the messages counted by kind.

    Staged: ``parsed`` is kept in staging and the other frames read it; ``kinds`` is known.
    Direct (``counts`` set): the batch's first messages were all changes of one table, so
    nothing is staged and its one table's change records are computed from the raw messages as
    they are written. ``confirm``, called between that write and its commit, learns ``kinds``
    from the write, or raises ``Mispredicted`` when the batch holds more (the caller discards
    the files and normalizes the batch again, staged)."""

    parsed: DataFrame
    kinds: dict[str, int] | None  # messages by kind (change, control, ddl, error)
    tables: list[tuple[TablePlan, DataFrame]]  # each table's change records
    quarantine: DataFrame
    quarantine_empty: bool  # known to have no rows (then nothing queries it)
    counts: Observation | None = None  # direct: observed by the change log's write

    @property
    def messages(self) -> int:
        return sum((self.kinds or {}).values())

    def confirm(self) -> None:
        assert self.counts is not None
        got = self.counts.get
        others = got["untyped"] + got["rejected"]
        others += sum(got[kind] for kind in C.KINDS if kind != C.KIND_CHANGE)
        if others:
            raise Mispredicted(f"{others} of the batch's messages are not changes of its table")
        self.kinds = {C.KIND_CHANGE: int(got[C.KIND_CHANGE])} if got[C.KIND_CHANGE] else {}

    def ddl(self) -> DataFrame:
        return ddl_records(self.parsed)

    def control(self) -> DataFrame:
        return control_records(self.parsed)


def normalize(
    raw: DataFrame,
    source: SourceConfig,
    known: Known,
    staging: lake.Staging,
    direct: bool = False,
) -> Normalized:
    """Parse, plan, type and split ``raw`` (``known``: the change logs' keys and types,
    ``lake.changelog_facts``). Frames read more than once are kept in ``staging``, unless
    ``direct`` and the batch's first messages are all changes of one table (``Normalized``)."""
    with phase("normalize.parse"):  # built once: a parse is thousands of column calls
        messages = parse_messages(raw, source)
    with phase("normalize.predict_plans"):
        prediction = predict_plans(messages, source, known)
    typed = prediction.plans
    # Messages by kind, changes the parse did not type (planned and typed afterwards) and typed
    # changes that cannot be applied: observed by the job that computes the parse.
    untyped = F.col(TYPED).isNull() if typed else F.lit(True)
    rejected = functools.reduce(
        lambda a, b: a | b,
        [F.col(typed_parts(i))["reason"].isNotNull() for i in range(len(typed))],
        F.lit(False),
    )
    counts = Observation()
    observed = with_plans(messages, typed).observe(
        counts,
        *[F.count_if(F.col("kind") == kind).alias(kind) for kind in C.KINDS],
        F.count_if((F.col("kind") == C.KIND_CHANGE) & untyped).alias("untyped"),
        F.count_if(rejected).alias("rejected"),
    )
    if direct and prediction.one_table:
        split = split_parsed(observed, source, staging, known, typed, rest=False)
        return Normalized(observed, None, split.tables, split.quarantine, True, counts)
    with phase("normalize.parse"):
        parsed = staging.keep(observed)
        got = counts.get
    kinds = {kind: int(got[kind]) for kind in C.KINDS if got[kind]}
    rest = bool(got["untyped"])
    with phase("normalize.split"):
        split = split_parsed(parsed, source, staging, known, typed, rest)
    empty = not (kinds.get(C.KIND_ERROR) or got["rejected"] or rest)
    return Normalized(parsed, kinds, split.tables, split.quarantine, empty)


__all__ = [
    "Known",
    "Mispredicted",
    "Normalized",
    "TablePlan",
    "normalize",
    "routed_name",
    "table_name",
]
