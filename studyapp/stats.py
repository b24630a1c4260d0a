"""Statistics at Anki's level, and mastery by topic: SQL aggregates plus pure folds over them.

Every query groups in the database and hands back a few hundred rows at most (per day, per bin,
per distinct tag list), so the page stays fast on 100k cards and 1M log rows; the pure functions
below them (`fold_retention`, `median_ms`, `calendar_weeks`, `rank_topics`, ...) are tested
against hand-computed examples. Undone reviews never count.

Definitions (Anki's, on SM-2's state):
- card states: new (never reviewed), learning (reviewed, but its last review lapsed: n = 0),
  young (n >= 1, interval < 21 days), mature (interval >= 21 days); retired cards are left out;
- a retention review: a graded review that is neither a card's first review nor a step-7
  same-day repeat; it passed with grade >= 3; it is mature when the interval before it was
  >= 21 days, else young. True retention = passed / retention reviews;
- a lapse: a retention review graded below 3.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta

from sqlalchemy import String, case, cast, func, or_
from sqlmodel import Session, select

from studyapp.models import Card, ReviewLog

MATURE_DAYS = 21  # Anki's line between young and mature cards
PASS_GRADE = 3  # SM-2: grades 3-5 recalled, 0-2 lapsed

# Histogram bins: (label, lowest value in the bin); a bin runs to the next bin's lowest value.
INTERVAL_BINS = (("1 d", 1), ("2 d", 2), ("3–6 d", 3), ("1–2 wk", 7), ("2–3 wk", 14), ("3 wk–1 mo", 21),
                 ("1–3 mo", 31), ("3–6 mo", 91), ("6–12 mo", 181), ("> 1 yr", 366))
EASE_BINS = (("1.3–1.5", 1.3), ("1.5–1.7", 1.5), ("1.7–1.9", 1.7), ("1.9–2.1", 1.9), ("2.1–2.3", 2.1),
             ("2.3–2.5", 2.3), ("2.5–2.7", 2.5), ("≥ 2.7", 2.7))
EASE_SLACK = 1e-6  # SM-2's easiness is a float sum: 1.5 may be stored as 1.4999999999

KIND_LEARN, KIND_YOUNG, KIND_MATURE = 0, 1, 2  # a log row: first review or repeat; young; mature


def _live():
    return ReviewLog.undone_at.is_(None)


def _bin_case(column, bins: Sequence[tuple[str, float]], slack: float = 0.0):
    """SQL: the index of the bin holding `column` (checked from the top bin down)."""
    whens = [(column >= lowest - slack, index) for index, (_, lowest) in reversed(list(enumerate(bins)))]
    return case(*whens, else_=0)


# --- cards ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CardStates:
    new: int = 0
    learning: int = 0
    young: int = 0
    mature: int = 0

    @property
    def total(self) -> int:
        return self.new + self.learning + self.young + self.mature


@dataclass(frozen=True)
class CardSummary:
    states: CardStates
    intervals: list[tuple[str, int]]  # reviewed cards per INTERVAL_BINS bin
    eases: list[tuple[str, int]]  # reviewed cards per EASE_BINS bin


STATE_NEW, STATE_LEARNING, STATE_YOUNG, STATE_MATURE = range(4)


def card_summary(session: Session) -> CardSummary:
    """Card states and the interval and ease histograms, from one grouped scan of the cards."""
    state = case(
        (Card.due_day.is_(None), STATE_NEW),
        (Card.repetitions == 0, STATE_LEARNING),
        (Card.interval >= MATURE_DAYS, STATE_MATURE),
        else_=STATE_YOUNG,
    )
    interval_bin, ease_bin = _bin_case(Card.interval, INTERVAL_BINS), _bin_case(Card.easiness, EASE_BINS, EASE_SLACK)
    rows = session.exec(
        select(state, interval_bin, ease_bin, func.count()).where(Card.retired.is_(False)).group_by(state, interval_bin, ease_bin)
    ).all()
    return fold_cards([(int(s), int(i), int(e), int(n)) for s, i, e, n in rows])


def fold_cards(rows: Iterable[tuple[int, int, int, int]]) -> CardSummary:
    """From (state, interval bin, ease bin, cards) rows; new cards stay out of the histograms."""
    states: Counter[int] = Counter()
    intervals: Counter[int] = Counter()
    eases: Counter[int] = Counter()
    for state, interval_bin, ease_bin, count in rows:
        states[state] += count
        if state != STATE_NEW:
            intervals[interval_bin] += count
            eases[ease_bin] += count
    return CardSummary(
        CardStates(states[STATE_NEW], states[STATE_LEARNING], states[STATE_YOUNG], states[STATE_MATURE]),
        histogram(dict(intervals), INTERVAL_BINS),
        histogram(dict(eases), EASE_BINS),
    )


def histogram(counts: dict[int, int], bins: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
    """(label, count) for every bin, empty ones included, from {bin index: count}."""
    return [(label, counts.get(index, 0)) for index, (label, _) in enumerate(bins)]


# --- the review log, per study day -------------------------------------------------------------


@dataclass(frozen=True)
class DayRow:
    """One study day's live reviews of one kind (KIND_LEARN, KIND_YOUNG or KIND_MATURE)."""

    day: date
    kind: int
    reviews: int
    passed: int
    duration_ms: int = 0  # summed over the reviews that carry a duration
    timed: int = 0  # how many carry one


