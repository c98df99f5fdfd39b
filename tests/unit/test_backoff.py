"""The claim loop's back-off: when a failed work item is due again."""

from __future__ import annotations

import pytest

from faultline import store
from faultline.store import backoff


@pytest.mark.parametrize(
    ("attempt", "delay", "expected"),
    [
        (1, 0.0, 0.5),  # a first failure: the base
        (2, 0.0, 1.0),
        (3, 0.0, 2.0),
        (5, 0.0, 8.0),
        (10, 0.0, 256.0),
        (11, 0.0, 300.0),  # capped
        (1_000, 0.0, 300.0),  # no overflow however many attempts
        (1, 5.0, 5.0),  # the error's own delay when it is longer
        (4, 1.0, 4.0),  # the back-off when it is longer
        (20, 900.0, 900.0),  # a server's Retry-After is honoured past the cap
        (0, 0.0, 0.5),  # attempts are counted from 1
    ],
)
def test_retry_delay(attempt: int, delay: float, expected: float) -> None:
    assert store.retry_delay(attempt, delay) == expected


def test_retry_delay_grows_monotonically_to_its_cap() -> None:
    delays = [backoff.retry_delay(n, base=0.1, cap=3.0) for n in range(1, 12)]
    assert delays == sorted(delays)
    assert delays[0] == 0.1 and delays[-1] == 3.0
