"""Soak and sweep of `make demo`'s stack: steady CDC traffic for minutes, step by step.

Starts what `make demo` starts (bench/latency.py's `DemoStack`, on a temporary folder): the
embedded broker, the Spark Connect server and `dagster dev` with the demo's run-queue
dagster.yaml, on a catalog with two Debezium sources, `soak_files` (landing files) and
`soak_kafka` (a topic on the broker). A generator thread writes change events to the sources
`--transports` names (both: in turn, half each): a new landing file every FILE_EVERY seconds under
`<landing>/soak_files/dt=<today>/`, and records produced to the topic as they are made (a Kafka
tombstone after each delete, as Debezium sends). Each source has its own bounded key space
(KEYS ids): an event on a key that is not live inserts it, on a live key it deletes it (15%) or
updates it; the generator keeps the reference state (id -> last row, deleted ids gone).

It runs one step per rate (`--rate`, or each of `--sweep`'s rates in turn on the same stack),
each for MINUTES. Every SAMPLE_EVERY seconds it samples, per source, the runs queued and in
flight (the webserver's GraphQL API, runsOrError; a run belongs to a source by its `cdc/source`
tag, else by its job `<source>__ingest`), the freshness lag of the current table (now - the
newest source event time it reflects, `cdc_platform.freshness.current`, from Delta statistics;
before anything is visible, now - the source's first event), the backlog (messages produced -
rows in raw), the resident memory and the CPU seconds of every process of the stack (over the
process trees of the processes it started, Dagster's run processes included). After a step's
load it waits (at most DRAIN seconds) until every source has caught up, then checks that each
current table equals the reference state and that raw holds exactly the messages produced, each
with an outcome (change log, control, DDL or quarantine). A step meets its targets when, per fed
source, the lag's p95 after the step's first SETTLE seconds is at most 30 s, at most one run is
queued and one in flight, and the tables are right. A sweep stops after the first step that
misses (unless `--keep-going`) and prints, per source, the highest rate that met every target,
with the stack's CPU (cores) and memory per step. The plot shows lag, runs and memory over time.

    .venv/bin/python bench/soak.py [--minutes 10] [--rate 1000 | --sweep 1000,2000,5000,10000]
        [--transports both|files|kafka] [--keep-going] [--keys 20000] [--file-every 5]
        [--sample-every 10] [--drain 300] [--settle 120] [--plot docs/soak.png]
        [--local-session] [--keep]

A trickle (`--rate 0.2 --file-every 30 --minutes 10`) measures what the stack costs when its
sources are nearly idle: the step's CPU line is its CPU seconds over those 10 minutes.

The plot needs matplotlib: `pip install -e '.[bench]'`, or `--plot ''` for none.
"""

import argparse
import datetime as dt
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import (  # noqa: E402  (bench/ is not a package)
    IN_FLIGHT,
    QUEUED,
    ROOT,
    RUN_MODES,
    TABLE,
    TOPIC,
    DemoStack,
    StackError,
    check_prerequisites,
    continuous_settings,
    create_topic,
    debezium_value,
    demo_settings,
    free_port,
    install_signal_handlers,
    run_source,
    today,
    verdict,
    write_catalog,
    write_landing_file,
)

FILES, KAFKA = "soak_files", "soak_kafka"
SOURCES = (FILES, KAFKA)
COLUMN_TYPES = {"id": "bigint", "name": "string", "amount": "double", "version": "bigint"}
DELETE_SHARE = 0.15
TARGET_QUEUED = 1
TARGET_IN_FLIGHT = 1
TARGET_LAG_P95_S = 30.0
TARGET_RSS = 8 * 2**30
GIB = 2**30


class Stream:
    """One source's changes: the next event for a random key, and the reference state."""

    def __init__(self, keys: int, rng: random.Random) -> None:
        self.keys = keys
        self.rng = rng
        self.state: dict[int, dict] = {}
        self.pos = 4  # binlog position: strictly increasing, so the order is unambiguous
        self.messages = 0  # what the transport carries (Kafka: tombstones too)
        self.ops: Counter = Counter()
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        self.files = 0  # landing files written (the landing source)

    def next(self, now_ms: int) -> tuple[int, str, str]:
        """(id, op, Debezium value) of one new change, applied to the reference state."""
        key = self.rng.randint(1, self.keys)
        old = self.state.get(key)
        self.pos += 1
        if old is None:
            op, new = "c", {"id": key, "name": f"n{key}-0", "version": 0}
        elif self.rng.random() < DELETE_SHARE:
            op, new = "d", None
        else:
            v = old["version"] + 1
            op, new = "u", {"id": key, "name": f"n{key}-{v}", "version": v}
        if new is not None:
            new["amount"] = round(self.rng.uniform(0, 100_000), 2)
            self.state[key] = new
        else:
            del self.state[key]
        self.ops[op] += 1
        self.first_ms = self.first_ms or now_ms
        self.last_ms = now_ms
        return key, op, debezium_value(op, old, new, self.pos, now_ms)


