"""A queue's name is refused at start unless RabbitMQ's client can declare it (second
breaker pass: ``break_fehler_ä``, a NUL or a line feed passed the settings, then pamqp
refused the declare, "Invalid value for queue", and the intake worker restarted in a
loop; with ``ingestion.workers = 0`` serve exited with a traceback)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp.commands import Queue
from pydantic import ValidationError

from controlroom.config import Settings


@pytest.mark.parametrize("name", ["fehler_\u00e4", "e\x00rr", "error\n", "a;b", "queue?"])
@pytest.mark.parametrize("setting", ["error_queue", "telemetry_queue"])
def test_a_queue_name_rabbitmq_cannot_declare_is_refused(setting: str, name: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{setting: name})
    [error] = refused.value.errors()
    assert error["loc"] == (setting,)
    assert "letters, digits" in error["msg"]


@given(st.text(min_size=1, max_size=255))
def test_every_queue_name_the_settings_take_rabbitmq_can_declare(name: str) -> None:
    try:
        Settings(error_queue=name)
    except ValidationError:
        return
    Queue.Declare(queue=name).validate()  # raises ValueError for a name pamqp refuses
