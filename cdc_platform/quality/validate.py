"""Run a suite on a validation frame with Great Expectations 1.x; plain dataclasses out.

One ephemeral GX context per process (nothing of Great Expectations is written next to the
warehouse), with a Spark and a pandas datasource. Which one runs a frame is measured, not
guessed: GX asks the Spark datasource one query per metric (about 0.2 s each, 2-6 s for the
change-log suite even on ten rows), the pandas one answers in milliseconds, so a frame of at most
``PANDAS_MAX_ROWS`` rows is collected (Arrow) and validated with pandas, a bigger one stays in
Spark (cached while the suite runs). A frame may be built in any thread; GX validates one at a
time (``_GX``): the context and its datasources are the process's.
"""

import datetime as dt
import math
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame

from cdc_platform.quality.suites import Suite
from cdc_platform.spark.session import PERSIST_LEVEL
from cdc_platform.timings import phase

# A Kafka micro-batch's default bound (max_records): micro-batches that large still validate
# on pandas. Through GX's Spark datasource a frame of 250,000-400,000 rows cost about 8 s more
# (BENCHMARKS.md, a backlog of 1M records). A bigger frame (a backfill of a busy day) pays for
# collecting this many rows before it goes to Spark.
PANDAS_MAX_ROWS = 1_000_000
SAMPLE_ROWS = 10
_GX = threading.Lock()
_ARROW_TEXT = {pa.string(): pd.StringDtype("pyarrow"), pa.large_string(): pd.StringDtype("pyarrow")}


@dataclass
class RuleResult:
    """The outcome of one rule (all its expectations) on one frame."""

    rule: str
    severity: str
    description: str
    success: bool
    unexpected: int  # rows failing any expectation of the rule (summed over them)
    checked: int  # rows the rule looked at
    sample: list[dict[str, Any]] = field(default_factory=list)  # failing rows: keys, coordinates
    error: str | None = None  # an expectation raised instead of answering


@dataclass
class SuiteRun:
    """One validation: a specialised suite on one batch."""

    suite: str  # <layer>.<source>.<table>, the name in the Data Docs
    batch: str  # what was validated: ingest dates, "current", ...
    rules: list[RuleResult]
    result: Any  # GX's ExpectationSuiteValidationResult (Data Docs); None: empty frame, skipped
    seconds: float
    engine: str  # "pandas" or "spark"
    rows: int | None  # rows of the frame (None: not counted, a Spark frame)
    expectations: dict[str, Any]  # the specialised suite as JSON (stored with the Data Docs)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.rules)

    def rule(self, name: str) -> RuleResult:
        return next(r for r in self.rules if r.rule == name)


@cache
def _context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    from great_expectations.execution_engine import pandas_execution_engine

    # GX fingerprints every pandas batch, an MD5 of all its rows, for the batch's markers,
    # which nothing reads: a third of its time on a frame of 100,000 rows. None is above 0.
    pandas_execution_engine.HASH_THRESHOLD = 0
    context = gx.get_context(mode="ephemeral")
    context.enable_analytics(False)  # no usage events leave the machine
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


@cache
def _datasource(engine: str) -> Any:
    """The engine's datasource, added on first use: adding the Spark one gets a Spark session
    (seconds), which a run validating only small frames never needs."""
    sources = _context().data_sources
    add = sources.add_spark if engine == "spark" else sources.add_pandas
    return add(engine).add_dataframe_asset("frame").add_batch_definition_whole_dataframe("whole")


def gx_suite(suite: Suite, name: str, key: list[str]) -> Any:
    """The Great Expectations suite of ``suite`` specialised for a table's key, named ``name``."""
    import great_expectations as gx

    return gx.ExpectationSuite(
        name=name,
        expectations=suite.specialise(key),
        meta={"rules": {r.name: r.description for r in suite.rules.values()}},
    )


def _batch(engine: str, data: Any) -> Any:
    """``data`` as a GX batch of the engine's datasource."""
    return _datasource(engine).get_batch(batch_parameters={"dataframe": data})


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars
    if value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    text = str(value)
    return None if text in ("NaT", "nan", "None") else text


def _exception(info: dict | None) -> str | None:
    """The message of an expectation that raised (GX nests it under metric ids)."""
    infos = [info or {}, *[v for v in (info or {}).values() if isinstance(v, dict)]]
    raised = [i for i in infos if i.get("raised_exception")]
    return str(raised[0].get("exception_message"))[:500] if raised else None


def _for_engine(value: Any, engine: str) -> Any:
    """pandas compares timestamps with time zone (Arrow gives UTC), Spark with naive UTC."""
    if isinstance(value, dt.datetime):
        utc = value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return utc if engine == "pandas" else utc.replace(tzinfo=None)
    return value


