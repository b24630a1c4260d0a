"""Home, deck, question, lab, stats and export pages through Flask's test client."""

from __future__ import annotations

import html
import re
from datetime import datetime, timezone

import pytest
from conftest import ALPHA_DECK, BETA_DECK, write_bank
from sqlmodel import Session, select

from sharding_lab import svg
from studyapp.charts import bar_chart
from studyapp.db import get_engine
from studyapp.models import Card, Deck, LabRun, RunStatus
from studyapp.study import StudySettings, grade
from studyapp.sync import sync_bank


def text(response) -> str:
    return html.unescape(response.get_data(as_text=True))


def review(app, qid: str, now, quality: int = 5) -> None:
    with Session(get_engine(app)) as session:
        card = session.exec(select(Card).where(Card.question_id == qid)).one()
        grade(session, card_id=card.id, version=card.version, choice=card.answer, quality=quality, now=now,
              settings=StudySettings(timezone="UTC"))


def deck_row(page: str, deck_id: str) -> dict[str, int]:
    row = re.search(rf'<tr data-deck="{deck_id}">(.*?)</tr>', page, re.S).group(1)
    return {name: int(re.search(rf'class="{name}">(\d+)<', row).group(1)) for name in ("due", "repeats", "new", "learned")}


def test_home_lists_each_deck_with_due_new_and_learned_counts(client, app, clock):
    page = client.get("/").get_data(as_text=True)
    assert deck_row(page, "alpha") == {"due": 0, "repeats": 0, "new": 3, "learned": 0}
    assert deck_row(page, "beta") == {"due": 0, "repeats": 0, "new": 2, "learned": 0}
    assert 'href="/study?deck=alpha"' in page and "Study" in page
    review(app, "alpha-shards", clock.now)
    review(app, "alpha-gather", clock.now, quality=3)  # passed, but below 4: its step-7 repeat waits today
    page = client.get("/").get_data(as_text=True)
    assert deck_row(page, "alpha") == {"due": 0, "repeats": 1, "new": 1, "learned": 2}
    clock.advance(days=1)
    page = client.get("/").get_data(as_text=True)
    assert deck_row(page, "alpha") == {"due": 2, "repeats": 0, "new": 1, "learned": 2}


def numbered_decks(count: int) -> dict[str, str]:
    """`count` copies of the alpha deck with their own ids (d0, d0-shards, ...)."""
    return {f"d{i}": ALPHA_DECK.replace("alpha", f"d{i}") for i in range(count)}


@pytest.mark.parametrize(("decks", "keys", "hint"), [
    (numbered_decks(10), list("123456789"),
     "Keys: 1–9 study a deck, s study all, h home."),  # the tenth deck has no key
    ({"alpha": ALPHA_DECK, "beta": BETA_DECK}, ["1", "2"], "Keys: 1–2 study a deck, s study all, h home."),
    ({"alpha": ALPHA_DECK}, ["1"], "Keys: 1 study the deck, s study all, h home."),
    (None, [], "Keys: h home."),  # no deck, so no Study button and no "s" either
], ids=["ten", "two", "one", "none"])
def test_the_home_page_hint_names_only_the_deck_keys_there_are(client, app, tmp_path, decks, keys, hint):
    # It said "1–9 study a deck" with two decks: 3–9 did nothing.
    if decks:
        sync_bank(get_engine(app), write_bank(tmp_path / "bank-now", decks))
    else:  # a bank with no deck is refused: retire the decks there are
        with Session(get_engine(app)) as session:
            for deck in session.exec(select(Deck)):
                deck.retired = True
            session.commit()
    page = text(client.get("/"))
    assert re.findall(r'data-key="(\d)"', page) == keys
    assert " ".join(re.sub(r"</?kbd>", "", re.search(r'<p class="keys">(.*?)</p>', page, re.S).group(1)).split()) == hint


def test_assets_are_served_locally(client):
    page = client.get("/").get_data(as_text=True)
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert client.get("/static/style.css").status_code == 200
    assert b"keydown" in client.get("/static/keys.js").data


def test_the_deck_page_links_each_card_to_its_question_and_lab(client):
    page = client.get("/decks/alpha").get_data(as_text=True)
    for qid in ("alpha-shards", "alpha-gather", "alpha-free"):
        assert f'href="/questions/{qid}"' in page
    assert 'href="/labs/allgather-before-layer"' in page
    assert client.get("/decks/nope").status_code == 404


