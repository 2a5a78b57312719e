"""CPU per message of the tokenizer (errors.ingest.search_terms) against the reference copy
of the regular-expression tokenizer kept in tests/unit/test_search_terms.py, on the
messages of benchmarks/ingest.py, in interleaved rounds (the order alternating), with the
ratio taken per round; then each one's terms per message, and how many of them no other
message of the set holds (each such term is an entry of its own in the full-text index,
one descent of it per message, in a tree that grows with the table: benchmarks/README.md
"Terms a search never asks for"). Run from the repository's root:

    PYTHONPATH=src:. python benchmarks/tokenizer.py [--messages 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import ingest

from controlroom.errors.ingest.search_terms import message_search_terms
from tests.unit.test_search_terms import reference_message_search_terms

Tokenizer = Callable[[dict[str, str | None], str | None], list[str]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    messages = ingest.generate_messages(
        args.messages, seed=1, now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    inputs = {
        "headers+body": [(m.headers, m.body.decode()) for m in messages],
        "headers only": [(m.headers, None) for m in messages],
    }
    methods: list[tuple[str, Tokenizer]] = [
        ("reference", reference_message_search_terms),
        ("current", message_search_terms),
    ]
    figures: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name, tokenize in methods if round_ % 2 == 0 else methods[::-1]:
            for part, items in inputs.items():
                start = time.process_time()
                for headers, body in items:
                    tokenize(headers, body)
                seconds = time.process_time() - start
                figures.setdefault((name, part), []).append(seconds / len(items) * 1e6)
    for (name, part), values in figures.items():
        print(
            f"{name:9} {part:12} median {statistics.median(values):6.1f} us CPU/msg "
            f"({min(values):.1f}-{max(values):.1f})"
        )
    for part in inputs:
        ratios = [
            new / old
            for new, old in zip(
                figures[("current", part)], figures[("reference", part)], strict=True
            )
        ]
        print(
            f"{part}: current / reference, same round: median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )
    for name, tokenize in methods:
        print_terms(name, [tokenize(headers, body) for headers, body in inputs["headers+body"]])


def print_terms(name: str, terms_per_message: list[list[str]]) -> None:
    """Terms per message, and those of them no other message holds (mean, headers+body)."""
    messages = Counter(term for terms in terms_per_message for term in terms)
    count = len(terms_per_message)
    total = sum(map(len, terms_per_message))
    own = sum(messages[term] == 1 for terms in terms_per_message for term in terms)
    print(f"{name:9} terms per message {total / count:6.1f}, of its own {own / count:5.1f}")


if __name__ == "__main__":
    main()
