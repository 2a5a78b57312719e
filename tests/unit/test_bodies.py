"""Body placement (every rule of docs/design.md "Body placement") and the file-system body store."""

from __future__ import annotations

import gzip
import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest import bodies
from controlroom.errors.ingest.bodies import (
    BodyNotFoundError,
    FileSystemBodyStore,
    body_key,
    is_text_body,
    parse_body_key,
    place_body,
)
from controlroom.errors.model import BodyPlacement
from controlroom.exceptions import BodyStoreError

CAP = 102_400  # the default max_body_size_to_store
MESSAGE = "0f8fad5b-d9cb-469f-a165-70867728950e"
OTHER = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


# --- is_text_body -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content_type", "encoding", "expected"),
    [
        ("text/plain", None, True),
        ("TEXT/CSV; charset=utf-8", None, True),
        ("application/json", None, True),
        ("application/vnd.api+JSON", None, True),
        ("text/xml", None, True),
        ("application/soap+xml", None, True),
        ("application/octet-stream", None, False),
        ("application/x-protobuf", None, False),
        ("image/png", None, False),
        ("", None, False),
        (None, None, False),
        ("application/json", "gzip", False),
        ("text/plain", "br", False),
    ],
)
def test_is_text_body(content_type: str | None, encoding: str | None, expected: bool) -> None:
    assert is_text_body(content_type, encoding) is expected


# --- placement: one test per rule ---------------------------------------------------------
def test_text_exactly_at_the_cap_is_inline() -> None:
    body = b"a" * CAP
    placement = place_body(body, "text/plain", None, CAP)
    assert placement.external is False
    assert placement.text == "a" * CAP
    assert placement.size == CAP


def test_text_one_byte_over_the_cap_is_external_with_a_cap_sized_prefix() -> None:
    body = b"a" * (CAP + 1)
    placement = place_body(body, "application/json", None, CAP)
    assert placement.external is True
    assert placement.text == "a" * CAP
    assert placement.size == CAP + 1


# A 2-, 3- or 4-byte character starting `offset` bytes before the cap: the cap falls inside.
STRADDLES = [(c, offset) for c in ("é", "€", "𝄞") for offset in range(1, len(c.encode()))]


@pytest.mark.parametrize(("char", "offset"), STRADDLES)
def test_prefix_is_cut_before_a_character_that_straddles_the_cap(char: str, offset: int) -> None:
    encoded = char.encode()
    body = b"a" * (CAP - offset) + encoded + b"z" * 10
    placement = place_body(body, "text/plain", None, CAP)
    assert placement.external is True
    assert placement.text == "a" * (CAP - offset)
    assert placement.size == len(body)


def test_a_character_ending_exactly_at_the_cap_is_kept() -> None:
    body = b"a" * (CAP - 2) + "é".encode() + b"z"
    placement = place_body(body, "text/plain", None, CAP)
    assert placement.text == "a" * (CAP - 2) + "é"


def test_binary_content_type_is_external_only() -> None:
    body = b"\x89PNG\r\n" + b"a" * 10
    placement = place_body(body, "image/png", None, CAP)
    assert (placement.external, placement.text, placement.size) == (True, None, len(body))


@pytest.mark.parametrize(
    "body",
    [
        b"ok \xff not utf-8",
        b"\xc3\x28",  # bad continuation
        b"\xc0\xaf",  # overlong "/"
        b"\xed\xa0\x80",  # UTF-16 surrogate
        b"a" * (CAP + 10) + b"\xff",  # invalid only after the cap: still not text
    ],
)
def test_text_type_that_is_not_strict_utf8_is_external_only(body: bytes) -> None:
    placement = place_body(body, "text/plain", None, CAP)
    assert (placement.external, placement.text, placement.size) == (True, None, len(body))


@pytest.mark.parametrize("body", [b"a\x00b", b"\x00", b"a" * (CAP + 10) + b"\x00"])
def test_text_containing_nul_is_external_only(body: bytes) -> None:
    placement = place_body(body, "application/json", None, CAP)
    assert (placement.external, placement.text, placement.size) == (True, None, len(body))


def test_gzip_encoded_json_is_external_only() -> None:
    body = gzip.compress(b'{"a": 1}')
    placement = place_body(body, "application/json", "gzip", CAP)
    assert (placement.external, placement.text, placement.size) == (True, None, len(body))


