"""What a Data Docs publish costs once the reports folder holds what live runs leave in it.

Every run's checks, and every micro-batch's, publish their validations (``quality.docs``); each
suite keeps its newest ``CDC_REPORTS_KEEP`` (50). This fills a fresh reports folder with
``--suites`` x ``--keep`` small change-log validations (not timed), then times ``--rounds``
publishes of one more validation and prints each and their median.

    .venv/bin/python bench/data_docs.py [--suites 8] [--keep 50] [--rounds 8]
"""

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

from cdc_platform.catalog import QualityConfig
from cdc_platform.quality import docs, suites
from cdc_platform.quality.validate import validate
from cdc_platform.quality.validations import changelog_parameters


def _validation(suite: str):
    """A change-log validation of two rows (its size does not matter to the publish)."""
    frame = pd.DataFrame(
        {
            "op": ["c", "u"],
            "before": [None, True],
            "after": [True, True],
            "key__id": [1, 2],
            "sequence": ["1", "2"],
            "event_time": pd.Timestamp("2026-11-27", tz="UTC"),
            "source_format": "debezium",
            "before_expected": False,
        }
    )
    quality = QualityConfig()
    return validate(
        frame,
        suites.load(suites.CHANGELOG),
        suite,
        ["key__id"],
        suites.severities(suites.CHANGELOG, quality),
        batch="bench",
        index_columns=["key__id", "sequence"],
        parameters=changelog_parameters(quality),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", type=int, default=8, help="suites with stored validations")
    parser.add_argument("--keep", type=int, default=50, help="validations kept per suite")
    parser.add_argument("--rounds", type=int, default=8, help="publishes timed")
    args = parser.parse_args()
    os.environ["CDC_REPORTS_KEEP"] = str(args.keep)

    names = [f"changelog.bench.table{i}" for i in range(args.suites)]
    runs = {name: _validation(name) for name in names}
    with tempfile.TemporaryDirectory(prefix="cdc-data-docs-") as tmp:
        reports = Path(tmp)
        started = time.monotonic()
        for _ in range(args.keep):
            for name in names:
                subject = docs.Subject(asset=name.replace(".", "/"), batch="fill", run_id="fill")
                docs.publish([(runs[name], subject)], reports)
        print(f"filled {args.suites} suites x {args.keep} validations in "
              f"{time.monotonic() - started:.0f} s")  # fmt: skip
        seconds = []
        for i in range(args.rounds):
            name = names[i % len(names)]
            subject = docs.Subject(asset=name.replace(".", "/"), batch="timed", run_id="timed")
            start = time.perf_counter()
            docs.publish([(runs[name], subject)], reports)
            seconds.append(time.perf_counter() - start)
    print("publish seconds:", " ".join(f"{s:.3f}" for s in seconds))
    print(f"median {statistics.median(seconds):.3f} s, min {min(seconds):.3f} s")


if __name__ == "__main__":
    main()
