"""``json_records.wire_keys``: a message's image columns in the order it writes them."""

from cdc_platform.formats.json_records import wire_keys


def test_keys_of_each_path_in_wire_order_each_once():
    message = b'{"old": [{"b": 1, "x": 2}], "data": [{"z": 1, "b": 2, "a": null}]}'
    assert wire_keys(message, (("data", 0), ("old", 0))) == ["z", "b", "a", "x"]


def test_what_is_not_there_gives_nothing():
    assert wire_keys(b"not json", (("data",),)) == []
    assert wire_keys(None, (("data",),)) == []
    assert wire_keys('{"data": []}', (("data", 0),)) == []
    assert wire_keys('{"data": [1]}', (("data", 0),)) == []
    assert wire_keys('{"data": {"0": {"a": 1}}}', (("data", 0),)) == []  # no index of an object
    assert wire_keys('[{"a": 1}]', (("data",),)) == []
    assert wire_keys('{"after": {"b": 1, "a": 2}}', (("before",), ("after",))) == ["b", "a"]
