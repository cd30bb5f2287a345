"""The pipeline's steps, shared by the Dagster assets and the command line:

``ingest`` (landing files -> raw) -> ``normalize`` (raw -> change logs, DDL and control logs,
quarantine) -> ``merge`` (current) and ``history`` (SCD type 2); ``replay`` chains them for
files. Every step can be rerun."""