def day_rows(session: Session, first: date, last: date) -> list[DayRow]:
    """Per study day in [first, last] and kind: reviews, passed, time spent. One grouped scan."""
    kind = case(
        (or_(ReviewLog.was_new, ReviewLog.is_repeat), KIND_LEARN),
        (ReviewLog.before_interval >= MATURE_DAYS, KIND_MATURE),
        else_=KIND_YOUNG,
    )
    rows = session.exec(
        select(
            ReviewLog.study_day, kind, func.count(),
            func.sum(case((ReviewLog.quality >= PASS_GRADE, 1), else_=0)),
            func.sum(ReviewLog.duration_ms), func.count(ReviewLog.duration_ms),
        )
        .where(_live(), ReviewLog.study_day >= first, ReviewLog.study_day <= last)
        .group_by(ReviewLog.study_day, kind)
    ).all()
    return [DayRow(d, int(k), int(n), int(p or 0), int(ms or 0), int(t or 0)) for d, k, n, p, ms, t in rows]


def reviews_per_day(rows: Iterable[DayRow]) -> dict[date, int]:
    counts: Counter[date] = Counter()
    for row in rows:
        counts[row.day] += row.reviews
    return dict(counts)


def minutes_per_day(rows: Iterable[DayRow], first: date, last: date) -> list[tuple[date, float]]:
    """Minutes spent answering on each day from first to last (reviews without a duration add nothing)."""
    spent: Counter[date] = Counter()
    for row in rows:
        spent[row.day] += row.duration_ms
    days = (last - first).days + 1
    return [(first + timedelta(i), spent.get(first + timedelta(i), 0) / 60_000) for i in range(days)]


@dataclass(frozen=True)
class Retention:
    passed: int = 0
    reviews: int = 0

    @property
    def percent(self) -> float | None:
        return 100 * self.passed / self.reviews if self.reviews else None

    def __add__(self, other: Retention) -> Retention:
        return Retention(self.passed + other.passed, self.reviews + other.reviews)


@dataclass(frozen=True)
class PeriodRetention:
    label: str
    first: date
    last: date
    young: Retention = field(default_factory=Retention)
    mature: Retention = field(default_factory=Retention)

    @property
    def overall(self) -> Retention:
        return self.young + self.mature


def week_starts(today: date, count: int) -> list[date]:
    """The Mondays of the last `count` weeks, oldest first; the last holds `today`."""
    monday = today - timedelta(days=today.weekday())
    return [monday - timedelta(weeks=count - 1 - i) for i in range(count)]


def month_starts(today: date, count: int) -> list[date]:
    """The first days of the last `count` calendar months, oldest first; the last holds `today`."""
    starts = []
    year, month = today.year, today.month
    for _ in range(count):
        starts.append(date(year, month, 1))
        year, month = (year, month - 1) if month > 1 else (year - 1, 12)
    return starts[::-1]


def fold_retention(rows: Iterable[DayRow], starts: Sequence[date], last: date, label_format: str) -> list[PeriodRetention]:
    """True retention per period: periods begin at `starts` (ascending) and the last ends at `last`."""
    ends = [start - timedelta(days=1) for start in starts[1:]] + [last]
    young = [Retention()] * len(starts)
    mature = [Retention()] * len(starts)
    for row in rows:
        if row.kind == KIND_LEARN or row.day < starts[0] or row.day > last:
            continue
        index = max(i for i, start in enumerate(starts) if start <= row.day)
        if row.kind == KIND_MATURE:
            mature[index] += Retention(row.passed, row.reviews)
        else:
            young[index] += Retention(row.passed, row.reviews)
    return [PeriodRetention(start.strftime(label_format), start, end, y, m)
            for start, end, y, m in zip(starts, ends, young, mature, strict=True)]


def total_retention(rows: Iterable[DayRow]) -> PeriodRetention:
    """Young, mature and overall retention over all the rows."""
    rows = list(rows)
    young = sum((Retention(r.passed, r.reviews) for r in rows if r.kind == KIND_YOUNG), Retention())
    mature = sum((Retention(r.passed, r.reviews) for r in rows if r.kind == KIND_MATURE), Retention())
    first = min((r.day for r in rows), default=date.min)
    last = max((r.day for r in rows), default=date.min)
    return PeriodRetention("all", first, last, young, mature)


