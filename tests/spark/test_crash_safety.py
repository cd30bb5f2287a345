"""Crash safety of the commit protocol: a replay killed (SIGKILL) after Spark wrote a table's
files and before their commit, after a commit and before the next step, or in the middle of a
MERGE leaves tables that a rerun brings to exactly those of an uninterrupted replay. The killed
run's uncommitted files are never read, and vacuum deletes them.

The killed process is a Spark Connect client, as a Dagster run of the demo is: the driver side
of the commit protocol (delta-rs commits, staging) dies with it, and no JVM starts per kill."""

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay

pytestmark = pytest.mark.spark
KEY = ["id"]
SOURCE = SourceConfig(name="crash", format="debezium", primary_key=KEY)
DAYS = ("2026-01-01", "2026-01-02")

# Runs one replay in a process of its own that kills itself (SIGKILL: no cleanup of any kind)
# at the given point of the commit protocol.
_KILLED_REPLAY = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from cdc_platform.catalog import SourceConfig
    from cdc_platform.lake import commit, data_files
    from cdc_platform.spark.session import get_spark
    from cdc_platform.steps.replay import replay

    point, nth, warehouse, landing, date, remote = sys.argv[1:]
    calls = {"n": 0}
    real_commit, real_write = commit.commit, data_files.write

    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def killing_commit(uri, *args, **kwargs):
        calls["n"] += 1
        if point == "before_commit" and calls["n"] == int(nth):
            die()
        version = real_commit(uri, *args, **kwargs)
        if point == "after_commit" and calls["n"] == int(nth):
            die()
        return version

    def killing_write(df, uri, *args, **kwargs):
        adds = real_write(df, uri, *args, **kwargs)
        if point == "mid_merge" and "/current/" in uri:
            print("merge files written:", len(adds), flush=True)
            die()
        return adds

    commit.commit, data_files.write = killing_commit, killing_write
    source = SourceConfig(name="crash", format="debezium", primary_key=["id"])
    replay(get_spark(remote=remote), Path(warehouse), [Path(landing)], source, date)
    print("not killed", flush=True)
    """
)


def _event(op: str, pos: int, before: dict | None, after: dict | None) -> dict:
    source = {"db": "app", "table": "t", "file": "mysql-bin.000001", "pos": pos, "row": 0,
              "ts_ms": 1_767_225_600_000 + pos}  # fmt: skip
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1}


def _landing(root: Path) -> list[Path]:
    """Two days of changes: inserts, then updates, deletes and new keys touching most files."""
    rng = random.Random(7)
    live: dict[int, dict] = {}
    files = []
    pos = 0
    for day in DAYS:
        lines = []
        for _ in range(3000):
            pos += 1
            k = rng.randrange(2000)
            before = live.get(k)
            if before is not None and rng.random() < 0.15:
                lines.append(_event("d", pos, before, None))
                del live[k]
                continue
            after = live[k] = {"id": k, "name": f"n{k}-{pos}", "amount": pos % 97}
            lines.append(_event("u" if before else "c", pos, before, after))
        path = root / f"dt={day}" / "changes.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in lines))
        files.append(path)
    return files


def _replay(spark, warehouse: Path, landing: Path, date: str) -> None:
    replay(spark, warehouse, [landing], SOURCE, date)


def _tables(spark, warehouse: Path) -> dict:
    """Everything a reader sees: the current rows, the change log, the quarantine."""
    current = current_rows(spark, warehouse, "crash", "app__t").toArrow().to_pylist()
    changelog = lake.read(spark, lake.TableRef(lake.CHANGELOG, "crash", "app__t").uri(warehouse))
    quarantine = lake.row_count(lake.TableRef(lake.QUARANTINE, "crash").uri(warehouse))
    return {
        "current": sorted(json.dumps(r, sort_keys=True, default=str) for r in current),
        "changelog": sorted(r[0] for r in changelog.select("sequence").collect()),
        "quarantine": quarantine,
    }


def _orphans(warehouse: Path) -> list[str]:
    """Parquet files under the tables that their snapshot does not name."""
    found = []
    for log in warehouse.rglob("_delta_log"):
        uri = log.parent
        named = {str(Path(f)) for f in DeltaTable(str(uri)).file_uris()}
        data = [p for p in uri.rglob("*.parquet") if log not in p.parents]  # not checkpoints
        found += [str(p) for p in data if str(p) not in named]
    return found


@pytest.fixture(scope="module")
def expected(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("uninterrupted")
    files = _landing(root / "landing")
    for date, path in zip(DAYS, files, strict=True):
        _replay(spark, root / "warehouse", path, date)
    return files, _tables(spark, root / "warehouse")


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("before_commit", 1),  # the change log's files written, not committed
        ("after_commit", 1),  # the change log committed; control, quarantine, current not
        ("mid_merge", 0),  # the merge wrote the files replacing current's, no commit yet
    ],
)
def test_a_killed_replay_reruns_to_the_uninterrupted_tables(
    spark, spark_connect_url, tmp_path, expected, point, nth
):
    files, want = expected
    warehouse = tmp_path / "warehouse"
    _replay(spark, warehouse, files[0], DAYS[0])
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_REPLAY, point, str(nth), str(warehouse), str(files[1]),
         DAYS[1], spark_connect_url],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stdout + killed.stderr[-3000:]
    if point != "after_commit":
        assert _orphans(warehouse), "the killed run wrote files it never committed"

    _replay(spark, warehouse, files[1], DAYS[1])
    assert _tables(spark, warehouse) == want

    for uri in lake.all_tables(warehouse):
        lake.vacuum(uri, retention_hours=0)
    assert _orphans(warehouse) == []
    assert not list(warehouse.rglob("write-*"))
    assert _tables(spark, warehouse) == want
