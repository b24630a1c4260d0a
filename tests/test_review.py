"""The review service (studyapp.study): queue, limits, day rollover, grading, step 7, undo."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timedelta, timezone

import pytest
from conftest import T0
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from studyapp import sm2
from studyapp.db import get_engine
from studyapp.models import Card, ReviewLog
from studyapp.study import (
    _APPEND_LOG,
    _CARD_TO_GRADE,
    AlreadyUndone,
    ReviewConflict,
    ReviewRejected,
    Schedule,
    SettingError,
    StudySettings,
    allowed_qualities,
    choice_order,
    day_progress,
    grade,
    grade_options,
    last_live_review,
    next_card,
    replayed_schedule,
    schedule_after,
    study_day,
    undo_last,
)

UTC_SETTINGS = StudySettings(timezone="UTC", day_start_hour=4)


@pytest.fixture
def session(app):
    with Session(get_engine(app)) as session:
        yield session


def card_by_qid(session: Session, qid: str) -> Card:
    card = session.exec(select(Card).where(Card.question_id == qid)).one()
    session.refresh(card)
    return card


def answer(session: Session, card: Card, *, right: bool, quality: int, now: datetime = T0, settings=UTC_SETTINGS):
    """Grade `card` as currently stored, answering right or wrong."""
    session.refresh(card)
    choice = card.answer if right else (card.answer + 1) % len(card.choices)
    return grade(session, card_id=card.id, version=card.version, choice=choice, quality=quality, now=now, settings=settings)


# --- Pure parts -------------------------------------------------------------------------


def test_study_day_rolls_over_at_the_configured_local_hour():
    berlin = StudySettings(timezone="Europe/Berlin", day_start_hour=4)
    # 02:30 UTC on 3 March is 03:30 in Berlin: still the study day of 2 March.
    assert study_day(datetime(2026, 3, 3, 2, 30, tzinfo=timezone.utc), berlin) == date(2026, 3, 2)
    # 03:00 UTC is 04:00 in Berlin: the new day has begun.
    assert study_day(datetime(2026, 3, 3, 3, 0, tzinfo=timezone.utc), berlin) == date(2026, 3, 3)
    midnight = StudySettings(timezone="America/New_York", day_start_hour=0)
    assert study_day(datetime(2026, 3, 3, 4, 59, tzinfo=timezone.utc), midnight) == date(2026, 3, 2)
    assert study_day(datetime(2026, 3, 3, 5, 0, tzinfo=timezone.utc), midnight) == date(2026, 3, 3)


def test_study_day_refuses_naive_times():
    with pytest.raises(ValueError, match="timezone-aware"):
        study_day(datetime(2026, 3, 3, 12), UTC_SETTINGS)


@pytest.mark.parametrize("bad, message", [
    ({"day_start_hour": 24}, "DAY_START_HOUR must be 0..23, got 24"),
    ({"new_per_day": -1}, "NEW_CARDS_PER_DAY is a daily limit and cannot be negative, got -1"),
    ({"reviews_per_day": -3}, "REVIEWS_PER_DAY is a daily limit and cannot be negative, got -3"),
    ({"timezone": "Mars/Olympus"}, "TIMEZONE 'Mars/Olympus' is not a time zone name (IANA, such as 'Europe/Berlin')"),
    ({"timezone": "../etc"}, "TIMEZONE '../etc' is not a time zone name (IANA, such as 'Europe/Berlin')"),
])
def test_settings_refuse_bad_values(bad, message):
    with pytest.raises(SettingError) as refused:
        StudySettings(**bad)
    assert str(refused.value) == message


def test_choice_order_is_a_stable_permutation_per_card_and_day():
    day = date(2026, 3, 2)
    order = choice_order(7, day, 4)
    assert sorted(order) == [0, 1, 2, 3]
    assert choice_order(7, day, 4) == order  # a reload shows the same order
    orders = {tuple(choice_order(card_id, day + timedelta(days=d), 4)) for card_id in range(10) for d in range(5)}
    assert len(orders) > 5  # and it does shuffle


def test_allowed_qualities_split_at_the_passing_line():
    assert allowed_qualities(True) == (3, 4, 5)
    assert allowed_qualities(False) == (0, 1, 2)


def test_schedule_after_a_first_pass_follows_sm2_and_sets_the_due_day():
    today = date(2026, 3, 2)
    new = Schedule(0, 2.5, 0, None, None)
    after = schedule_after(new, 5, is_repeat=False, today=today)
    assert after.state == sm2.SM2State(repetitions=1, easiness=2.6, interval=1)  # EF 2.5 + 0.1
    assert after.due_day == today + timedelta(days=1)
    assert after.repeat_day is None
    failed = schedule_after(new, 3, is_repeat=False, today=today)
    assert failed.repeat_day == today  # step 7: below 4 comes back today


def test_schedule_after_a_repeat_changes_nothing_but_the_repeat_flag():
    today = date(2026, 3, 2)
    before = Schedule(2, 2.2, 6, today + timedelta(days=6), today)
    assert schedule_after(before, 2, is_repeat=True, today=today) == before
    assert schedule_after(before, 4, is_repeat=True, today=today) == replace(before, repeat_day=None)


# --- Queue and limits -------------------------------------------------------------------


def test_new_cards_come_in_bank_order_then_the_day_is_done(session):
    seen = []
    while (card := next_card(session, T0, UTC_SETTINGS)) is not None:
        seen.append(card.question_id)
        answer(session, card, right=True, quality=5)
    assert seen == ["alpha-shards", "alpha-gather", "alpha-free", "beta-adam", "beta-stage3"]


def test_a_deck_filter_limits_the_queue(session):
    card = next_card(session, T0, UTC_SETTINGS, deck_id="beta")
    assert card.question_id == "beta-adam"


def test_the_new_card_limit_holds_per_study_day(session):
    settings = replace(UTC_SETTINGS, new_per_day=2)
    for _ in range(2):
        answer(session, next_card(session, T0, settings), right=True, quality=5, settings=settings)
    assert next_card(session, T0, settings) is None
    assert day_progress(session, study_day(T0, settings)).new_done == 2
    tomorrow = T0 + timedelta(days=1)
    # Tomorrow: the two reviewed cards are due (interval 1) and two more new ones are allowed.
    shown = []
    while (card := next_card(session, tomorrow, settings)) is not None:
        shown.append((card.question_id, card.is_new))
        answer(session, card, right=True, quality=5, now=tomorrow, settings=settings)
    assert shown == [("alpha-shards", False), ("alpha-gather", False), ("alpha-free", True), ("beta-adam", True)]


def test_the_review_limit_holds_per_study_day(session):
    for _ in range(5):
        answer(session, next_card(session, T0, UTC_SETTINGS), right=True, quality=5)
    tomorrow = T0 + timedelta(days=1)
    settings = replace(UTC_SETTINGS, reviews_per_day=3)
    for _ in range(3):
        answer(session, next_card(session, tomorrow, settings), right=True, quality=5, now=tomorrow, settings=settings)
    assert next_card(session, tomorrow, settings) is None
    assert day_progress(session, study_day(tomorrow, settings)).reviews_done == 3


def test_the_day_rolls_over_at_the_start_hour_not_at_midnight(session):
    settings = replace(UTC_SETTINGS, new_per_day=1)
    late = datetime(2026, 3, 2, 23, 0, tzinfo=timezone.utc)
    answer(session, next_card(session, late, settings), right=True, quality=5, now=late, settings=settings)
    after_midnight = late + timedelta(hours=2)  # 01:00: still the same study day
    assert next_card(session, after_midnight, settings) is None
    after_start = late + timedelta(hours=5, minutes=1)  # 04:01: a new study day
    card = next_card(session, after_start, settings)
    assert card is not None and card.question_id == "alpha-shards"  # due again (interval 1)


def test_step7_repeats_come_after_the_first_pass_until_graded_4_or_more(session):
    settings = replace(UTC_SETTINGS, new_per_day=2)
    first = next_card(session, T0, settings)
    answer(session, first, right=False, quality=1, now=T0, settings=settings)
    second = next_card(session, T0, settings)
    assert second.question_id != first.question_id  # first pass goes on
    answer(session, second, right=True, quality=5, settings=settings)
    repeat = next_card(session, T0, settings)
    assert repeat.id == first.id
    before = card_by_qid(session, first.question_id).state
    result = answer(session, repeat, right=True, quality=3, settings=settings)
    assert result.log.is_repeat
    assert card_by_qid(session, first.question_id).state == before  # a repeat changes no SM-2 state
    again = next_card(session, T0, settings)
    assert again.id == first.id  # graded 3: still below 4
    answer(session, again, right=True, quality=4, settings=settings)
    assert next_card(session, T0, settings) is None
    assert day_progress(session, study_day(T0, settings)).repeats_done == 2


def test_retired_cards_leave_the_queue(session):
    card = card_by_qid(session, "alpha-shards")
    card.retired = True
    session.add(card)
    session.commit()
    assert next_card(session, T0, UTC_SETTINGS).question_id == "alpha-gather"


# --- Grading ----------------------------------------------------------------------------


def test_grading_logs_the_state_before_and_after(session):
    card = card_by_qid(session, "alpha-gather")
    shown_version = card.version
    result = answer(session, card, right=True, quality=4)
    log = result.log
    assert not result.duplicate
    assert (log.before_repetitions, log.before_easiness, log.before_interval) == (0, 2.5, 0)
    assert (log.after_repetitions, log.after_easiness, log.after_interval) == (1, 2.5, 1)  # grade 4 keeps EF
    assert log.correct and log.choice == card.answer and log.was_new and not log.is_repeat
    assert log.reviewed_at == T0
    stored = card_by_qid(session, "alpha-gather")
    assert stored.state == sm2.SM2State(repetitions=1, easiness=2.5, interval=1)
    assert stored.due_day == study_day(T0, UTC_SETTINGS) + timedelta(days=1)
    assert stored.version == shown_version + 1


def test_grading_stores_and_reads_what_sqlalchemy_would(session):
    """grade runs its statements on the driver's cursor (db.DirectStatement): the rows it writes read
    back through the ORM as the values it returned, and its read of a card equals SQLAlchemy's."""
    card = card_by_qid(session, "alpha-gather")
    first = answer(session, card, right=False, quality=1, now=T0 + timedelta(seconds=1.5))  # a repeat due today
    stored = session.get(ReviewLog, first.log.id)
    assert stored.model_dump() == first.log.model_dump()
    card = card_by_qid(session, "alpha-gather")
    assert (card.due_day, card.repeat_day, card.last_reviewed_at, card.version) == (
        first.log.after_due_day, first.log.after_repeat_day, first.log.reviewed_at, 1)
    connection = session.connection()
    direct = _CARD_TO_GRADE.rows(connection, {"card_id": card.id})
    assert [tuple(row) for row in direct] == [tuple(connection.execute(_CARD_TO_GRADE.statement, {"card_id": card.id}).one())]
    assert isinstance(direct[0].choices, list) and direct[0].last_reviewed_at == T0 + timedelta(seconds=1.5)
    session.rollback()
    second = answer(session, card, right=True, quality=5, now=T0 + timedelta(minutes=1))
    assert session.get(ReviewLog, second.log.id).model_dump() == second.log.model_dump()
    assert second.log.before_last_reviewed_at == T0 + timedelta(seconds=1.5) and second.log.is_repeat


