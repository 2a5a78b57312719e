"""A transport takes a prefetch of 1 to 65535 deliveries: AMQP's ``basic.qos`` carries it
as a 16-bit number (settings_sources.MAX_PREFETCH), and both transports take the same settings."""

from __future__ import annotations

import pytest

from controlroom.settings_sources import MAX_PREFETCH
from controlroom.transport.base import check_prefetch


def test_the_largest_prefetch_is_amqps() -> None:
    assert MAX_PREFETCH == 2**16 - 1
    check_prefetch(MAX_PREFETCH)


@pytest.mark.parametrize("prefetch", [0, -1, MAX_PREFETCH + 1, True, 2.0])
def test_a_prefetch_out_of_range_is_refused(prefetch: int) -> None:
    with pytest.raises(ValueError, match="prefetch must be an integer from 1 to 65535"):
        check_prefetch(prefetch)
