"""Storage: every Delta read and write goes through ``cdc_platform.lake.delta``."""
