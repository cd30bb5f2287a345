"""Render a model's Jinja into Spark SQL, and check the SQL with Spark's own parser.

``ref``/``source`` render as temp-view names (``current__shop__orders``, ``models__x``), which
``build.register`` binds to the tables' rows before the SQL runs; ``config`` renders as nothing.
"""

import re
import traceback

import jinja2
from pyspark.errors import AnalysisException, ParseException
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame, SparkSession

from cdc_platform.models.project import Model, ModelError, Project, display_path, resolve_ref

# Spark's position of an error: "(line 2, pos 8)" (parser), "; line 2 pos 8" (analyzer).
_LINE = re.compile(r";?\s*\(?line (\d+),? pos (\d+)\)?;?")
# A model is a query: Spark would run a command (DROP, INSERT, SET ...) as soon as it is parsed.
_QUERY = re.compile(r"\s*\(*\s*(select|with|from|values|table)\b", re.IGNORECASE)
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
# The Spark Connect client's logger.
_CONNECT_LOGGER = "pyspark.sql.connect.logging"


def render(project: Project, model: Model, incremental: bool = False) -> str:
    """The model's SQL. ``incremental``: the build merges into an existing table, so
    ``is_incremental()`` is true and inputs without ``all_rows=True`` name their changed rows."""

    def ref(name: str, all_rows: bool = False) -> str:
        relation = resolve_ref(project, model.path, 0, name)
        return relation.name(changed_only=incremental and not all_rows and not relation.is_model)

    def source(src: str, table: str, layer: str = "current", all_rows: bool = False) -> str:
        return next(
            r.relation.name(changed_only=incremental and not all_rows)
            for r in model.refs
            if (r.relation.layer, r.relation.source, r.relation.table) == (layer, src, table)
        )

    env = project_environment(model)
    context = {
        "ref": ref,
        "source": source,
        "config": lambda **_: "",
        "is_incremental": lambda: incremental,
        "this": model.relation.name(),
    }
    try:
        return env.get_template(model.path.name).render(context)
    except jinja2.TemplateError as e:
        raise ModelError(f"{_where(model, e)}: {e}") from None


def project_environment(model: Model) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(model.path.parent),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return env


def _where(model: Model, error: Exception) -> str:
    line = getattr(error, "lineno", None)
    # Jinja rewrites tracebacks so that template frames carry the file and line.
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == str(model.path):
            line = frame.lineno
    return f"{display_path(model.path)}:{line}" if line else display_path(model.path)


def check_sql(spark: SparkSession, model: Model, sql: str) -> None:
    """Parse ``sql`` with Spark's parser (nothing runs); ModelError with the model file's line
    if it does not parse, or if it is not a query."""
    try:
        _parse(spark, sql)
    except ParseException as e:
        message = str(e).strip().splitlines()[0]
        m = _LINE.search(message)
        line = template_line(model, sql, int(m[1])) if m else None
        message = _LINE.sub("", message).strip()
        raise ModelError(
            f"{display_path(model.path)}:{line or '?'}: SQL does not parse: {message}"
        ) from None
    if not _QUERY.match(_COMMENTS.sub(" ", sql)):
        raise ModelError(
            f"{display_path(model.path)}: a model is one query (SELECT, WITH, ...), not a command"
        )


def _parse(spark: SparkSession, sql: str) -> None:
    """Spark's parser on ``sql`` (ParseException if it does not parse). A local session parses
    without running anything; a Spark Connect session has no JVM handle here, so the server
    analyses the query, and an analysis error (names bound only at build time) means it parsed."""
    jvm = getattr(spark, "_jsparkSession", None)
    if jvm is not None:
        jvm.sessionState().sqlParser().parsePlan(sql)  # noqa: SLF001 - parse only
        return
    # pyspark logs every SQL error at ERROR with its stack, caught or not: this one is expected.
    # (The Connect client's logger is off by default, but a host's logging setup, such as
    # Dagster's, may turn it back on.)
    loggers = [PySparkLogger.getLogger(n) for n in ("SQLQueryContextLogger", _CONNECT_LOGGER)]
    were = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        spark.sql(sql)
    except ParseException:
        raise
    except AnalysisException:
        pass
    finally:
        for logger, was in zip(loggers, were, strict=True):
            logger.disabled = was


def template_line(model: Model, sql: str, line: int) -> int:
    """The model file's line for line ``line`` of its compiled SQL. Rendering keeps lines
    unless a Jinja block drops some; then compiled lines are matched, in order, to file lines
    read as patterns (an expression matches any text, a tag none)."""
    compiled, source = sql.splitlines(), model.template.splitlines()
    if line > len(compiled):  # "end of input": the file's last line
        return max(len(source), 1)
    if len(compiled) == len(source) or line < 1:
        return line
    patterns = [re.compile(_line_pattern(s)) for s in source]
    j = 0
    for i, text in enumerate(compiled[:line]):
        while j < len(patterns) and not patterns[j].fullmatch(text):
            j += 1
        if j == len(patterns):
            return line
        if i == line - 1:
            return j + 1
        j += 1
    return line


def _line_pattern(text: str) -> str:
    parts = re.split(r"(\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\})", text)
    return "".join(
        ".*" if p.startswith("{{") else "" if p[:2] in ("{%", "{#") else re.escape(p) for p in parts
    )


def run_sql(spark: SparkSession, model: Model, sql: str) -> DataFrame:
    """The model's query over the bound views; ModelError when Spark cannot resolve it (an
    unknown column or function), with the model file's line when Spark gives one."""
    try:
        return spark.sql(sql)
    except AnalysisException as e:
        message = str(e).strip().splitlines()[0]
        m = _LINE.search(message)
        where = (
            f"{display_path(model.path)}:{template_line(model, sql, int(m[1]))}"
            if m
            else display_path(model.path)
        )
        raise ModelError(f"{where}: {_LINE.sub('', message).strip()}") from None
