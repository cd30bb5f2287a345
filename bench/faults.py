"""Recovery times of the fault-injection suite (tests/ops/test_faults.py), as a table.

Runs the suite (one live stack under traffic, one fault per test, the tables checked against the
generator's reference state after each) with CDC_FAULT_REPORT set, and prints, per fault, the
seconds from the fault until each source's current table has shown an event written after it
with a lag of at most 45 s (30 s and both at once until 2026-11-28), beside the same measure with
no fault. The suite's pass or failure is its exit status.

    .venv/bin/python bench/faults.py [-k <pytest expression>]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="pytest -k: run only the faults it selects")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        argv = [sys.executable, "-m", "pytest", "-q", "-m", "faults", "-p", "no:cacheprovider",
                "tests/ops/test_faults.py", *(["-k", args.k] if args.k else [])]  # fmt: skip
        status = subprocess.run(
            argv, cwd=ROOT, env={**os.environ, "CDC_FAULT_REPORT": str(report)}, check=False
        ).returncode
        rows = (
            [json.loads(line) for line in report.read_text().splitlines()]
            if report.exists()
            else []
        )
    print(f"\n{'fault':<48} {'recovery s':>10}  checked after it (per source)")
    for row in rows:
        found = "; ".join(f"{s}: {f['live_rows']} live rows = reference, {f['messages']} messages "
                          "once each" for s, f in row["found"].items())  # fmt: skip
        extra = "".join(
            f"; {k}: {v}" for k, v in row.items() if k not in ("fault", "recovery_s", "found")
        )
        print(f"{row['fault']:<48} {row['recovery_s']:>10.1f}  {found}{extra}")
    if not rows:
        print("(no fault passed)")
    return status


if __name__ == "__main__":
    sys.exit(main())
