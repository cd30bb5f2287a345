"""Sample CDC traffic for the demo, in several formats.

Landing files: Debezium (MySQL connector, Kafka envelopes with keys and schemas) for
``inventory.customers`` and ``inventory.orders``, and a Lindorm HBase table. The embedded broker:
Canal flat messages for ``crm.accounts``, Maxwell for ``crm.tickets`` and Debezium heartbeats,
all read by the ``crm`` source with format detection.
"""

import base64
import datetime as dt
import json
import random
import time

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_platform.lake import storage

_CUSTOMER_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "string", "optional": True, "field": "email"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "signed_up"},
]
_ORDER_FIELDS = [
    {"type": "int32", "optional": False, "field": "order_id"},
    {"type": "int32", "optional": False, "field": "customer_id"},
    {"type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "amount"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "order_date"},
]  # fmt: skip


def _envelope_schema(table: str, fields: list[dict]) -> dict:
    value = {"type": "struct", "fields": fields, "optional": True, "name": f"demo.{table}.Value"}
    return {
        "type": "struct",
        "name": f"demo.inventory.{table}.Envelope",
        "fields": [
            {**value, "field": "before"},
            {**value, "field": "after"},
            {"type": "struct", "field": "source", "fields": []},
            {"type": "string", "field": "op"},
        ],
    }


def _decimal(cents: int) -> str:
    """A Connect Decimal as the JsonConverter writes it: base64 of the unscaled value's two's
    complement, in as few bytes as keep its sign bit."""
    return base64.b64encode(
        cents.to_bytes(cents.bit_length() // 8 + 1, "big", signed=True)
    ).decode()


class _Binlog:
    """Strictly increasing MySQL binlog positions, as Debezium reports them; each batch starts
    past the previous one, so a later batch's changes are newer."""

    def __init__(self, start_ms: int, batch: int) -> None:
        self.pos, self.ts = 4 + batch * 1_000_000, start_ms

    def source(self, table: str) -> dict:
        self.pos += 317
        self.ts += 1000
        return {"version": "2.7.3.Final", "connector": "mysql", "name": "demo", "ts_ms": self.ts,
                "snapshot": "false", "db": "inventory", "table": table, "server_id": 1,
                "file": "mysql-bin.000001", "pos": self.pos, "row": 0}  # fmt: skip


def debezium_records(batch: int, start_ms: int, rng: random.Random) -> list[dict]:
    """One batch of customer and order changes as Kafka record envelopes."""
    log = _Binlog(start_ms + batch * 3_600_000, batch)
    records: list[dict] = []

    def emit(table: str, fields: list[dict], key: dict, op: str, before, after) -> None:
        value = {
            "schema": _envelope_schema(table, fields),
            "payload": {"before": before, "after": after, "source": log.source(table), "op": op,
                        "ts_ms": log.ts + 5},
        }  # fmt: skip
        records.append({"topic": f"demo.inventory.{table}", "partition": 0,
                        "offset": len(records) + batch * 1000, "timestamp": log.ts + 7,
                        "key": {"payload": key}, "value": value})  # fmt: skip

    base = batch * 10
    customers = {}
    for i in range(base + 1, base + 11):
        row = {"id": i, "name": f"Customer {i}", "email": f"c{i}@example.com",
               "signed_up": start_ms + i * 60_000}  # fmt: skip
        customers[i] = row
        emit("customers", _CUSTOMER_FIELDS, {"id": i}, "c", None, row)
    for order_id in range(base * 3 + 1, base * 3 + 21):
        amount = _decimal(rng.randint(100, 99_999))
        row = {"order_id": order_id, "customer_id": rng.randint(base + 1, base + 10),
               "amount": amount, "order_date": 20_000 + batch}  # fmt: skip
        emit("orders", _ORDER_FIELDS, {"order_id": order_id}, "c", None, row)
    for i in rng.sample(sorted(customers), 4):
        new = {**customers[i], "email": f"customer{i}@example.org"}
        emit("customers", _CUSTOMER_FIELDS, {"id": i}, "u", customers[i], new)
        customers[i] = new
    gone = rng.choice(sorted(customers))
    emit("customers", _CUSTOMER_FIELDS, {"id": gone}, "d", customers[gone], None)
    records.append({"topic": "demo.inventory.customers", "partition": 0,  # Kafka tombstone
                    "offset": len(records) + batch * 1000, "key": {"payload": {"id": gone}},
                    "value": None})  # fmt: skip
    return records


def lindorm_messages(batch: int, start_ms: int) -> list[dict]:
    """Lindorm HBase change subscription messages: base64 cells, ROW key, family_qualifier."""

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    out = []
    for i in range(batch * 5 + 1, batch * 5 + 6):
        after = {"ROW": b64(f"user{i}"), "f_name": b64(f"name {i}"), "f_city": b64("Hangzhou")}
        out.append({"schema": {}, "payload": {
            "op": "c", "ts_ms": start_ms + i, "before": None, "after": after,
            "source": {"version": "v2.0", "db": "ld-demo", "namespace": "default",
                       "table": "users", "ts_ms": start_ms + i}}})  # fmt: skip
    return out


def write_demo_traffic(landing: str, batch: int = 0, date: str | None = None) -> list[str]:
    """Write one batch of demo traffic into the landing folders of sources shop and lindorm.
    With ``date``, event times are hours into that day (repeatable); without, live traffic of
    today whose event times are a minute ago, so the freshness checks see a live source."""
    day = date or dt.datetime.now(dt.UTC).date().isoformat()
    start_ms = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() * 1000)
    lindorm_ms = start_ms
    if date is None:
        now_ms = int(time.time() * 1000) - 60_000
        start_ms = now_ms - batch * 3_600_000  # debezium_records adds batch hours back
        lindorm_ms = now_ms - batch * 5
    rng = random.Random(batch)
    written = []
    for source, name, lines in (
        ("shop", f"{batch:05d}.kafka.jsonl", debezium_records(batch, start_ms, rng)),
        ("lindorm", f"{batch:05d}.jsonl", lindorm_messages(batch, lindorm_ms)),
    ):
        path = storage.join(str(landing), source, f"dt={day}", name)
        # Whole: a sensor never sees half a file.
        storage.write_whole(path, "".join(json.dumps(x) + "\n" for x in lines).encode())
        written.append(path)
    return written


# The demo's Kafka source: its topics on the embedded broker (see sources.yaml, source crm).
CRM_TOPICS = {"canal": "crm.canal", "maxwell": "crm.maxwell", "heartbeat": "crm.heartbeat"}
_ACCOUNT_TYPES = {"id": "int(11)", "name": "varchar(64)", "tier": "varchar(16)",
                  "balance": "decimal(12,2)"}  # fmt: skip
_TIERS = ("free", "pro", "enterprise")


def canal_messages(batch: int, now_ms: int, rng: random.Random) -> list[dict]:
    """Canal flat messages for crm.accounts: 5 inserts in one message, 2 updates, a delete."""

    def message(kind: str, rows: list[dict], old: list[dict] | None = None) -> dict:
        return {"data": rows, "database": "crm", "table": "accounts", "pkNames": ["id"],
                "isDdl": False, "type": kind, "es": now_ms, "ts": now_ms + 3, "sql": "",
                "id": batch, "mysqlType": _ACCOUNT_TYPES, "old": old,
                "sqlType": {"id": 4, "name": 12, "tier": 12, "balance": 3}}  # fmt: skip

    ids = range(batch * 5 + 1, batch * 5 + 6)
    rows = {i: {"id": str(i), "name": f"Account {i}", "tier": rng.choice(_TIERS),
                "balance": f"{rng.randint(0, 10**7) / 100:.2f}"} for i in ids}  # fmt: skip
    out = [message("INSERT", list(rows.values()))]
    for i in rng.sample(list(ids), 2):
        new = {**rows[i], "balance": f"{rng.randint(0, 10**7) / 100:.2f}"}
        out.append(message("UPDATE", [new], [{"balance": rows[i]["balance"]}]))
        rows[i] = new
    if batch:  # close an account of the previous batch
        gone = str(batch * 5 - rng.randint(0, 4))
        out.append(message("DELETE", [{"id": gone, "name": None, "tier": None, "balance": None}]))
    return out


def maxwell_messages(batch: int, now_ms: int, rng: random.Random) -> list[dict]:
    """Maxwell messages for crm.tickets: 3 opened, 1 closed."""
    out = []
    for xoffset, i in enumerate(range(batch * 3 + 1, batch * 3 + 4)):
        out.append({"database": "crm", "table": "tickets", "type": "insert", "ts": now_ms // 1000,
                    "xid": 1000 + batch, "xoffset": xoffset, "primary_key_columns": ["id"],
                    "data": {"id": i, "account_id": batch * 5 + rng.randint(1, 5),
                             "status": "open", "opened_at": now_ms // 1000}})  # fmt: skip
    closed = dict(out[0]["data"], status="closed")
    out.append({"database": "crm", "table": "tickets", "type": "update", "ts": now_ms // 1000,
                "xid": 1001 + batch, "commit": True, "primary_key_columns": ["id"],
                "data": closed, "old": {"status": "open"}})  # fmt: skip
    return out


def create_topics(bootstrap: str, timeout: float = 10.0) -> None:
    """The crm topics (once the broker answers; an existing topic is fine)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        try:
            existing = admin.list_topics(timeout=2).topics
            break
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    wanted = [NewTopic(t, 1, 1) for t in CRM_TOPICS.values() if t not in existing]
    for future in admin.create_topics(wanted).values() if wanted else []:
        future.result(timeout=timeout)


def produce_demo_traffic(bootstrap: str, batch: int) -> int:
    """Produce one batch of crm traffic (Canal, Maxwell, a heartbeat); the records sent."""
    now_ms = int(time.time() * 1000)
    rng = random.Random(batch)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = 0
    for topic, key, value in [
        *[(CRM_TOPICS["canal"], None, m) for m in canal_messages(batch, now_ms, rng)],
        *[(CRM_TOPICS["maxwell"], None, m) for m in maxwell_messages(batch, now_ms, rng)],
        (CRM_TOPICS["heartbeat"], {"serverName": "crm"}, {"ts_ms": now_ms}),
    ]:
        producer.produce(
            topic,
            value=json.dumps(value).encode(),
            key=json.dumps(key).encode() if key else None,
        )
        sent += 1
    if producer.flush(30):
        raise KafkaException(f"demo traffic not delivered to {bootstrap} within 30 s")
    return sent