def test_the_question_page_shows_the_answer_reasons_lab_and_history(client, app, clock):
    review(app, "alpha-gather", clock.now)
    page = text(client.get("/questions/alpha-gather"))
    assert "All-gather" in page and "correct answer" in page
    assert "A barrier moves no data." in page
    assert "sharding-lab run allgather-before-layer" in page
    assert "Due 2026-03-03" in page and "right" in page
    assert client.get("/questions/nope").status_code == 404


def test_the_question_page_says_a_card_is_to_be_repeated_today(client, app, clock):
    review(app, "alpha-gather", clock.now, quality=3)  # passed, but below 4: its step-7 repeat waits today
    page = " ".join(text(client.get("/questions/alpha-gather")).split())
    assert "Repeat today (graded below 4 today: it comes back until graded 4 or 5), then due 2026-03-03 · interval 1 day ·" in page
    clock.advance(days=1)  # the repeat ended with its day
    page = " ".join(text(client.get("/questions/alpha-gather")).split())
    assert "Repeat today" not in page and "Due 2026-03-03 · interval 1 day · 1 in a row" in page


def test_the_lab_page_shows_claim_command_and_the_questions_it_backs(client):
    page = text(client.get("/labs/allgather-before-layer"))
    assert "In forward, FSDP all-gathers each block's full parameters" in page
    assert "sharding-lab run allgather-before-layer" in page
    assert 'href="/questions/alpha-gather"' in page
    assert "fsdp-all-gather-before-layer" in page  # backed in the catalogue, not in this test bank
    # World size and device, each choice labelled; CPU ranks always (CUDA once a lab process finds a GPU).
    # This lab runs at N alone, so each choice is its number.
    assert '<label>World size <select name="world_size">' in page and '<label>Device <select name="device" id="device-choice">' in page
    assert '<option value="cpu">CPU ranks (gloo)</option>' in page
    assert client.get("/labs/not-a-lab").status_code == 404
    assert "What FSDP shards that DDP replicates" in text(client.get("/labs"))


def test_a_scaling_lab_s_choices_say_how_many_ranks_each_starts(client):
    # ring-all-reduce compares N with 2N ranks; persistent-memory-scaling runs 1, N and 2N.
    ring = client.get("/labs/ring-all-reduce").get_data(as_text=True)
    assert '<option value="2">2 (runs at 2 and 4 ranks)</option>' in ring
    assert '<option value="4">4 (runs at 4 and 8 ranks)</option>' in ring
    scaling = client.get("/labs/persistent-memory-scaling").get_data(as_text=True)
    assert '<option value="2">2 (runs at 1, 2 and 4 ranks)</option>' in scaling
    assert '<option value="4">4 (runs at 1, 4 and 8 ranks)</option>' in scaling


def test_the_stats_page_draws_its_svg_charts(client, app, clock):
    review(app, "alpha-shards", clock.now)
    review(app, "beta-adam", clock.now)
    page = client.get("/stats").get_data(as_text=True)
    assert page.count("<svg") == 8  # reviews, accuracy, forecast, intervals, ease, retention, calendar, time
    assert page.count(": 100%</title>") == 1 and ": 0%</title>" not in page  # days without reviews: no bar
    assert "Reviews per day" in page and "Accuracy per day" in page and "Cards due, next 30 days" in page
    assert "2 reviews in the last 30 days, 100% answered right" in html.unescape(page)
    assert "Mar 03: 2</title>" in page  # both cards due tomorrow in the forecast


def test_bar_chart_escapes_its_labels():
    svg = bar_chart([("<b>x</b>", 3), ("y", 1), ("z", None)], title="A & B")
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg and "A &amp; B" in svg
    assert svg.count("<rect") == 2  # no bar where there is nothing to measure


def test_bank_text_is_escaped_everywhere(client, app, bank_dir, csrf_token):
    evil = ALPHA_DECK.replace("What does FSDP shard that DDP replicates?", "<script>alert(1)</script> shards?")
    evil = evil.replace("FSDP keeps 1/N of every model state per rank.", "<img src=x onerror=alert(2)>")
    evil = evil.replace("Every data-parallel method splits the batch.", "<b onclick=x()>why</b>")
    write_bank(bank_dir, {"alpha": evil.replace("title: Alpha deck", "title: <i>Alpha</i>"), "beta": BETA_DECK})
    sync_bank(get_engine(app), bank_dir)
    pages = [client.get(url).get_data(as_text=True) for url in ("/", "/study", "/decks/alpha", "/questions/alpha-shards",
                                                                "/labs/what-fsdp-shards")]
    page = client.get("/study").get_data(as_text=True)
    card_id = re.search(r'name="card_id" value="(\d+)"', page).group(1)
    version = re.search(r'name="version" value="(\d+)"', page).group(1)
    pages.append(client.post("/study/answer", data={"csrf_token": csrf_token, "card_id": card_id, "version": version,
                                                    "choice": "1"}).get_data(as_text=True))
    for page in pages:
        assert "<script>alert" not in page and "<img src=x" not in page and "<b onclick" not in page and "<i>Alpha" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1]
    assert "&lt;b onclick=x()&gt;" in pages[-1]