def test_an_encoded_body_is_binary_even_when_its_bytes_are_utf8() -> None:
    placement = place_body(b'{"a": 1}', "application/json", "gzip", CAP)
    assert (placement.external, placement.text) == (True, None)


def test_cap_zero_keeps_an_empty_prefix() -> None:
    placement = place_body(b"abc", "text/plain", None, 0)
    assert (placement.external, placement.text, placement.size) == (True, "", 3)


def test_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="cap"):
        place_body(b"abc", "text/plain", None, -1)


@pytest.mark.parametrize(
    ("body", "content_type", "encoding"),
    [
        (b"a" * 10, "text/plain", None),
        (b"a" * (CAP * 3), "text/plain", None),
        (b"\xff" * (CAP * 2), "text/plain", None),
        (b"\x00" * 5, "application/json", None),
        (os.urandom(CAP + 7), "application/octet-stream", None),
        (gzip.compress(b"x" * CAP * 4), "text/plain", "gzip"),
    ],
)
def test_size_is_always_the_true_size(body: bytes, content_type: str, encoding: str | None) -> None:
    assert place_body(body, content_type, encoding, CAP).size == len(body)


@given(st.text(), st.integers(min_value=0, max_value=64))
def test_text_placement_prefix_is_valid_bounded_and_maximal(text: str, cap: int) -> None:
    body = text.encode("utf-8", "surrogatepass")
    placement = place_body(body, "text/plain", None, cap)
    assert placement.size == len(body)
    if not body:  # stored nowhere (tests/unit/test_parity_parsing.py)
        assert (placement.external, placement.text) == (False, None)
        return
    if "\x00" in text or any("\ud800" <= c <= "\udfff" for c in text):
        assert (placement.external, placement.text) == (True, None)
        return
    assert placement.text is not None
    prefix = placement.text.encode("utf-8")  # valid UTF-8 by construction of a str
    assert len(prefix) <= cap or not placement.external
    assert body.startswith(prefix)
    assert placement.external is (len(body) > cap)
    if placement.external:
        # Maximal: the next whole character would not have fitted under the cap.
        next_char = body[len(prefix) :].decode()[:1].encode()
        assert len(prefix) + len(next_char) > cap
    else:
        assert placement.text == text


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=300))
def test_any_bytes_place_safely(body: bytes, cap: int) -> None:
    placement = place_body(body, "text/plain", None, cap)
    assert placement.size == len(body)
    if placement.text is None:
        assert placement.external is bool(body)  # an empty body is stored nowhere
    else:
        encoded = placement.text.encode("utf-8")
        assert body.startswith(encoded)
        assert b"\x00" not in encoded
        assert len(encoded) <= cap or encoded == body


# --- keys ---------------------------------------------------------------------------------
def test_body_key_is_the_message_id_and_the_body_hash() -> None:
    assert body_key(MESSAGE, b"abc") == f"{MESSAGE}/{hashlib.sha256(b'abc').hexdigest()}"
    assert body_key(MESSAGE.upper(), b"abc") == body_key(MESSAGE, b"abc")
    assert body_key(MESSAGE.replace("-", ""), b"abc") == body_key(MESSAGE, b"abc")


@pytest.mark.parametrize("unique_id", ["", "../../etc", "msg-1", MESSAGE + "/x", f" {MESSAGE}"])
def test_body_key_refuses_a_non_guid_id(unique_id: str) -> None:
    with pytest.raises(ValueError, match="GUID"):
        body_key(unique_id, b"abc")


@pytest.mark.parametrize(
    "key",
    [
        "",
        f"{MESSAGE}/{'a' * 63}",
        f"{MESSAGE}/{'A' * 64}",
        f"{MESSAGE.upper()}/{'a' * 64}",
        f"{MESSAGE}/{'a' * 64}\n",
        f"../{MESSAGE[3:]}/{'a' * 64}",
        f"{MESSAGE}/../{'a' * 61}",
        f"/{MESSAGE}/{'a' * 63}",
        f"{MESSAGE}\\{'a' * 64}",
    ],
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="not a body key"):
        parse_body_key(key)


