"""The Dagster asset key of a lake table: its ``TableRef``'s key path (``raw/<source>``,
``current/<source>/<table>``, ``models/<name>``…) as an AssetKey."""

import dagster as dg

from cdc_platform import lake


def asset_key(layer: str, source: str, table: str | None = None) -> dg.AssetKey:
    return dg.AssetKey(lake.TableRef(layer, source, table).key_path)


def model_key(name: str) -> dg.AssetKey:
    return dg.AssetKey(lake.TableRef(lake.MODELS, name).key_path)
