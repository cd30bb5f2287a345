"""The Dagster asset key of a layer's table: the lake's key path (``raw/<source>``,
``current/<source>/<table>``…) as an AssetKey."""

import dagster as dg

from cdc_platform import lake


def asset_key(layer: str, source: str, table: str | None = None) -> dg.AssetKey:
    return dg.AssetKey(lake.key_path(layer, source, table))
