"""Whether a source's outputs are behind their inputs: raw not normalized yet, or change-log
versions not merged into a current or history table. A run that died after its raw commit (kill
-9, a lost machine, a step that failed for good) leaves the source so; the sensors ask for a run
that finishes it even when no new data comes. Delta logs only, no Spark."""

from cdc_platform import lake
from cdc_platform.catalog import SourceConfig


def unfinished(warehouse: str, source: SourceConfig) -> str | None:
    """What the outputs of ``source`` lack (as text naming the versions, so that one state
    reads the same every time), or None when every output has all of its input."""
    behind = []
    raw = lake.version(lake.TableRef(lake.RAW, source.name).uri(warehouse))
    normalized = lake.normalized_raw_version(
        lake.TableRef(lake.QUARANTINE, source.name).uri(warehouse)
    )  # the quarantine is the last output a normalize writes
    if raw is not None and (normalized is None or normalized < raw):
        behind.append(f"raw@{raw}>normalized@{normalized}")
    for table in source.tables:
        ref = lake.TableRef(lake.CHANGELOG, source.name, table.name)
        changes = lake.version(ref.uri(warehouse))
        if changes is None:
            continue
        layers = [lake.CURRENT, lake.HISTORY] if table.history else [lake.CURRENT]
        for layer in layers:
            merged = lake.state(lake.TableRef(layer, source.name, table.name).uri(warehouse))
            if merged.changelog_version != changes:
                behind.append(
                    f"{table.name}:changelog@{changes}>{layer}@{merged.changelog_version}"
                )
    return ";".join(behind) or None
