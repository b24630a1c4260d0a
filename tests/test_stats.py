"""Statistics and mastery by topic (studyapp.stats): the pure folds against hand-computed examples,
then every SQL aggregate on a hand-built review log (SQLite and PostgreSQL), undone reviews left out."""

from __future__ import annotations

import html
import itertools
import re
from datetime import date, datetime, timedelta, timezone

import pytest
from conftest import ALPHA_DECK, BETA_DECK, write_bank
from sqlmodel import Session, select

from studyapp import stats
from studyapp.charts import bar_chart
from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog
from studyapp.stats import KIND_LEARN, KIND_MATURE, KIND_YOUNG, DayRow, Retention, Topic
from studyapp.study import StudySettings, grade
from studyapp.sync import sync_bank

WED = date(2026, 3, 4)


# --- pure -------------------------------------------------------------------------------------


def test_retention_per_week_splits_young_and_mature_and_leaves_out_first_reviews_and_repeats():
    rows = [
        DayRow(date(2026, 2, 20), KIND_YOUNG, 9, 9),  # before the first week: not counted
        DayRow(date(2026, 2, 24), KIND_YOUNG, 4, 3),
        DayRow(date(2026, 2, 25), KIND_MATURE, 2, 2),
        DayRow(date(2026, 3, 3), KIND_YOUNG, 5, 1),
        DayRow(date(2026, 3, 3), KIND_LEARN, 10, 0),  # first reviews and repeats: not retention
    ]
    starts = stats.week_starts(WED, 2)
    assert starts == [date(2026, 2, 23), date(2026, 3, 2)]
    first, second = stats.fold_retention(rows, starts, WED, "%b %d")
    assert (first.label, first.first, first.last) == ("Feb 23", date(2026, 2, 23), date(2026, 3, 1))
    assert (first.young, first.mature, first.overall) == (Retention(3, 4), Retention(2, 2), Retention(5, 6))
    assert round(first.overall.percent, 1) == 83.3
    assert (second.young, second.mature, second.overall) == (Retention(1, 5), Retention(0, 0), Retention(1, 5))
    assert second.young.percent == 20 and second.mature.percent is None
    total = stats.total_retention(rows[1:])
    assert (total.young, total.mature, total.overall) == (Retention(4, 9), Retention(2, 2), Retention(6, 11))


def test_months_run_back_over_the_new_year():
    assert stats.month_starts(date(2026, 1, 15), 3) == [date(2025, 11, 1), date(2025, 12, 1), date(2026, 1, 1)]
    rows = [DayRow(date(2025, 12, 31), KIND_MATURE, 3, 2), DayRow(date(2026, 1, 1), KIND_MATURE, 1, 0)]
    periods = stats.fold_retention(rows, stats.month_starts(date(2026, 1, 15), 3), date(2026, 1, 15), "%b %Y")
    assert [(p.label, p.mature) for p in periods] == [
        ("Nov 2025", Retention(0, 0)), ("Dec 2025", Retention(2, 3)), ("Jan 2026", Retention(0, 1))]


def test_median_answer_time_by_hand():
    assert stats.median_ms([]) is None
    assert stats.median_ms([(30, 2), (12, 1)]) == 3000.0  # 1.2 s, 3.0 s, 3.0 s
    assert stats.median_ms([(5, 1), (7, 1), (20, 2)]) == 1350.0  # 0.5, 0.7 | 2.0, 2.0: (0.7 + 2.0) / 2


def test_minutes_per_day_and_reviews_per_day():
    rows = [DayRow(WED, KIND_YOUNG, 2, 1, 90_000, 2), DayRow(WED, KIND_LEARN, 1, 1, 30_000, 1)]
    assert stats.minutes_per_day(rows, WED - timedelta(days=1), WED) == [(WED - timedelta(days=1), 0.0), (WED, 2.0)]
    assert stats.reviews_per_day(rows) == {WED: 3}


def test_the_calendar_is_weeks_of_monday_to_sunday_ending_today():
    weeks = stats.calendar_weeks({date(2026, 3, 3): 5}, WED, weeks=2)
    assert weeks[0][0] == (date(2026, 2, 23), 0)
    assert weeks[1] == [(date(2026, 3, 2), 0), (date(2026, 3, 3), 5), (WED, 0), None, None, None, None]
    assert [stats.calendar_level(n, 8) for n in (0, 1, 2, 3, 5, 7, 8)] == [0, 1, 1, 2, 3, 4, 4]


