"""`cdc-platform up` (what `make demo` runs) survives a Spark server killed under runs in flight
(restarted; the runs retry and succeed) and stops cleanly: Ctrl-C or SIGTERM while runs are in
flight ends every process it started, the Spark Connect server's JVM included, frees every port,
leaves no run "started", and the next start comes up. The real stack: broker, Spark server,
`dagster dev`, the demo's traffic."""

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from cdc_platform.processes import in_sessions
from tests.ops.live_stack import (
    ROOT,
    UNFINISHED,
    Up,
    alive,
    bindable,
    free_ports,
    running_step,
)
from tests.ops.live_stack import runs as runs_of


def _catalog(work: Path, broker_port: int) -> Path:
    """The demo catalog on ``work``, its Kafka source on the test's broker port, with a run per
    batch (whose runs end, as the Spark server's kill below needs; a continuous run waits out
    the same failures in place, tests/kafka/test_continuous.py)."""
    catalog = yaml.safe_load((ROOT / "sources.yaml").read_text())
    catalog["warehouse"], catalog["landing"] = str(work / "warehouse"), str(work / "landing")
    for source in catalog["sources"]:
        source.pop("continuous", None)
        if source.get("kafka"):
            source["kafka"]["bootstrap_servers"] = f"127.0.0.1:{broker_port}"
    (work / "dbt_like_models").symlink_to(ROOT / "dbt_like_models")
    path = work / "sources.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def stacks() -> Iterator[list[Up]]:
    """The stacks a test starts, stopped (SIGTERM, then SIGKILL) when a failed test left them."""
    started: list[Up] = []
    yield started
    for up in started:
        up.ensure_stopped()


@pytest.mark.jvm
def test_the_stack_survives_a_killed_spark_server_and_stops_on_ctrl_c_and_sigterm(tmp_path, stacks):
    ports = free_ports()
    _catalog(tmp_path, ports["broker-port"])
    home = tmp_path / "home"

    up = Up(tmp_path, ports, "--no-warm-up", "--every", "5")
    stacks.append(up)
    up.wait_for(lambda: "Dagster UI" in up.text(), 300, "no Dagster UI")
    up.wait_for(
        lambda: running_step(home, "changelog") or running_step(home, "current"),
        240,
        "no run in a Spark step",
    )

    # The Spark server killed under a run in a Spark step: it is started again, and the source
    # runs in flight succeed on the new one: the client's bounded retries reach it, or the step
    # is retried (defs/transient.py; which of the two depends on the call in flight).
    java = up.processes("java")
    in_flight = [r.run_id for r in runs_of(home) if r.status in UNFINISHED and
                 r.job_name.endswith("__ingest")]  # fmt: skip
    assert in_flight
    os.kill(java[0], signal.SIGKILL)
    up.wait_for(lambda: "Spark Connect server exited" in up.text(), 30, "no restart")
    up.wait_for(
        lambda: all(r.is_finished for r in runs_of(home) if r.run_id in in_flight),
        300,
        "the runs in flight at the kill did not end",
    )
    ended = {r.run_id: r.status for r in runs_of(home) if r.run_id in in_flight}
    assert set(ended.values()) == {dg.DagsterRunStatus.SUCCESS}, ended

    up.wait_for(
        lambda: any(r.status == dg.DagsterRunStatus.STARTED for r in runs_of(home)),
        120,
        "no run in flight to stop",
    )
    tree = up.stop(signal.SIGINT)  # what a terminal's Ctrl-C sends it

    assert up.proc.returncode == 0
    assert {"tansu", "java"} <= set(up.names)  # the broker, the Spark server's JVM, ...
    assert alive(tree) == []
    assert in_sessions(up.sessions) == []  # nor anything started while it stopped
    assert all(bindable(p) for p in ports.values()), {n: bindable(p) for n, p in ports.items()}
    all_runs = runs_of(home)
    assert not [r.run_id for r in all_runs if r.status in UNFINISHED]
    assert any(
        r.status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED) for r in all_runs
    )  # fmt: skip  (the run in flight)

    # The next start comes up on the same ports and instance; SIGTERM stops it too.
    again = Up(tmp_path, ports, "--no-spark-server", "--every", "5")
    stacks.append(again)
    again.wait_for(lambda: "Dagster UI" in again.text(), 300, "no Dagster UI the second time")
    again.wait_for(lambda: not bindable(ports["port"]), 120, "the UI's port not taken")
    tree = again.stop(signal.SIGTERM)
    assert again.proc.returncode == 0
    assert alive(tree) == []
    assert in_sessions(again.sessions) == []
    assert all(bindable(p) for p in ports.values())
