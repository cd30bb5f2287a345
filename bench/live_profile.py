"""Where a live run's time goes, and what it costs as `fixed + per_event x events`.

Starts what `make demo` starts (bench/latency.py's `DemoStack`, on a temporary folder): the
embedded broker, the Spark Connect server and `dagster dev` with the demo's run queue, on a catalog
with one Debezium landing source and one Debezium Kafka source. For each batch size (default 1,
1,000, 10,000, 100,000), for each source, it appends that many inserts of new keys, waits until
they are all live in the current table, and reads the run that carried them from the Dagster
instance's event log:

- `request -> start`: the sensor's request to the run's start (queue, launch, code location load);
- each step's time (`raw`, `changelog` with its checks, `current` with its checks);
- each step's phases, as the step logged them (`seconds by phase`, `cdc_platform.timings`).

Then it fits `request -> success = fixed + per_event x events` over the sizes (least squares) and
prints the phase tables of the smallest and the largest batch per source, largest phases first.

The counted rounds come after uncounted ones (`--warmup`, by default one round of each size):
the costs are those of a warm server, one that has already run batches of every size, as a
server running all day has. A server's first batch of a new size is slower (most likely the JIT,
not done with the code it makes hot): a first micro-batch of 100,000 events took 9.2-13.0 s, the
next ones 5.2-8.0 s.

With `--runs continuous` the sources run as the demo's do, one long run each, but a landing
micro-batch starts as soon as anything waits (`max_wait_seconds: 0`, not the demo's gathering of
a trickle), and a Kafka one once the largest round waits or 10 s after the run saw less
(`KAFKA_GATHER_SECONDS`). There is no request, launch or run per batch, and what it fits is
each micro-batch's own time
(`seconds by phase`'s `step`: raw, change log and its checks, current and its checks) against
the records its raw step took. A round that goes through in more than one micro-batch prints each
(`records:seconds`, then the seconds of each one's raw step: consuming and storing);
`append -> done` adds the wait for the run's next look (`poll_seconds`, 1 s), and for a Kafka
round smaller than the largest, the gathering.

    .venv/bin/python bench/live_profile.py [--sizes 1,1000,10000,100000] [--sources files,kafka]
        [--runs batches|continuous] [--warmup SIZES] [--max-records N] [--keep]
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import (  # noqa: E402  (bench/ is not a package)
    FILES,
    IN_FLIGHT,
    KAFKA,
    QUEUED,
    DemoStack,
    StackError,
    append_files,
    append_kafka,
    check_prerequisites,
    create_topic,
    demo_settings,
    free_port,
    install_signal_handlers,
    visible,
    write_catalog,
)

from cdc_platform.defs.metadata import PROFILE_PREFIX  # noqa: E402  (what each step logs)


def run_profile(home: Path, run_id: str) -> dict:
    """A finished run's request, start and end times, step times and logged phases."""
    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_record_by_id(run_id)
        stats = instance.get_run_stats(run_id)
        steps: dict[str, dict] = {}
        for s in instance.get_run_step_stats(run_id):
            steps[s.step_key] = {"seconds": (s.end_time or 0) - (s.start_time or 0)}
        for entry in instance.all_logs(run_id):
            message = entry.user_message or ""
            if entry.step_key and PROFILE_PREFIX in message:
                phases = json.loads(message.split(PROFILE_PREFIX, 1)[1])
                steps.setdefault(entry.step_key, {})["phases"] = phases
        started = [
            e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.RUN_START)
        ]
    return {
        "requested": run.create_timestamp.timestamp(),
        "started": started[0] if started else stats.start_time,
        "ended": stats.end_time,
        "status": run.dagster_run.status.value,
        "steps": steps,
    }


# A continuous source of the profile: one run for it all, a micro-batch as soon as anything waits.
CONTINUOUS = {"run_minutes": 120, "max_wait_seconds": 0}
# A Kafka round is produced over seconds: a run that took what it found would take a round in
# parts, while the broker is busy taking the rest (on the embedded broker a micro-batch's
# consume then stalled for 8-9 s). So a Kafka micro-batch starts once a round of the largest
# size waits, or this long after the run first saw records (a smaller round): that wait adds to
# `append -> done`, not to the micro-batch.
KAFKA_GATHER_SECONDS = 10
VISIBLE_POLL_SECONDS = 0.5  # how often the bench looks whether a round is live


def raw_records(entry) -> int | None:
    """The records a raw materialization stored (Kafka) or the messages it read (landing)."""
    event = entry.dagster_event
    if event is None or not event.is_step_materialization or event.asset_key.path[0] != "raw":
        return None
    metadata = {
        k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()
    }
    if "ingested_records" in metadata:
        return int(metadata["ingested_records"])
    return sum(metadata.get("messages_by_date", {}).values())


