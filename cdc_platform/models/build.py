"""Build a model: bind its inputs to temp views, run its SQL with Spark, write the Delta table.

- ``view``: nothing is written; its SQL is computed whenever it is read (by a model or a test).
- ``table``: the result replaces the table (``partition_by`` partitions it).
- ``incremental``: the first build (and ``full_refresh``) writes the whole result; later builds
  read only the input rows changed since the last build and MERGE the result on ``unique_key``.
  "Changed" is exact: the rows of the input's Delta files added since the version the last build
  read (a late change with an older sequence is caught too; a rewritten, unchanged row is merged
  again, which changes nothing). When that version is gone (vacuumed), rows whose sequence is
  newer than the last build's high-water mark. Both marks are in the model table's commit state.
"""

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_platform import lake
from cdc_platform.formats import canonical as C
from cdc_platform.models.compile import check_sql, render, run_sql
from cdc_platform.models.graph import build_order
from cdc_platform.models.project import Model, ModelError, Project, Relation

# The column that orders a layer's rows: a current table's row sequence, a change record's.
_SEQUENCE = {lake.CURRENT: C.SEQUENCE_COL, lake.CHANGELOG: "sequence"}


@dataclass
class BuildResult:
    name: str
    materialized: str
    rows: int  # rows of the model after the build (a view: rows it computes now)
    schema: pa.Schema | None  # the table's (set once built)
    uri: str | None  # None for a view
    version: int | None = None
    merged: bool = False  # an incremental build merged changed rows into the existing table
    input_rows: dict[str, int] = field(default_factory=dict)  # changed rows read, per input
    metrics: dict[str, Any] = field(default_factory=dict)


def model_uri(warehouse: str, name: str) -> str:
    return lake.TableRef(lake.MODELS, name).uri(warehouse)


def _lake_uri(warehouse: str, relation: Relation) -> str:
    return lake.TableRef(relation.layer, relation.source or "", relation.table).uri(warehouse)


def _exposed(relation: Relation, df: DataFrame) -> DataFrame:
    """What a model sees of a lake table: a current table's live rows, without bookkeeping."""
    if relation.layer == lake.CURRENT:
        return df.where(~F.col(C.DELETED_COL)).drop(*C.CURRENT_META)
    return df


def relation_frame(
    spark: SparkSession, warehouse: str, project: Project, relation: Relation
) -> DataFrame:
    """All rows of a model or lake table, as a model sees them now."""
    if relation.is_model:
        return model_frame(spark, warehouse, project, relation.table)
    df = lake.read(spark, _lake_uri(warehouse, relation))
    if df is None:
        raise ModelError(f"{relation} does not exist yet (nothing has been written to it)")
    return _exposed(relation, df)


def model_frame(spark: SparkSession, warehouse: str, project: Project, name: str) -> DataFrame:
    """A model's rows: a view's SQL computed now, or the table as last built."""
    model = project.models[name]
    if model.materialized == "view":
        sql = render(project, model)
        _register(spark, warehouse, project, model, None)
        return run_sql(spark, model, sql)
    df = lake.read(spark, model_uri(warehouse, name))
    if df is None:
        raise ModelError(f"model {name} has not been built yet: build it first")
    return df


def _changed_rows(
    spark: SparkSession, uri: str, relation: Relation, version: int, mark: dict[str, Any] | None
) -> DataFrame:
    """The rows of ``uri`` at ``version`` that changed since ``mark`` (all when None)."""
    now = lake.files(uri, version)
    if mark is None:
        return lake.read(spark, uri, only_files=now)
    try:
        before = set(lake.files(uri, mark["version"]))
    except Exception:  # that version is gone (vacuumed): fall back to the sequence mark
        df = lake.read(spark, uri, only_files=now)
        if mark.get("sequence") is None:
            return df
        return df.where(F.col(_SEQUENCE[relation.layer]) > mark["sequence"])
    return lake.read(spark, uri, only_files=[f for f in now if f not in before])


def _register(
    spark: SparkSession,
    warehouse: str,
    project: Project,
    model: Model,
    marks: dict[str, Any] | None,
) -> dict[str, dict[str, Any]]:
    """Bind every view ``model``'s SQL names. ``marks``: for an incremental model (None for any
    other), the input marks of its last build ({} when it reads everything). Returns the new
    marks and counts the changed rows read."""
    new_marks: dict[str, dict[str, Any]] = {}
    for ref in {(r.relation, r.all_rows): r for r in model.refs}.values():
        relation = ref.relation
        if relation.is_model or marks is None or ref.all_rows:
            df = relation_frame(spark, warehouse, project, relation)
            df.createOrReplaceTempView(relation.view())
            continue
        uri = _lake_uri(warehouse, relation)
        version = lake.version(uri)
        if version is None:
            raise ModelError(f"{relation} does not exist yet (nothing has been written to it)")
        mark = marks.get(str(relation))
        changed = _changed_rows(spark, uri, relation, version, mark)
        column = _SEQUENCE[relation.layer]
        top, count = changed.agg(F.max(column), F.count(F.lit(1))).first()
        previous = (mark or {}).get("sequence")
        new_marks[str(relation)] = {
            "version": version,
            "sequence": max(filter(None, [top, previous]), default=None),
            "changed_rows": int(count),
        }
        _exposed(relation, changed).createOrReplaceTempView(relation.view(changed_only=True))
        if mark is None:  # a first build: everything changed, and its SQL names the full view
            _exposed(relation, changed).createOrReplaceTempView(relation.view())
    return new_marks


def build_model(
    spark: SparkSession, warehouse: str, project: Project, name: str, full_refresh: bool = False
) -> BuildResult:
    """Build one model from its inputs as they are now (the models it reads must be built)."""
    build_order(project)  # fails on a cycle
    model = project.models[name]
    uri = model_uri(warehouse, name)
    state = lake.TableState() if full_refresh else lake.state(uri)
    merge = model.materialized == "incremental" and lake.exists(uri) and state.inputs is not None
    sql = render(project, model, incremental=merge)
    check_sql(spark, model, sql)
    marks = state.inputs if merge else ({} if model.materialized == "incremental" else None)
    new_marks = _register(spark, warehouse, project, model, marks)
    df = run_sql(spark, model, sql)
    if model.materialized == "view":
        schema = df.limit(0).toArrow().schema
        return BuildResult(name, model.materialized, df.count(), schema, None)
    missing = [c for c in [*model.unique_key, *model.partition_by] if c not in df.columns]
    if missing:
        raise ModelError(f"{model.path}: the query has no column {', '.join(missing)} (config)")
    new_state = lake.TableState(model=name, code_version=model.code_version, inputs=new_marks)
    result = BuildResult(name, model.materialized, 0, None, uri)
    result.input_rows = {k: v["changed_rows"] for k, v in new_marks.items()}
    if merge:
        key = model.unique_key
        written, replaced = lake.replace_keys(
            spark, uri, df, df.select(*key), key, new_state, compact=True
        )
        result.metrics = {
            "num_target_rows_inserted": written - replaced,
            "num_target_rows_updated": replaced,
        }
        result.merged = True
    else:
        lake.replace(df, uri, new_state, partition_by=model.partition_by or None)
    result.rows = lake.row_count(uri)
    result.version = lake.version(uri)
    result.schema = lake.arrow_schema(uri)
    return result