class Generator(threading.Thread):
    """RATE events/s for SECONDS, given to the fed sources in turn: lines of a landing file
    written every FILE_EVERY seconds, records produced to the topic as they are made.

    ``landing``: a folder (a Path), or a location string (``s3://bucket/prefix``, or a folder),
    where each file is written whole (``lake.storage.write_whole``: one put). A put the store did
    not take is kept and tried again, before any later file and with the same name and bytes
    (unless the store holds it already: a put that timed out may have landed), as a writer that
    waits out its store does; its messages count once it is written (``Stream.messages``)."""

    def __init__(
        self, landing: Path | str, producer, streams: dict[str, Stream], feeds: tuple[str, ...],
        rate: float, seconds: float, file_every: float,
    ) -> None:  # fmt: skip
        super().__init__(name="generator", daemon=True)
        if isinstance(landing, Path):
            self.landing: Path | str = landing / FILES
        else:
            from cdc_platform.lake import storage

            self.landing = storage.join(landing, FILES)
        self.unwritten: list[tuple[str, bytes, int, bool]] = []  # location, bytes, lines, tried
        self.put_failures: list[str] = []  # why a put failed, each time
        self.producer = producer
        self.undelivered = 0
        self.rate, self.seconds, self.file_every = rate, seconds, file_every
        self.streams, self.feeds = streams, feeds
        self.buffer: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.started_at: float | None = None  # time.time()
        self.ended_at: float | None = None
        self.emitted = 0

    def _flush_file(self) -> None:
        if self.buffer:
            stream = self.streams[FILES]
            stream.files += 1  # names keep rising from step to step: the reader's order
            name = f"{stream.files:06d}.jsonl"
            if isinstance(self.landing, Path):
                write_landing_file(self.landing / f"dt={today()}", name, self.buffer)
                stream.messages += len(self.buffer)
            else:
                from cdc_platform.lake import storage

                data = "".join(line + "\n" for line in self.buffer).encode()
                location = storage.join(self.landing, f"dt={today()}", name)
                self.unwritten.append((location, data, len(self.buffer), False))
            self.buffer = []
        self._put_unwritten()

    def _put_unwritten(self) -> None:
        """Put the files not written yet, oldest first; stop at the first the store refuses."""
        if not self.unwritten:
            return
        from cdc_platform.lake import storage

        while self.unwritten:
            location, data, lines, tried = self.unwritten[0]
            try:
                if not (tried and _holds(location, len(data))):
                    storage.write_whole(location, data)
            except OSError as e:
                self.put_failures.append(f"{type(e).__name__}: {e}")
                self.unwritten[0] = (location, data, lines, True)
                return
            self.unwritten.pop(0)
            self.streams[FILES].messages += lines

    def _produce(self, key: int, value: str | None) -> None:
        while True:
            try:
                self.producer.produce(TOPIC, key=json.dumps({"id": key}), value=value,
                                      on_delivery=self._delivered)  # fmt: skip
                self.streams[KAFKA].messages += 1
                return
            except BufferError:
                self.producer.poll(0.1)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.undelivered += 1

    def run(self) -> None:
        try:
            self.started_at = time.time()
            start = time.monotonic()
            last_file = start
            while not self.stop.is_set():
                now = time.monotonic()
                elapsed = now - start
                due = int(self.rate * min(elapsed, self.seconds)) - self.emitted
                now_ms = int(time.time() * 1000)
                for _ in range(due):
                    name = self.feeds[self.emitted % len(self.feeds)]
                    key, op, value = self.streams[name].next(now_ms)
                    if name == FILES:
                        self.buffer.append(value)
                    else:
                        self._produce(key, value)
                        if op == "d":
                            self._produce(key, None)  # Debezium's tombstone after a delete
                    self.emitted += 1
                self.producer.poll(0)
                if now - last_file >= self.file_every:
                    self._flush_file()
                    last_file = now
                if elapsed >= self.seconds:
                    break
                time.sleep(0.05)
            self._flush_file()
            deadline = time.monotonic() + 120
            while self.unwritten and time.monotonic() < deadline:
                time.sleep(1)
                self._put_unwritten()
            if self.unwritten:
                raise StackError(f"{len(self.unwritten)} landing files not written: "
                                 f"{self.put_failures[-1]}")  # fmt: skip
            if self.producer.flush(60) or self.undelivered:
                raise StackError("the producer could not deliver every record to the broker")
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            self.error = e
        finally:
            self.ended_at = time.time()


