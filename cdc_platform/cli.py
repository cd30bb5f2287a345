"""``cdc-platform``: replay landing files into a warehouse and show its tables (no Dagster).

User errors (unknown option, missing input, unreadable warehouse, bad config) print one line on
stderr and exit with status 2; the summary of a replay is the last line on stdout.
"""

import argparse
import base64
import datetime as dt
import decimal
import json
import sys
from pathlib import Path
from typing import NoReturn

from cdc_platform import formats
from cdc_platform.catalog import CatalogError, SourceConfig
from cdc_platform.formats.column_specs import parse_type
from cdc_platform.ingest.landing import LandingError
from cdc_platform.lake import delta as lake

REPLAY_SOURCE = "replay"


class UserError(Exception):
    """Something the user can fix; printed as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in values:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UserError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[k.strip()] = v.strip()
    return out


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cdc-platform", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("replay", help="raw -> changelog -> current for every table in INPUTs")
    r.add_argument("inputs", nargs="+", metavar="INPUT", help="landing files or folders")
    r.add_argument("--warehouse", required=True, type=Path)
    r.add_argument("--format", default="auto", help=f"one of {', '.join(formats.format_names())}")
    r.add_argument("--primary-key", help="COL[,COL]: key of every table in the inputs")
    r.add_argument("--format-option", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--column-type", action="append", default=[], metavar="COL=TYPE")
    r.add_argument("--source", default=REPLAY_SOURCE, help="source name in the warehouse")
    r.add_argument("--date", help="ingest date for inputs outside dt=YYYY-MM-DD folders")
    s = sub.add_parser("show", help="print a table as JSON lines, sorted by primary key")
    s.add_argument("table", metavar="TABLE")
    s.add_argument("--warehouse", required=True, type=Path)
    s.add_argument("--layer", choices=["current", "changelog", "quarantine"], default="current")
    s.add_argument("--source", help="needed only when several sources have TABLE")
    d = sub.add_parser("demo", help="write sample CDC traffic into the catalog's landing folder")
    d.add_argument("--sources", type=Path, default=None, help="sources file (default sources.yaml)")
    d.add_argument("--batches", type=int, default=1, help="batches to write now")
    d.add_argument(
        "--every",
        type=float,
        default=0,
        help="then keep writing one batch every this many seconds (0: stop)",
    )
    m = sub.add_parser("models", help="compile, build or test the SQL models (dbt_like_models)")
    msub = m.add_subparsers(dest="models_command", required=True, parser_class=_Parser)
    for name, text in (
        ("compile", "print each model's compiled SQL (checked by Spark's parser)"),
        ("run", "build the models (all, or --select) into the warehouse, in dependency order"),
        ("test", "run the models' YAML tests; exit 1 if an error-severity test fails"),
    ):
        c = msub.add_parser(name, help=text)
        c.add_argument("--select", action="append", default=[], metavar="MODEL[,MODEL]")
        c.add_argument("--models", type=Path, help="models folder (default: beside sources.yaml)")
        c.add_argument("--sources", type=Path, help="sources file (default sources.yaml)")
        c.add_argument("--warehouse", type=Path, help="default: the catalog's warehouse")
        if name == "run":
            c.add_argument("--full-refresh", action="store_true", help="rebuild incremental models")
    return p


def _models(args: argparse.Namespace) -> int:
    from cdc_platform.catalog import default_catalog_path, load_catalog
    from cdc_platform.models import commands
    from cdc_platform.models.project import ModelError
    from cdc_platform.spark.session import get_spark

    catalog = load_catalog(args.sources or default_catalog_path())
    warehouse = (args.warehouse or catalog.warehouse_path).resolve()
    _check_warehouse(warehouse, must_exist=args.models_command != "compile")
    names = [n.strip() for item in args.select for n in item.split(",") if n.strip()]
    failed = False
    try:
        project = commands.open_project(catalog, warehouse, args.models)
        if args.models_command == "compile":
            for header, sql in commands.compile_models(get_spark(), project, names):
                print(f"{header}\n{sql.strip()}\n")
        elif args.models_command == "run":
            spark = get_spark()
            for summary in commands.run_models(spark, warehouse, project, names, args.full_refresh):
                print(json.dumps(summary, sort_keys=True), flush=True)
        else:
            for result in commands.run_model_tests(get_spark(), warehouse, project, names):
                print(json.dumps(result, sort_keys=True), flush=True)
                failed |= not result["passed"] and result["severity"] == "error"
    except ModelError as e:
        raise UserError(str(e)) from None
    return 1 if failed else 0


def _demo(args: argparse.Namespace) -> int:
    import time

    from cdc_platform.catalog import default_catalog_path, load_catalog
    from cdc_platform.demo import write_demo_traffic

    catalog = load_catalog(args.sources or default_catalog_path())
    landing_root = catalog.landing_path
    batch = len(list(landing_root.glob("shop/dt=*/*.kafka.jsonl")))
    for _ in range(args.batches):
        for path in write_demo_traffic(landing_root, batch):
            print(path)
        batch += 1
    while args.every > 0:
        time.sleep(args.every)
        for path in write_demo_traffic(landing_root, batch):
            print(path, flush=True)
        batch += 1
    return 0


def _input_files(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(f"input not found: {item}")
    if not files:
        raise UserError("no input files")
    return files


def _check_warehouse(path: Path, must_exist: bool) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"warehouse is not a directory: {path}")
    if must_exist and not path.is_dir():
        raise UserError(f"warehouse not found: {path}")


def _replay(args: argparse.Namespace) -> int:
    from cdc_platform import pipeline
    from cdc_platform.spark.session import get_spark

    files = _input_files(args.inputs)
    _check_warehouse(args.warehouse, must_exist=False)
    try:
        source = SourceConfig(
            name=args.source,
            format=args.format,
            format_options=_pairs(args.format_option, "--format-option"),
        )
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        raise UserError(str(e).splitlines()[-1].strip().removeprefix("Value error, ")) from None
    try:
        types = {c: parse_type(t) for c, t in _pairs(args.column_type, "--column-type").items()}
    except ValueError as e:
        raise UserError(str(e)) from None
    key = [c.strip() for c in args.primary_key.split(",")] if args.primary_key else None
    today = args.date or dt.datetime.now(dt.UTC).date().isoformat()
    summary, result = pipeline.replay(
        get_spark(),
        args.warehouse.resolve(),
        files,
        source,
        today,
        key_override=key,
        types_override=types,
    )
    for reason, n in sorted(result.quarantine_reasons.items()):
        print(f"quarantined {n}: {reason}", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    return 0


def _find_table(warehouse: Path, table: str, source: str | None) -> tuple[str, str]:
    from cdc_platform.spark.normalize import table_name

    names = {table, table_name(table)}
    found = sorted(
        {
            (p.parent.name, p.name)
            for p in (warehouse / lake.CHANGELOG).glob("*/*")
            if p.name in names
        }
    )
    if source:
        found = [f for f in found if f[0] == source]
    if not found:
        raise UserError(f"no table {table!r} in warehouse {warehouse}")
    if len(found) > 1:
        raise UserError(
            f"table {table!r} is in several sources; add --source "
            f"({', '.join(s for s, _ in found)})"
        )
    return found[0]


def _jsonable(value: object) -> object:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot print {type(value).__name__}")


def _show(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    from cdc_platform import pipeline
    from cdc_platform.spark.session import get_spark

    warehouse = args.warehouse.resolve()
    _check_warehouse(warehouse, must_exist=True)
    source, table = _find_table(warehouse, args.table, args.source)
    spark = get_spark()
    state = lake.state(lake.table_uri(warehouse, lake.CHANGELOG, source, table))
    key = state.get("key", [])
    if args.layer == "current":
        df = pipeline.current_rows(spark, warehouse, source, table)
        order = key
    elif args.layer == "changelog":
        df = lake.read(spark, lake.table_uri(warehouse, lake.CHANGELOG, source, table))
        order = [f"key.{k}" for k in key] + ["sequence"]
    else:
        df = lake.read(spark, lake.table_uri(warehouse, lake.QUARANTINE, source))
        if df is not None:
            df = df.where(
                F.col("qualified_table").isNull()
                | (F.col("qualified_table") == state.get("qualified"))
            )
        order = ["ingest_date", "file", "line", "partition", "offset"]
    if df is None:
        return 0
    for row in df.orderBy(*order).toArrow().to_pylist():
        value = row.get("value")
        if isinstance(value, bytes):
            try:
                row["value"] = value.decode()
            except UnicodeDecodeError:
                row["value_b64"] = base64.b64encode(row.pop("value")).decode()
        print(json.dumps(row, default=_jsonable, ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        command = {"replay": _replay, "show": _show, "demo": _demo, "models": _models}[args.command]
        return command(args)
    except (UserError, CatalogError, LandingError) as e:
        print(f"cdc-platform: error: {e}", file=sys.stderr)
        return 2