# --- the file-system store ----------------------------------------------------------------
def test_put_get_exists_round_trip(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path / "bodies")
    key = body_key(MESSAGE, b"payload")
    assert store.exists(key) is False
    store.put(key, b"payload")
    assert store.exists(key) is True
    assert store.get(key) == b"payload"
    assert (tmp_path / "bodies" / MESSAGE / key.split("/")[1]).read_bytes() == b"payload"


def test_put_is_idempotent_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path)
    key = body_key(MESSAGE, b"payload")
    store.put(key, b"payload")
    store.put(key, b"payload")
    assert [p.name for p in (tmp_path / MESSAGE).iterdir()] == [key.split("/")[1]]


def test_put_repairs_a_damaged_copy(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path)
    key = body_key(MESSAGE, b"payload")
    store.put(key, b"payload")
    (tmp_path / key).write_bytes(b"pay")  # e.g. truncated by an outside hand
    store.put(key, b"payload")
    assert store.get(key) == b"payload"


def test_put_refuses_data_that_does_not_match_its_key(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path)
    with pytest.raises(ValueError, match="does not match"):
        store.put(body_key(MESSAGE, b"one"), b"two")
    assert not (tmp_path / MESSAGE).exists()


def test_get_of_an_absent_body_is_a_clear_not_found(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path)
    key = body_key(MESSAGE, b"never stored")
    with pytest.raises(BodyNotFoundError, match=f"no body stored under {key}") as caught:
        store.get(key)
    assert isinstance(caught.value, KeyError)
    assert isinstance(caught.value, FileNotFoundError)


def test_every_operation_refuses_a_malformed_key(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path / "root")
    (tmp_path / "secret").write_bytes(b"x")
    for call in (store.get, store.exists, lambda key: store.put(key, b"x")):
        with pytest.raises(ValueError):
            call("../secret")
    with pytest.raises(ValueError):
        store.delete_message("..")


def test_delete_message_removes_all_its_bodies_and_only_its(tmp_path: Path) -> None:
    store = FileSystemBodyStore(tmp_path)
    keys = [body_key(MESSAGE, data) for data in (b"one", b"two")]
    store.put(keys[0], b"one")
    store.put(keys[1], b"two")
    other = body_key(OTHER, b"one")
    store.put(other, b"one")
    store.delete_message(MESSAGE)
    assert not any(store.exists(key) for key in keys)
    assert not (tmp_path / MESSAGE).exists()
    assert store.get(other) == b"one"
    store.delete_message(MESSAGE)  # nothing left: a no-op


def test_a_failed_write_raises_body_store_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_bytes(b"a file where the root directory should be")
    store = FileSystemBodyStore(root)
    with pytest.raises(BodyStoreError, match="cannot store body"):
        store.put(body_key(MESSAGE, b"x"), b"x")


def test_a_failed_fsync_leaves_neither_the_body_nor_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileSystemBodyStore(tmp_path)
    key = body_key(MESSAGE, b"x")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(bodies.os, "fsync", failing_fsync)
    with pytest.raises(BodyStoreError, match="Input/output error"):
        store.put(key, b"x")
    monkeypatch.undo()
    assert list((tmp_path / MESSAGE).iterdir()) == []
    assert store.exists(key) is False


def test_placing_a_large_text_body_never_decodes_it_whole() -> None:
    # 20 MiB of two-byte characters: decoded whole it would be a 10 MiB str beside it.
    body = ("é" * (10 * 1024 * 1024)).encode()
    tracemalloc.start()
    try:
        placement = place_body(body, "application/json", None, CAP)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert placement.external
    assert placement.text == "é" * (CAP // 2)
    assert peak < 4 * bodies.VALIDATION_CHUNK + 4 * CAP  # the old whole decode: 10 MiB


def test_a_large_body_that_is_not_utf8_past_the_first_chunk_is_binary() -> None:
    body = b"a" * (3 * bodies.VALIDATION_CHUNK) + b"\xff" + b"a" * 10
    placement = place_body(body, "text/plain", None, CAP)
    assert placement == BodyPlacement(size=len(body), text=None, external=True)


def test_a_character_across_two_validation_chunks_is_text() -> None:
    body = b"a" * (bodies.VALIDATION_CHUNK - 1) + "é".encode() + b"a" * 10
    assert place_body(body, "text/plain", None, CAP).text == "a" * CAP
