"""freshness returns plain values; the Dagster layer wraps the position as a timestamp."""

from datetime import UTC, datetime

import dagster as dg

from cdc_platform.freshness import Freshness


def test_metadata_is_plain_numbers_that_dagster_accepts_and_the_position_survives():
    position = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    values = Freshness(position, 12.345).metadata()
    assert values == {"source_position": position.timestamp(), "lag_seconds": 12.3}
    assert all(type(v) is float for v in values.values())
    shown = dg.MetadataValue.timestamp(values["source_position"])
    assert datetime.fromtimestamp(shown.value, UTC) == position
    assert dg.MaterializeResult(metadata=values).metadata == values


def test_nothing_seen_records_nothing():
    assert Freshness(None, None).metadata() == {}
