"""SharePlex JSON (``formats.shareplex``): the seed 002 examples verbatim, detection, an
end-to-end replay and partial after images (updates carry only the changed columns).

The seed's three SharePlex examples are in tests/fixtures/seeds/002_shareplex_*.json (see the
README there). The update and delete are not valid JSON as printed; their ``.completed`` copies
carry only the repairs applied by ``_repair`` below.
"""

import datetime as dt
import json
import re

import pytest
from pyspark.sql import functions as F

from cdc_platform.catalog import SourceConfig
from cdc_platform.formats import canonical as C
from cdc_platform.formats import detect, shareplex
from cdc_platform.formats import json_records as J
from cdc_platform.ingest import landing
from cdc_platform.normalize import table_name
from cdc_platform.steps.current import current_rows
from cdc_platform.steps.replay import replay
from tests.conftest import FIXTURES
from tests.tables import changelog, quarantine, write_lines

SEED = FIXTURES / "seeds"
DATE = "2026-01-01"
MIO_LOG = "CL_BIZ1.MIO_LOG"
CUSTOMERS = "APP.CUSTOMERS"
ORDERS = "APP.ORDERS"
SEED_EXAMPLES = ("insert", "update", "delete")


# --- fixtures as landing lines ---------------------------------------------------------------


def _text(name: str) -> str:
    return (SEED / name).read_text(encoding="utf-8")


def _line(name: str) -> str:
    """The fixture as one landing line: JSON on one line, or the verbatim bytes minus newlines."""
    text = _text(name)
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except json.JSONDecodeError:
        return text.replace("\r", "").replace("\n", "")


def _replay(spark, warehouse, files, key=None, types=None):
    return replay(
        spark, warehouse, files,
        SourceConfig(name="t", format="shareplex", primary_key=key, column_types=types or {}),
        DATE,
    )  # fmt: skip


def _current(spark, warehouse, qualified: str) -> dict:
    df = current_rows(spark, warehouse, "t", table_name(qualified))
    rows = df.toArrow().to_pylist()
    key = "MIO_LOG_ID" if qualified == MIO_LOG else "ID"
    return {r[key]: r for r in rows}


def msg(op: str, table: str, scn: int | None, seq: int = 1, data=None, key=None, **meta) -> str:
    """A SharePlex message as DTS writes it (all meta fields, values as JSON text)."""
    m = {
        "time": "2026-01-01T10:00:00", "userid": 84, "op": op, "scn": None if scn is None
        else str(scn), "rowid": "AAATGpAAIAAItcIAAA", "trans": f"5.1.{scn}", "seq": seq,
        "size": 3, "table": table, "idx": f"{seq}/3", "posttime": "2026-01-01T10:00:05",
    }  # fmt: skip
    m.update(meta)
    body: dict = {"meta": {k: v for k, v in m.items() if v is not None}}
    if data is not None:
        body["data"] = data
    if key is not None:
        body["key"] = key
    return json.dumps(body)


def customer(cid: int, name: str, email: str, city: str) -> dict:
    return {"ID": str(cid), "NAME": name, "EMAIL": email, "CITY": city}


# --- the seed examples: verbatim, and completed only by the documented repairs -----------------

_ELISION = re.compile(r"^[ \t]*…\.[ \t]*\n", re.M)  # the update's "…." line (elided meta fields)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def _repair(text: str) -> str:
    return _TRAILING_COMMA.sub(r"\1", _ELISION.sub("", text))


def test_seed_examples_verbatim_and_completed_only_by_the_documented_repairs():
    assert isinstance(json.loads(_text("002_shareplex_insert.json")), dict)
    for name in ("update", "delete"):
        verbatim = _text(f"002_shareplex_{name}.json")
        with pytest.raises(json.JSONDecodeError):
            json.loads(verbatim)
        completed = _text(f"002_shareplex_{name}.completed.json")
        assert _repair(verbatim) == completed  # byte for byte
        assert isinstance(json.loads(completed), dict)


