"""The Dagster layer: thin wrappers over ``cdc_platform.pipeline``. Only here (and in
``cdc_platform.definitions``) is ``dagster`` imported."""
