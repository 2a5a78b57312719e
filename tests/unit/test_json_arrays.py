"""A JSON array's elements as they were sent (``telemetry.json_arrays``): the same values
as decoding it whole, each with its exact bytes, whatever the spacing; anything that is
not one UTF-8 JSON array is a ``ValueError``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.telemetry.json_arrays import array_elements

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
spacing = st.sampled_from(["", " ", "\n\t ", "\r\n"])


@given(st.lists(values, max_size=5), spacing, spacing)
def test_each_element_is_its_value_and_its_exact_bytes(
    items: list[Any], inside: str, around: str
) -> None:
    written = [json.dumps(item, ensure_ascii=False) for item in items]
    body = f"{around}[{inside}{f'{inside},{inside}'.join(written)}{inside}]{around}".encode()

    elements = array_elements(body)

    assert [value for value, _ in elements] == json.loads(body)
    assert [raw for _, raw in elements] == [text.encode() for text in written]


def test_what_decoding_would_change_is_kept_as_written() -> None:
    element = b'{ "b" : 1.00000000000000000001, "a": 1e400, "a": "\\u00e9" }'

    ((value, raw),) = array_elements(b"[" + element + b"]")

    assert raw == element
    assert value == {"b": 1.0, "a": "é"}


def test_a_leading_byte_order_mark_is_ignored() -> None:
    assert array_elements(b"\xef\xbb\xbf[1]") == [(1, b"1")]


@pytest.mark.parametrize(
    "body",
    [
        *(b"", b"{}", b"1", b"[1,]", b"[1 2]", b"[1] x", b"[", b"[,1]", '["é"]'.encode("utf-16")),
        *(b"[NaN]", b'[{"a": Infinity}]', b"[-Infinity]"),  # not JSON (RFC 8259 section 6)
    ],
)
def test_anything_but_one_utf8_json_array_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        array_elements(body)


def test_an_element_nested_past_what_the_parser_reads_is_refused_as_not_json() -> None:
    # Python's decoder recurses per level: a 2 KB body must be a refusal, not a 500.
    deep = b"[" + b"[" * 5000 + b"]" * 5000 + b"]"
    with pytest.raises(ValueError, match="nested"):
        array_elements(deep)
