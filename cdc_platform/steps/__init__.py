"""The pipeline's steps, each named after the layer it writes, shared by the Dagster assets and
the command line:

``raw`` (landing files -> raw) -> ``changelog`` (raw -> change logs, DDL and control logs,
quarantine; the parse itself is ``cdc_platform.normalize``) -> ``current`` (the current state)
and ``history`` (SCD type 2); ``redrive`` re-processes quarantined messages; ``replay`` chains
raw, changelog and current for files. Every step can be rerun."""