def test_topics_by_hand_weakest_first():
    cards = [("alpha", "lab-a", '["memory", "comm"]', 3, 2, 5.0, 1), ("beta", "lab-b", '["comm"]', 2, 2, 4.6, 2)]
    reviews = [("alpha", "lab-a", '["memory", "comm"]', 4, 1, 2, 3), ("beta", "lab-b", '["comm"]', 2, 2, 0, 2)]
    topics = stats.fold_topics(cards, reviews)
    assert [(t.kind, t.name) for t in topics] == [("deck", "alpha"), ("tag", "memory"), ("tag", "comm"), ("deck", "beta")]
    comm = topics[2]
    assert (comm.cards, comm.due, comm.reviews, comm.passed, comm.lapses) == (5, 3, 6, 3, 3)
    assert (comm.retention, comm.lapsed_cards, comm.cards_reviewed_in_window) == (50, 2, 5)
    assert comm.average_ease == pytest.approx(9.6 / 4)
    assert comm.lab == "lab-a"  # where its lapses are
    assert topics[0].retention == 25 and topics[0].average_ease == 2.5
    assert stats.weakest(topics).name == "alpha"
    assert stats.weakest(stats.fold_topics(cards, [reviews[1]])) is None  # nothing lapsed


def test_a_tag_on_exactly_one_decks_cards_is_shown_once_with_the_deck():
    cards = [("alpha", "lab-a", '["memory", "comm"]', 3, 2, 5.0, 1), ("beta", "lab-b", '["comm"]', 2, 2, 4.6, 2),
             ("beta", "lab-b", '["comm", "late"]', 1, 0, 0.0, 0)]
    merged = stats.merge_deck_twins(stats.fold_topics(cards, []))
    # memory: all 3 of alpha's cards and nothing else. comm spans two decks; late is on 1 of beta's 3 cards.
    assert [(t.kind, t.name) for t in merged] == [("deck", "alpha"), ("deck", "beta"), ("tag", "comm"), ("tag", "late")]
    assert merged[0].twin_tags == ["memory"] and merged[1].twin_tags == []


# --- SQL on a hand-built log --------------------------------------------------------------------


def log(card: Card, day: date, quality: int, *, before_interval: int = 6, was_new=False, is_repeat=False,
        duration_ms: int | None = None, undone=False) -> ReviewLog:
    moment = datetime(day.year, day.month, day.day, 12, tzinfo=timezone.utc)
    return ReviewLog(
        card_id=card.id, submission_id=f"{card.id}-{day}-{quality}-{before_interval}-{was_new}-{is_repeat}-{undone}",
        reviewed_at=moment, study_day=day, quality=quality, choice=card.answer if quality >= 3 else (card.answer + 1) % 2,
        correct=quality >= 3, is_repeat=is_repeat, was_new=was_new,
        before_repetitions=2, before_easiness=2.5, before_interval=before_interval,
        after_repetitions=3, after_easiness=2.5, after_interval=15, duration_ms=duration_ms,
        undone_at=moment if undone else None,
    )


@pytest.fixture
def built(app):
    """The test bank's five cards in hand-set states, and a log whose figures are worked out below."""
    with Session(get_engine(app)) as session:
        cards = {c.question_id: c for c in session.exec(select(Card)).all()}
        states = {  # question: (repetitions, easiness, interval, due)
            "alpha-shards": (3, 2.6, 30, WED + timedelta(days=5)),  # mature
            "alpha-gather": (0, 1.7, 1, WED),  # learning (lapsed), due today
            "alpha-free": (1, 2.36, 1, WED - timedelta(days=2)),  # young, overdue
            "beta-adam": (2, 1.3, 6, WED + timedelta(days=1)),  # young
        }  # beta-stage3 stays new
        for qid, (n, ef, interval, due) in states.items():
            card = cards[qid]
            card.repetitions, card.easiness, card.interval, card.due_day = n, ef, interval, due
            session.add(card)
        shards, gather, free, adam = (cards[q] for q in ("alpha-shards", "alpha-gather", "alpha-free", "beta-adam"))
        session.add_all([
            log(shards, WED, 5, before_interval=30, duration_ms=4_000),  # mature, passed
            log(shards, WED - timedelta(days=8), 2, before_interval=25, duration_ms=9_000),  # mature, lapsed last week
            log(gather, WED, 1, duration_ms=2_500),  # young, lapsed
            log(gather, WED, 4, is_repeat=True, duration_ms=1_000),  # repeat: not retention
            log(free, WED - timedelta(days=1), 4, was_new=True, duration_ms=6_000),  # first review
            log(adam, WED, 3, duration_ms=3_000),  # young, passed
            log(adam, WED, 0, duration_ms=50_000, undone=True),  # undone: never counts
        ])
        session.commit()
    return app


