"""cdc-platform: the pipeline and its tools without Dagster.

commands:
  replay          landing files -> raw -> change log -> current; a JSON summary as last line
  show            print a table of a warehouse as JSON lines, sorted by primary key
  demo            write sample CDC traffic: landing files, and records for the embedded broker
  broker          run the embedded Kafka-protocol broker (Tansu, in memory) until Ctrl-C
  spark-server    run a local Spark Connect server that runs can share (warm Spark)
  up              the demo stack (`make demo`): broker, reports, Spark server, traffic, Dagster
  reset-offsets   make a Kafka source's next run read from the earliest or latest offsets
  models          compile, run or test the SQL models (dbt_like_models)
  quality-report  validate every table and rebuild the Data Docs site; exit 1 on an ERROR rule
  redrive         re-process quarantined messages with the current configuration

Commands that run Spark take their settings from the sources file's `spark` block (--sources,
else CDC_SOURCES or ./sources.yaml if present), then CDC_SPARK_CONF / CDC_SPARK_MASTER /
CDC_SPARK_REMOTE, then any number of --spark-conf KEY=VALUE (spark.master or spark.remote choose
where Spark runs).

User errors (unknown option, missing input, unreadable warehouse, bad config) print one line on
stderr and exit with status 2.
"""

import argparse
import base64
import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError
from pyspark.sql import SparkSession

from cdc_platform import formats, lake
from cdc_platform.catalog import (
    Catalog,
    CatalogError,
    SourceConfig,
    SparkConfig,
    catalog_if_present,
    parse_pairs,
    spark_settings,
)
from cdc_platform.formats.column_specs import parse_type
from cdc_platform.ingest.landing import LandingError
from cdc_platform.lake import storage
from cdc_platform.processes import stop_group

REPLAY_SOURCE = "replay"
DEMO_BROKER_PORT = 19092  # the demo catalog's crm source reads from 127.0.0.1:19092


