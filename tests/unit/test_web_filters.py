"""The console's template filters that shape text: counts in their number, and URL-like
values with break opportunities between their parts (escaped)."""

from __future__ import annotations

from controlroom.web.filters import breakable, counted


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