def _holds(location: str, size: int) -> bool:
    """Whether the object (or file) at ``location`` exists with ``size`` bytes."""
    import pyarrow.fs as pafs

    from cdc_platform.lake import storage

    fs, path = storage.filesystem(location)
    info = fs.get_file_info(path)
    return info.type == pafs.FileType.File and info.size == size


# --- sampling -----------------------------------------------------------------------------


def lag_seconds(warehouse: Path | str, source: str, stream: Stream) -> float | None:
    """now - the newest source event time the current table reflects; before it reflects any,
    now - the source's first event (None before there is one)."""
    from cdc_platform import freshness

    try:
        fresh = freshness.current(warehouse, source, TABLE)
    except Exception:  # noqa: BLE001  (a table being created; the next sample sees it)
        fresh = None
    if fresh is not None and fresh.lag_seconds is not None:
        return fresh.lag_seconds
    if stream.first_ms is None:
        return None
    return time.time() - stream.first_ms / 1000


def position_ms(warehouse: Path | str, source: str) -> float | None:
    from cdc_platform import freshness

    try:
        position = freshness.current(warehouse, source, TABLE).position
    except Exception:  # noqa: BLE001
        return None
    return position.timestamp() * 1000 if position else None


def raw_rows(warehouse: Path | str, source: str) -> int:
    from cdc_platform import lake

    try:
        return lake.row_count(lake.TableRef(lake.RAW, source).uri(warehouse))
    except Exception:  # noqa: BLE001
        return 0


def active_runs(
    stack: DemoStack, count_continuous: bool = True
) -> dict[str, dict[str, int]] | None:
    """source -> {"queued": n, "in_flight": n}; None when the webserver did not answer."""
    try:
        runs = stack.runs(statuses=(*QUEUED, *IN_FLIGHT), limit=200)
    except (OSError, StackError):
        return None
    out: dict[str, dict[str, int]] = {}
    for r in runs:
        if not count_continuous and (r.get("jobName") or "").endswith("__continuous"):
            continue
        counts = out.setdefault(run_source(r), {"queued": 0, "in_flight": 0})
        counts["queued" if r["status"] in QUEUED else "in_flight"] += 1
    return out


def take_sample(stack: DemoStack, streams: dict[str, Stream], t0: float, step: int,
                phase: str) -> dict:  # fmt: skip
    """One sample: per source runs queued and in flight, lag and backlog; the stack's memory
    and its CPU seconds so far. `t` is seconds since the soak's first step began (t0)."""
    runs = active_runs(stack)
    sample = {"t": round(time.time() - t0, 1), "step": step, "phase": phase,
              "graphql_ok": runs is not None, "sources": {}}  # fmt: skip
    for name in SOURCES:
        stream = streams[name]
        counts = (runs or {}).get(name, {"queued": 0, "in_flight": 0})
        sample["sources"][name] = {
            "queued": counts["queued"] if runs is not None else None,
            "in_flight": counts["in_flight"] if runs is not None else None,
            "lag": lag_seconds(stack.warehouse, name, stream),
            "backlog": stream.messages - raw_rows(stack.warehouse, name),
        }
    sample["other_runs"] = sum(
        c["queued"] + c["in_flight"] for s, c in (runs or {}).items() if s not in SOURCES
    )
    rss = stack.rss()
    sample["rss"] = sum(rss.values())
    sample["rss_parts"] = rss
    sample["cpu"] = stack.cpu_seconds()
    return sample


HEADER = (
    f"{'t s':>6} {'step':>4} {'phase':<5} | "
    + " | ".join(f"{n:<10} {'q':>2} {'run':>3} {'lag s':>6} {'backlog':>7}" for n in SOURCES)
    + f" | {'other':>5} {'RSS GiB':>7}"
)


def _fmt(value, width: int, digits: int = 0) -> str:
    if value is None:
        return f"{'?':>{width}}"
    return f"{value:>{width}.{digits}f}" if isinstance(value, float) else f"{value:>{width}}"