class UserError(Exception):
    """Something the user can fix; printed as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(message)


def _spark_options(p: argparse.ArgumentParser, sources: bool = False) -> None:
    """The options of a command that runs Spark: --spark-conf, and --sources when it has none."""
    if sources:
        p.add_argument(
            "--sources",
            type=Path,
            help="sources file for its spark settings (default: CDC_SOURCES or ./sources.yaml if "
            "present; none: local)",
        )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting over the sources file's and CDC_SPARK_*'s (repeatable); "
        "spark.master=URL or spark.remote=sc://HOST:PORT choose where Spark runs",
    )


def _parser() -> argparse.ArgumentParser:
    # The module docstring lists the commands; each command's --help shows its description.
    raw = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="cdc-platform", description=__doc__, formatter_class=raw)
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
        metavar="COMMAND",
        help="one of the commands above",
    )
    r = sub.add_parser(
        "replay", description="raw -> changelog -> current for every table in INPUTs"
    )
    r.add_argument("inputs", nargs="+", metavar="INPUT", help="landing files or folders")
    r.add_argument("--warehouse", required=True, type=_location)
    r.add_argument("--format", default="auto", help=f"one of {', '.join(formats.format_names())}")
    r.add_argument("--primary-key", help="COL[,COL]: key of every table in the inputs")
    r.add_argument("--format-option", action="append", default=[], metavar="KEY=VALUE")
    r.add_argument("--column-type", action="append", default=[], metavar="COL=TYPE")
    r.add_argument("--source", default=REPLAY_SOURCE, help="source name in the warehouse")
    r.add_argument("--date", help="ingest date for inputs outside dt=YYYY-MM-DD folders")
    _spark_options(r, sources=True)
    s = sub.add_parser("show", description="print a table as JSON lines, sorted by primary key")
    s.add_argument("table", metavar="TABLE")
    s.add_argument("--warehouse", required=True, type=_location)
    s.add_argument("--layer", choices=["current", "changelog", "quarantine"], default="current")
    s.add_argument("--source", help="needed only when several sources have TABLE")
    _spark_options(s, sources=True)
    d = sub.add_parser(
        "demo", description="sample CDC traffic: landing files, and records for the embedded broker"
    )
    d.add_argument("--sources", type=Path, default=None, help="sources file (default sources.yaml)")
    d.add_argument("--batches", type=int, default=1, help="batches to write now")
    d.add_argument(
        "--every",
        type=float,
        default=0,
        help="then keep writing one batch every this many seconds (0: stop)",
    )
    b = sub.add_parser(
        "broker", description="run the embedded Kafka-protocol broker (Tansu, in memory)"
    )
    b.add_argument("--sources", type=Path, default=None, help="sources file (default sources.yaml)")
    b.add_argument("--port", type=int, default=DEMO_BROKER_PORT)
    sp = sub.add_parser("spark-server", description="run a local Spark Connect server (warm runs)")
    sp.add_argument("--sources", type=Path, help="sources file (default sources.yaml if present)")
    sp.add_argument("--port", type=int, default=15002)
    sp.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false",
        help="skip the warm-up replays the server runs once it is up",
    )  # fmt: skip
    _spark_options(sp)
    u = sub.add_parser(
        "up",
        description="the demo stack until Ctrl-C or SIGTERM: the embedded broker, the Data Docs "
        "server, a supervised Spark Connect server, demo traffic and `dagster dev` (make demo)",
    )
    u.add_argument("--sources", type=Path, default=Path("sources.yaml"), help="sources file")
    u.add_argument("--dagster-home", type=Path, default=Path("var/dagster_home"))
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=3000, help="the Dagster UI's")
    u.add_argument("--reports-port", type=int, default=3001, help="the Data Docs server's")
    u.add_argument("--broker-port", type=int, default=DEMO_BROKER_PORT)
    u.add_argument("--spark-port", type=int, default=15002, help="the Spark Connect server's")
    u.add_argument(
        "--no-spark-server", dest="spark_server", action="store_false",
        help="no Spark Connect server: each run starts a local Spark of its own",
    )  # fmt: skip
    u.add_argument(
        "--no-warm-up", dest="warm_up", action="store_false",
        help="start the UI without the Spark server's warm-up (the first runs are slower)",
    )  # fmt: skip
    u.add_argument(
        "--every", type=float, default=30,
        help="seconds between demo traffic batches (0: the first batch only)",
    )  # fmt: skip
    o = sub.add_parser(
        "reset-offsets",
        description="make a Kafka source's next run read from the earliest or latest",
    )
    o.add_argument("--source", required=True, help="a transport: kafka source of the catalog")
    o.add_argument("--to", choices=["earliest", "latest"], required=True)
    o.add_argument("--sources", type=Path, default=None, help="sources file (default sources.yaml)")
    m = sub.add_parser(
        "models", description="compile, build or test the SQL models (dbt_like_models)"
    )
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
        c.add_argument("--warehouse", type=_location, help="default: the catalog's warehouse")
        if name == "run":
            c.add_argument("--full-refresh", action="store_true", help="rebuild incremental models")
        _spark_options(c)
    q = sub.add_parser(
        "quality-report", description="validate every table, build the Data Docs site"
    )
    q.add_argument("--warehouse", required=True, type=_location)
    q.add_argument("--out", required=True, type=Path, help="reports folder (the site and gx/)")
    q.add_argument("--sources", type=Path, help="sources file with quality settings")
    _spark_options(q)
    rd = sub.add_parser(
        "redrive", description="re-process quarantined messages; drop those that pass"
    )
    rd.add_argument("--warehouse", required=True, type=_location)
    rd.add_argument("--reason", help="only messages whose reason starts with this")
    rd.add_argument("--source", help="only this source (default: all)")
    rd.add_argument("--sources", type=Path, help="sources file (default sources.yaml if present)")
    _spark_options(rd)
    return p


def _quality_report(args: argparse.Namespace) -> int:
    from cdc_platform.quality.commands import quality_report

    _check_warehouse(args.warehouse, must_exist=True)
    index, runs = quality_report(_spark(args), args.warehouse, args.out.resolve(), args.sources)
    failed = [(run, r) for run in runs for r in run.rules if not r.success]
    for run, r in failed:
        print(f"{run.suite} [{run.batch}] {r.rule} ({r.severity}): {r.unexpected} unexpected",
              file=sys.stderr)  # fmt: skip
    print(json.dumps({"report": str(index), "suites": len(runs), "failed_rules": len(failed)}))
    return 1 if any(r.severity == "ERROR" for _, r in failed) else 0


def _redrive(args: argparse.Namespace) -> int:
    from cdc_platform.quality.commands import redrive_all

    _check_warehouse(args.warehouse, must_exist=True)
    results = redrive_all(_spark(args), args.warehouse, args.reason, args.source, args.sources)
    for name, r in results.items():
        for reason, n in sorted(r.reasons.items()):
            print(f"{name}: still quarantined {n}: {reason}", file=sys.stderr)
    summary = {n: {"redriven": r.redriven, "remaining": r.remaining} for n, r in results.items()}
    print(json.dumps(summary, sort_keys=True))
    return 0


def _models(args: argparse.Namespace) -> int:
    from cdc_platform.models import commands
    from cdc_platform.models.project import ModelError

    catalog = _catalog(args.sources)
    warehouse = args.warehouse or catalog.warehouse_uri
    _check_warehouse(warehouse, must_exist=args.models_command != "compile")
    names = [n.strip() for item in args.select for n in item.split(",") if n.strip()]
    failed = False
    try:
        project = commands.open_project(catalog, warehouse, args.models)
        spark = _spark(args, catalog)
        if args.models_command == "compile":
            for header, sql in commands.compile_models(spark, project, names):
                print(f"{header}\n{sql.strip()}\n")
        elif args.models_command == "run":
            for summary in commands.run_models(spark, warehouse, project, names, args.full_refresh):
                print(json.dumps(summary, sort_keys=True), flush=True)
        else:
            for result in commands.run_model_tests(spark, warehouse, project, names):
                print(json.dumps(result, sort_keys=True), flush=True)
                failed |= not result["passed"] and result["severity"] == "error"
    except ModelError as e:
        raise UserError(str(e)) from None
    return 1 if failed else 0


def _demo(args: argparse.Namespace) -> int:
    import time

    from confluent_kafka import KafkaException

    from cdc_platform import demo
    from cdc_platform.ingest import landing

    catalog = _catalog(args.sources)
    landing_root = catalog.landing_uri
    brokers = sorted({s.kafka.bootstrap_servers for s in catalog.sources if s.kafka})
    for bootstrap in brokers:
        try:
            demo.create_topics(bootstrap)
        except KafkaException:
            raise UserError(
                f"no Kafka broker answers on {bootstrap} (the catalog's Kafka sources read from "
                "it); start the embedded one with `cdc-platform broker`"
            ) from None
    shop = storage.join(landing_root, "shop")
    batch = sum(
        f.name.endswith(".kafka.jsonl")
        for date in landing.partition_dates(shop)
        for f in landing.files_for_date(shop, date)
    )

    def one_batch() -> None:
        for path in demo.write_demo_traffic(landing_root, batch):
            print(path, flush=True)
        for bootstrap in brokers:
            print(f"{bootstrap}: {demo.produce_demo_traffic(bootstrap, batch)} records", flush=True)

    for _ in range(args.batches):
        one_batch()
        batch += 1
    while args.every > 0:
        time.sleep(args.every)
        one_batch()
        batch += 1
    return 0


def _local_var(catalog) -> Path:
    """Where a command keeps its local files (logs): beside a local warehouse, else ``var/``
    beside the sources file."""
    warehouse = catalog.warehouse_uri
    return catalog.base_dir / "var" if storage.is_remote(warehouse) else Path(warehouse).parent


def _catalog(path: Path | None):
    from cdc_platform.catalog import default_catalog_path, load_catalog

    return load_catalog(path or default_catalog_path())


def _spark_settings(args: argparse.Namespace, catalog: Catalog | None = None) -> SparkConfig:
    """``spark_settings`` of the sources file (``catalog``, else the command's --sources, else
    CDC_SOURCES or ./sources.yaml if present), the CDC_SPARK_* variables and --spark-conf."""
    overrides = parse_pairs(args.spark_conf, "--spark-conf")
    if catalog is None:
        catalog = catalog_if_present(args.sources)
    return spark_settings(catalog, overrides)


def _spark(args: argparse.Namespace, catalog: Catalog | None = None) -> SparkSession:
    """The command's session (``settings.remote``: a Spark Connect client)."""
    from cdc_platform.spark.session import get_spark

    settings = _spark_settings(args, catalog)
    return get_spark(settings.master, settings.conf, remote=settings.remote)


