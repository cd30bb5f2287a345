"""Fuzzing every format: random bytes, truncated and mutated valid messages.

Per format (and ``auto`` over all of them): no run crashes, every raw message lands in a change
log, the control or DDL log, or the quarantine (the reconciliation check passes), every
quarantine row has a reason, and random bytes and truncated messages are quarantined.
Each example is one Spark run (10-25 s on a busy machine), so by default one ``auto`` run mixes
mutated messages of every format (each reaches its own parser when detection still claims it),
once. ``QUALITY_FUZZ_EXAMPLES`` sets the examples per run, ``QUALITY_FUZZ_FORMATS`` the runs:
``all`` (auto and each format forced, which reaches a parser even with what detection would
refuse) or a comma-separated list.
"""

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.quality import validations
from cdc_platform.steps.changelog import normalize_source
from cdc_platform.steps.raw import ingest_files
from tests.quality.corpus import messages

pytestmark = pytest.mark.spark
DATE = "2026-03-01"
POOL = messages()
EXAMPLES = int(os.environ.get("QUALITY_FUZZ_EXAMPLES", "1"))
_FORMATS = os.environ.get("QUALITY_FUZZ_FORMATS", "auto")
FORMATS = ["auto", *POOL] if _FORMATS == "all" else _FORMATS.split(",")


@st.composite
def mutated(draw, valid: list[bytes]) -> tuple[str, bytes | None]:
    """(what was done, the message value)."""
    base = draw(st.sampled_from(valid))
    how = draw(st.sampled_from(["keep", "truncate", "flip", "noise", "splice", "tombstone"]))
    if how == "keep":
        return how, base
    if how == "truncate":
        return how, base[: draw(st.integers(1, max(1, len(base.rstrip()) - 1)))]
    if how == "flip":
        i = draw(st.integers(0, len(base) - 1))
        return how, base[:i] + bytes([base[i] ^ draw(st.integers(1, 255))]) + base[i + 1 :]
    if how == "noise":
        return how, b"\xff" + draw(st.binary(min_size=0, max_size=64))
    if how == "splice":  # valid JSON of the wrong shape, or another message's middle
        other = draw(st.sampled_from(valid))
        cut = draw(st.integers(0, len(other)))
        return how, base[: len(base) // 2] + other[cut:]
    return how, None


def _land(path: Path, values: list[bytes | None]) -> None:
    lines = []
    for offset, v in enumerate(values):
        env = {"topic": "fz", "partition": 0, "offset": offset, "timestamp": 1700000000000}
        if v is None:
            env["value"] = None
        else:
            env["value_b64"] = base64.b64encode(v).decode()
        lines.append(json.dumps(env))
    path.write_text("\n".join(lines) + "\n")


def _check(spark, fmt: str, batch: list[tuple[str, bytes | None]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        _check_in(spark, root / "warehouse", fmt, batch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_in(spark, warehouse: Path, fmt: str, batch: list[tuple[str, bytes | None]]) -> None:
    landing = warehouse.parent / "m.kafka.jsonl"
    _land(landing, [v for _, v in batch])
    source = SourceConfig(name="fz", format=fmt)
    ingest_files(warehouse, "fz", [(landing, landing.name)], DATE, whole_date=True)
    normalize_source(spark, warehouse, source, [DATE])  # must not raise
    assert lake.row_count(lake.TableRef(lake.RAW, "fz").uri(warehouse)) == len(batch)
    run = validations.validate_reconciliation(spark, warehouse, source, [DATE])
    assert run.success, run.rule("raw_messages_accounted").sample
    quarantine = lake.read_arrow(lake.TableRef(lake.QUARANTINE, "fz").uri(warehouse)).to_pylist()
    assert all(q["reason"] and q["reason"].strip() for q in quarantine)
    quarantined = {q["offset"] for q in quarantine}
    for offset, (how, value) in enumerate(batch):
        if how == "noise" or (how == "truncate" and value[:1] in (b"{", b"[")):
            assert offset in quarantined, (how, value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzzed_messages_are_applied_or_quarantined_with_a_reason(spark, fmt):
    valid = [m for ms in POOL.values() for m in ms] if fmt == "auto" else POOL[fmt]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(mutated(valid), min_size=4, max_size=16))
    def run(batch):
        _check(spark, fmt, batch)

    run()