def validate(
    frame: DataFrame | pd.DataFrame,
    suite: Suite,
    name: str,
    key: list[str],
    severities: dict[str, str],
    *,
    batch: str,
    index_columns: list[str],
    parameters: dict[str, Any] | None = None,
    engine: str = "auto",
) -> SuiteRun:
    """Validate ``frame`` with ``suite`` (specialised for ``key``) and group results by rule.

    ``index_columns`` identify a failing row in the samples (keys, sequence, raw coordinates)."""
    started = time.monotonic()
    rows: int | None = None
    data: Any = frame
    names = None  # the frame's columns, from the Arrow batch when there is one
    if isinstance(frame, pd.DataFrame):
        engine, rows = "pandas", len(frame)
    elif engine in ("auto", "pandas"):
        limit = PANDAS_MAX_ROWS + 1 if engine == "auto" else None
        with phase("checks/frame"):
            arrow = (frame.limit(limit) if limit else frame).toArrow()
        names = arrow.column_names  # frame.columns would be a round trip on Spark Connect
        if limit is None or arrow.num_rows < limit:
            # object columns for integers with nulls: samples keep 7, not 7.0. Text stays in
            # Arrow (pandas' "string[pyarrow]"): GX filters the whole frame for each metric
            # with a row condition, and Arrow takes rows faster than Python strings (a third
            # less GX time on a change log of 100,000 rows).
            data = arrow.to_pandas(integer_object_nulls=True, types_mapper=_ARROW_TEXT.get)
            engine, rows = "pandas", arrow.num_rows
        else:
            engine = "spark"
    if rows == 0:  # nothing written for this table in the run: nothing can fail, skip GX
        rules = [
            RuleResult(r.name, severities.get(r.name, r.severity), r.description, True, 0, 0)
            for r in suite.rules.values()
        ]
        return SuiteRun(name, batch, rules, None, time.monotonic() - started, engine, 0, {})
    names = frame.columns if names is None else names
    cached = engine == "spark"
    if cached:
        data = frame.persist(PERSIST_LEVEL)
    try:
        from great_expectations.core.run_identifier import RunIdentifier

        # Batch.validate, not a ValidationDefinition: that one would add the suite and itself
        # to the context's stores, check both are fresh, and keep each result in memory for
        # the life of the process. The Data Docs store the results (``docs.publish``).
        with _GX, phase(f"checks/gx_{engine}"):
            expectations = gx_suite(suite, name, key)
            result = _batch(engine, data).validate(
                expectations,
                expectation_parameters={
                    k: _for_engine(v, engine) for k, v in (parameters or {}).items()
                },
                result_format={
                    "result_format": "SUMMARY",
                    "partial_unexpected_count": SAMPLE_ROWS,
                    "unexpected_index_column_names": [c for c in index_columns if c in names],
                },
            )
        run_id = RunIdentifier(run_name=batch)  # the run's name in the Data Docs
        result.meta.update(run_id=run_id, validation_time=run_id.run_time)
    finally:
        if cached:
            data.unpersist()
    by_rule: dict[str, RuleResult] = {
        r.name: RuleResult(r.name, severities.get(r.name, r.severity), r.description, True, 0, 0)
        for r in suite.rules.values()
    }
    for r in result.results:
        out = by_rule[r.expectation_config.meta["rule"]]
        if error := _exception(r.exception_info):
            out.success = False
            out.error = error
            continue
        res = r.result or {}
        out.success = out.success and bool(r.success)
        out.unexpected += int(res.get("unexpected_count") or 0)
        out.checked = max(out.checked, int(res.get("element_count") or 0))
        if not r.success:
            if "partial_unexpected_index_list" in res:
                sample = res["partial_unexpected_index_list"]
            elif "observed_value" in res:
                sample = [{"observed_value": res["observed_value"]}]
            else:
                sample = [{"value": v} for v in res.get("partial_unexpected_list") or []]
            room = SAMPLE_ROWS - len(out.sample)
            out.sample += [_jsonable(s) for s in sample[:room]]
    spec = expectations.to_json_dict()
    spec.pop("id", None)
    for e in spec["expectations"]:
        e.pop("id", None)
    return SuiteRun(
        name, batch, list(by_rule.values()), result, time.monotonic() - started, engine, rows, spec
    )


def describe(run: SuiteRun) -> str:
    """One line per rule, for logs and the CLI."""
    lines = []
    for r in run.rules:
        state = "ok" if r.success else ("error" if r.error else f"{r.unexpected} unexpected")
        lines.append(f"{run.suite} [{run.batch}] {r.rule} ({r.severity}): {state}")
    return "\n".join(lines)
