"""dbt_like_models: SQL models over the lake's tables (load, order, compile, build, test).

No Dagster here: ``cdc_platform.defs.models`` wraps these functions as assets and checks, and the
``cdc-platform models`` command runs them directly.
"""