def sample_row(s: dict) -> str:
    parts = []
    for name in SOURCES:
        x = s["sources"][name]
        parts.append(f"{'':<10} {_fmt(x['queued'], 2)} {_fmt(x['in_flight'], 3)} "
                     f"{_fmt(x['lag'], 6, 1)} {_fmt(x['backlog'], 7)}")  # fmt: skip
    return (f"{s['t']:>6.0f} {s['step']:>4} {s['phase']:<5} | " + " | ".join(parts)
            + f" | {s['other_runs']:>5} {s['rss'] / GIB:>7.2f}")  # fmt: skip


# --- draining and the end checks -----------------------------------------------------------


def caught_up(stack: DemoStack, streams: dict[str, Stream]) -> dict[str, bool]:
    """Per source: raw holds every message, the current table reflects the last event, and no
    run of the source is queued or in flight (but its continuous run, which never ends)."""
    runs = active_runs(stack, count_continuous=False)
    out = {}
    for name, stream in streams.items():
        busy = runs is None or sum((runs.get(name) or {}).values()) > 0
        pos = position_ms(stack.warehouse, name)
        out[name] = (
            not busy
            and raw_rows(stack.warehouse, name) >= stream.messages
            and (stream.last_ms is None or (pos is not None and pos >= stream.last_ms - 1))
        )
    return out


def compare_current(warehouse: Path | str, source: str, stream: Stream) -> dict:
    """The current table's live rows against the reference state."""
    from cdc_platform import lake

    uri = lake.TableRef(lake.CURRENT, source, TABLE).uri(warehouse)
    table = lake.read_arrow(uri, columns=[*COLUMN_TYPES, "__deleted"])
    rows = {}
    if table is not None:
        for r in table.to_pylist():
            if not r.pop("__deleted"):
                rows[r["id"]] = r
    expected = stream.state
    missing = sorted(set(expected) - set(rows))
    extra = sorted(set(rows) - set(expected))
    differ = sorted(k for k in set(rows) & set(expected) if rows[k] != expected[k])
    return {
        "expected": len(expected), "live": len(rows), "missing": len(missing),
        "extra": len(extra), "differ": len(differ),
        "examples": [("missing", k, expected[k]) for k in missing[:2]]
        + [("extra", k, rows[k]) for k in extra[:2]]
        + [("differ", k, {"table": rows[k], "reference": expected[k]}) for k in differ[:2]],
        "ok": not (missing or extra or differ),
    }  # fmt: skip


def reconcile(warehouse: Path | str, source: str, produced: int) -> dict:
    """Raw rows against the messages produced, and every raw message's outcome: the first of
    change, control, ddl, quarantine whose table holds its raw coordinates (duckdb over Arrow,
    as `cdc_platform.quality.frames.reconciliation_frame` does in Spark)."""
    import duckdb

    from cdc_platform import lake
    from cdc_platform.formats.canonical import RAW_COORDINATES

    coords = list(RAW_COORDINATES)
    raw = lake.read_arrow(lake.TableRef(lake.RAW, source).uri(warehouse), columns=coords)
    if raw is None:
        return {"raw": 0, "produced": produced, "ok": False, "outcomes": {}, "no_outcome": 0,
                "duplicates": 0, "quarantine_reasons": {}}  # fmt: skip
    outputs = []
    for outcome, uris in (
        ("change", lake.tables_under(warehouse, lake.CHANGELOG, source)),
        ("control", [lake.TableRef(lake.CONTROL, source).uri(warehouse)]),
        ("ddl", lake.tables_under(warehouse, lake.DDL, source)),
        ("quarantine", [lake.TableRef(lake.QUARANTINE, source).uri(warehouse)]),
    ):
        for uri in uris:
            if lake.exists(uri) and set(coords) <= set(lake.arrow_schema(uri).names):
                outputs.append((outcome, lake.read_arrow(uri, columns=coords)))
    con = duckdb.connect()
    key = "concat_ws(chr(31), " + ", ".join(
        f"coalesce(cast(\"{c}\" as varchar), chr(0))" for c in coords
    ) + ")"  # fmt: skip
    con.register("raw", raw)
    union = []
    for i, (outcome, table) in enumerate(outputs):
        con.register(f"out{i}", table)
        rank = ("change", "control", "ddl", "quarantine").index(outcome)
        union.append(f"select {key} as k, {rank} as rank, '{outcome}' as outcome from out{i}")
    outs = " union all ".join(union) or "select null as k, 0 as rank, null as outcome where false"
    rows = con.execute(f"""
        with o as (select k, arg_min(outcome, rank) as outcome from ({outs}) group by k),
             r as (select {key} as k from raw)
        select coalesce(o.outcome, '(none)'), count(*) from r left join o using (k) group by 1
    """).fetchall()  # fmt: skip
    outcomes = dict(rows)
    duplicates = con.execute(f"select count(*) - count(distinct {key}) from raw").fetchall()[0][0]
    reasons = {}
    q = lake.TableRef(lake.QUARANTINE, source).uri(warehouse)
    if lake.exists(q) and "reason" in lake.arrow_schema(q).names:
        con.register("q", lake.read_arrow(q, columns=["reason"]))
        reasons = dict(con.execute("select reason, count(*) from q group by 1 order by 2 desc"
                                   " limit 5").fetchall())  # fmt: skip
    no_outcome = outcomes.get("(none)", 0)
    return {
        "raw": raw.num_rows, "produced": produced, "outcomes": outcomes, "no_outcome": no_outcome,
        "duplicates": duplicates, "quarantine_reasons": reasons,
        "ok": raw.num_rows == produced and no_outcome == 0 and duplicates == 0,
    }  # fmt: skip


