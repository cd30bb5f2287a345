"""CDC lakehouse: CDC topics to exact, typed current-state Delta tables, orchestrated by Dagster."""

__version__ = "0.1.0"
