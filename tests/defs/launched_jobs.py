"""Jobs the run-launcher test launches: importable by module name, as a run's code origin is."""

import os
import time
from pathlib import Path

import dagster as dg


@dg.op(config_schema={"out": str})
def write_pid(context: dg.OpExecutionContext) -> None:
    Path(context.op_config["out"]).write_text(str(os.getpid()))


@dg.op(config_schema={"out": str})
def wait_long(context: dg.OpExecutionContext) -> None:
    Path(context.op_config["out"]).write_text(str(os.getpid()))
    time.sleep(120)


@dg.job(executor_def=dg.in_process_executor)
def writes_its_pid() -> None:
    write_pid()


@dg.job(executor_def=dg.in_process_executor)
def waits() -> None:
    wait_long()
