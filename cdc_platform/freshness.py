"""How far behind its source each table is.

A source's *position* is the newest event time seen from it: the table's own changes, and the
source's heartbeats and transaction markers (the control log), which move on even when the table
does not change. A change log is as fresh as that position. A current table that has not merged
the newest change-log version yet is only as fresh as the changes it merged. Lag = now - position.
Positions come from the Delta files' statistics: no data is read. Plain values only: the Dagster
layer turns them into metadata.
"""

from dataclasses import dataclass
from datetime import UTC, datetime

from cdc_platform import lake


@dataclass(frozen=True)
class Freshness:
    position: datetime | None  # newest source event time the table reflects
    lag_seconds: float | None  # now - position (None: nothing seen yet)

    def metadata(self) -> dict[str, float]:
        """What a materialization records ({} before anything is seen): ``source_position`` in
        epoch seconds (shown as a time once wrapped in ``MetadataValue.timestamp``) and
        ``lag_seconds``."""
        if self.position is None:
            return {}
        return {
            "source_position": self.position.timestamp(),
            "lag_seconds": round(self.lag_seconds, 1),
        }


def _of(position: datetime | None, now: datetime | None) -> Freshness:
    if position is None:
        return Freshness(None, None)
    now = now or datetime.now(UTC)
    # A source clock ahead of ours is no lag.
    return Freshness(position, max(0.0, (now - position).total_seconds()))


def _newest(*times: datetime | None) -> datetime | None:
    return max((t for t in times if t is not None), default=None)


def changelog(warehouse: str, source: str, table: str, now: datetime | None = None) -> Freshness:
    changes = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
    control = lake.TableRef(lake.CONTROL, source).uri(warehouse)
    return _of(
        _newest(lake.max_stat(changes, "event_time"), lake.max_stat(control, "event_time")), now
    )


def current(warehouse: str, source: str, table: str, now: datetime | None = None) -> Freshness:
    changes = lake.TableRef(lake.CHANGELOG, source, table).uri(warehouse)
    merged = lake.state(lake.TableRef(lake.CURRENT, source, table).uri(warehouse)).changelog_version
    if merged is None:
        return Freshness(None, None)
    if merged == lake.version(changes):
        return changelog(warehouse, source, table, now)
    return _of(lake.max_stat(changes, "event_time", at_version=merged), now)
