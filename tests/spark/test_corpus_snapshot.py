"""Every table a replay of the whole ../shared/corpus leaves (raw, change logs, DDL and control
logs, quarantine, current) equals the accepted snapshot, tests/fixtures/corpus_tables.json: a
refactoring changes no output. A deliberate change of behaviour is accepted by rewriting it
(``CDC_ACCEPT_SNAPSHOT=1 pytest tests/spark/test_corpus_snapshot.py``), and the diff is
reviewed with the change."""

import os

import pytest

from cdc_platform.catalog import SourceConfig
from cdc_platform.steps.replay import replay
from tests import corpus_snapshot as snap
from tests.conftest import CORPUS

pytestmark = pytest.mark.spark


def test_the_corpus_leaves_the_accepted_tables(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    for source, (typed, files) in snap.REPLAYS.items():
        options = {"primary_key": snap.PRIMARY_KEY, "column_types": snap.COLUMN_TYPES}
        config = SourceConfig(name=source, format="auto", **(options if typed else {}))
        replay(spark, warehouse, [CORPUS / f for f in files], config, snap.DATE)
    found = snap.tables(warehouse)
    if os.environ.get("CDC_ACCEPT_SNAPSHOT") == "1":
        snap.accept(found)
    snap.assert_accepted(found)