# --- Exports ----------------------------------------------------------------------------


@pytest.fixture
def exports(app, tmp_path):
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "alpha.apkg").write_bytes(b"PK-alpha")
    (folder / "all-decks.apkg").write_bytes(b"PK-all")
    (folder / "notes.txt").write_text("not a deck")
    (tmp_path / "secret.apkg").write_bytes(b"outside")
    return folder


def test_existing_exports_are_linked_and_served(client, exports):
    page = client.get("/").get_data(as_text=True)
    assert 'href="/exports/alpha.apkg"' in page and 'href="/exports/all-decks.apkg"' in page
    assert 'href="/exports/beta.apkg"' not in page  # not built: no dead link
    response = client.get("/exports/alpha.apkg")
    assert response.status_code == 200 and response.data == b"PK-alpha"
    assert "attachment" in response.headers["Content-Disposition"]
    assert 'href="/exports/alpha.apkg"' in client.get("/decks/alpha").get_data(as_text=True)


@pytest.mark.parametrize(
    "name",
    ["beta.apkg", "notes.txt", "../secret.apkg", "..%2fsecret.apkg", "%2e%2e%2fsecret.apkg", "....//secret.apkg",
     "ALPHA.apkg", "alpha.apkg%00.txt", "%2fetc%2fpasswd"],
)
def test_anything_but_an_existing_export_by_exact_name_is_refused(client, exports, name):
    response = client.get(f"/exports/{name}")
    assert response.status_code == 404
    assert b"outside" not in response.data


@pytest.mark.parametrize("url", ["/decks/a%00b", "/questions/x%00", "/study?deck=al%00pha", "/decks/" + "a" * 300,
                                 "/questions/ALPHA-SHARDS", "/labs/%00"])
def test_odd_ids_in_urls_are_a_clean_404(client, url):
    response = client.get(url)
    assert response.status_code == 404
    assert "There is no" in text(response)


@pytest.mark.parametrize("url", ["/study?card=%00", "/study?card=%C2%B2", "/study?card=-1", "/study?card="])
def test_an_odd_card_parameter_is_ignored(client, url):
    """`card` only picks a card to show when it is a card's id; otherwise the queue decides."""
    plain = client.get("/study")
    response = client.get(url)
    assert response.status_code == plain.status_code == 200
    shown = re.search(r'name="card_id" value="(\d+)"', text(response))
    assert shown and shown.group(1) == re.search(r'name="card_id" value="(\d+)"', text(plain)).group(1)


def test_a_lab_charts_hover_figures_are_also_given_as_a_list(app, client):
    # A lab chart's figures were only in the <title> each bar segment or marker shows on hover.
    bars = svg.stacked_bar_chart("Model states per rank", [svg.Bar("ddp", {"params": 2048, "grads": 1536}),
                                                          svg.Bar("zero3", {"params": 1024})], ["params", "grads"])
    timeline = svg.timeline_chart("FSDP step", svg.Timeline(
        lanes=["layers.0"], spans=[svg.Span("layers.0", 0, 1, "forward")],
        markers=[svg.Marker("layers.0", 0, "all_gather", "all_gather 50.6 KiB, forward")],
        bands=[svg.Band(0, 1, "forward")], length=2))
    moment = datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        session.add(LabRun(lab_id="adam-optimizer-state", params={"world_size": 2}, status=RunStatus.done,
                           result={"holds": True, "finding": "f", "charts": {"bars": bars, "timeline": timeline}},
                           created_at=moment, started_at=moment, finished_at=moment))
        session.commit()
    page = text(client.get("/labs/adam-optimizer-state/results"))
    shown = re.findall(r"<summary>(.*?)</summary>\s*<ul>(.*?)</ul>", page, re.S)
    assert [(summary, re.findall(r"<li>(.*?)</li>", items)) for summary, items in shown] == [
        ("Model states per rank: the figures as a list", ["ddp: params 2.0 KiB", "ddp: grads 1.5 KiB", "zero3: params 1.0 KiB"]),
        ("FSDP step: the figures as a list", ["layers.0 forward", "all_gather 50.6 KiB, forward"]),
    ]