def run_summary(stack: DemoStack) -> dict[str, dict]:
    """Per source (or other job): runs by status, run and queue+launch times."""
    out: dict[str, dict] = {}
    for r in stack.runs():
        s = out.setdefault(run_source(r), {"status": Counter(), "run": [], "launch": []})
        s["status"][r["status"]] += 1
        if r.get("startTime"):
            s["launch"].append(r["startTime"] - r["creationTime"])
            if r.get("endTime"):
                s["run"].append(r["endTime"] - r["startTime"])
    return out


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


# --- the plot ------------------------------------------------------------------------------


def plot(samples: list[dict], steps: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def nan(v):
        return float("nan") if v is None else v

    t = [s["t"] / 60 for s in samples]
    fig, (ax_lag, ax_q, ax_rss) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    colors = {FILES: "tab:blue", KAFKA: "tab:orange"}
    offset = {FILES: -0.04, KAFKA: 0.04}  # so that equal counts do not hide each other
    for name in SOURCES:
        xs = [s["sources"][name] for s in samples]
        ax_lag.plot(t, [nan(x["lag"]) for x in xs], color=colors[name], label=name)
        for what, style in (("in_flight", "-"), ("queued", "--")):
            ys = [nan(x[what]) + offset[name] for x in xs]
            ax_q.step(t, ys, where="post", color=colors[name], linestyle=style,
                      label=f"{name} {what.replace('_', ' ')}")  # fmt: skip
    ax_lag.axhline(TARGET_LAG_P95_S, color="red", linewidth=0.8, linestyle=":",
                   label=f"target p95 {TARGET_LAG_P95_S:.0f} s")  # fmt: skip
    ax_lag.set_ylabel("freshness lag (s)")
    ax_q.axhline(1, color="red", linewidth=0.8, linestyle=":", label="target: at most 1")
    ax_q.set_ylabel("runs per source (lines offset)")
    ax_rss.plot(t, [s["rss"] / GIB for s in samples], color="tab:green", label="stack RSS")
    ax_rss.axhline(TARGET_RSS / GIB, color="red", linewidth=0.8, linestyle=":",
                   label="target 8 GiB")  # fmt: skip
    ax_rss.set_ylabel("resident memory (GiB)")
    ax_rss.set_xlabel("minutes since the first step began")
    for step in steps:
        ax_lag.annotate(f"{step['rate']:g}/s", (step["start_t"] / 60, 1), fontsize=7,
                        xycoords=("data", "axes fraction"), va="top")  # fmt: skip
    for ax in (ax_lag, ax_q, ax_rss):
        for step in steps:  # solid: a step's load begins; dotted: its load ends (drain)
            ax.axvline(step["start_t"] / 60, color="grey", linewidth=0.8)
            ax.axvline(step["stop_t"] / 60, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    ax_lag.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------


def check_imports(want_plot: bool) -> None:
    for module, hint in (("confluent_kafka", "pip install -e ."), ("deltalake", "pip install -e ."),
                         ("duckdb", "pip install -e '.[dev]'")):  # fmt: skip
        try:
            __import__(module)
        except ImportError:
            raise StackError(f"{module} is not installed: {hint}") from None
    if want_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise StackError(
                "matplotlib is not installed (the plot needs it): pip install -e '.[bench]', "
                "or pass --plot '' to skip the plot"
            ) from None


def run_step(args, stack: DemoStack, producer, streams: dict[str, Stream], feeds: tuple[str, ...],
             rate: float, index: int, t0: float, samples: list[dict]) -> dict:  # fmt: skip
    """One step: RATE events/s for --minutes, sampled; then the drain, and the tables checked
    against the reference state. Returns what the step's verdict needs."""
    gen = Generator(stack.landing, producer, streams, feeds, rate, args.minutes * 60,
                    args.file_every)  # fmt: skip
    cpu0 = stack.cpu_seconds()
    gen.start()
    start_t = time.time() - t0
    next_sample = time.monotonic()
    while gen.is_alive():
        time.sleep(max(0.0, min(next_sample - time.monotonic(), 1.0)))
        stack.check_alive()
        if time.monotonic() >= next_sample and gen.is_alive():
            samples.append(take_sample(stack, streams, t0, index, "load"))
            print(sample_row(samples[-1]), flush=True)
            next_sample += args.sample_every
    gen.join()
    if gen.error is not None:
        raise gen.error
    cpu = stack.cpu_seconds() - cpu0
    stop_t = gen.ended_at - t0
    load_seconds = gen.ended_at - gen.started_at
    drain_start = time.monotonic()
    done = {n: False for n in SOURCES}
    next_sample = time.monotonic()
    while time.monotonic() - drain_start < args.drain:
        stack.check_alive()
        if time.monotonic() >= next_sample:
            samples.append(take_sample(stack, streams, t0, index, "drain"))
            print(sample_row(samples[-1]), flush=True)
            next_sample += args.sample_every
        done = caught_up(stack, streams)
        if all(done.values()):
            break
        time.sleep(5)
    drained = time.monotonic() - drain_start
    samples.append(take_sample(stack, streams, t0, index, "end"))
    print(sample_row(samples[-1]), flush=True)
    step = {"index": index, "rate": rate, "events": gen.emitted, "start_t": start_t,
            "stop_t": stop_t, "load_seconds": load_seconds, "cpu": cpu, "drained": drained,
            "caught_up": all(done.values()), "sources": {}}  # fmt: skip
    mine = [x for x in samples if x["step"] == index]
    step["rss"] = max(x["rss"] for x in mine)
    for name in feeds:
        xs = [x["sources"][name] for x in mine if x["graphql_ok"]]
        load = [x for x in mine if x["phase"] == "load"]
        lags = [x["sources"][name]["lag"] for x in load if x["t"] - start_t >= args.settle]
        if not lags:  # a step shorter than the settling time: every sample counts
            lags = [x["sources"][name]["lag"] for x in load]
        lags = [x for x in lags if x is not None]
        cmp = compare_current(stack.warehouse, name, streams[name])
        rec = reconcile(stack.warehouse, name, streams[name].messages)
        step["sources"][name] = {
            "rate": rate / len(feeds),
            "max_queued": max((x["queued"] for x in xs), default=0),
            "max_in_flight": max((x["in_flight"] for x in xs), default=0),
            "lag_p95": p95(lags) if lags else None,
            "lag_median": statistics.median(lags) if lags else None,
            "lag_max": max(lags, default=None),
            "lag_samples": len(lags),
            "compare": cmp, "reconcile": rec,
        }  # fmt: skip
    return step


def step_verdicts(step: dict) -> dict[str, dict[str, bool]]:
    """Per fed source: lag, queue and correctness verdicts of a step."""
    out = {}
    for name, x in step["sources"].items():
        out[name] = {
            "lag": x["lag_p95"] is not None and x["lag_p95"] <= TARGET_LAG_P95_S,
            "queue": x["max_queued"] <= TARGET_QUEUED and x["max_in_flight"] <= TARGET_IN_FLIGHT,
            "correct": step["caught_up"] and x["compare"]["ok"] and x["reconcile"]["ok"],
        }
    return out


def print_step(step: dict) -> None:
    verdicts = step_verdicts(step)
    load = step["load_seconds"]
    print(f"\nstep {step['index']}: {step['rate']:g} events/s asked, {step['events']} events in "
          f"{load:.0f} s ({step['events'] / load:.0f}/s); stack CPU {step['cpu']:.0f} s "
          f"({step['cpu'] / load:.2f} cores) under load; RSS max {step['rss'] / GIB:.2f} GiB; "
          f"drained in {step['drained']:.0f} s"
          f"{'' if step['caught_up'] else ' (NOT caught up)'}")  # fmt: skip
    nan = float("nan")
    for name, x in step["sources"].items():
        v = verdicts[name]
        lag = [nan if x[k] is None else x[k] for k in ("lag_p95", "lag_median", "lag_max")]
        print(
            f"  {name:<10} {x['rate']:g}/s: lag p95 {lag[0]:.1f} s ({verdict(v['lag'])}), "
            f"median {lag[1]:.1f}, max {lag[2]:.1f} ({x['lag_samples']} samples); max queued "
            f"{x['max_queued']}, in flight {x['max_in_flight']} ({verdict(v['queue'])})"
        )
        cmp, rec = x["compare"], x["reconcile"]
        print(f"  {'':<10} current: {cmp['live']} live rows vs {cmp['expected']} expected, "
              f"{cmp['missing']} missing, {cmp['extra']} extra, {cmp['differ']} differ; raw "
              f"{rec['raw']} of {rec['produced']} messages, {rec['duplicates']} duplicates, "
              f"{rec['no_outcome']} without an outcome ({verdict(v['correct'])})")  # fmt: skip
        for example in cmp["examples"]:
            print(f"  {'':<10}   e.g. {example}")
        if rec["quarantine_reasons"]:
            print(f"  {'':<10}   quarantined: {rec['quarantine_reasons']}")


def print_sweep(steps: list[dict], feeds: tuple[str, ...]) -> None:
    print(
        f"\nsweep (targets: lag p95 <= {TARGET_LAG_P95_S:.0f} s after the first "
        f"settling seconds of each step, at most {TARGET_QUEUED} run queued and "
        f"{TARGET_IN_FLIGHT} in flight per source, tables equal to the reference):"
    )
    cells = " ".join(f"| {n:<10} {'p95 s':>6} {'q':>2} {'ok':>3}" for n in feeds)
    print(f"{'events/s':>9} {cells} | {'cores':>5} {'RSS GiB':>7}")
    for step in steps:
        verdicts = step_verdicts(step)
        cells = []
        for name in feeds:
            x, v = step["sources"][name], verdicts[name]
            p = "?" if x["lag_p95"] is None else f"{x['lag_p95']:.1f}"
            cells.append(f"| {x['rate']:<10g} {p:>6} {x['max_queued']:>2} "
                         f"{'yes' if all(v.values()) else 'NO':>3}")  # fmt: skip
        print(
            f"{step['rate']:>9g} "
            + " ".join(cells)
            + f" | {step['cpu'] / step['load_seconds']:>5.2f} {step['rss'] / GIB:>7.2f}"
        )
    for name in feeds:
        good = [s["sources"][name]["rate"] for s in steps if all(step_verdicts(s)[name].values())]
        best = f"{max(good):g} events/s" if good else "none of the steps"
        print(f"highest rate meeting every target, {name}: {best}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10,
                        help="how long the generator runs, per step")  # fmt: skip
    parser.add_argument("--rate", type=float, default=1000, help="events per second, in all")
    parser.add_argument(
        "--sweep", default="",
        help="rates (events/s, in all) to run one after another, e.g. 1000,2000,5000,10000",
    )  # fmt: skip
    parser.add_argument("--transports", choices=("both", "files", "kafka"), default="both",
                        help="which sources the generator feeds (both: half each)")  # fmt: skip
    parser.add_argument(
        "--keep-going", action="store_true",
        help="run a sweep's later steps after a step misses a target",
    )  # fmt: skip
    parser.add_argument("--keys", type=int, default=20_000, help="key space of each source")
    parser.add_argument("--file-every", type=float, default=5, help="seconds between files")
    parser.add_argument("--sample-every", type=float, default=10, help="seconds between samples")
    parser.add_argument("--drain", type=float, default=300, help="most seconds to catch up")
    parser.add_argument(
        "--settle", type=float, default=120,
        help="seconds of each step's load left out of the lag target (warm-up, rate change)",
    )  # fmt: skip
    parser.add_argument(
        "--sensor-interval", type=int, default=None,
        help="seconds; default: the demo catalog's (sources.yaml) per transport",
    )  # fmt: skip
    parser.add_argument(
        "--plot", default=str(ROOT / "docs" / "soak.png"), help="PNG to write; '' for none"
    )
    parser.add_argument(
        "--runs", choices=RUN_MODES, default="demo",
        help="the sources run as the demo's do (default), a run per batch, or continuously",
    )  # fmt: skip
    parser.add_argument(
        "--max-records", type=int, default=None,
        help="the Kafka source's max_records (a run's or micro-batch's bound); default the demo's",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--local-session", action="store_true",
        help="no Spark Connect server: each run starts its own local Spark",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, tables)")
    args = parser.parse_args()
    try:
        rates = [float(r) for r in args.sweep.split(",") if r.strip()] or [args.rate]
    except ValueError:
        parser.error(f"--sweep takes rates separated by commas, not {args.sweep!r}")
    if any(r <= 0 for r in rates):
        parser.error("rates must be above 0")
    feeds = SOURCES if args.transports == "both" else (FILES if args.transports == "files"
                                                        else KAFKA,)  # fmt: skip
    install_signal_handlers()
    plot_path = Path(args.plot) if args.plot else None
    if plot_path is not None and not plot_path.is_absolute():
        plot_path = Path.cwd() / plot_path

    try:
        check_imports(plot_path is not None)
        check_prerequisites()
    except StackError as e:
        sys.exit(f"soak: error: {e}")
    work = Path(tempfile.mkdtemp(prefix="cdc-soak-"))
    stack = None
    correct = False
    samples: list[dict] = []
    steps: list[dict] = []
    try:
        demo = demo_settings()
        interval = {t: args.sensor_interval or demo["interval"].get(t, 15)
                    for t in ("files", "kafka")}  # fmt: skip
        bootstrap = f"127.0.0.1:{free_port()}"
        catalog = write_catalog(
            work / "sources.yaml", bootstrap=bootstrap, files_source=FILES, kafka_source=KAFKA,
            column_types=COLUMN_TYPES, interval=interval, spark=demo["spark"],
            max_records=args.max_records or demo["max_records"],
            continuous=continuous_settings(args.runs, demo),
        )  # fmt: skip
        stack = DemoStack(work, catalog, spark_connect=not args.local_session)
        t_start = time.monotonic()
        stack.start(bootstrap)
        create_topic(bootstrap)
        spark = f"Spark Connect server {stack.spark_url}" if stack.spark_url else "local sessions"
        print(f"stack up in {time.monotonic() - t_start:.0f} s: broker {bootstrap}, {spark}, "
              f"dagster dev {stack.url}; dagster.yaml: {stack.dagster_yaml}; sensor intervals "
              f"{interval}; work {work}", flush=True)  # fmt: skip
        print(f"generator: {', '.join(f'{r:g}' for r in rates)} events/s to {', '.join(feeds)}, "
              f"{args.minutes:g} min a step, over {args.keys} keys per source; a landing file "
              f"every {args.file_every:g} s\n", flush=True)  # fmt: skip
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})
        streams = {FILES: Stream(args.keys, random.Random(args.seed)),
                   KAFKA: Stream(args.keys, random.Random(args.seed + 1))}  # fmt: skip
        t0 = time.time()
        print(HEADER, flush=True)
        for index, rate in enumerate(rates, 1):
            step = run_step(args, stack, producer, streams, feeds, rate, index, t0, samples)
            steps.append(step)
            print_step(step)
            verdicts = step_verdicts(step)
            if not all(v["correct"] for v in verdicts.values()):
                print("the tables are not right: the sweep stops here")
                break
            if not args.keep_going and not all(all(v.values()) for v in verdicts.values()):
                if index < len(rates):
                    print("a target is missed: the sweep stops here (--keep-going runs on)")
                break
            print(HEADER, flush=True)
        print_sweep(steps, feeds)
        print_runs(stack)
        correct = all(v["correct"] for s in steps for v in step_verdicts(s).values())
        if plot_path is not None and samples:
            asked = ", ".join(f"{s['rate']:g}" for s in steps)
            title = (f"soak: {asked} events/s to "
                     f"{', '.join(feeds)}, {args.minutes:g} min a step, "
                     f"{'local sessions' if args.local_session else 'Spark Connect'}, "
                     f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip
            plot(samples, steps, plot_path, title)
            print(f"plot: {plot_path}")
    except StackError as e:
        print(f"soak: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        print("soak: interrupted", file=sys.stderr)
    finally:
        (work / "samples.json").write_text(json.dumps(samples, indent=1))
        if stack is not None:
            stack.stop()
        if args.keep or not correct:
            print(f"work folder (logs, tables, samples.json): {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    # 0: every step ran and its tables are right (performance verdicts are printed only)
    sys.exit(0 if correct else 1)


def print_runs(stack: DemoStack) -> None:
    print("\nruns:")
    for source, s in sorted(run_summary(stack).items()):
        status = ", ".join(f"{k.lower()} {v}" for k, v in sorted(s["status"].items()))
        runs = (f"run median {statistics.median(s['run']):.1f} s, max {max(s['run']):.1f} s"
                if s["run"] else "no finished run")  # fmt: skip
        launch = (f"queue+launch median {statistics.median(s['launch']):.1f} s, "
                  f"max {max(s['launch']):.1f} s" if s["launch"] else "")  # fmt: skip
        print(f"  {source:<40} {status}; {runs}; {launch}")


if __name__ == "__main__":
    main()