def micro_batches(home: Path, source: str, since: float) -> list[dict]:
    """The micro-batches of ``source``'s continuous runs that ended after ``since`` (epoch s):
    when each ended, its logged phases (``step``: the whole micro-batch) and the records its
    raw step took."""
    from dagster import DagsterInstance, RunsFilter

    found = []
    with DagsterInstance.from_config(str(home)) as instance:
        for run in instance.get_runs(RunsFilter(job_name=f"{source}__continuous")):
            records = 0
            for entry in instance.all_logs(run.run_id):
                message = entry.user_message or ""
                records += raw_records(entry) or 0
                if PROFILE_PREFIX in message:
                    if entry.timestamp > since:
                        phases = json.loads(message.split(PROFILE_PREFIX, 1)[1])
                        found.append(
                            {"ended": entry.timestamp, "phases": phases, "records": records}
                        )
                    records = 0
    return sorted(found, key=lambda m: m["ended"])


def continuous_profile(home: Path, source: str, since: float, seen: float, timeout: float) -> dict:
    """The micro-batches that carried a round appended at ``since`` and seen live at ``seen``:
    those that ended since it was appended, up to the first that ended after it was seen (its
    checks come after the merge; less the bench's look interval), as ``run_profile`` gives a
    run (``step`` summed)."""
    deadline = time.monotonic() + timeout
    while True:
        batches = micro_batches(home, source, since)
        # The bench looks every 0.5 s: the micro-batch that made the round live may have
        # logged its profile just before the look that saw it.
        done = [m for m in batches if m["ended"] >= seen - VISIBLE_POLL_SECONDS - 0.5]
        if done:
            carried = [m for m in batches if m["ended"] <= done[0]["ended"]]
            break
        if time.monotonic() > deadline:
            raise StackError(f"{source}: no micro-batch ended after its round was live")
        time.sleep(0.5)
    phases: dict[str, float] = {}
    for m in carried:
        for name, seconds in m["phases"].items():
            phases[name] = phases.get(name, 0.0) + seconds
    step = f"{source}__micro_batches"
    return {
        "requested": since,
        "started": since,
        "ended": carried[-1]["ended"],
        "status": "SUCCESS",
        "steps": {step: {"seconds": phases.get("step", 0.0), "phases": phases}},
        "micro_batches": len(carried),
        # (records, seconds) of each: a round bigger than --max-records, or one the run found
        # while it was still being written, is taken in more than one micro-batch.
        "points": [(m["records"], m["phases"].get("step", 0.0)) for m in carried],
        "raw": [m["phases"].get("raw", 0.0) for m in carried],
    }


def runs_of(stack: DemoStack, source: str, since: float) -> list[dict]:
    return [
        r
        for r in stack.runs()
        if r["jobName"] == f"{source}__ingest" and r["creationTime"] >= since
    ]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of seconds = fixed + per_event x events."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def short(step_key: str, source: str) -> str:
    return "/".join(p for p in step_key.split("__") if p != source)


def print_run(kind: str, events: int, prof: dict, source: str) -> None:
    total = prof["ended"] - prof["requested"]
    launch = prof["started"] - prof["requested"]
    steps = ", ".join(
        f"{short(k, source)} {v.get('seconds', 0):.2f}" for k, v in prof["steps"].items()
    )
    if "micro_batches" in prof:
        print(f"  {kind:<5} {events:>7} events: micro-batch {seconds(prof):6.2f} s "
              f"(append->done {total:6.2f} s, micro-batches "
              f"{' '.join(f'{n}:{t:.2f}' for n, t in prof['points'])}, of which raw "
              f"{' '.join(f'{t:.2f}' for t in prof['raw'])})",
              flush=True)  # fmt: skip
        return
    print(f"  {kind:<5} {events:>7} events: request->success {total:6.2f} s "
          f"(request->start {launch:5.2f} s) [{steps}]", flush=True)  # fmt: skip


def seconds(prof: dict) -> float:
    """What the fit measures: a run's request -> success, or a round's micro-batches."""
    if "micro_batches" in prof:
        return sum(step["seconds"] for step in prof["steps"].values())
    return prof["ended"] - prof["requested"]


