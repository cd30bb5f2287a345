"""The demo's Kafka traffic (Canal, Maxwell and Debezium heartbeats on three topics of the
embedded broker) goes through the demo catalog's crm source cleanly: detected formats, no
quarantine, the rows the generator meant."""

import pyarrow.compute as pc
import pytest

from cdc_platform import demo, lake
from cdc_platform.catalog import load_catalog
from cdc_platform.ingest import kafka
from cdc_platform.steps.changelog import normalize_new
from cdc_platform.steps.current import current_rows, merge_current
from tests.defs.test_pipeline_in_dagster import ROOT

pytestmark = pytest.mark.spark


def test_demo_traffic_reaches_the_crm_tables(spark, kafka_bootstrap, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_WAREHOUSE", str(tmp_path / "warehouse"))
    catalog = load_catalog(ROOT / "sources.yaml")
    source = catalog.source("crm")
    source = source.model_copy(
        update={"kafka": source.kafka.model_copy(update={"bootstrap_servers": kafka_bootstrap})}
    )
    demo.create_topics(kafka_bootstrap)
    sent = sum(demo.produce_demo_traffic(kafka_bootstrap, batch) for batch in range(3))
    warehouse = catalog.warehouse_uri

    assert kafka.ingest_kafka(warehouse, source).records == sent
    result = normalize_new(spark, warehouse, source)
    for table in ("accounts", "tickets"):
        merge_current(spark, warehouse, "crm", table, options=source.table_config(table))

    # Each batch: Canal's INSERT message carries 5 rows, so records outnumber messages.
    assert sent == 26 and result.messages == 38
    assert (result.quarantined, result.control) == (0, 3)
    # The newest heartbeat's time, observed by the control log's write.
    control = lake.read_arrow(lake.TableRef(lake.CONTROL, "crm").uri(warehouse))
    assert result.max_control_time == pc.max(control["event_time"]).as_py()
    assert result.tables["accounts"].ops == {"c": 15, "u": 6, "d": 2}
    assert result.tables["tickets"].ops == {"c": 9, "u": 3}
    accounts = current_rows(spark, warehouse, "crm", "accounts").toArrow()
    tickets = current_rows(spark, warehouse, "crm", "tickets").toArrow()
    assert accounts.num_rows == 13 and tickets.num_rows == 9
    assert dict(zip(accounts.column_names, map(str, accounts.schema.types), strict=True)) == {
        "id": "int32", "name": "string", "tier": "string", "balance": "decimal128(12, 2)"
    }  # fmt: skip
    assert sorted(tickets.column("status").to_pylist()).count("closed") == 3
