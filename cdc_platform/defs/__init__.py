"""The Dagster layer: thin wrappers over the core modules (steps, ingest, models, quality,
freshness). Only here (and in ``cdc_platform.definitions``) is ``dagster`` imported."""
