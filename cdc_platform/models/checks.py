"""The tests of a model's YAML (unique, not_null, accepted_values, relationships) as Spark SQL.

Each test is a query for the offending values with their row counts; it passes when that query
is empty. The counts and a few values are the evidence a Dagster asset check shows.
"""

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from cdc_platform.models.build import model_frame, relation_frame
from cdc_platform.models.project import ModelTest, Project

SAMPLE = 5


@dataclass
class Outcome:
    name: str
    passed: bool
    failing_rows: int
    failing_values: int
    severity: str
    sql: str
    sample: list[Any] = field(default_factory=list)


def _column(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def failing_values_sql(project: Project, model_name: str, test: ModelTest) -> str:
    """A query returning ``value`` and ``n`` (rows) for each offending value of the column."""
    table = project.models[model_name].relation.name()
    col = _column(test.column)
    if test.kind == "not_null":
        return f"SELECT NULL AS value, count(*) AS n FROM {table} WHERE {col} IS NULL HAVING n > 0"
    if test.kind == "unique":
        return (
            f"SELECT {col} AS value, count(*) AS n FROM {table} WHERE {col} IS NOT NULL "
            f"GROUP BY {col} HAVING count(*) > 1"
        )
    if test.kind == "accepted_values":
        values = ", ".join(_literal(v) for v in test.values)
        return (
            f"SELECT {col} AS value, count(*) AS n FROM {table} "
            f"WHERE {col} IS NOT NULL AND {col} NOT IN ({values}) GROUP BY {col}"
        )
    assert test.to is not None and test.field is not None  # relationships
    return (
        f"SELECT c.{col} AS value, count(*) AS n FROM {table} c LEFT ANTI JOIN {test.to.name()} p "
        f"ON c.{col} = p.{_column(test.field)} WHERE c.{col} IS NOT NULL GROUP BY c.{col}"
    )


def run_tests(
    spark: SparkSession,
    warehouse: str,
    project: Project,
    model_name: str,
    only: set[str] | None = None,
) -> list[Outcome]:
    """Run the model's tests (those named in ``only``, else all) on its rows as they are now."""
    model = project.models[model_name]
    tests = [t for t in model.tests if only is None or t.name in only]
    if not tests:
        return []
    model_frame(spark, warehouse, project, model_name).createOrReplaceTempView(
        model.relation.view()
    )
    for target in {t.to for t in tests if t.to is not None}:
        relation_frame(spark, warehouse, project, target).createOrReplaceTempView(target.view())
    outcomes = []
    for test in tests:
        sql = failing_values_sql(project, model_name, test)
        # One job: the first offending values, with the totals over all of them. (A window of
        # all rows; by a literal, as a Spark Connect client warns on each window without one.)
        everything = Window.partitionBy(F.lit(0))
        top = (
            spark.sql(sql)
            .select(
                "value",
                "n",
                F.count(F.lit(1)).over(everything).alias("values"),
                F.sum("n").over(everything).alias("rows"),
            )
            .orderBy(F.desc("n"), "value")
            .limit(SAMPLE)
            .collect()
        )
        values, rows = (top[0]["values"], top[0]["rows"]) if top else (0, 0)
        sample = [r["value"] for r in top]
        outcomes.append(
            Outcome(
                test.name,
                passed=values == 0,
                failing_rows=int(rows or 0),
                failing_values=int(values),
                severity=test.severity,
                sql=sql,
                sample=sample,
            )
        )
    return outcomes