# --- answer time ------------------------------------------------------------------------------

DURATION_STEP_MS = 100  # the median is exact to a tenth of a second


def duration_histogram(session: Session, first: date, last: date) -> list[tuple[int, int]]:
    """(duration bucket, reviews) for live reviews in [first, last] that carry a duration; bucket b
    holds durations in [b·100 ms, (b+1)·100 ms)."""
    bucket = ReviewLog.duration_ms // DURATION_STEP_MS
    rows = session.exec(
        select(bucket, func.count())
        .where(_live(), ReviewLog.study_day >= first, ReviewLog.study_day <= last, ReviewLog.duration_ms.is_not(None))
        .group_by(bucket)
    ).all()
    return [(int(b), int(n)) for b, n in rows]


def median_ms(buckets: Iterable[tuple[int, int]]) -> float | None:
    """The median duration, each review counted at its bucket's lower bound (so to 100 ms);
    with an even count, the mean of the two middle ones. None without any."""
    ordered = sorted(buckets)
    total = sum(n for _, n in ordered)
    if total == 0:
        return None

    def nth(k: int) -> int:  # the k-th smallest (0-based)
        seen = 0
        for bucket, n in ordered:
            seen += n
            if k < seen:
                return bucket * DURATION_STEP_MS
        raise AssertionError("k out of range")

    middle = total // 2
    return float(nth(middle)) if total % 2 else (nth(middle - 1) + nth(middle)) / 2


# --- the review calendar ----------------------------------------------------------------------


def calendar_weeks(counts: dict[date, int], today: date, weeks: int = 53) -> list[list[tuple[date, int] | None]]:
    """Columns of Monday..Sunday for the last `weeks` weeks, the last holding `today`; days after
    today are None."""
    first = today - timedelta(days=today.weekday()) - timedelta(weeks=weeks - 1)
    columns = []
    for w in range(weeks):
        column: list[tuple[date, int] | None] = []
        for d in range(7):
            day = first + timedelta(weeks=w, days=d)
            column.append((day, counts.get(day, 0)) if day <= today else None)
        columns.append(column)
    return columns


