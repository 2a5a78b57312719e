"""The console's template filters that shape text: counts in their number, URL-like
values with break opportunities between their parts (escaped), related paths as links;
and what it says of a widened search."""

from __future__ import annotations

from controlroom.errors.ingest.search_terms import parse_search
from controlroom.errors.read.summaries import SearchPage
from controlroom.web.filters import breakable, counted, related_link
from controlroom.web.pages import search_note


def test_counted_puts_the_noun_in_its_number() -> None:
    assert counted(1, "monthly chain") == "1 monthly chain"
    assert counted(0, "event") == "0 events"
    assert counted(2, "entry", "entries") == "2 entries"


def test_breakable_escapes_and_breaks_after_punctuation_only() -> None:
    assert str(breakable("https://a.b/c?d=1&e")) == (
        "https://<wbr>a.<wbr>b/<wbr>c?<wbr>d=<wbr>1&amp;<wbr>e"
    )
    assert str(breakable("<script>x</script>")) == "&lt;script&gt;x&lt;/<wbr>script&gt;"
    assert str(breakable(None)) == ""


def test_every_kind_of_related_path_links_to_the_page_that_shows_it() -> None:
    assert related_link("/message/abc") == "/messages/abc"
    assert related_link("/site-call/0b1c") == "/site-calls/0b1c"
    assert related_link("/notification/9f2e") == "/notifications/9f2e"
    assert related_link("/site/north") == "/site-calls?site=north"
    assert related_link("/site/a b/c") == "/site-calls?site=a%20b%2Fc"
    assert related_link("/retry/7") == "/operations/7"  # a retry operation's page


def test_a_widened_search_of_several_words_does_not_say_each_is_missing() -> None:
    one = SearchPage(total=3, items=[], widened=("outofstock",))
    two = SearchPage(total=9, items=[], widened=("warehouse", "outofstock"))
    assert search_note(one) == (
        "No message contains “outofstock” as a whole word; showing messages with a word "
        "starting with it."
    )
    assert search_note(two) == (
        "No message contains “warehouse”, “outofstock” together as whole words; showing "
        "messages with words starting with them."
    )


def test_a_search_that_found_nothing_names_the_status_it_was_narrowed_to() -> None:
    # The list opens on Unresolved: an operator must not read "nothing" as "nowhere".
    nothing = SearchPage(total=0, items=[], query=parse_search("invalidoperation"))

    narrowed = search_note(nothing, status="Unresolved")

    assert narrowed.endswith(
        "Only Unresolved messages were searched: choose Any status to search them all."
    )
    assert "Only" not in search_note(nothing)
