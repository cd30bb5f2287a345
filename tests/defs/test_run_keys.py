"""Run keys and the sensors' cursor, without a sensor: one state of raw gives one key, a new
state or a recreated raw a new one, and a tick asks for a state once."""

import dagster as dg

from cdc_platform.defs.runs import SensorCursor, Tick, run_key


def _request(key: str) -> dg.RunRequest:
    return dg.RunRequest(run_key=key)


def test_one_state_one_key_and_long_states_are_hashed():
    assert run_key("t[0]:0-5", 3, 0) == "t[0]:0-5|raw=3|gen=0"
    assert run_key("t[0]:0-5", None, 1) == "t[0]:0-5|raw=none|gen=1"
    long = "x" * 500
    assert run_key(long, 3, 0) == run_key(long, 3, 0)
    assert run_key(long, 3, 0).startswith("sha1:") and len(run_key(long, 3, 0)) < 80
    assert run_key(long, 3, 0) != run_key(long + "y", 3, 0)


def test_a_state_is_requested_once_then_skipped_until_it_changes():
    first = Tick.start(None, 3).request("files a", "files", _request)
    assert [r.run_key for r in first.run_requests] == ["files a|raw=3|gen=0"]
    again = Tick.start(first.cursor, 3).request("files a", "files", _request)
    assert not again.run_requests and "already requested" in again.skip_reason.skip_message
    # Same pending text, raw moved on (the run ingested, new files arrived meanwhile): new key.
    moved = Tick.start(again.cursor, 4).request("files a", "files", _request)
    assert [r.run_key for r in moved.run_requests] == ["files a|raw=4|gen=0"]


def test_a_recreated_raw_starts_a_new_generation_that_stays():
    cursor = Tick.start(None, 7).request("p", "records", _request).cursor
    recreated = Tick.start(cursor, None)  # tables cleared: no raw any more
    assert recreated.generation == 1
    request = recreated.request("p", "records", _request)
    assert [r.run_key for r in request.run_requests] == ["p|raw=none|gen=1"]
    later = Tick.start(request.cursor, 0)  # raw written again from version 0
    assert (
        later.generation == 1
        and later.skip("idle").cursor
        == SensorCursor(run_key="p|raw=none|gen=1", raw_version=0, generation=1).dumps()
    )


def test_a_cursor_of_an_older_format_starts_over():
    assert SensorCursor.parse('{"run_key": "k"}') == SensorCursor()
    assert SensorCursor.parse("[1]") == SensorCursor()
    assert SensorCursor.parse(None) == SensorCursor()
