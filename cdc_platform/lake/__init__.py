"""Storage: every Delta Lake read and write goes through this package (``from cdc_platform
import lake``), so nothing else touches Delta. delta-rs (``deltalake``) keeps the transaction
log; Spark reads and writes the data.

- ``tables``: which table (``TableRef``) and where, the bookkeeping our commits record
  (``TableState``), Spark reads, and snapshot facts from the log (no data read);
- ``data_files``: Spark's executors write data files; their add actions from the footers;
- ``commit``: the commit protocol (adds, removes, state, transaction ids, schema changes);
- ``merge``: MERGE, key replacement and deletes in Spark, merge-on-read or copy-on-write;
- ``deletion_vectors``: the rows a merge-on-read merge marks deleted, in Delta's bytes;
- ``delta_log``: the log read and written as the protocol has it, for commits that carry DVs;
- ``storage``: where the bytes live (a local folder or ``s3://``) and the options to reach it;
- ``arrow_files``: executors' reads and writes of data files through pyarrow (object storage);
- ``parquet_stats``: a data file's Delta statistics from its footer;
- ``kafka_offsets``: a Kafka source's raw batches with their offsets;
- ``landing_files``: a files source's raw, one data file per landing file;
- ``staging``: frames a step computes once and reads several times, as Parquet;
- ``vacuum``: deletes the data files no version within the retention names.
"""

from cdc_platform.lake import storage
from cdc_platform.lake.commit import (
    NORMALIZED_APP,
    ROWS_PER_FILE,
    Pin,
    TableMoved,
    append,
    append_normalized,
    normalized_raw_version,
    overwrite_partitions,
    properties,
    record_state,
    replace,
    upgrade_properties,
)
from cdc_platform.lake.kafka_offsets import (
    KAFKA_KEY,
    append_kafka_batch,
    kafka_app_id,
    kafka_batches,
    kafka_offsets,
    kafka_stored_offsets,
)
from cdc_platform.lake.merge import (
    BROADCAST_ROWS,
    DROP,
    PURGE_SHARE,
    REBUILT,
    Candidates,
    broadcastable,
    candidates,
    delete_rows,
    files_sharing_keys,
    purge,
    replace_keys,
    rewrite_keys,
    rows_of_keys,
    upsert_newer,
)
from cdc_platform.lake.staging import Staging
from cdc_platform.lake.tables import (
    CHANGELOG,
    CONTROL,
    CURRENT,
    DDL,
    FILE_COLUMN,
    HISTORY,
    LAYERS,
    MODELS,
    PARTITION_COLUMN,
    QUARANTINE,
    RAW,
    ROW_COLUMN,
    TABLE_PROPERTIES,
    ChangelogFacts,
    TableRef,
    TableState,
    arrow_schema,
    changelog_facts,
    changelog_tables,
    deletion_vectors_of,
    describe,
    exists,
    files,
    files_added_since,
    files_between,
    files_removed_since,
    folders,
    head,
    image_types,
    key_span,
    max_stat,
    may_hold_truncates,
    partition_row_counts,
    quoted,
    read,
    read_arrow,
    row_count,
    stat_range,
    state,
    tables_under,
    version,
)
from cdc_platform.lake.vacuum import Vacuumed, all_tables, vacuum

__all__ = [
    "BROADCAST_ROWS", "CHANGELOG", "CONTROL", "CURRENT", "DDL", "DROP", "FILE_COLUMN", "HISTORY",
    "KAFKA_KEY", "LAYERS", "MODELS", "NORMALIZED_APP", "PARTITION_COLUMN", "PURGE_SHARE",
    "QUARANTINE", "RAW",
    "REBUILT",
    "ROW_COLUMN", "ROWS_PER_FILE",
    "all_tables", "append", "append_kafka_batch", "append_normalized",
    "arrow_schema", "broadcastable", "candidates", "Candidates", "ChangelogFacts",
    "changelog_facts", "changelog_tables", "delete_rows", "deletion_vectors_of", "describe",
    "exists", "files",
    "files_added_since", "files_between", "files_removed_since",
    "files_sharing_keys", "folders", "head", "image_types", "key_span", "kafka_app_id",
    "kafka_batches",
    "kafka_offsets",
    "kafka_stored_offsets", "max_stat", "normalized_raw_version",
    "overwrite_partitions", "partition_row_counts", "Pin", "properties", "purge", "quoted", "read",
    "read_arrow",
    "record_state", "replace", "replace_keys", "rewrite_keys", "row_count", "rows_of_keys",
    "Staging", "storage",
    "may_hold_truncates", "stat_range", "state", "TABLE_PROPERTIES", "TableMoved", "TableRef",
    "TableState", "tables_under", "upgrade_properties", "upsert_newer", "vacuum", "Vacuumed",
    "version",
]  # fmt: skip