def test_a_driver_error_on_the_direct_path_is_sqlalchemys(session):
    """grade's race handling catches SQLAlchemy's IntegrityError; the direct path raises it too."""
    card = card_by_qid(session, "alpha-gather")
    first = answer(session, card, right=True, quality=5)
    again = {**first.row, "card_id": card.id}
    del again["id"]
    with pytest.raises(IntegrityError):  # the same submission id twice
        _APPEND_LOG.rows(session.connection(), again)
    session.rollback()
    assert len(session.exec(select(ReviewLog)).all()) == 1


def test_a_grade_is_committed_on_its_own_and_the_sessions_objects_reload_it(session, app):
    """grade commits in a driver transaction of its own: another connection sees the grade at once,
    the engine's pool has every connection back, and a card the session had loaded reads the new state."""
    card = card_by_qid(session, "alpha-shards")
    result = answer(session, card, right=True, quality=5)
    with Session(get_engine(app)) as other:
        stored = other.exec(select(ReviewLog).where(ReviewLog.submission_id == result.log.submission_id)).one()
        assert stored.model_dump() == result.log.model_dump()
    assert get_engine(app).pool.checkedout() == 1  # the test's own session holds one; grade's went back
    assert (card.version, card.state) == (1, sm2.SM2State(repetitions=1, easiness=2.6, interval=1))  # expired, so read again


