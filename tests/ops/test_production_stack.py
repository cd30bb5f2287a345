"""The production profile end to end (docs/deploying.md): `dagster-daemon run` and
`dagster-webserver` on a DAGSTER_HOME holding deploy/dagster-production.yaml (runs, events,
schedules and sensor cursors on the test's PostgreSQL), a catalog whose warehouse is a bucket of
the test's S3 server (SeaweedFS), one Kafka source on a broker the test started (Tansu, external
to the platform), and Spark on a standalone master with two workers. Records produced to the
topic reach the current table through the source's sensor and its ingest runs (the queue, the
WarmRunLauncher, a Spark driver per run on the cluster). The Dagster processes are stopped and
started again: the runs are still there, succeeded, and a second batch goes through."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from cdc_platform import lake
from cdc_platform.processes import in_sessions, signal_group
from tests.conftest import SPARK_CONF
from tests.kafka.test_kafka_ingest import _produce, _topic
from tests.ops.live_stack import free_port
from tests.spark.test_standalone_cluster import (  # noqa: F401  (cluster: the fixture)
    JVM_OPTIONS,
    _master_state,
    cluster,
)

pytestmark = [pytest.mark.postgres, pytest.mark.s3, pytest.mark.jvm]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SOURCE, TABLE = "shop", "customers"
JOB = f"{SOURCE}__ingest"
TIMEOUT = 900  # a wait; a run (a Spark driver, two executors) took 7 min at load 16 on 2 cores
UNFINISHED = {dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.QUEUED,
              dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
              dg.DagsterRunStatus.CANCELING}  # fmt: skip


def _change(op: str, pos: int, before: dict | None = None, after: dict | None = None) -> dict:
    """A Debezium (MySQL) change of inventory.customers, made now, as a Kafka record: JSON key
    and value."""
    now = int(time.time() * 1000)
    source = {"db": "inventory", "table": TABLE, "file": "mysql-bin.000001", "pos": pos,
              "row": 0, "ts_ms": now}  # fmt: skip
    value = {"before": before, "after": after, "op": op, "source": source, "ts_ms": now}
    key = {"id": (after or before)["id"]}
    return {"key": json.dumps(key).encode(), "value": json.dumps(value).encode(),
            "timestamp": now}  # fmt: skip


def _current(warehouse: str) -> list[tuple] | None:
    table = lake.read_arrow(lake.TableRef("current", SOURCE, TABLE).uri(warehouse))
    if table is None:
        return None
    return sorted((r["id"], r["name"]) for r in table.to_pylist() if not r["__deleted"])


def _failures(instance: dg.DagsterInstance) -> list[str]:
    """Each failed run's step failures (the product's error text), else its run failure."""
    found = []
    for run in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])):
        steps = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE
        ).records
        events = [r.event_log_entry.dagster_event for r in steps]
        if not events:
            events = [
                r.event_log_entry.dagster_event
                for r in instance.get_records_for_run(
                    run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE
                ).records
            ]
        for e in events:
            error = e.event_specific_data and getattr(e.event_specific_data, "error", None)
            text = error.to_string() if error else e.message
            found.append(f"{run.job_name} {run.run_id[:8]} {e.step_key}: {text}")
    return found


def _failed_checks(instance: dg.DagsterInstance, run_ids) -> list[str]:
    found = []
    for run_id in run_ids:
        for record in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        ).records:
            check = record.event_log_entry.dagster_event.event_specific_data
            if not check.passed:
                found.append(f"{check.asset_key.to_user_string()} {check.check_name}")
    return found


def _quiet(instance: dg.DagsterInstance, settle: float = 0) -> bool:
    """No run unfinished. ``settle``: nor ended in the last ``settle`` seconds (the automation
    sensor ticks every 15 s and may ask for one more), and not from 5 s before to 15 s after a
    */5 boundary, when the freshness schedule creates its run: a stop could cut one short."""
    now = time.time()
    return (not settle or 15 < now % 300 < 295) and all(
        r.dagster_run.status not in UNFINISHED and now - (r.end_time or now) >= settle
        for r in instance.get_run_records()
    )


class Dagster:
    """`dagster-daemon run` and `dagster-webserver` from the checkout (workspace.yaml), each in
    a process group of its own; their output in ``logs``."""

    def __init__(self, env: dict[str, str], logs: Path, port: int) -> None:
        self.logs, self.port = logs, port
        argv = {
            "daemon": [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            "webserver": [str(BIN / "dagster-webserver"), "-w", "workspace.yaml",
                          "-h", "127.0.0.1", "-p", str(port)],
        }  # fmt: skip
        self.procs = {}
        for name, args in argv.items():
            with (logs / f"{name}.log").open("ab") as out:
                self.procs[name] = subprocess.Popen(
                    args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip

    def tails(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    def wait(self, instance: dg.DagsterInstance, what, why: str):
        deadline = time.monotonic() + TIMEOUT
        while not (got := what()):
            failed = _failures(instance)
            assert not failed, "\n\n".join(failed)
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited {proc.returncode}: {self.tails()}"
            assert time.monotonic() < deadline, f"{why} after {TIMEOUT} s: {self.tails()}"
            time.sleep(2)
        return got

    def graphql_runs(self) -> dict[str, str]:
        """The runs the webserver lists (its GraphQL API): run id -> status."""
        query = "{ runsOrError { ... on Runs { results { runId status } } } }"
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/graphql",
            data=json.dumps({"query": query}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            results = json.load(response)["data"]["runsOrError"]["results"]
        return {r["runId"]: r["status"] for r in results}

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=5)
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to both groups at once (SIGKILL after 30 s); then nothing of their sessions
        may be left: no code server, forkserver, run or Spark driver."""
        for proc in self.procs.values():
            signal_group(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        sessions = {proc.pid for proc in self.procs.values()}
        deadline = time.monotonic() + 10
        while (left := in_sessions(sessions)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"still running after the stop: {left}"


def test_the_production_stack_ingests_kafka_to_s3_and_keeps_its_runs_across_a_restart(
    cluster,  # noqa: F811  (the fixture imported above)
    postgres_server,
    s3_server,
    s3_bucket,
    kafka_bootstrap,
    tmp_path,
    monkeypatch,
):
    started = time.monotonic()
    url, webui = cluster
    home, logs = tmp_path / "dagster_home", tmp_path / "logs"
    home.mkdir()
    logs.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster-production.yaml", home / "dagster.yaml")
    topic = _topic(kafka_bootstrap, "production")
    warehouse = f"s3://{s3_bucket}/warehouse"
    spark_conf = {
        # The executors connect back to the driver (the run's JVM) on loopback.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        "spark.locality.wait": "0s",
        **SPARK_CONF,
    }
    table = {"name": TABLE, "source_table": f"inventory.{TABLE}", "primary_key": ["id"],
             "column_types": {"id": "bigint", "name": "string"}}  # fmt: skip
    kafka = {"bootstrap_servers": kafka_bootstrap, "topics": [topic], "idle_timeout_seconds": 2}
    catalog = {
        "warehouse": warehouse,
        "landing": f"s3://{s3_bucket}/landing",
        "spark": {"master": url, "conf": spark_conf},
        "sources": [{"name": SOURCE, "transport": "kafka", "format": "debezium",
                     "kafka": kafka, "tables": [table]}],
    }  # fmt: skip
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump(catalog))

    # Every Dagster process (and the runs it launches) gets the deployment's variables, nothing
    # of this process's CDC_/SPARK_/DAGSTER_/AWS_ settings.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CDC_", "SPARK_", "DAGSTER_", "AWS_"))}  # fmt: skip
    env |= postgres_server.env() | s3_server.env()
    env |= {"DAGSTER_HOME": str(home), "CDC_SOURCES": str(tmp_path / "sources.yaml"),
            "SPARK_LOCAL_IP": "127.0.0.1", "JAVA_TOOL_OPTIONS": JVM_OPTIONS}  # fmt: skip
    for key, value in env.items():
        if key.startswith(("DAGSTER_", "AWS_")):
            monkeypatch.setenv(key, value)  # this process reads the same instance and bucket
    migrate = subprocess.run(
        [str(BIN / "dagster"), "instance", "migrate"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-3000:]

    first_batch = [
        _change("c", 1, after={"id": 1, "name": "ann"}),
        _change("c", 2, after={"id": 2, "name": "bob"}),
        _change("c", 3, after={"id": 3, "name": "cy"}),
    ]
    port = free_port()
    dagster = Dagster(env, logs, port)
    try:
        with dg.DagsterInstance.get() as instance:
            _produce(kafka_bootstrap, topic, first_batch)
            want = [(1, "ann"), (2, "bob"), (3, "cy")]
            dagster.wait(instance, lambda: _current(warehouse) == want, f"current is not {want}")
            dagster.wait(instance, lambda: _quiet(instance, settle=16), "runs still in flight")
            first = time.monotonic()
            before = {r.run_id: r for r in instance.get_runs()}
            assert JOB in {r.job_name for r in before.values()}
            assert {r.status for r in before.values()} == {dg.DagsterRunStatus.SUCCESS}
            # The ingest runs were the Kafka sensor's requests.
            assert {r.tags.get("dagster/sensor_name") for r in before.values()
                    if r.job_name == JOB} == {f"{SOURCE}__kafka_sensor"}  # fmt: skip

            dagster.stop()
            # Records that arrive while Dagster is down are taken up by the restarted daemon.
            second_batch = [
                _change("u", 4, before={"id": 2, "name": "bob"}, after={"id": 2, "name": "bo"}),
                _change("d", 5, before={"id": 3, "name": "cy"}),
                _change("c", 6, after={"id": 4, "name": "dee"}),
            ]
            _produce(kafka_bootstrap, topic, second_batch)
            dagster = Dagster(env, logs, port)
            dagster.wait(instance, dagster.answers, "no webserver")
            restart = time.monotonic()
            # The restarted webserver lists the runs of before the stop, succeeded.
            listed = dagster.graphql_runs()
            assert {i: listed.get(i) for i in before} == dict.fromkeys(before, "SUCCESS")

            want = [(1, "ann"), (2, "bo"), (4, "dee")]
            dagster.wait(instance, lambda: _current(warehouse) == want, f"current is not {want}")
            dagster.wait(instance, lambda: _quiet(instance), "runs still in flight")
            after = {r.run_id: r for r in instance.get_runs()}
            assert before.keys() < after.keys()
            assert {after[i].status for i in before} == {dg.DagsterRunStatus.SUCCESS}
            new = [after[i] for i in after.keys() - before.keys()]
            assert JOB in {r.job_name for r in new}
            assert {r.status for r in new} == {dg.DagsterRunStatus.SUCCESS}
            # The ingest runs' quality and freshness checks passed (the freshness schedule's
            # may have run before the first merge: it then fails, rightly).
            ingest_runs = [i for i, r in after.items() if r.job_name == JOB]
            assert _failed_checks(instance, ingest_runs) == []
    finally:
        dagster.stop()
    assert not list(home.rglob("*.db"))  # no SQLite storage beside the instance file

    # Every run's Spark application ran on the cluster, an executor on each worker.
    state = _master_state(webui)
    apps = state["activeapps"] + state["completedapps"]
    assert apps and {a["cores"] for a in apps} == {2}, apps
    phases = [first - started, restart - first, time.monotonic() - restart]
    print("production stack: first batch, restart, second batch and stop: "
          + ", ".join(f"{s:.0f} s" for s in phases))  # fmt: skip
