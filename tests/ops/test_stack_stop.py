"""`cdc-platform up` (what `make demo` runs) stops cleanly: Ctrl-C or SIGTERM while runs are in
flight ends every process it started, the Spark Connect server's JVM included, frees every port,
leaves no run "started" (the run it interrupted ends canceled), and the next start comes up.
The real stack: broker, Spark server, `dagster dev`, the demo's traffic. A Spark server killed
under runs in flight (started again, the runs retry and succeed) is the fault suite's
(tests/ops/test_faults.py)."""

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
    batch, so that the stop meets runs the queue launched, in a Spark step."""
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
def test_the_stack_stops_on_ctrl_c_and_sigterm_with_runs_in_flight(tmp_path, stacks):
    ports = free_ports()
    _catalog(tmp_path, ports["broker-port"])
    home = tmp_path / "home"

    up = Up(tmp_path, ports, "--no-warm-up", "--every", "5")
    stacks.append(up)
    up.wait_for(lambda: "Dagster UI" in up.text(), 300, "no Dagster UI")
    in_flight: list[dg.DagsterRun] = []

    def in_normalize() -> bool:  # a Spark step with the merge still to come: not about to end
        run = running_step(home, "changelog")
        in_flight[:] = [run] if run else []
        return bool(in_flight)

    up.wait_for(in_normalize, 240, "no run in a Spark step to stop")
    tree = up.stop(signal.SIGINT)  # what a terminal's Ctrl-C sends it

    assert up.proc.returncode == 0
    assert {"tansu", "java"} <= set(up.names)  # the broker, the Spark server's JVM, ...
    assert alive(tree) == []
    assert in_sessions(up.sessions) == []  # nor anything started while it stopped
    assert all(bindable(p) for p in ports.values()), {n: bindable(p) for n, p in ports.items()}
    all_runs = runs_of(home)
    assert not [r.run_id for r in all_runs if r.status in UNFINISHED]
    # The run the stop interrupted is canceled, as a stop asked for, not failed "unexpectedly".
    status = {r.run_id: r.status for r in all_runs}
    assert status[in_flight[0].run_id] == dg.DagsterRunStatus.CANCELED

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