def test_grading_refuses_a_session_with_unsaved_changes(session):
    """Unsaved changes would not be part of grade's own transaction: it says so and writes nothing."""
    card = card_by_qid(session, "alpha-shards")
    card.prompt = "edited, not saved"
    with pytest.raises(RuntimeError, match="commit or discard the session's changes first"):
        grade(session, card_id=card.id, version=card.version, choice=card.answer, quality=5, now=T0, settings=UTC_SETTINGS)
    session.rollback()
    assert session.exec(select(ReviewLog)).all() == []
    assert card_by_qid(session, "alpha-shards").version == 0


def test_the_server_decides_correctness_and_enforces_the_grade_range(session):
    card = card_by_qid(session, "alpha-shards")
    with pytest.raises(ReviewRejected, match="wrong answer is graded 0 to 2"):
        answer(session, card, right=False, quality=5)
    with pytest.raises(ReviewRejected, match="right answer is graded 3 to 5"):
        answer(session, card, right=True, quality=2)
    with pytest.raises(ReviewRejected, match="choice must be from 0 to 3"):
        grade(session, card_id=card.id, version=card.version, choice=4, quality=1, now=T0, settings=UTC_SETTINGS)
    assert session.exec(select(ReviewLog)).all() == []


def test_a_submission_sent_twice_counts_once(session):
    card = card_by_qid(session, "alpha-shards")
    args = dict(card_id=card.id, version=card.version, choice=card.answer, quality=5, now=T0, settings=UTC_SETTINGS)
    first = grade(session, **args)
    second = grade(session, **args)
    assert second.duplicate and second.log.id == first.log.id
    assert len(session.exec(select(ReviewLog)).all()) == 1
    assert card_by_qid(session, "alpha-shards").state == sm2.SM2State(repetitions=1, easiness=2.6, interval=1)