def print_phases(kind: str, events: int, prof: dict, source: str) -> None:
    print(f"\n{kind}, {events} events: where the run's time went (seconds)")
    rows = []
    if "micro_batches" not in prof:
        rows.append(
            ("request -> start (queue, launch, code location)", prof["started"] - prof["requested"])
        )
    for key, step in prof["steps"].items():
        name = short(key, source)
        phases = step.get("phases", {})
        top = {p: s for p, s in phases.items() if "/" not in p and p != "step"}
        rows.append(
            (f"{name}: Dagster around the step", step.get("seconds", 0) - phases.get("step", 0))
        )
        rows.append((f"{name}: unphased", phases.get("step", 0) - sum(top.values())))
        rows += [(f"{name}: {p}", s) for p, s in phases.items() if p != "step"]
    for label, seconds in sorted(rows, key=lambda r: -r[1]):
        print(f"  {seconds:8.2f}  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1000,10000,100000")
    parser.add_argument("--sources", default="files,kafka")
    parser.add_argument(
        "--runs", choices=("batches", "continuous"), default="batches",
        help="a run per batch from the sensor (default), or the sources' continuous runs",
    )  # fmt: skip
    parser.add_argument(
        "--warmup", default=None,
        help="events of the uncounted rounds before the counted ones, comma-separated "
        "(default: the sizes; 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--max-records", type=int, default=None,
        help="the Kafka source's max_records (default: the largest round): with --runs "
        "continuous, a larger round goes through in micro-batches of this many, back to back",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600, help="per round, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    warmup = [n for s in (args.warmup or args.sizes).split(",") if (n := int(s))]
    kinds = [k.strip() for k in args.sources.split(",") if k.strip()]
    install_signal_handlers()
    try:
        check_prerequisites()
    except StackError as e:
        sys.exit(f"live_profile: error: {e}")
    work = Path(tempfile.mkdtemp(prefix="cdc-profile-"))
    stack, ok = None, False
    try:
        demo = demo_settings()
        bootstrap = f"127.0.0.1:{free_port()}"
        catalog = write_catalog(
            work / "sources.yaml", bootstrap=bootstrap, files_source=FILES, kafka_source=KAFKA,
            column_types={"id": "bigint", "name": "string", "round": "int"},
            interval={t: demo["interval"].get(t, 15) for t in ("files", "kafka")},
            spark=demo["spark"], max_records=args.max_records or max([*sizes, *warmup]),
            continuous={
                "files": CONTINUOUS,
                "kafka": {**CONTINUOUS, "min_batch_records": max([*sizes, *warmup]),
                          "max_wait_seconds": KAFKA_GATHER_SECONDS},
            } if args.runs == "continuous" else None,
        )  # fmt: skip
        stack = DemoStack(work, catalog)
        stack.start(bootstrap)
        create_topic(bootstrap)
        print(f"stack up: {stack.url}, {stack.spark_url}; work {work}", flush=True)
        pos = {"files": 4, "kafka": 4}
        # (counted, events) a round. Each round's rows carry its number (from 1), so a round is
        # live once that many rows of it are.
        plan = [(False, n) for n in warmup] + [(True, n) for n in sizes]
        measured: dict[str, list[tuple[int, dict]]] = {k: [] for k in kinds}
        for round_no, (counted, events) in enumerate(plan, start=1):
            for kind in kinds:
                source = FILES if kind == "files" else KAFKA
                since = time.time() - 1
                append = append_files if kind == "files" else append_kafka
                where = stack.landing if kind == "files" else bootstrap
                pos[kind] = append(where, round_no + 1000, events, pos[kind])
                start = time.monotonic()
                while visible(stack.warehouse, source, round_no + 1000) < events:
                    if time.monotonic() - start > args.timeout:
                        raise StackError(f"{kind} {events} events not live in {args.timeout} s")
                    stack.check_alive()
                    time.sleep(VISIBLE_POLL_SECONDS)
                if args.runs == "continuous":
                    prof = continuous_profile(stack.home, source, since + 1, time.time(),
                                              args.timeout)  # fmt: skip
                    if counted:
                        measured[kind].append((events, prof))
                    print_run(kind + ("" if counted else "*"), events, prof, source)
                    continue
                # The run ends after its last commit (the current table's checks).
                while any(r["status"] in IN_FLIGHT + QUEUED for r in runs_of(stack, source, since)):
                    if time.monotonic() - start > args.timeout:
                        raise StackError(f"{kind}: the run of {events} events did not end")
                    time.sleep(0.5)
                done = [r for r in runs_of(stack, source, since) if r["status"] == "SUCCESS"]
                if not done:
                    raise StackError(f"{kind}: no successful run found for round {round_no}")
                profs = [run_profile(stack.home, r["runId"]) for r in done]
                prof = max(profs, key=lambda p: p["ended"] - p["requested"])
                if len(done) > 1:
                    print(f"  ({kind}: {len(done)} runs carried the round; the longest shown)")
                if counted:
                    measured[kind].append((events, prof))
                print_run(kind + ("" if counted else "*"), events, prof, source)
        print("\n* warm-up, not counted")
        for kind, runs in measured.items():
            source = FILES if kind == "files" else KAFKA
            if args.runs == "continuous":  # micro-batch by micro-batch, as the rounds split
                points = [point for _, p in runs for point in p["points"]]
            else:
                points = [(n, seconds(p)) for n, p in runs]
            fixed, per_event = fit(points)
            what = "micro-batch" if args.runs == "continuous" else "request->success"
            print(f"\n{kind}: {what} = {fixed:.2f} s + {per_event * 1000:.4f} ms x "
                  f"events  ({1 / per_event if per_event > 0 else float('inf'):,.0f} events/s "
                  "marginal)")  # fmt: skip
            # The smallest batch is the fixed cost; the largest, what grows with the batch.
            ends = sorted(runs, key=lambda r: r[0])
            for events, prof in ends[:1] + ends[1:][-1:]:
                print_phases(kind, events, prof, source)
        ok = True
    except StackError as e:
        print(f"live_profile: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("live_profile: interrupted", file=sys.stderr)
    finally:
        if stack is not None:
            stack.stop()
        if args.keep or not ok:
            print(f"work folder: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
