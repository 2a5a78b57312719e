"""Full-text search of failed messages: the condition, the page and its total, exact or
estimated, by the cheapest of the forms below for how many messages match.

SQLAlchemy Core only; the user's text only ever a bound parameter.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from controlroom.db.providers import Provider, SearchQuery, provider_for
from controlroom.db.tables import failed_messages
from controlroom.errors.ingest.search_terms import parse_search, widened, widened_words
from controlroom.errors.read.counts import Total, count_failed_messages, count_rows, kept_count
from controlroom.errors.read.filters import (
    EVERY_MESSAGE,
    FailedMessageFilter,
    Ordering,
    as_uuid,
    check_window,
    filter_conditions,
    message_id_is,
    order_by,
    sort_columns,
)
from controlroom.errors.read.lists import merged_statuses, merged_walks
from controlroom.errors.read.summaries import SUMMARY_COLUMNS, SearchPage, hits_page, to_hit

fm = failed_messages.c


BROAD_SEARCH_ESTIMATE = 5
"""A search whose matches in a sample of the messages (``SEARCH_SAMPLE``) come to this
many times the exact-count limit or more is a broad search: its page is looked for among
the first rows of the sort order and nothing is counted (``_page_of_a_broad_search``). At
the default limit and 1,000,000 messages: 5 % of them, 25 of the sample."""

SEARCH_SAMPLE = 500
"""The messages a broad search is sampled on: the first by id. Ids are UniqueMessageIds,
digests of the message id and endpoint (``errors.ingest.identity``), unrelated to content,
time or storage: a random sample, so a burst of recent matches, or matches stored first,
do not pass for many (a store of sequential ids would have no such sample)."""

SEARCH_SAMPLE_MATCHES = 10
"""The fewest matches in the sample that count as evidence (below, chance decides)."""

BROAD_SEARCH_WINDOW = 40
"""How many rows of the sort order per row up to the page's end a broad search's page is
looked for in: twice what a search matching 5 % of the messages needs. Where the window
holds no full page, testing it was wasted: about 2,000 rows for a first page of 50."""

WINDOW_GROWTH = 4
"""How many times wider each next window of a walk is, when the last held no full page
(``_search_page_of_many``)."""

WALKED_ROW_COST = 4
"""About how many collected matches cost what one row of a walk's window costs: at
1,000,000 messages on SQLite a window of 14,250 rows took 97 ms, collecting 302,597
matches 684 ms (``benchmarks/README.md``, ``views_http.py``). A walk widens no further
than the matches / this many rows (``_search_page_of_many``)."""

BROAD_SEARCH_WINDOW_MAX = 20_000
"""No window past this many rows: a deeper page of a broad search counts first, and a
search of many matches walks the sort order unbounded (``_search_page_of_many``)."""


def search_failed_messages(
    conn: sa.Connection,
    text: str,
    *,
    offset: int,
    limit: int,
    order: Ordering = Ordering(),
    where: FailedMessageFilter = EVERY_MESSAGE,
    exact_count_limit: int | None = None,
    any_word: bool = False,
    widen: bool = False,
) -> SearchPage:
    """Failed messages whose headers or body text contain ``text`` (the provider's
    full-text index over the terms of ``errors.ingest.search_terms``: every term of
    ``text`` must occur, or with ``any_word`` those of one of its words; a word ending in ``*`` as a
    prefix, ``parse_search``), or whose message id is ``text``, or whose id
    (UniqueMessageId) is ``text`` when it is a UUID, among those matching ``where``; in
    ``order``, with the total: exact, or past ``exact_count_limit`` an estimate
    (``_total_past_limit``).

    With ``widen``, a search that matches nothing is run again with its words of at
    least ``MIN_PREFIX_CHARS`` characters as prefixes (``widened``); the page then names
    them in ``widened``. A search that matched costs nothing more; one that matched
    nothing costs a second search, of prefixes.

    Raises ``ValueError`` for a negative ``offset`` or a ``limit`` below 1.
    """
    check_window(offset, limit)
    query = parse_search(text, any_word=any_word)
    found = _search_query(conn, text, query, offset, limit, order, where, exact_count_limit)
    if not widen or found.total:
        return replace(found, query=query)
    wider = widened(query)
    if wider == query:
        return replace(found, query=query)
    again = _search_query(conn, text, wider, offset, limit, order, where, exact_count_limit)
    return replace(again, query=wider, widened=tuple(widened_words(query, wider)))


def _search_query(
    conn: sa.Connection,
    text: str,
    query: SearchQuery,
    offset: int,
    limit: int,
    order: Ordering,
    where: FailedMessageFilter,
    exact_count_limit: int | None,
) -> SearchPage:
    """``search_failed_messages`` of ``query``, the terms of ``text``."""
    condition = sa.and_(search_condition(conn.dialect, text, query), *filter_conditions(where))
    provider = provider_for(conn)
    provider.prepare_search(conn)
    if exact_count_limit is None:
        return _search_page(conn, condition, offset, limit, order)
    matching = sa.select(sa.literal(1)).select_from(failed_messages).where(condition)
    broad, sampled = _page_of_a_broad_search(
        conn, condition, matching, exact_count_limit, offset, limit, order, _prefixed(query)
    )
    if broad is not None:
        return broad
    hits = provider.count_search_hits(conn, query, exact_count_limit)
    if hits is not None and hits <= exact_count_limit:
        # Few by the terms; the id alternatives add a handful, which the page counts.
        return _search_page(conn, condition, offset, limit, order)
    total = _broad_among(conn, query, where, exact_count_limit) if hits is not None else None
    if total is None:
        if hits is None or where != EVERY_MESSAGE:
            few = _search_page(conn, condition, offset, limit, order, cap=exact_count_limit + 1)
            if few.total <= exact_count_limit:
                return few
        total = _total_past_limit(conn, query, matching, where, exact_count_limit, hits is not None)
    walk_pays = _walk_pays(conn, query, where, matching, total, exact_count_limit, offset + limit)
    if not walk_pays:
        return _search_page(conn, condition, offset, limit, order)
    spread = max(total.value, sampled or 0)
    return _search_page_of_many(
        conn, text, query, where, condition, total, spread, offset, limit, order
    )


def _broad_among(
    conn: sa.Connection, query: SearchQuery, where: FailedMessageFilter, exact_count_limit: int
) -> Total | None:
    """The estimated total of a search of ``query`` among ``where`` (not every message)
    whose hits the provider counted in its full-text index past ``exact_count_limit``
    (SQLite), where the provider's sample of the hits meeting ``where``
    (``Provider.estimate_search_hits``) comes to ``BROAD_SEARCH_ESTIMATE`` x the limit or
    more, as a broad search's sample must (``_page_of_a_broad_search``); else ``None``
    (the caller counts). Collecting the matches up to the limit, then counting every one,
    read each match's row: 0.15 s and 0.57 s for 200,943 Unresolved of 1,000,000 messages
    (the console's default status), the sample 4 ms (``benchmarks/README.md``)."""
    if where == EVERY_MESSAGE:
        return None
    estimate = provider_for(conn).estimate_search_hits(conn, query, filter_conditions(where))
    if estimate is None or estimate < BROAD_SEARCH_ESTIMATE * exact_count_limit:
        return None
    return _estimated(conn, where, estimate, exact_count_limit)


def _walk_pays(
    conn: sa.Connection,
    query: SearchQuery,
    where: FailedMessageFilter,
    matching: sa.Select[Any],
    total: Total,
    exact_count_limit: int,
    rows: int,
) -> bool:
    """Whether walking the sort order to the page's end (``rows``: offset + limit) is
    expected to read no more rows than the search of ``query`` among ``where`` matches
    (``matching``: a row per match; ``total``, more than ``exact_count_limit``).

    The walk passes about ``rows`` x all messages / matches rows, matching or not;
    collecting reads the matches alone: the walk pays where the matches number at least
    the square root of ``rows`` x all messages (docs/decisions.md "A subset is read from
    its own rows"). Known without counting where the total is exact or the limit already
    passed that many; else the matches are counted up to that many, in the full-text
    index alone where the provider can (``Provider.count_search_hits``) and nothing else
    filters, else through their rows: never more than the walk would read, and only
    matches. An estimate decides nothing here: a sampled estimate of an old burst of
    matches can be many times their number."""
    needed = math.isqrt(max(rows * count_failed_messages(conn), 1) - 1) + 1  # ceil of the root
    if not total.estimated:
        return total.value >= needed
    if needed <= exact_count_limit + 1:
        return True
    if where == EVERY_MESSAGE:
        hits = provider_for(conn).count_search_hits(conn, query, needed - 1)
        if hits is not None:
            return hits >= needed
    return count_rows(conn, matching.limit(needed)) >= needed


def _prefixed(query: SearchQuery) -> bool:
    """Whether any alternative of ``query`` holds a prefix."""
    return any(terms.prefixes for terms in query.alternatives)


def _page_of_a_broad_search(
    conn: sa.Connection,
    condition: sa.ColumnElement[bool],
    matching: sa.Select[Any],
    exact_count_limit: int,
    offset: int,
    limit: int,
    order: Ordering,
    prefixed: bool,
) -> tuple[SearchPage | None, int | None]:
    """The page of a broad search with its estimated total, or ``None`` (the caller
    counts, as for any search); and the sample's matches scaled to every message when
    the sample was taken and held at least ``SEARCH_SAMPLE_MATCHES`` (else ``None``).

    Broad: the provider estimates more than the exact-count limit (a cheap gate: SQLite
    has no such estimate; a ``prefixed`` search passes it whatever the estimate, as
    PostgreSQL's planner prices a prefix as a rare word: 4,449 estimated of 59,247
    matching at 1,000,000, ``benchmarks/README.md``), and the matches among
    ``SEARCH_SAMPLE`` messages spread over the ids, scaled to every message, come to
    ``BROAD_SEARCH_ESTIMATE`` x the limit or more, from at least ``SEARCH_SAMPLE_MATCHES``
    of them. That scaled figure is the total, marked estimated; a sample holding every
    message is exact but still marked.
    The page is then looked for in the first ``BROAD_SEARCH_WINDOW`` x (``offset`` +
    ``limit``) rows of the sort order; no full page there gives ``None`` too.

    Counting even up to the limit builds the index's bitmap of every candidate first
    (PostgreSQL's GIN: 287,000 of 1,000,000 messages, 60-450 ms, ``benchmarks/query.py``);
    this tests the sample and the window's rows one by one. The sample, not the
    planner, says "many": the planner takes words for independent (four messages
    saying both "alpha" and "beta" were estimated at 78, break-it pass)."""
    window_rows = BROAD_SEARCH_WINDOW * (offset + limit)
    provider = provider_for(conn)
    estimate = provider.estimate_rows(conn, matching)
    if estimate is None or window_rows > BROAD_SEARCH_WINDOW_MAX:
        return None, None
    if estimate <= exact_count_limit and not prefixed:
        return None, None
    sample = sa.select(fm.id).order_by(fm.id).limit(SEARCH_SAMPLE).subquery("sample")
    sampled = conn.execute(
        sa.select(sample.c.id)
        .join_from(sample, failed_messages, fm.id == sample.c.id)
        .where(condition)
    ).all()
    messages = count_failed_messages(conn)
    scaled = round(len(sampled) * messages / max(min(SEARCH_SAMPLE, messages), 1))
    if len(sampled) < SEARCH_SAMPLE_MATCHES:
        return None, None
    if scaled < BROAD_SEARCH_ESTIMATE * exact_count_limit:
        return None, scaled
    window = _window(provider, order, window_rows)
    page = _window_page(provider, condition, window, order, offset=offset, limit=limit)
    total = Total(scaled, estimated=True)
    found = hits_page(conn, page, order, total, offset=offset, limit=limit)
    return (found if len(found.items) == limit else None), scaled


def _window(provider: Provider, order: Ordering, rows: int) -> sa.Select[Any]:
    """The first ``rows`` messages of the sort order (their sort keys and ids), a select
    of ``failed_messages``: where the key is indexed after the status (migration 0024),
    the first ``rows`` of each status's walk merged (``merged_walks``)."""
    statuses = merged_statuses(EVERY_MESSAGE, order)
    if not statuses:
        return sa.select(*sort_columns(order)).order_by(*order_by(provider, order)).limit(rows)
    first = merged_walks(provider, [], statuses, order, offset=0, limit=rows)
    return sa.select(*sort_columns(order)).join_from(failed_messages, first, fm.id == first.c.id)


def _window_page(
    provider: Provider,
    condition: sa.ColumnElement[bool],
    window: sa.Select[Any],
    order: Ordering,
    *,
    offset: int,
    limit: int,
) -> sa.Subquery:
    """The ids of the page among the messages of ``window`` (``_window``) matching
    ``condition``: each of those rows tested in turn, until the page is full. The window
    is a subquery with its own LIMIT, so the planner keeps its order (the page stops
    early) and cannot collect every match from the condition's index instead."""
    rows = window.subquery("window")
    return (
        sa.select(rows.c.id)
        .join_from(rows, failed_messages, fm.id == rows.c.id)
        .where(condition)
        .order_by(*order_by(provider, order, rows.c))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )


def _total_past_limit(
    conn: sa.Connection,
    query: SearchQuery,
    matching: sa.Select[Any],
    where: FailedMessageFilter,
    exact_count_limit: int,
    counted_in_index: bool,
) -> Total:
    """The total of a search of ``query`` (``matching``: a row per match, its filter
    ``where``) known to have more matches than ``exact_count_limit``.

    Where the provider counted the terms' hits in its full-text index alone
    (``counted_in_index``: ``Provider.count_search_hits``, SQLite) and nothing else
    filters, the index's own estimate (``Provider.estimate_search_hits``); otherwise the
    provider's estimate of ``matching`` (``Provider.estimate_rows``), or, where it has
    none, the exact count. An estimate is raised to the limit + 1 and marked, as
    ``count_matching`` marks one. Counting every match read each one's table row: 5 s for
    287,000 of 1,000,000 (``benchmarks/README.md``).
    """
    provider = provider_for(conn)
    estimate = None
    if counted_in_index and where == EVERY_MESSAGE:
        estimate = provider.estimate_search_hits(conn, query)
    if estimate is None:
        estimate = provider.estimate_rows(conn, matching)
    if estimate is None:
        return Total(count_rows(conn, matching))
    return _estimated(conn, where, estimate, exact_count_limit)


def _estimated(
    conn: sa.Connection, where: FailedMessageFilter, estimate: int, exact_count_limit: int
) -> Total:
    """``estimate`` of a search among ``where`` that has more matches than
    ``exact_count_limit``, marked: at least the limit + 1, as ``count_matching`` marks one,
    and at most the messages ``where`` holds where the database keeps that count
    (``kept_count``): a planner's estimate from stale statistics can pass it."""
    kept = kept_count(conn, where)
    capped = estimate if kept is None else min(estimate, kept)
    return Total(max(capped, exact_count_limit + 1), estimated=True)


def _search_page_of_many(
    conn: sa.Connection,
    text: str,
    query: SearchQuery,
    where: FailedMessageFilter,
    collected: sa.ColumnElement[bool],
    total: Total,
    spread: int,
    offset: int,
    limit: int,
    order: Ordering,
) -> SearchPage:
    """A page of a search of ``text`` (its terms ``query``) among ``where`` (as one
    condition: ``collected``, the form that collects every match) with more matches
    than the exact-count limit, ``total`` of them, and enough for a walk to pay
    (``_walk_pays``; else the caller reads its page from the collected matches): walking
    the sort key's index and testing each row finds a page after about (offset + limit) x
    (all messages / ``spread``) rows, ``spread`` the most matches known (the total, or a
    sample's figure past it: a total held at the exact-count limit would size the walk
    for that many). The walk keeps the condition from every index
    (``Provider.without_index``): SQLite, having no statistics, would otherwise collect
    every match by its indexes and sort them all.

    That many assumes matches spread evenly in time; failures come in bursts. So where it
    is at most ``BROAD_SEARCH_WINDOW_MAX``, the walk tests twice that many rows (plus a
    page); a window holding no full page is followed by one ``WINDOW_GROWTH`` times wider,
    up to ``BROAD_SEARCH_WINDOW_MAX`` rows and no further than what collecting costs
    (``total`` / ``WALKED_ROW_COST`` rows),
    and a page not full by then is read from the collected matches instead, with their
    exact count: an old burst of 4,000 of 20,000 messages cost 1.7 s by lookups walked to
    its end, 0.07 s collected (break-it pass). The newest messages may hold a search's
    words less often than the older ones do (a new mix of failures arriving): 20,000 of
    them, the words in fewer than one in eight, and the first window missed its page,
    so a broad search at 1,000,000 collected its 302,597 matches, 0.7 s, where a wider
    window finds the page (``benchmarks/README.md``). The bounded walk's window goes to
    the provider with the condition (``search_condition``'s ``among``): SQLite then reads
    only the hits within the window's rowid range."""
    provider = provider_for(conn)
    tested = math.ceil((offset + limit) * count_failed_messages(conn) / max(spread, 1))
    bound = 2 * tested + limit
    if bound <= BROAD_SEARCH_WINDOW_MAX:
        ceiling = min(BROAD_SEARCH_WINDOW_MAX, max(bound, total.value // WALKED_ROW_COST))
        while True:
            window = _window(provider, order, bound)
            condition = sa.and_(
                search_condition(conn.dialect, text, query, among=window),
                *filter_conditions(where),
            )
            page = _window_page(provider, condition, window, order, offset=offset, limit=limit)
            found = hits_page(conn, page, order, total, offset=offset, limit=limit)
            if len(found.items) == limit:
                return found
            if bound >= ceiling:
                return _search_page(conn, collected, offset, limit, order)
            bound = min(ceiling, bound * WINDOW_GROWTH)
    statuses = merged_statuses(where, order)
    if statuses:
        kept = [provider.without_index(collected)]
        walked = merged_walks(provider, kept, statuses, order, offset=offset, limit=limit)
        return hits_page(conn, walked, order, total, offset=offset, limit=limit)
    walked = (
        sa.select(fm.id)
        .where(provider.without_index(collected))
        .order_by(*order_by(provider, order))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )
    return hits_page(conn, walked, order, total, offset=offset, limit=limit)


def _search_page(
    conn: sa.Connection,
    condition: sa.ColumnElement[bool],
    offset: int,
    limit: int,
    order: Ordering,
    *,
    cap: int | None = None,
) -> SearchPage:
    """The page of the matches of ``condition`` and their exact number, from the matches
    collected in one pass; with ``cap``, at most that many are collected, and a total of
    ``cap`` means "at least ``cap``" (the page is then not the page: the caller's search
    has many matches). Counting first, up to the limit, and collecting after read the
    same matches twice (``tests/integration/test_list_pages.py``)."""
    # One pass over the matches, fenced off in a materialized CTE: the planner would
    # otherwise walk a sort key's index and test the full-text condition row by row
    # (detoasting every search_vector on PostgreSQL: 15 s for a term in 7,000 of
    # 1,000,000 rows), as it cannot see what that test costs. From the matches (ids and
    # sort keys only) come the page's ids and their number, counted by a window before
    # LIMIT; the page's rows are read last, by id. Materialized, not streamed as a
    # subset's fenced sort is (``Provider.fenced``): the window counting them holds every
    # match anyway.
    provider = provider_for(conn)
    matches = sa.select(*sort_columns(order)).where(condition).limit(cap)
    hits = provider.materialized_cte(matches, "hits")
    page = (
        sa.select(hits.c.id, sa.func.count().over().label("total"))
        .order_by(*order_by(provider, order, hits.c))
        .limit(limit)
        .offset(offset)
        .subquery("page")
    )
    rows = conn.execute(
        sa.select(*SUMMARY_COLUMNS, fm.conversation_id, fm.headers_json, fm.body_size, page.c.total)
        .join_from(failed_messages, page, fm.id == page.c.id)
        .order_by(*order_by(provider, order))
    ).all()
    if rows:
        total = int(rows[0].total)
    else:  # past the last page, or no match: the window had no row to ride on
        matching = sa.select(sa.literal(1)).select_from(failed_messages).where(condition)
        total = count_rows(conn, matching.limit(cap))
    return SearchPage(total=total, items=[to_hit(row) for row in rows])


def search_condition(
    dialect: sa.Dialect,
    text: str,
    query: SearchQuery | None = None,
    *,
    among: sa.Select[Any] | None = None,
) -> sa.ColumnElement[bool]:
    """The WHERE condition of ``search_failed_messages`` on ``dialect``'s provider: the
    full-text index's matches of ``query`` (default: ``parse_search(text)``), or the
    message whose id is ``text``; ``among`` as ``Provider.search_matches`` takes it.

    The exact-id alternatives use the primary key and the message-id index (after each
    status: ``message_id_is``), so a message is found by its id even where its headers
    are longer than the indexed prefix.
    """
    stripped = text.strip().replace("\x00", "")
    terms = parse_search(text) if query is None else query
    alternatives = [provider_for(dialect).search_matches(terms, among=among)]
    if stripped:
        alternatives.append(message_id_is(stripped))
        unique_id = as_uuid(stripped)
        if unique_id is not None:
            alternatives.append(fm.id == unique_id)
    return sa.or_(*alternatives)