def test_a_stale_showing_is_a_conflict(session):
    card = card_by_qid(session, "alpha-shards")
    answer(session, card, right=False, quality=0)  # version 0 -> 1
    undo_last(session, T0)  # version 1 -> 2: the page shown at version 1 is stale
    with pytest.raises(ReviewConflict):
        grade(session, card_id=card.id, version=1, choice=card.answer, quality=5, now=T0, settings=UTC_SETTINGS)
    assert len(session.exec(select(ReviewLog)).all()) == 1


def test_a_card_not_due_cannot_be_graded(session):
    card = card_by_qid(session, "alpha-shards")
    answer(session, card, right=True, quality=5)
    with pytest.raises(ReviewRejected, match="not due until"):
        answer(session, card, right=True, quality=5, now=T0 + timedelta(minutes=5))


def test_grade_options_show_the_interval_each_grade_leads_to(session):
    card = card_by_qid(session, "alpha-shards")
    today = study_day(T0, UTC_SETTINGS)
    options = grade_options(card, True, today)
    assert [(o.quality, o.interval, o.again_today) for o in options] == [(3, 1, True), (4, 1, False), (5, 1, False)]
    assert options[2].wording == sm2.QUALITY_WORDING[5]
    answer(session, card, right=True, quality=5, now=T0)  # n=1, I=1
    answer(session, card, right=True, quality=5, now=T0 + timedelta(days=1))  # n=2, I=6
    card = card_by_qid(session, "alpha-shards")  # n=2, I=6, EF=2.7
    options = grade_options(card, True, study_day(T0 + timedelta(days=10), UTC_SETTINGS))
    # every passing grade grows I by the easiness from before it: ceil(6 x 2.7) = 17
    assert [o.interval for o in options] == [17, 17, 17]


# --- Undo -------------------------------------------------------------------------------


def test_undo_restores_the_card_exactly_and_marks_the_log(session):
    card = card_by_qid(session, "alpha-shards")
    answer(session, card, right=True, quality=5)
    before = card_by_qid(session, "alpha-shards")
    snapshot = (before.state, before.due_day, before.repeat_day, before.last_reviewed_at)
    answer(session, before, right=True, quality=4, now=T0 + timedelta(days=1))
    undone = undo_last(session, T0 + timedelta(days=1, minutes=1))
    assert undone.undone_at is not None and undone.quality == 4
    after = card_by_qid(session, "alpha-shards")
    assert (after.state, after.due_day, after.repeat_day, after.last_reviewed_at) == snapshot
    assert len(session.exec(select(ReviewLog)).all()) == 2  # marked, not deleted
    assert replayed_schedule(session, after.id) == after.state


def test_undo_twice_walks_back_and_nothing_left_returns_none(session):
    card = card_by_qid(session, "alpha-shards")
    answer(session, card, right=False, quality=2)
    answer(session, card, right=True, quality=5)  # the step-7 repeat
    undo_last(session, T0)
    undo_last(session, T0)
    fresh = card_by_qid(session, "alpha-shards")
    assert fresh.is_new and fresh.state == sm2.NEW_CARD and fresh.repeat_day is None
    assert undo_last(session, T0) is None
    assert day_progress(session, study_day(T0, UTC_SETTINGS)) == day_progress(session, date(1999, 1, 1))


