"""Long card lists come a page at a time (studyapp.views.paging): the deck page and a topic's page."""

from __future__ import annotations

import re
from datetime import date

import pytest
from sqlalchemy import insert
from sqlmodel import Session

from studyapp.db import get_engine
from studyapp.models import Card
from studyapp.views.paging import Page

EXTRA = 247  # alpha's 3 synced cards plus these: 250, so pages of 100, 100 and 50


def test_a_page_knows_its_place():
    assert (Page(1, 250).count, Page(1, 250).first_shown, Page(1, 250).last_shown) == (3, 1, 100)
    assert (Page(3, 250).offset, Page(3, 250).first_shown, Page(3, 250).last_shown) == (200, 201, 250)
    assert Page(3, 250).slice(list(range(250))) == list(range(200, 250))
    assert (Page(1, 0).count, Page(1, 0).first_shown, Page(1, 0).last_shown) == (1, 0, 0)
    assert Page(2, 200).count == 2 and Page(1, 201).count == 3


@pytest.fixture
def many_cards(app) -> list[dict]:
    """EXTRA cards in deck alpha, tagged `bulk`, eases spread so that the weakest are scattered in bank
    order, every tenth new."""
    rows = [{
        "question_id": f"bulk-{i}", "deck_id": "alpha", "position": 100 + i, "prompt": f"Bulk question {i}?",
        "choices": ["a", "b"], "answer": 0, "explanation": "e", "why_wrong": ["", "no"], "lab": "what-fsdp-shards",
        "tags": ["bulk"], "content_hash": f"{i:064x}", "retired": False, "repetitions": 0 if i % 10 == 0 else 2,
        "easiness": 1.3 + (i * 37 % EXTRA) / 100, "interval": 0 if i % 10 == 0 else 6,
        "due_day": None if i % 10 == 0 else date(2026, 3, 1), "repeat_day": None, "last_reviewed_at": None,
        "version": 0,
    } for i in range(EXTRA)]
    with Session(get_engine(app)) as session:
        session.execute(insert(Card), rows)
        session.commit()
    return rows


def prompts(page_html: str) -> list[str]:
    return re.findall(r'<a href="/questions/[^"]+">([^<]+)</a>', page_html)


def test_the_deck_page_shows_a_hundred_cards_a_page_in_bank_order(client, many_cards):
    first = client.get("/decks/alpha").get_data(as_text=True)
    assert len(prompts(first)) == 100 and prompts(first)[3:5] == ["Bulk question 0?", "Bulk question 1?"]
    assert "Cards 1–100 of 250, page 1 of 3" in first and 'rel="next" href="/decks/alpha?page=2"' in first
    assert 'rel="prev"' not in first
    last = client.get("/decks/alpha?page=3").get_data(as_text=True)
    assert prompts(last) == [f"Bulk question {i}?" for i in range(197, 247)]  # 3 synced cards come first
    assert "Cards 201–250 of 250, page 3 of 3" in last and 'rel="next"' not in last


def test_a_topic_page_pages_its_cards_weakest_first(client, many_cards):
    # Weakest first by ease, the new cards last, bank order among equals: worked out here from the rows.
    expected = [f"Bulk question {r['position'] - 100}?" for r in
                sorted(many_cards, key=lambda r: (r["due_day"] is None, r["easiness"], r["position"]))]
    pages = [client.get(f"/stats/tags/bulk?page={n}").get_data(as_text=True) for n in (1, 2, 3)]
    assert [len(prompts(page)) for page in pages] == [100, 100, 47]
    assert [p for page in pages for p in prompts(page)] == expected
    assert "Cards 201–247 of 247, page 3 of 3" in pages[2]


@pytest.mark.parametrize(("query", "status", "phrase"), [
    ("page=0", 400, "page must be a whole number from 1, got &#39;0&#39;"),
    ("page=two", 400, "page must be a whole number from 1"),
    ("page=%D9%A2", 400, "page must be a whole number from 1"),  # an Arabic 2
    ("page=9999999999", 400, "page must be a whole number from 1"),
    ("page=4", 404, "There is no page 4: there are 3."),
])
def test_a_page_that_is_not_there_says_why(client, many_cards, query, status, phrase):
    for path in ("/decks/alpha", "/stats/tags/bulk"):
        response = client.get(f"{path}?{query}")
        assert response.status_code == status and phrase in response.get_data(as_text=True), path


def test_a_short_list_shows_no_pager(client):
    page = client.get("/decks/beta").get_data(as_text=True)
    assert 'class="pager"' not in page and len(prompts(page)) == 2
