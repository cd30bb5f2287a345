"""What a normalize leaves in its last output, without Spark, for the sensor tests: the
quarantine's commit recording the raw version the outputs reflect."""

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from cdc_platform import lake


def mark_normalized(warehouse: Path, source: str, version: int | None = None) -> None:
    """Record raw's ``version`` (default: its newest) as normalized."""
    raw = lake.TableRef(lake.RAW, source).uri(warehouse)
    version = lake.version(raw) if version is None else version
    write_deltalake(
        lake.TableRef(lake.QUARANTINE, source).uri(warehouse),
        pa.table({"reason": pa.array([], pa.string())}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(lake.NORMALIZED_APP, version)]
        ),
    )
