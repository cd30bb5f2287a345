"""Where a step's wall time goes: named phases, summed per step.

A step opens ``recorded()``; code anywhere below it marks its phases with ``phase(name)``
(outside a recording a phase costs one clock read and records nothing). A phase named
``a/b`` lies within phase ``a``. The Dagster layer logs
each step's phases and keeps them in its metadata (``seconds_by_phase``), so a run's profile is
in its event log: ``bench/live_profile.py`` reads it from there.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_phases: ContextVar[dict[str, float] | None] = ContextVar("phases", default=None)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` (added to what it already took in this recording)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds = _phases.get()
        if seconds is not None:
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def recorded() -> Iterator[dict[str, float]]:
    """Collect the phases timed inside the block: phase -> seconds, in the order first seen."""
    seconds: dict[str, float] = {}
    token = _phases.set(seconds)
    try:
        yield seconds
    finally:
        _phases.reset(token)


def rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {name: round(s, 3) for name, s in seconds.items()}