def test_seed_examples_replayed(spark, warehouse, tmp_path):
    lines = [_line(f"002_shareplex_{n}.json") for n in SEED_EXAMPLES] + [
        _line(f"002_shareplex_{n}.completed.json") for n in ("update", "delete")
    ]
    path = write_lines(tmp_path / "seed.jsonl", lines)
    # The update's `key` names every column (a table without a primary key): configure the key.
    summary, result = _replay(spark, warehouse, [path], key=["MIO_LOG_ID"])

    assert summary["tables"][MIO_LOG] == {"inserted": 1, "updated": 1, "deleted": 0, "rows": 2}
    assert summary["quarantined"] == 3
    current = _current(spark, warehouse, MIO_LOG)
    assert current == {
        "32539737": {"MIO_LOG_ID": "32539737", "CNTR_NO": None, "PLNMIO_REC_ID": None,
                     "POL_CODE": None, "CNTR_TYPE": None},
        # the key's previous values, with the changed CNTR_NO from data
        "32537893": {"MIO_LOG_ID": "32537893", "CNTR_NO": "1171201606",
                     "PLNMIO_REC_ID": "31557806", "POL_CODE": None, "CNTR_TYPE": None},
    }  # fmt: skip

    insert, update = changelog(spark, warehouse, "t", MIO_LOG)
    assert (insert["database"], insert["schema"], insert["table"]) == (None, "CL_BIZ1", "MIO_LOG")
    assert insert["event_time"] == dt.datetime(2017, 6, 16, 14, 24, 34, tzinfo=dt.UTC)
    assert insert["tx_id"] == "7.0.411499"
    assert insert["source_format"] == "shareplex"
    assert insert["sequence"].startswith(
        "scn:00000014589063118712.000000000007.000000000000.000000411499.0000000001|"
    )
    assert update["op"] == "u"
    assert update["before"]["CNTR_NO"] == "1171201606syui26"  # the key: previous values
    assert sorted(update["after_columns"]) == sorted(current["32537893"])

    bad = quarantine(spark, warehouse, "t")
    raw = path.read_bytes().splitlines()
    assert [(r["line"], r["reason"]) for r in bad] == [
        (2, "invalid JSON: not a JSON object"),
        (3, "invalid JSON: not a JSON object"),
        (5, "no meta.table: table unknown"),  # the delete example has no table
    ]
    assert [r["value"] for r in bad[:2]] == raw[1:3]  # verbatim bytes kept
    assert result.control == 0 and result.ddl == 0


# --- parse() and detection ----------------------------------------------------------------------


def test_parse_keeps_raw_columns_adds_the_parsed_schema_and_claims(spark, tmp_path):
    path = write_lines(
        tmp_path / "m.jsonl",
        [
            _line("002_shareplex_insert.json"),
            msg("UPDATE BEFORE", CUSTOMERS, 5, data=customer(1, "a", "b", "c")),
            msg("drop column", CUSTOMERS, 6, data={"NICK": None}),
            msg("Truncate", ORDERS, 7),
            msg("merge", CUSTOMERS, 8, data={}),
            '{"op":"c","source":{"table":"t"},"after":{"id":1}}',
            '{"meta":{"table":"A.B"},"data":{"ID":"1"}}',
            "not json at all",
        ],
    )
    raw = spark.createDataFrame(landing.read_file(path, DATE, "t"))
    parsed = shareplex.parse(raw, {})
    assert parsed.schema.fieldNames() == raw.columns + C.PARSED_SCHEMA.fieldNames()
    assert [f.dataType for f in parsed.schema.fields[len(raw.columns) :]] == [
        f.dataType for f in C.PARSED_SCHEMA.fields
    ]
    text = F.col("value").cast("string")
    # as format detection calls claims: the value as text, keys null unless a JSON object
    keys = F.when(F.col("value").isNotNull(), F.json_object_keys(text))
    rows = (
        parsed.withColumn(
            "claimed", shareplex.claims(keys, text, J.probe(keys, shareplex.CLAIM_PATHS))
        )
        .withColumn("claimants", detect.claimants(keys, text))
        .orderBy("line")
        .toArrow()
        .to_pylist()
    )
    assert [(r["kind"], r["op"], r["reason"], r["claimed"]) for r in rows] == [
        ("change", "c", None, True),
        ("control", None, "update before image: its UPDATE AFTER is the change", True),
        ("ddl", None, "column drop on APP.CUSTOMERS", True),
        ("change", "t", None, False),  # no data or key: a truncate is not claimed
        ("error", None, "unknown SharePlex op 'merge'", True),
        ("error", None, "not a SharePlex message: no meta.op", False),
        ("error", None, "not a SharePlex message: no meta.op", False),
        ("error", None, "invalid JSON: not a JSON object", False),
    ]
    assert all(r["claimants"] == ["shareplex"] for r in rows if r["claimed"])
    assert rows[2]["ddl"] == rows[2]["value"].decode()
    assert (rows[3]["schema"], rows[3]["table"], rows[3]["database"]) == ("APP", "ORDERS", None)
    assert dict(rows[0]["after_image"]) == {"MIO_LOG_ID": "32539737"}
    assert rows[0]["after_partial"] is False


# --- end to end ---------------------------------------------------------------------------------


