"""Spark jobs as pure functions: DataFrame in, DataFrame out. No Dagster here."""