def test_card_states_and_histograms_in_sql(built):
    with Session(get_engine(built)) as session:
        summary = stats.card_summary(session)
        assert summary.states == stats.CardStates(new=1, learning=1, young=2, mature=1)
        intervals = dict(summary.intervals)
        assert (intervals["1 d"], intervals["3–6 d"], intervals["3 wk–1 mo"], sum(intervals.values())) == (2, 1, 1, 4)
        eases = dict(summary.eases)
        assert (eases["1.3–1.5"], eases["1.7–1.9"], eases["2.3–2.5"], eases["2.5–2.7"], sum(eases.values())) == (1, 1, 1, 1, 4)


def test_day_rows_retention_time_and_median_in_sql(built):
    with Session(get_engine(built)) as session:
        rows = stats.day_rows(session, WED - timedelta(days=30), WED)
        by_key = {(r.day, r.kind): (r.reviews, r.passed, r.duration_ms, r.timed) for r in rows}
        assert by_key == {
            (WED, KIND_MATURE): (1, 1, 4_000, 1),
            (WED, KIND_YOUNG): (2, 1, 5_500, 2),  # the undone 0 is not here
            (WED, KIND_LEARN): (1, 1, 1_000, 1),
            (WED - timedelta(days=1), KIND_LEARN): (1, 1, 6_000, 1),
            (WED - timedelta(days=8), KIND_MATURE): (1, 0, 9_000, 1),
        }
        week = stats.fold_retention(rows, stats.week_starts(WED, 1), WED, "%b %d")[0]
        assert (week.young, week.mature, week.overall) == (Retention(1, 2), Retention(1, 1), Retention(2, 3))
        # Durations in the last 7 days: 1.0, 2.5, 3.0, 4.0, 6.0 s -> 3.0 s (the undone 50 s left out).
        assert stats.median_ms(stats.duration_histogram(session, WED - timedelta(days=6), WED)) == 3000.0


def test_mastery_by_tag_and_deck_in_sql(built):
    with Session(get_engine(built)) as session:
        topics = {(t.kind, t.name): t for t in stats.mastery(session, WED, 7)}
        fsdp = topics[("tag", "fsdp")]  # alpha's three cards
        assert (fsdp.cards, fsdp.due, fsdp.reviews, fsdp.passed, fsdp.lapsed_cards, fsdp.cards_reviewed_in_window) == (3, 2, 2, 1, 1, 2)
        assert fsdp.average_ease == pytest.approx((2.6 + 1.7 + 2.36) / 3)
        assert fsdp.lab == "allgather-before-layer"  # the lapsed card's lab
        zero = topics[("tag", "zero")]
        assert (zero.cards, zero.reviews, zero.passed, zero.lapsed_cards) == (2, 1, 1, 0)  # the undone lapse is not one
        weakest = stats.weakest(stats.mastery(session, WED, 7))
        assert (weakest.kind, weakest.name, weakest.retention) == ("deck", "alpha", 50)  # ties with fsdp: decks first
        month = stats.mastery(session, WED, 30)
        assert [(t.kind, t.name) for t in month][:2] == [("deck", "alpha"), ("tag", "fsdp")]  # 1 of 3: 33%
        assert month[0].retention == pytest.approx(100 / 3)


def test_the_stats_page_shows_every_figure(built, client, clock):
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    page = " ".join(html.unescape(client.get("/stats").get_data(as_text=True)).split())
    page = page.replace('<span class="state">', "").replace("</span>", "")
    assert "5 cards: 1 new, 1 learning, 2 young, 1 mature" in page
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="chart') == 8
    assert page.count('<details class="chart-data">') == 8
    assert "median answer time <strong>3.5 s</strong>" in page  # the last 30 days: 1, 2.5, 3 | 4, 6, 9 s
    assert "True retention per month" in page and "Mastery by topic" in page
    assert '<tr data-topic="deck:alpha">' in page
    # The test bank tags alpha's three cards fsdp and beta's two zero, and no others: a deck by another
    # name is one row, the deck's, which says so.
    assert 'data-topic="tag:' not in page
    assert 'alpha</a> <span class="muted">deck, every card tagged <a href="/stats/tags/fsdp">fsdp</a></td>' in page
    assert 'beta</a> <span class="muted">deck, every card tagged <a href="/stats/tags/zero">zero</a></td>' in page


