"""The adaptive bound of a continuous Kafka source's micro-batches: it converges on the count that
takes ``batch_seconds``, grows while the source has more, shrinks after a slow micro-batch, and
stays within the memory bound (``max_records``)."""

import pytest

from cdc_platform.defs.continuous import (
    FIRST_RECORDS_PER_SECOND,
    MAX_GROWTH,
    MIN_RECORDS,
    BatchBound,
)


def _took(records: int, fixed: float = 4.0, per_record: float = 1e-4) -> float:
    return fixed + per_record * records


def test_the_first_bound_is_a_guess_within_the_memory_bound():
    assert BatchBound(20, 10**6).records == 20 * FIRST_RECORDS_PER_SECOND
    assert BatchBound(20, 30_000).records == 30_000
    assert BatchBound(0.01, 10**6).records == MIN_RECORDS
    assert BatchBound(0.01, 6).records == 6


@pytest.mark.parametrize("start", [MIN_RECORDS, 100_000, 900_000])
def test_behind_it_converges_on_what_takes_batch_seconds(start):
    bound = BatchBound(20, 10**6, records=start)
    for _ in range(30):  # a backlog: every micro-batch is cut by the bound
        bound.learn(bound.records, _took(bound.records), bounded=True)
    # fixed 4 s + 0.1 ms a record: 160,000 records take 20 s
    assert bound.records == pytest.approx(160_000, rel=0.01)


def test_it_grows_at_most_max_growth_a_micro_batch():
    bound = BatchBound(20, 10**6, records=MIN_RECORDS)
    bound.learn(MIN_RECORDS, 0.1, bounded=True)
    assert bound.records == MIN_RECORDS * MAX_GROWTH


def test_it_never_passes_the_memory_bound():
    bound = BatchBound(20, 50_000, records=50_000)
    bound.learn(50_000, 1.0, bounded=True)
    assert bound.records == 50_000


def test_a_micro_batch_that_took_everything_in_time_says_nothing():
    bound = BatchBound(20, 10**6, records=100_000)
    bound.learn(30, 5.0, bounded=False)
    assert bound.records == 100_000


def test_a_slow_micro_batch_shrinks_it_even_when_it_took_everything():
    bound = BatchBound(20, 10**6, records=100_000)
    bound.learn(60_000, 40.0, bounded=False)  # the machine is busy: half as many next time
    assert bound.records == 30_000
    bound.learn(10, 400.0, bounded=False)
    assert bound.records == MIN_RECORDS
