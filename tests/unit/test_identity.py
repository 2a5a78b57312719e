"""Deterministic ids: ServiceControl's DeterministicGuid on the real sample header sets."""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest.headers import is_canonical_guid
from controlroom.errors.ingest.identity import (
    ID_CACHE_SIZE,
    deterministic_id,
    group_id,
    known_endpoint_id,
    unique_message_id,
)
from controlroom.exceptions import MessageRejected
from tests.unit import SAMPLE_UNIQUE_IDS, V8, V10, sample_headers


def test_deterministic_id_reads_md5_as_a_dotnet_guid() -> None:
    # md5("") = d41d8cd9 8f00 b204 e980 0998ecf8427e; a .NET Guid reads its first three
    # fields (4, 2 and 2 bytes) little-endian, so each of them is byte-reversed.
    assert deterministic_id("") == "d98c1dd4-008f-04b2-e980-0998ecf8427e"


def test_unique_message_id_of_the_nservicebus_10_sample() -> None:
    assert unique_message_id(sample_headers(V10)) == "4d0fa359-a748-5c14-e6c2-70c018dc84f7"


def test_unique_message_id_of_the_nservicebus_8_sample() -> None:
    assert unique_message_id(sample_headers(V8)) == "fcc478a8-4871-59f5-1546-02e396768e8b"


@pytest.mark.parametrize("index", sorted(SAMPLE_UNIQUE_IDS))
def test_unique_message_id_of_every_sample_matches_its_notes(index: int) -> None:
    assert unique_message_id(sample_headers(index)) == SAMPLE_UNIQUE_IDS[index]


def test_unique_message_id_is_message_id_plus_processing_endpoint() -> None:
    headers = {"NServiceBus.MessageId": "m-1", "NServiceBus.ProcessingEndpoint": "Sales"}
    assert unique_message_id(headers) == deterministic_id("m-1Sales")


def test_unique_message_id_falls_back_to_the_failed_queue_before_the_at() -> None:
    headers = {"NServiceBus.MessageId": "m-1", "NServiceBus.FailedQ": "Sales@host-1"}
    assert unique_message_id(headers) == deterministic_id("m-1Sales")


@pytest.mark.parametrize(
    "spelling",
    [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "0F8FAD5B-D9CB-469F-A165-70867728950E",
        "0f8fad5bd9cb469fa16570867728950e",
        "{0f8fad5b-d9cb-469f-a165-70867728950e}",
        "(0F8FAD5B-D9CB-469F-A165-70867728950E)",
    ],
)
def test_retry_header_wins_and_is_normalised_to_lower_case_d_form(spelling: str) -> None:
    headers = sample_headers(V10) | {"ServiceControl.Retry.UniqueMessageId": spelling}
    assert unique_message_id(headers) == "0f8fad5b-d9cb-469f-a165-70867728950e"


@pytest.mark.parametrize(
    "value",
    ["", "some-id", "../../etc/passwd", " 0f8fad5b-d9cb-469f-a165-70867728950e", "urn:uuid:x"],
)
def test_a_retry_header_that_is_not_a_guid_is_rejected_naming_it(value: str) -> None:
    headers = sample_headers(V10) | {"ServiceControl.Retry.UniqueMessageId": value}
    with pytest.raises(MessageRejected, match=re.escape("ServiceControl.Retry.UniqueMessageId")):
        unique_message_id(headers)


def test_missing_message_id_is_rejected_naming_it() -> None:
    with pytest.raises(MessageRejected, match=re.escape("NServiceBus.MessageId")):
        unique_message_id({"NServiceBus.FailedQ": "Sales"})


def test_missing_processing_endpoint_is_rejected() -> None:
    with pytest.raises(MessageRejected, match="processing endpoint"):
        unique_message_id({"NServiceBus.MessageId": "m-1", "NServiceBus.FailedQ": "@host"})


def test_group_id_hashes_classifier_then_classification() -> None:
    assert group_id("Message Type", "Ns.Order") == deterministic_id("Message TypeNs.Order")


def test_known_endpoint_id_hashes_name_then_d_form_host_id() -> None:
    host_id = "daaf5ebc-8d6a-51b7-b0dc-cdd8b15c3626"
    assert known_endpoint_id("Sales", host_id) == deterministic_id("Sales" + host_id)


@given(st.text())
def test_every_text_has_a_stable_canonical_id(text: str) -> None:
    first = deterministic_id(text)
    assert is_canonical_guid(first)
    assert deterministic_id(text) == first
    data = text.encode("utf-8", "surrogatepass")
    assert uuid.UUID(first).bytes_le == hashlib.md5(data).digest()


def _uncached(text: str) -> str:
    """The id as computed before the cache: ServiceControl's ``DeterministicGuid.MakeId``."""
    return str(uuid.UUID(bytes_le=hashlib.md5(text.encode("utf-8", "surrogatepass")).digest()))


@given(st.lists(st.tuples(st.text(), st.text()), max_size=30))
def test_cached_group_and_endpoint_ids_equal_uncached_ones(pairs: list[tuple[str, str]]) -> None:
    # Twice over: the first call fills the cache, the second reads it.
    for _ in range(2):
        for first, second in pairs:
            assert group_id(first, second) == _uncached(first + second)
            assert known_endpoint_id(first, second) == _uncached(first + second)


def test_the_id_cache_is_bounded() -> None:
    for n in range(ID_CACHE_SIZE + 50):
        assert group_id("Exception Type", f"E{n}") == _uncached(f"Exception TypeE{n}")
    assert group_id.cache_info().currsize <= ID_CACHE_SIZE
    assert known_endpoint_id.cache_info().maxsize == ID_CACHE_SIZE
