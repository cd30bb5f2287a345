"""Stopping a child started in its own process group (``start_new_session=True``): a Spark
server or worker is a shell that execs a JVM, and an executor is the JVM's child, so the whole
group is signalled, not just the process we started."""

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace: float = 30) -> bool:
    """SIGTERM to the process group of ``proc``, SIGKILL when it has not ended after ``grace``
    seconds. Returns whether it ended without SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            proc.poll()  # the group is gone: reap ours
            return sig == signal.SIGTERM
        try:
            proc.wait(timeout=wait)
            return sig == signal.SIGTERM
        except subprocess.TimeoutExpired:
            continue
    return False