def test_the_home_page_names_the_weakest_topic_and_its_lab(built, client, clock):
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    page = " ".join(html.unescape(client.get("/").get_data(as_text=True)).split())
    assert "Weakest topic this week:" in page
    assert "alpha</a> deck: 1 of 2 cards lapsed" in page
    assert "/labs/allgather-before-layer" in page


def test_every_tag_the_bank_accepts_has_the_page_the_stats_page_links(app, client, bank_dir):
    """Capitals, colons and underscores pass `bank check`; the tag page once refused them (404)."""
    odd = ("ZeRO-3", "fsdp:memory", "_private", "v1.2")
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("tags: [fsdp]", f"tags: [{', '.join(odd)}]", 1), "beta": BETA_DECK})
    sync_bank(get_engine(app), bank_dir)
    page = html.unescape(client.get("/stats").get_data(as_text=True))
    for tag in odd:
        assert f'href="/stats/tags/{tag}"' in page, tag
        tag_page = client.get(f"/stats/tags/{tag}")
        assert tag_page.status_code == 200 and "/questions/alpha-shards" in tag_page.get_data(as_text=True), tag


def test_a_tag_page_lists_its_cards_and_refuses_odd_tags(built, client, clock):
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    page = html.unescape(client.get("/stats/tags/fsdp").get_data(as_text=True))
    assert page.count("/questions/alpha-") == 3 and "beta-" not in page
    assert client.get("/stats/tags/nope").status_code == 404
    assert client.get("/stats/tags/%22fsdp%22").status_code == 404
    assert client.get("/stats/tags/fs").status_code == 404  # a prefix is not the tag


def test_a_tag_page_counts_and_marks_todays_same_day_repeats(app, client, clock):
    with Session(get_engine(app)) as session:
        gather = session.exec(select(Card).where(Card.question_id == "alpha-gather")).one()
        grade(session, card_id=gather.id, version=gather.version, choice=gather.answer, quality=3, now=clock.now,
              settings=StudySettings(timezone="UTC"))  # passed, but below 4: repeated today (2026-03-02)
    page = " ".join(html.unescape(client.get("/stats/tags/fsdp").get_data(as_text=True)).split())
    assert "3 cards; over the last 30 days" in page
    assert "0 due today (overdue included), 1 to repeat today (graded below 4 earlier today)." in page
    row = re.search(r"<tr><td><a href=\"/questions/alpha-gather\">.*?</tr>", page).group(0)
    assert "<td>repeat today, then due 2026-03-03</td>" in row
    clock.advance(days=1)  # the repeat ended with its day; the card is due
    page = " ".join(html.unescape(client.get("/stats/tags/fsdp").get_data(as_text=True)).split())
    assert "1 due today (overdue included)." in page and "repeat today" not in page


def test_the_stats_page_says_one_review_and_one_day_in_the_singular(app, client, clock):
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        session.add(log(session.exec(select(Card)).first(), WED, 4))
        session.commit()
    page = " ".join(html.unescape(client.get("/stats").get_data(as_text=True)).split())
    assert "<p>1 review in the last 30 days, 100% answered right;" in page
    assert "1 review on 1 day in the last 12 months" in page
    assert "young 100% (1 review)," in page


def test_the_busiest_day_is_shaded_darkest_even_when_it_is_small():
    # Quarters of the busiest day, by hand: up to 1/4 of it is level 1, (1/4, 1/2] 2, (1/2, 3/4] 3, above 4.
    assert stats.calendar_level(1, 1) == 4  # a single review is the busiest day
    assert [stats.calendar_level(n, 2) for n in (1, 2)] == [2, 4]  # 1/2, 2/2
    assert [stats.calendar_level(n, 3) for n in (1, 2, 3)] == [2, 3, 4]  # 1/3, 2/3, 3/3
    assert [stats.calendar_level(n, 5) for n in (1, 2, 4, 5)] == [1, 2, 4, 4]  # 1/5, 2/5, 4/5, 5/5


