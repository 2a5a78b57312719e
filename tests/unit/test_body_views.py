"""The console's body views (pure): pretty JSON and XML, decompression and its limits,
hex for binary, and a view that says when it shows less than the body."""

from __future__ import annotations

import gzip
import zlib

from controlroom.web.bodies import MAX_DECOMPRESSED_BYTES, MAX_SHOWN_BYTES, view_body


def test_json_is_indented_and_invalid_json_is_shown_as_is() -> None:
    assert view_body(b'{"a":[1]}', "application/json", None).text == '{\n  "a": [\n    1\n  ]\n}'
    broken = view_body(b'{"a":', "application/json", None)
    assert (broken.kind, broken.text) == ("text", '{"a":')


def test_xml_with_an_entity_expansion_is_shown_as_is() -> None:
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><x>&b;</x>'
    )
    view = view_body(bomb, "application/xml", None)
    assert view.kind in ("xml", "text")
    assert len(view.text) < 10_000


def test_gzip_and_deflate_are_undone_and_an_unknown_encoding_is_said() -> None:
    assert view_body(gzip.compress(b"hello"), "text/plain", "gzip").text == "hello"
    assert view_body(zlib.compress(b"hello"), "text/plain", "deflate").text == "hello"
    unknown = view_body(b"\x00\x01", "text/plain", "br")
    assert unknown.kind == "binary" and unknown.note is not None and "'br'" in unknown.note


def test_a_body_inflating_past_the_limit_is_not_inflated() -> None:
    bomb = gzip.compress(b"\x00" * (MAX_DECOMPRESSED_BYTES + 1))
    view = view_body(bomb, "text/plain", "gzip")
    assert view.encoding is None and view.note is not None and "inflates" in view.note


def test_binary_is_a_hex_dump_and_a_long_text_says_it_is_partial() -> None:
    binary = view_body(b"\xff\x00AB", "application/octet-stream", None)
    assert binary.kind == "binary"
    assert binary.text == "00000000  ff 00 41 42".ljust(10 + 47) + "  ..AB"
    long = view_body(b"x" * (MAX_SHOWN_BYTES + 10), "text/plain", None)
    assert long.partial and long.shown_size == MAX_SHOWN_BYTES
