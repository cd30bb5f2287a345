"""Valid messages of every format, from the shared corpus, the seed fixtures and builders."""

import json

from tests.conftest import CORPUS, FIXTURES
from tests.spark.test_format_dts_avro import encode, order

SEEDS = FIXTURES / "seeds"


def _lines(path, n: int) -> list[bytes]:
    """The first ``n`` JSON lines of a corpus file (license headers skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            continue
        out.append(line.strip().encode())
        if len(out) == n:
            break
    return out


def _seed(name: str) -> bytes:
    return json.dumps(json.loads((SEEDS / name).read_text(encoding="utf-8"))).encode()


def _tuple(seq: int, op: str, before: str, after: str, id_: int) -> bytes:
    return json.dumps(
        {
            "_sequence_id_": str(seq),
            "_operation_type_": op,
            "_excute_time_": 1700000000000 + seq,
            "_source_table_": "db.users",
            "_before_image_": before,
            "_after_image_": after,
            "id": str(id_),
            "name": f"u{id_}",
        }  # fmt: skip
    ).encode()


def messages() -> dict[str, list[bytes]]:
    """format -> a few valid messages of it."""
    return {
        "debezium": _lines(CORPUS / "debezium" / "debezium-data-schema-include.txt", 4)
        + [_seed("004_db2_create_value.completed.json")],
        "lindorm": [_seed("000_lindorm_hbase_insert.json"), _seed("000_lindorm_sql_update.json")],
        "dataworks": _lines(CORPUS / "dataworks" / "event-insert.txt", 2)
        + [_seed("001_dataworks_update_before.json"), _seed("001_dataworks_update_after.json")],
        "datahub-tuple": [
            _tuple(1, "I", "N", "Y", 1),
            _tuple(2, "U", "Y", "N", 1),
            _tuple(2, "U", "N", "Y", 1),
            _tuple(3, "D", "Y", "N", 1),
        ],  # fmt: skip
        "dts-avro": [encode(order(1, 0)), encode(order(2, 1))],
        "shareplex": [
            _seed("002_shareplex_insert.json"),
            _seed("002_shareplex_update.completed.json"),
        ],
        "canal": _lines(CORPUS / "canal" / "canal-data.txt", 3),
        "maxwell": _lines(CORPUS / "maxwell" / "maxwell-data.txt", 3),
        "ogg": _lines(CORPUS / "ogg" / "ogg-data.txt", 3),
    }