def test_replay_reaches_the_final_state(spark, warehouse, tmp_path):
    lines = [
        msg("ins", CUSTOMERS, 100, 1, customer(1, "ann", "a@x", "Oslo")),
        msg("ins", CUSTOMERS, 100, 2, customer(2, "bo", "b@x", "Rome")),
        msg("ins", CUSTOMERS, 100, 3, customer(3, "cy", "c@x", "Nice")),
        msg("ins", ORDERS, 110, 1, {"ID": "1", "AMOUNT": "10.00"}),
        msg("ins", ORDERS, 110, 2, {"ID": "2", "AMOUNT": "20.00"}),
        # every non-key column changed: complete without partial merging
        msg("upd", CUSTOMERS, 200, 1, {"NAME": "ann b", "EMAIL": "ab@x", "CITY": "Bergen"},
            key={"ID": "1"}),
        msg("del", CUSTOMERS, 300, 1, customer(2, "bo", "b@x", "Rome")),
        msg("DROP COLUMN", CUSTOMERS, 310, 1, {"NICK": None}),
        msg("truncate", ORDERS, 400),
        msg("ins", ORDERS, 500, 1, {"ID": "3", "AMOUNT": "30.00"}),
        msg("upd", ORDERS, 510, 1, {"AMOUNT": "7.50"}, key={"ID": "3"}),
        # an update as two messages: the before half is control, the after half the change
        msg("UPDATE BEFORE", CUSTOMERS, 600, 1, customer(3, "cy", "c@x", "Nice")),
        msg("UPDATE AFTER", CUSTOMERS, 600, 2, {"NAME": "cy2", "EMAIL": "c2@x", "CITY": "Lyon"},
            key={"ID": "3"}),
        # an older update arriving later loses: order is scn, trans, seq
        msg("upd", CUSTOMERS, 550, 1, {"NAME": "stale", "EMAIL": "s@x", "CITY": "Old"},
            key={"ID": "3"}),
        "{not json",
        msg("merge", CUSTOMERS, 700, 1, {"ID": "9"}),
        '{"meta": {"table": "APP.CUSTOMERS", "scn": "701"}, "data": {"ID": "9"}}',
        msg("ins", CUSTOMERS, 702, 1, key={"ID": "9"}),
    ]  # fmt: skip
    path = write_lines(tmp_path / "shareplex.jsonl", lines)
    # the source's column_types apply to every table: only the shared ID column is typed
    summary, result = _replay(spark, warehouse, [path], types={"ID": "int"})

    assert summary["tables"][CUSTOMERS] == {"inserted": 3, "updated": 3, "deleted": 1, "rows": 2}
    assert summary["tables"][ORDERS] == {"inserted": 3, "updated": 1, "deleted": 0, "rows": 1}
    assert summary["quarantined"] == 4
    assert (result.control, result.ddl) == (1, 1)
    assert result.tables[table_name(CUSTOMERS)].key == ["ID"]  # from the key objects

    assert _current(spark, warehouse, CUSTOMERS) == {
        1: {"ID": 1, "NAME": "ann b", "EMAIL": "ab@x", "CITY": "Bergen"},
        3: {"ID": 3, "NAME": "cy2", "EMAIL": "c2@x", "CITY": "Lyon"},
    }
    assert _current(spark, warehouse, ORDERS) == {3: {"ID": 3, "AMOUNT": "7.50"}}
    reasons = [r["reason"] for r in quarantine(spark, warehouse, "t")]
    assert reasons == [
        "invalid JSON: not a JSON object",
        "unknown SharePlex op 'merge'",
        "not a SharePlex message: no meta.op",
        "op 'ins' without data",
    ]


# --- partial after images: the columns an update does not carry keep their values -------------
# Correct behaviour, asserted as such; needs partial-image merging in spark/apply.py.


def test_update_with_only_changed_columns_keeps_the_other_columns(spark, warehouse, tmp_path):
    first = write_lines(
        tmp_path / "dt=2026-01-01" / "1.jsonl",
        [msg("ins", CUSTOMERS, 100, 1, customer(1, "ann", "a@x", "Oslo"))],
    )
    # Inserts carry no `key` object: a batch of inserts alone needs the key configured.
    _replay(spark, warehouse, [first], key=["ID"], types={"ID": "int"})
    second = write_lines(
        tmp_path / "dt=2026-01-02" / "2.jsonl",
        [
            # a later batch changes only NAME of row 1
            msg("upd", CUSTOMERS, 200, 1, {"NAME": "ann b"}, key={"ID": "1"}),
            # in one batch: an insert, then two updates of different columns
            msg("ins", CUSTOMERS, 210, 1, customer(7, "gil", "g@x", "Kyiv")),
            msg("upd", CUSTOMERS, 220, 1, {"CITY": "Lviv"}, key={"ID": "7"}),
            msg("upd", CUSTOMERS, 230, 1, {"EMAIL": "g2@x"}, key={"ID": "7"}),
        ],
    )
    _replay(spark, warehouse, [second], key=["ID"], types={"ID": "int"})

    assert _current(spark, warehouse, CUSTOMERS) == {
        1: {"ID": 1, "NAME": "ann b", "EMAIL": "a@x", "CITY": "Oslo"},
        7: {"ID": 7, "NAME": "gil", "EMAIL": "g2@x", "CITY": "Lviv"},
    }
