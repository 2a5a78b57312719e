"""The tokenizer shared by the index and the query (errors.ingest.search_terms): what a
message's terms are, that every query made of its text asks only for terms it has, and
the bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlroom.errors.ingest.search_terms import (
    MAX_TERM_CHARS,
    MAX_TERMS,
    message_search_terms,
    query_search_terms,
)

GUID = "3a70adf2-2ade-430b-a91b-b33b000cea13"


def finds(text: str, headers: dict[str, str | None], body: str | None = None) -> bool:
    """Whether a search for ``text`` matches a message (every query term indexed)."""
    terms = set(message_search_terms(headers, body))
    query = query_search_terms(text)
    return bool(query) and set(query) <= terms


@pytest.mark.parametrize(
    "text",
    [
        "System.InvalidOperationException",
        "InvalidOperationException",
        "invalidoperationexception",
        "Shop.Sales.CreditPolicy.Approve",
        "CreditPolicy.Approve",
        "Approve(PlaceOrder",
    ],
)
def test_a_dotted_net_name_is_found_whole_and_by_any_part(text: str) -> None:
    headers = {
        "NServiceBus.ExceptionInfo.ExceptionType": "System.InvalidOperationException",
        "NServiceBus.ExceptionInfo.StackTrace": "at Shop.Sales.CreditPolicy.Approve(PlaceOrder m)",
    }

    assert finds(text, headers)


def test_a_token_is_indexed_as_written_and_split_at_punctuation() -> None:
    terms = message_search_terms({"type": "System.InvalidOperationException"}, None)

    assert terms == ["system", "invalidoperationexception", "system.invalidoperationexception"]


@pytest.mark.parametrize(
    "text",
    ["/srv/warehouse/app/handlers/stock.py", "handlers/stock.py", "reserve_stock", "domain.errors"],
)
def test_a_python_path_is_found_whole_and_by_any_part(text: str) -> None:
    trace = (
        'File "/srv/warehouse/app/handlers/stock.py", line 88, in reserve_stock\n'
        "warehouse.domain.errors.StockLevelError: BLU-CHAIR-04"
    )

    assert finds(text, {"trace": trace})


@pytest.mark.parametrize("text", [GUID, GUID.upper(), f"{{{GUID}}}", "b33b000cea13"])
def test_a_guid_is_found_in_any_case_and_by_a_part(text: str) -> None:
    assert finds(text, {"NServiceBus.MessageId": GUID})
    assert GUID in message_search_terms({"NServiceBus.MessageId": GUID}, None)


@pytest.mark.parametrize("text", [f"{{{GUID}}}\\16389", "16389", GUID])
def test_a_message_id_of_a_guid_and_a_sequence_number_is_found(text: str) -> None:
    assert finds(text, {"NServiceBus.MessageId": f"{{{GUID}}}\\16389"})


def test_a_different_guid_is_not_found() -> None:
    assert not finds("1df93f45-324e-43b4-88c5-b33b000cea00", {"id": GUID})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Ошибка", "Ошибка обработки заказа"),
        ("ΣΦΆΛΜΑ", "σφάλμα: η παραγγελία"),
        ("注文処理", "注文処理 に失敗しました"),
        ("الطلب", "فشل معالجة الطلب"),
        ("Ünïcödé", "ünïcödé ✓"),
        ("हिन्दी", "त्रुटि हिन्दी संदेश"),
    ],
)
def test_non_latin_text_is_found(text: str, value: str) -> None:
    assert finds(text, {"NServiceBus.ExceptionInfo.Message": value})


def test_header_names_are_not_terms_only_their_values() -> None:
    terms = message_search_terms({"NServiceBus.EnclosedMessageTypes": "Shop.PlaceOrder"}, None)

    assert "nservicebus" not in terms and "enclosedmessagetypes" not in terms
    assert "placeorder" in terms


def test_a_json_body_gives_its_words_not_its_punctuation() -> None:
    terms = message_search_terms({}, '{"OrderId":"ORD-1","Note":"zanzibar delivery"}')

    assert terms == ["orderid", "ord", "1", "note", "zanzibar", "delivery", "ord-1"]


def test_terms_are_distinct_lower_case_and_never_empty() -> None:
    terms = message_search_terms({"a": "Boom BOOM boom", "b": None, "c": "", "d": "-- ..."}, "Boom")

    assert terms == ["boom"]


def test_lone_surrogates_and_nul_never_reach_a_term() -> None:
    terms = message_search_terms({"a": "ab\ud800cd", "b": "x\x00y"}, None)

    assert terms == ["ab", "cd", "x", "y"]


def test_a_1_mb_body_is_bounded() -> None:
    words = " ".join(f"word{n}" for n in range(200_000))  # ~1.3 MB, 200,000 distinct words
    terms = message_search_terms({"id": "first"}, words)

    assert len(terms) == MAX_TERMS
    assert terms[:2] == ["first", "word0"]  # header values first, then the body in order


def test_a_1_mb_token_is_one_term_cut_to_the_bound() -> None:
    body = "x" + "a." * 500_000  # one token of 1 MB with as many parts as characters / 2

    terms = message_search_terms({}, body)

    assert len(terms) <= MAX_TERMS
    assert all(0 < len(term) <= MAX_TERM_CHARS for term in terms)
    assert finds("x" + "a." * 100, {}, body)  # found by what it starts with


def test_a_long_word_is_found_by_itself_cut_the_same_way() -> None:
    word = "k" * 500

    assert finds(word, {"key": word})
    # Only its first MAX_TERM_CHARS characters tell it from another word.
    assert not finds("z" + word, {"key": word})
    assert finds(word + "z", {"key": word})


@pytest.mark.parametrize(
    "text",
    ["a & b", "a | b", "!a", "a:*", "'a'", '"a"', "a\\b", "a & | ! :* ' \" \\ b"],
)
def test_query_syntax_characters_are_never_terms(text: str) -> None:
    assert set(query_search_terms(text)) <= {"a", "b"}


def test_a_query_without_letters_or_digits_has_no_terms() -> None:
    assert query_search_terms(" & | ! :* ' \" \\ \x00 ") == []


ascii_texts = st.text(
    st.one_of(
        st.characters(max_codepoint=127),
        st.sampled_from(list("._-:/\\@+#$%&*!?~^\"'()[]{}<>,;=|` \t\n\x00\x7fAZaz09")),
    ),
    max_size=300,
)


@given(ascii_texts)
def test_ascii_text_gives_the_terms_the_unicode_patterns_give(text: str) -> None:
    # A value that is not ASCII sends the header values through the Unicode patterns;
    # its one term, "é", comes last of the parts and is the only difference.
    ascii_only = message_search_terms({"a": text}, text)
    through_unicode = message_search_terms({"a": text, "b": "é"}, "é " + text)

    assert [term for term in through_unicode if term != "é"] == ascii_only
