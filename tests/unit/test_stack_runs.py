"""What ``cdc-platform up`` does with the runs its stop left unfinished: a run the daemon launched
on its way out, whose process was killed before it could report, is marked canceled instead of
showing as starting for good (the stack test met it)."""

from pathlib import Path

import dagster as dg

from cdc_platform.stack import Settings, Stack


def test_runs_left_in_flight_by_a_stop_are_canceled(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")  # the default instance: runs in <home>/history
    statuses = {
        "starting": dg.DagsterRunStatus.STARTING,
        "started": dg.DagsterRunStatus.STARTED,
        "not_started": dg.DagsterRunStatus.NOT_STARTED,
        "done": dg.DagsterRunStatus.SUCCESS,
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for name, status in statuses.items():
            instance.add_run(dg.DagsterRun(job_name=name, run_id=f"run-{name}", status=status))

    settings = Settings(
        sources=tmp_path / "sources.yaml", home=home, logs=tmp_path, reports=tmp_path
    )
    Stack(settings)._end_runs_left_in_flight()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        after = {r.job_name: r.status for r in instance.get_runs()}
    assert after == {
        "starting": dg.DagsterRunStatus.CANCELED,
        "started": dg.DagsterRunStatus.CANCELED,
        "not_started": dg.DagsterRunStatus.NOT_STARTED,
        "done": dg.DagsterRunStatus.SUCCESS,
    }
