"""How many Spark jobs a small micro-batch runs, and in which step: the fixed cost of a
continuous run's micro-batch is mostly jobs over a few dozen rows.

It runs the demo catalog's continuous job of one source (`shop` by default: two tables, one
with history) in this process on a local Spark, one micro-batch per batch of demo traffic, and
counts the Spark jobs each step started (Spark's status tracker; with adaptive query execution
each shuffle stage is a job of its own) and the seconds it took, and the jobs of each timed
phase within the steps, and the Delta snapshots it read (loaded: the last checkpoint and the
commits after it; or brought up to date: the commits since). The first micro-batch also
pays for imports and code generation: the median is over the others.

    .venv/bin/python bench/micro_batch_jobs.py [--source shop] [--batches 6]
"""

import argparse
import atexit
import contextlib
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="shop", help="a landing source of sources.yaml")
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="micro-batch-jobs-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    os.environ.update(
        CDC_WAREHOUSE=str(work / "warehouse"),
        CDC_LANDING=str(work / "landing"),
        CDC_REPORTS=str(work / "reports"),
    )
    import dagster as dg

    from cdc_platform import timings

    # Jobs per phase too: every module takes ``phase`` from timings at import, so it is
    # wrapped before they are imported.
    by_phase: Counter[str] = Counter()
    phase = timings.phase

    @contextlib.contextmanager
    def counting_phase(name: str):
        before = jobs() if tracker else 0
        with phase(name):
            try:
                yield
            finally:
                if tracker:
                    by_phase[name] += jobs() - before

    timings.phase = counting_phase
    tracker = None

    from cdc_platform.catalog import ContinuousConfig, load_catalog
    from cdc_platform.defs import continuous
    from cdc_platform.defs.cdc_tables import build_source_defs
    from cdc_platform.defs.resources import build_resources
    from cdc_platform.demo import write_demo_traffic
    from cdc_platform.spark.session import get_spark

    catalog = load_catalog(ROOT / "sources.yaml")
    source = catalog.source(args.source)
    if catalog.spark.remote:
        sys.exit("the jobs are counted on a local Spark: unset the Spark Connect address")
    if source.transport != "files":
        sys.exit(f"source {args.source}: a landing-file source is needed (demo traffic)")
    # A run that ends after one micro-batch.
    source = source.model_copy(update={"continuous": ContinuousConfig(run_minutes=0.001)})
    defs = dg.Definitions.merge(
        build_source_defs(source, catalog),
        dg.Definitions(resources=build_resources(catalog), executor=dg.in_process_executor),
    )
    job = defs.resolve_job_def(f"{args.source}__continuous")
    # The JVM's tracker, asked for a count: PySpark's copies the id of every job run so far
    # into a Python list, one call each, and took longer each micro-batch (0.3 s a phase by
    # the 14th). Every job is kept (Spark keeps the last 1,000), or the counts stop growing.
    session = get_spark(catalog.spark.master, conf={"spark.ui.retainedJobs": "10000000"})
    tracker = session.sparkContext._jsc.statusTracker()  # noqa: SLF001 (the JVM's own)

    # The reconciliation runs in a thread of its own beside the merges: its jobs are put in a
    # group of their own, so the steps around it do not count them.
    beside = "reconciliation"

    def jobs(group: str | None = None) -> int:
        return len(tracker.getJobIdsForGroup(group))

    by_step: Counter[str] = Counter()
    seconds_by_step: Counter[str] = Counter()

    def counted(module: object, name: str, step: str) -> None:
        function = getattr(module, name)

        def wrapper(*a: object, **k: object) -> object:
            before, started = jobs(), time.monotonic()
            try:
                return function(*a, **k)
            finally:
                by_step[step] += jobs() - before
                seconds_by_step[step] += time.monotonic() - started

        setattr(module, name, wrapper)

    reconcile = continuous.quality.validations.validate_reconciliation

    def reconciled(*a: object, **k: object) -> object:
        session.sparkContext.setJobGroup(beside, beside)
        before, started = jobs(beside), time.monotonic()
        try:
            return reconcile(*a, **k)
        finally:
            by_step["checks: reconciliation (in a thread, beside the others)"] += (
                jobs(beside) - before
            )
            seconds_by_step["checks: reconciliation (in a thread, beside the others)"] += (
                time.monotonic() - started
            )

    continuous.quality.validations.validate_reconciliation = reconciled
    counted(continuous, "normalize_new", "normalize (all outputs)")
    counted(continuous.quality, "validate_changelogs", "checks: change logs")
    counted(continuous, "merge_current", "merge into current")
    counted(continuous.outputs, "current", "current's metadata")
    counted(continuous.quality, "validate_current", "checks: current")
    counted(continuous, "update_history", "history")
    counted(continuous.outputs, "changelog", "change logs' metadata")

    # Snapshot reads of the Delta log: loaded (the last checkpoint and the commits after it:
    # bench/delta_log_reads.py times one as the log grows) or brought up to date (the commits
    # since a snapshot ``lake`` keeps).
    from deltalake import DeltaTable

    snapshots: Counter[str] = Counter()

    def timed(name: str) -> None:
        method = getattr(DeltaTable, name)

        def wrapper(self: DeltaTable, *a: object, **k: object) -> object:
            started = time.perf_counter()
            try:
                return method(self, *a, **k)
            finally:
                snapshots[name] += 1
                snapshots["s"] += time.perf_counter() - started

        setattr(DeltaTable, name, wrapper)

    timed("__init__")
    timed("update_incremental")
    day = dt.date.today().isoformat()
    totals, seconds, steps, phases, step_seconds = [], [], [], [], []
    for batch in range(args.batches):
        write_demo_traffic(catalog.landing_uri, batch=batch, date=day)
        by_step.clear()
        snapshots.clear()
        by_phase.clear()
        seconds_by_step.clear()
        before, started = jobs() + jobs(beside), time.monotonic()
        with dg.instance_for_test() as instance:
            assert job.execute_in_process(instance=instance).success
        totals.append(jobs() + jobs(beside) - before)
        seconds.append(time.monotonic() - started)
        steps.append(dict(by_step))
        phases.append(dict(by_phase))
        step_seconds.append(dict(seconds_by_step))
        print(
            f"micro-batch {batch}: {totals[-1]} Spark jobs, {seconds[-1]:.1f} s, "
            f"Delta snapshots: {snapshots['__init__']} loaded, "
            f"{snapshots['update_incremental']} brought up to date ({snapshots['s']:.2f} s)",
            flush=True,
        )
    if args.batches < 2:
        return
    later, later_seconds = steps[1:], step_seconds[1:]
    rest = [t - sum(d.values()) for t, d in zip(totals[1:], later, strict=True)]
    print(f"\nmedian of micro-batches 1-{args.batches - 1} ({args.source}):")
    print(
        f"  {statistics.median(totals[1:]):.0f} Spark jobs, {statistics.median(seconds[1:]):.1f} s"
    )
    print("  jobs  seconds  step")
    for step in dict.fromkeys(s for d in later for s in d):
        jobs_ = statistics.median(d.get(step, 0) for d in later)
        secs = statistics.median(d.get(step, 0.0) for d in later_seconds)
        print(f"  {jobs_:4.0f}  {secs:7.2f}  {step}")
    print(f"  {statistics.median(rest):4.0f}           the rest")
    print("  jobs  phase (within the steps)")
    for name in dict.fromkeys(n for d in phases[1:] for n in d):
        print(f"  {statistics.median(d.get(name, 0) for d in phases[1:]):4.0f}  {name}")


if __name__ == "__main__":
    main()