def _broker(args: argparse.Namespace) -> int:
    """Run the embedded broker until interrupted. It starts empty, so the Kafka sources that read
    from it start over: their tables would hold offsets past the new topics' ends."""
    import signal

    from cdc_platform import broker

    catalog = _catalog(args.sources)
    address = f"127.0.0.1:{args.port}"
    for source in catalog.sources:
        if source.kafka and source.kafka.bootstrap_servers == address:
            for layer in lake.LAYERS:
                storage.delete_tree(storage.join(catalog.warehouse_uri, layer, source.name))
            print(f"source {source.name}: tables cleared (the embedded broker starts empty)")
    log = _local_var(catalog) / "broker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        proc, bootstrap = broker.start(log, port=args.port)
    except broker.BrokerError as e:
        raise UserError(str(e)) from None
    print(f"embedded broker on {bootstrap} (log: {log}); Ctrl-C stops it", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop(proc)
    return 0


def _spark_server(args: argparse.Namespace) -> int:
    """Run a Spark Connect server with the catalog's master and settings until interrupted."""
    import signal

    from cdc_platform.spark import connect_server

    settings = _spark_settings(args)  # the server's master; a remote setting means nothing here
    argv, env = connect_server.command(settings.master, settings.conf, args.port)
    print(f"Spark Connect on sc://127.0.0.1:{args.port}; Ctrl-C stops it", flush=True)
    # The JVM is a grandchild of the launcher scripts: start them in a process group of their own
    # and stop the whole group, or a SIGTERM (make demo's exit) would leave the JVM running.
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    signal.signal(signal.SIGTERM, _interrupt)
    warm_up: list[SparkSession] = []  # the warm-up's client session, once it has one
    if args.warm_up:
        threading.Thread(target=_warm_up, args=(proc, args.port, warm_up), daemon=True).start()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        # Closed while the server is up: a Connect client still open at exit retries its
        # clean-up calls against the stopped server for minutes (the process hung on Ctrl-C).
        for session in warm_up:
            session.stop()
        stop_group(proc)
        return 0
    # The server ended by itself (a crash, kill -9): a warm-up client still open would retry its
    # exit hooks against it for minutes, so this process ends without running them.
    print(f"the Spark Connect server exited with {code}", flush=True)
    sys.stderr.flush()
    os._exit(code or 1)


def _warm_up(proc: subprocess.Popen, port: int, session: list[SparkSession]) -> None:
    """Once the server answers, run the platform's Spark work on it (``connect_server.warm``)
    and say so: a failed warm-up only costs the first runs their speed. The first runs on a
    cold server are several times slower (code generation, the JIT)."""
    import socket
    import time

    from cdc_platform.spark import connect_server
    from cdc_platform.spark.session import get_spark

    while proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(1)
    else:
        return
    try:
        spark = get_spark(remote=f"sc://127.0.0.1:{port}", app_name="cdc-platform warm-up")
        session.append(spark)
        try:
            seconds = connect_server.warm(spark)
        finally:
            spark.stop()
    except Exception as e:  # noqa: BLE001  (any failure: the server still serves)
        print(f"warm-up failed ({type(e).__name__}: {e}); the first runs are slower", flush=True)
        seconds = 0.0
    print(f"{connect_server.WARM} ({seconds:.0f} s)", flush=True)


def _up(args: argparse.Namespace) -> int:
    from cdc_platform import stack
    from cdc_platform.quality.docs import reports_dir, site_copy

    catalog = _catalog(args.sources)  # a bad sources file: one line, before anything starts
    # A bucket it cannot use: one line, before anything starts.
    for location in (catalog.warehouse_uri, site_copy()):
        if location:
            storage.check(location)
    settings = stack.Settings(
        sources=args.sources.resolve(),
        home=args.dagster_home.resolve(),
        logs=_local_var(catalog),
        reports=reports_dir(catalog.warehouse_uri),
        host=args.host,
        port=args.port,
        reports_port=args.reports_port,
        broker_port=args.broker_port,
        spark_port=args.spark_port if args.spark_server else None,
        warm_up=args.warm_up,
        every=args.every,
    )
    return stack.up(settings)


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _reset_offsets(args: argparse.Namespace) -> int:
    from cdc_platform.ingest import kafka

    catalog = _catalog(args.sources)
    source = catalog.source(args.source)
    if source.transport != "kafka":
        raise UserError(f"source {args.source} is not a transport: kafka source")
    try:
        offsets = kafka.reset_offsets(catalog.warehouse_uri, source, args.to)
    except kafka.KafkaIngestError as e:
        raise UserError(str(e)) from None
    for (topic, partition), offset in sorted(offsets.items()):
        print(f"{topic}[{partition}]: next run reads from offset {offset}")
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


def _location(text: str) -> str:
    """A ``--warehouse``: a local path (made absolute) or an object-store URI."""
    try:
        return storage.resolve(text, Path.cwd())
    except storage.StorageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _check_warehouse(location: str, must_exist: bool) -> None:
    """A warehouse the command can use: a bucket that exists and takes the credentials (a
    store has no folders: ``must_exist`` asks nothing more of it), or a local folder."""
    if storage.is_remote(location):
        storage.check(location)
        return
    path = Path(location)
    if path.exists() and not path.is_dir():
        raise UserError(f"warehouse is not a directory: {path}")
    if must_exist and not path.is_dir():
        raise UserError(f"warehouse not found: {path}")


def _replay(args: argparse.Namespace) -> int:
    from cdc_platform.steps.replay import replay

    files = _input_files(args.inputs)
    _check_warehouse(args.warehouse, must_exist=False)
    try:
        types = {
            c: parse_type(t) for c, t in parse_pairs(args.column_type, "--column-type").items()
        }
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        # --primary-key and --column-type hold for every table of the replayed files.
        source = SourceConfig(
            name=args.source,
            format=args.format,
            format_options=parse_pairs(args.format_option, "--format-option"),
            primary_key=args.primary_key or None,
            column_types=types,
        )
    except ValidationError as e:
        raise UserError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
    today = args.date or dt.datetime.now(dt.UTC).date().isoformat()
    summary, result = replay(_spark(args), args.warehouse, files, source, today)
    for reason, n in sorted(result.quarantine_reasons.items()):
        print(f"quarantined {n}: {reason}", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    return 0


def _find_table(warehouse: str, table: str, source: str | None) -> tuple[str, str]:
    from cdc_platform.normalize import table_name

    names = {table, table_name(table)}
    found = sorted(
        {
            (storage.name(source_dir), storage.name(t))
            for source_dir in lake.folders(storage.join(warehouse, lake.CHANGELOG))
            for t in lake.folders(source_dir)
            if storage.name(t) in names
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

    from cdc_platform.steps.current import current_rows

    warehouse = args.warehouse
    _check_warehouse(warehouse, must_exist=True)
    source, table = _find_table(warehouse, args.table, args.source)
    spark = _spark(args)
    state = lake.state(lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse))
    key = state.key or []
    if args.layer == "current":
        df = current_rows(spark, warehouse, source, table)
        order = key
    elif args.layer == "changelog":
        df = lake.read(spark, lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse))
        order = [f"key.{k}" for k in key] + ["sequence"]
    else:
        df = lake.read(spark, lake.TableRef(lake.QUARANTINE, source).uri(warehouse))
        if df is not None:
            df = df.where(
                F.col("qualified_table").isNull() | (F.col("qualified_table") == state.qualified)
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
        command = {
            "replay": _replay,
            "show": _show,
            "models": _models,
            "demo": _demo,
            "broker": _broker,
            "reset-offsets": _reset_offsets,
            "spark-server": _spark_server,
            "up": _up,
            "quality-report": _quality_report,
            "redrive": _redrive,
        }[args.command]
        return command(args)
    except (UserError, CatalogError, LandingError, storage.StorageError) as e:
        print(f"cdc-platform: error: {e}", file=sys.stderr)
        return 2
