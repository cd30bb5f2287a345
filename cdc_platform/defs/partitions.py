"""The one daily partitioning of raw and changelog: the ingest date of a message."""

import dagster as dg

# end_offset=1: today's partition exists, so files landing today can be processed today.
daily = dg.DailyPartitionsDefinition(start_date="2024-01-01", end_offset=1)