def calendar_level(count: int, busiest: int) -> int:
    """0 for no reviews, else 1-4 by quarters of the busiest day: up to a quarter of it is 1, the
    busiest day itself 4 (so a single review, or a busiest day of 1-3, shades the darkest)."""
    if count <= 0 or busiest <= 0:
        return 0
    return min(4, -(-4 * count // busiest))  # ceil(4 · count / busiest), in integers


# --- mastery by topic -------------------------------------------------------------------------


@dataclass
class Topic:
    """A tag or a deck: its cards now and its reviews in the window."""

    kind: str  # "tag" or "deck"
    name: str
    cards: int = 0
    reviewed_cards: int = 0  # ever reviewed (easiness counts only for these)
    easiness_sum: float = 0.0
    due: int = 0
    reviews: int = 0  # retention reviews in the window
    passed: int = 0
    lapsed_cards: int = 0  # cards with at least one lapse in the window
    cards_reviewed_in_window: int = 0
    labs: dict[str, tuple[int, int]] = field(default_factory=dict)  # lab id -> (lapsed cards, cards)
    decks: set[str] = field(default_factory=set)  # the decks its cards are in
    twin_tags: list[str] = field(default_factory=list)  # a deck's: tags on exactly its cards (merge_deck_twins)

    @property
    def retention(self) -> float | None:
        return 100 * self.passed / self.reviews if self.reviews else None

    @property
    def lapses(self) -> int:
        return self.reviews - self.passed

    @property
    def average_ease(self) -> float | None:
        # Rounded past any summation order's last-bit difference: PostgreSQL and SQLite add the same
        # eases in different orders, and 1.985 shown to two places read 1.99 on one and 1.98 on the other.
        return round(self.easiness_sum / self.reviewed_cards, 9) if self.reviewed_cards else None

    @property
    def lab(self) -> str | None:
        """The lab that shows the effect: the one most of its lapsed cards (then of its cards) link to."""
        if not self.labs:
            return None
        return min(self.labs, key=lambda lab: (-self.labs[lab][0], -self.labs[lab][1], lab))


def _tags(text: str | None) -> list[str]:
    try:
        tags = json.loads(text) if text else []
    except ValueError:
        return []
    return [tag for tag in tags if isinstance(tag, str)] if isinstance(tags, list) else []


def topic_groups(session: Session, today: date, since: date) -> tuple[list[tuple], list[tuple]]:
    """Two grouped queries over (deck, lab, tag list): the cards now, and their retention reviews
    since `since`. A card is in exactly one group, so every figure adds up across groups."""
    tags = cast(Card.tags, String)  # PostgreSQL's json has no equality: group its text
    keys = (Card.deck_id, Card.lab, tags)
    reviewed = Card.due_day.is_not(None)
    cards = session.exec(
        select(*keys, func.count(), func.sum(case((reviewed, 1), else_=0)),
               func.sum(case((reviewed, Card.easiness), else_=0.0)), func.sum(case((Card.due_day <= today, 1), else_=0)))
        .where(Card.retired.is_(False)).group_by(*keys)
    ).all()
    # Per card first, from the window alone (the day index), then onto the cards by primary key:
    # the join never walks the whole log.
    per_card = (
        select(
            ReviewLog.card_id.label("card_id"),
            func.count().label("reviews"),
            func.sum(case((ReviewLog.quality >= PASS_GRADE, 1), else_=0)).label("passed"),
            func.max(case((ReviewLog.quality < PASS_GRADE, 1), else_=0)).label("lapsed"),
        )
        .where(_live(), ReviewLog.study_day >= since, ReviewLog.study_day <= today,
               ReviewLog.was_new.is_(False), ReviewLog.is_repeat.is_(False))
        .group_by(ReviewLog.card_id)
        .subquery()
    )
    reviews = session.exec(
        select(*keys, func.sum(per_card.c.reviews), func.sum(per_card.c.passed), func.sum(per_card.c.lapsed), func.count())
        .select_from(per_card).join(Card, Card.id == per_card.c.card_id)
        .where(Card.retired.is_(False))
        .group_by(*keys)
    ).all()
    return [tuple(row) for row in cards], [tuple(row) for row in reviews]


def fold_topics(cards: Iterable[tuple], reviews: Iterable[tuple]) -> list[Topic]:
    """Per tag and per deck, from `topic_groups`' rows:
    cards: (deck, lab, tags JSON, cards, reviewed cards, easiness sum, due);
    reviews: (deck, lab, tags JSON, retention reviews, passed, lapsed cards, cards reviewed)."""
    topics: dict[tuple[str, str], Topic] = {}

    def of(deck: str, tags_text: str | None) -> list[Topic]:
        keys = [("deck", deck)] + [("tag", tag) for tag in dict.fromkeys(_tags(tags_text))]
        return [topics.setdefault(key, Topic(*key)) for key in keys]

    lab_counts: dict[tuple[str, str], defaultdict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for deck, lab, tags_text, count, reviewed, easiness, due in cards:
        for topic in of(deck, tags_text):
            topic.cards += int(count)
            topic.reviewed_cards += int(reviewed or 0)
            topic.easiness_sum += float(easiness or 0)
            topic.due += int(due or 0)
            topic.decks.add(deck)
            lab_counts[(topic.kind, topic.name)][lab][1] += int(count)
    for deck, lab, tags_text, count, passed, lapsed_cards, cards_reviewed in reviews:
        for topic in of(deck, tags_text):
            topic.reviews += int(count)
            topic.passed += int(passed or 0)
            topic.lapsed_cards += int(lapsed_cards or 0)
            topic.cards_reviewed_in_window += int(cards_reviewed or 0)
            lab_counts[(topic.kind, topic.name)][lab][0] += int(lapsed_cards or 0)
    for key, labs in lab_counts.items():
        topics[key].labs = {lab: (counts[0], counts[1]) for lab, counts in labs.items()}
    return rank_topics(topics.values())


def rank_topics(topics: Iterable[Topic]) -> list[Topic]:
    """Weakest first: lowest retention in the window, then most lapsed cards; topics without
    reviews in the window last, by name."""
    def weakness(topic: Topic):
        if topic.retention is None:
            return (1, 0.0, 0, topic.kind, topic.name)
        return (0, topic.retention, -topic.lapsed_cards, topic.kind, topic.name)

    return sorted(topics, key=weakness)


def merge_deck_twins(topics: Sequence[Topic]) -> list[Topic]:
    """`topics` without the tags that are a deck by another name: on every card of one deck and on no
    other card, so every figure is the deck's. The deck keeps them in `twin_tags`; the order is kept."""
    decks = {topic.name: topic for topic in topics if topic.kind == "deck"}
    kept = []
    for topic in topics:
        deck = decks.get(next(iter(topic.decks))) if topic.kind == "tag" and len(topic.decks) == 1 else None
        if deck is not None and deck.cards == topic.cards:
            deck.twin_tags.append(topic.name)
        else:
            kept.append(topic)
    return kept


def mastery(session: Session, today: date, days: int) -> list[Topic]:
    """Every tag and deck, weakest first, over the last `days` study days."""
    return fold_topics(*topic_groups(session, today, today - timedelta(days=days - 1)))


def weakest(topics: Sequence[Topic]) -> Topic | None:
    """The weakest topic that lapsed at all; None when nothing lapsed."""
    return next((topic for topic in topics if topic.lapsed_cards > 0), None)
