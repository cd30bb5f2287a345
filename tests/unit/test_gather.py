"""When a continuous source's next micro-batch starts (``Gather``): at once when enough waits,
else ``max_wait_seconds`` after less was first seen; the wait starts again after each start and
whenever nothing waits."""

from cdc_platform.defs.continuous import Gather


def test_enough_waiting_starts_at_once():
    gather = Gather(minimum=1000, seconds=60)
    assert gather.ready(1000, now=0.0)
    assert gather.ready(5000, now=1.0)


def test_less_waits_until_max_wait_after_it_was_first_seen():
    gather = Gather(minimum=1000, seconds=60)
    assert not gather.ready(10, now=100.0)
    assert not gather.ready(20, now=159.9)  # more came: the wait still counts from 100
    assert gather.ready(30, now=160.0)
    assert not gather.ready(5, now=161.0)  # the next trickle waits anew
    assert gather.ready(5, now=221.0)


def test_more_arriving_within_the_wait_starts_once_enough():
    gather = Gather(minimum=1000, seconds=60)
    assert not gather.ready(400, now=0.0)
    assert gather.ready(1200, now=10.0)


def test_nothing_waiting_never_starts_and_resets_the_wait():
    gather = Gather(minimum=1000, seconds=60)
    assert not gather.ready(0, now=0.0)
    assert not gather.ready(10, now=1.0)
    assert not gather.ready(0, now=50.0)  # taken by another run meanwhile
    assert not gather.ready(10, now=70.0)  # seen anew at 70
    assert gather.ready(10, now=130.0)


def test_no_minimum_or_no_wait_starts_on_anything():
    assert Gather(minimum=0, seconds=60).ready(1, now=0.0)
    assert Gather(minimum=1000, seconds=0).ready(1, now=0.0)