def test_an_undone_card_can_be_reviewed_again_with_a_new_submission(session):
    card = card_by_qid(session, "alpha-shards")
    first = answer(session, card, right=True, quality=3)
    undo_last(session, T0)
    second = answer(session, card, right=True, quality=5)
    assert not second.duplicate and second.log.submission_id != first.log.submission_id
    assert card_by_qid(session, "alpha-shards").state == sm2.SM2State(repetitions=1, easiness=2.6, interval=1)


def _schedules(session: Session) -> list[tuple]:
    """Every card's schedule and every log row's undo mark, as stored (another connection's view)."""
    with Session(session.get_bind()) as fresh:
        cards = [(c.id, c.repetitions, c.easiness, c.interval, c.due_day, c.repeat_day, c.version) for c in fresh.exec(select(Card))]
        marks = [(log.id, log.undone_at) for log in fresh.exec(select(ReviewLog).order_by(ReviewLog.id))]
    return sorted(cards) + marks


def test_an_undo_naming_its_review_counts_once(session):
    card = card_by_qid(session, "alpha-shards")
    first = answer(session, card, right=True, quality=5)
    second = answer(session, card_by_qid(session, "alpha-gather"), right=True, quality=4)
    undone = undo_last(session, T0, review_id=second.log.id)
    assert undone.id == second.log.id and undone.undone_at is not None
    stored = _schedules(session)
    with pytest.raises(AlreadyUndone) as already:  # the same form posted again
        undo_last(session, T0, review_id=second.log.id)
    assert already.value.log.id == second.log.id and already.value.status == 409
    assert _schedules(session) == stored  # the first review was not undone in its place
    assert session.get(ReviewLog, first.log.id).undone_at is None


def test_an_undo_naming_an_older_review_is_a_conflict_and_changes_nothing(session):
    first = answer(session, card_by_qid(session, "alpha-shards"), right=True, quality=5)
    answer(session, card_by_qid(session, "alpha-gather"), right=True, quality=4)
    stored = _schedules(session)
    with pytest.raises(ReviewConflict, match="newer review"):
        undo_last(session, T0, review_id=first.log.id)
    with pytest.raises(ReviewRejected, match="there is no review 999") as missing:
        undo_last(session, T0, review_id=999)
    assert missing.value.status == 404
    assert _schedules(session) == stored


def test_an_undo_in_one_deck_undoes_that_decks_latest_review_once(session):
    adam = card_by_qid(session, "beta-adam")
    beta_review = answer(session, adam, right=True, quality=5)
    alpha_review = answer(session, card_by_qid(session, "alpha-shards"), right=True, quality=4)  # newer, other deck
    assert last_live_review(session, "beta").id == beta_review.log.id
    assert last_live_review(session).id == alpha_review.log.id
    undone = undo_last(session, T0, review_id=beta_review.log.id, deck_id="beta")
    assert undone.id == beta_review.log.id and undone.undone_at is not None
    fresh = card_by_qid(session, "beta-adam")
    assert fresh.is_new and fresh.state == sm2.NEW_CARD and replayed_schedule(session, fresh.id) == fresh.state
    assert session.get(ReviewLog, alpha_review.log.id).undone_at is None
    stored = _schedules(session)
    with pytest.raises(AlreadyUndone):  # the same form posted again
        undo_last(session, T0, review_id=beta_review.log.id, deck_id="beta")
    assert undo_last(session, T0, deck_id="beta") is None  # nothing of beta's left to undo
    with pytest.raises(ReviewConflict):  # alpha's review is not beta's to undo
        undo_last(session, T0, review_id=alpha_review.log.id, deck_id="beta")
    assert _schedules(session) == stored


def test_a_grade_posted_again_after_its_undo_is_a_conflict_not_a_count(session):
    card = card_by_qid(session, "alpha-shards")
    args = dict(card_id=card.id, version=card.version, choice=card.answer, quality=5, now=T0, settings=UTC_SETTINGS)
    grade(session, **args)
    undo_last(session, T0)
    stored = _schedules(session)
    with pytest.raises(ReviewConflict, match="was undone"):
        grade(session, **args)
    assert _schedules(session) == stored