def test_one_review_shades_its_calendar_day_darkest(app, client, clock):
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        session.add(log(session.exec(select(Card)).first(), WED, 4))
        session.commit()
    page = client.get("/stats").get_data(as_text=True)
    assert 'class="cal-4"><title>2026-03-04: 1 review</title>' in page
    assert page.count('class="cal-4"') == 1 and 'class="cal-1"' not in page


def test_every_last_12_months_figure_covers_the_same_days(app, client, clock):
    """The retention table's 12 months run from 1 April 2025 to Wednesday 4 March 2026; the calendar's
    53 weeks start on Monday 3 March 2025, so its first four weeks are not part of that window."""
    clock.now = datetime(2026, 3, 4, 12, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        first, second = session.exec(select(Card).order_by(Card.position)).all()[:2]
        session.add_all([
            log(first, date(2025, 3, 10), 4, before_interval=30),  # in the calendar, before the 12 months
            log(first, date(2025, 4, 1), 4, before_interval=30),
            log(first, WED, 4, before_interval=30),
            log(second, WED, 2, before_interval=30),
        ])
        session.commit()
    page = " ".join(html.unescape(client.get("/stats").get_data(as_text=True)).split())
    # By hand: 2025-04-01 and twice on 2026-03-04: 3 reviews on 2 days, 2 of them passed.
    assert "3 reviews on 2 days in the last 12 months; the busiest day 2026-03-04 with 2." in page
    assert "overall <strong class=\"retention-overall\">67%</strong> (3)" in page
    calendar_table = page[page.index("Review calendar, last 12 months, table"):]
    calendar_table = calendar_table[:calendar_table.index("</table>")]
    months = re.findall(r"<tr><td>(\d{4}-\d{2})</td><td>(\d+)</td></tr>", calendar_table)
    assert len(months) == 12 and months[0] == ("2025-04", "1") and months[-1] == ("2026-03", "2")


def test_a_tag_page_for_a_very_long_tag_is_a_404_or_the_page_not_a_500(app, client, bank_dir):
    long_tag = "t" * 1500  # the bank accepts any length
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("tags: [fsdp]", f"tags: [{long_tag}]", 1), "beta": BETA_DECK})
    sync_bank(get_engine(app), bank_dir)
    page = client.get(f"/stats/tags/{long_tag}")
    assert page.status_code == 200 and page.get_data(as_text=True).count("/questions/alpha-") == 1
    assert client.get(f"/stats/tags/{long_tag}x").status_code == 404  # the same first 1000 characters: not it
    assert client.get("/stats/tags/" + "a" * 60_000).status_code == 404  # SQLite: "LIKE pattern too complex"


def test_a_chart_shows_a_huge_count_in_full_and_leaves_its_label_room():
    svg = str(bar_chart([("Mar 04", 1_234_567), ("Mar 05", 0)], title="Cards due"))
    assert "<title>Mar 04: 1234567</title>" in svg  # not 1.23457e+06
    tick_x = int(re.search(r'<text x="(\d+)" y="32" class="tick" text-anchor="end">1234567</text>', svg).group(1))
    assert tick_x >= 7 * 6  # seven digits of about 6px each end at the tick: none cut off at x = 0


def test_a_measured_zero_draws_a_stub_and_no_data_draws_nothing():
    # 0% right on a day with reviews is a figure; a day without reviews has none: they must not look alike.
    svg = str(bar_chart([("Mar 04", 0.0), ("Mar 05", None), ("Mar 06", 50.0)], title="Accuracy", max_value=100))
    rects = re.findall(r'<rect [^>]*height="([\d.]+)" class="([^"]+)"><title>([^<]+)</title>', svg)
    plot_h = 220 - 28 - 36  # the chart's height less its top and bottom margins
    assert rects == [("2.0", "bar zero", "Mar 04: 0"), (f"{plot_h / 2:.1f}", "bar", "Mar 06: 50")]


def test_the_average_ease_is_the_same_whatever_order_its_eases_were_added_in():
    # 2.18 + 1.7 + 2.36 + 1.7 is 7.94 in one order and 7.9399999... in another (PostgreSQL's and
    # SQLite's), so the mean 1.985 was shown as 1.99 from one database and 1.98 from the other.
    shown = set()
    for order in itertools.permutations([2.18, 1.7, 2.36, 1.7]):
        topic = Topic("tag", "communication", reviewed_cards=4)
        for ease in order:
            topic.easiness_sum += ease
        shown.add(f"{topic.average_ease:.2f}")
    assert shown == {"1.99"}
