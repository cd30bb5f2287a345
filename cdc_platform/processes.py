"""Stopping children and finding process trees. A child started in its own process group
(``start_new_session=True``) is stopped as a group: a Spark server or worker is a shell that execs
a JVM, and an executor is the JVM's child, so the whole group is signalled, not just the process
we started."""

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path


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


def stat(pid: int | str) -> tuple[int, int, str, int] | None:
    """(parent pid, start time in clock ticks, state letter, session id) of a process, None when
    there is none (Linux /proc: the start time tells a reused pid apart; state Z is a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0], int(fields[3])


def proc_table() -> dict[int, tuple[int, int, str, int]]:
    """pid -> ``stat(pid)`` of every process now."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (found := stat(entry.name)) is not None:
            out[int(entry.name)] = found
    return out


def in_sessions(sessions: set[int]) -> list[int]:
    """The live processes (not zombies) whose session is one of ``sessions``: a child started
    with ``start_new_session=True`` leads a session that its descendants keep unless they start
    their own, even after their parents ended."""
    return [pid for pid, s in proc_table().items() if s[3] in sessions and s[2] != "Z"]


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads, if it still exists."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(roots: Iterable[int]) -> dict[int, int]:
    """The roots and every process below them: pid -> start time (to tell a reused pid)."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found
