"""Statistics: card states, interval and ease, true retention, the review calendar, time spent,
the due forecast, and mastery by topic; SVG charts, each with a data table as its text alternative.

    /stats                  stats.index
    /stats/tags/<tag>       stats.tag      a topic's cards, with the lab that shows the effect
"""

from __future__ import annotations

from datetime import date, timedelta

from flask import Blueprint, abort, render_template
from sqlalchemy import String, case, cast, func
from sqlmodel import Session, select

from sharding_lab.catalog import lab_info
from studyapp import stats
from studyapp.bank import TAG
from studyapp.charts import bar_chart, calendar_chart
from studyapp.db import get_session
from studyapp.models import Card, ReviewLog
from studyapp.views import clock
from studyapp.views.paging import requested_page

bp = Blueprint("stats", __name__, url_prefix="/stats")

HISTORY_DAYS = 30
FORECAST_DAYS = 30
RETENTION_WEEKS, RETENTION_MONTHS = 12, 12
CALENDAR_WEEKS = 53
MASTERY_DAYS = 30  # the mastery table's window; the home page's line uses the last 7 days
TAG_LIKE_MAX = 1000  # characters of a tag the tag page's SQL prefilter matches; Python checks the rest


def reviews_by_day(session: Session, today: date, days: int = HISTORY_DAYS) -> list[tuple[date, int, int]]:
    """(day, reviews, correct answers) for each of the last `days` study days, oldest first."""
    first = today - timedelta(days=days - 1)
    rows = session.exec(
        select(ReviewLog.study_day, func.count(), func.sum(case((ReviewLog.correct, 1), else_=0)))
        .where(ReviewLog.undone_at.is_(None), ReviewLog.study_day >= first, ReviewLog.study_day <= today)
        .group_by(ReviewLog.study_day)
    ).all()
    by_day = {day: (int(count), int(correct or 0)) for day, count, correct in rows}
    return [(first + timedelta(days=i), *by_day.get(first + timedelta(days=i), (0, 0))) for i in range(days)]


def due_forecast(session: Session, today: date, days: int = FORECAST_DAYS) -> list[tuple[date, int]]:
    """Cards due on each of the next `days` days; overdue cards count for today."""
    last = today + timedelta(days=days - 1)
    rows = session.exec(
        select(Card.due_day, func.count())
        .where(Card.retired.is_(False), Card.due_day.is_not(None), Card.due_day <= last)
        .group_by(Card.due_day)
    ).all()
    counts = {today + timedelta(days=i): 0 for i in range(days)}
    for day, count in rows:
        counts[max(day, today)] += int(count)
    return sorted(counts.items())


def chart(svg, title: str, columns: tuple[str, ...], rows: list[tuple]) -> dict:
    """An SVG chart with its text alternative: the same figures as a table (stats/_chart.html)."""
    return {"svg": svg, "title": title, "columns": columns, "rows": rows}


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}%"


@bp.get("")
def index():
    session = get_session()
    today = clock.today()
    history = reviews_by_day(session, today)
    forecast = due_forecast(session, today)
    total = sum(count for _, count, _ in history)
    correct = sum(right for _, _, right in history)

    weeks = stats.calendar_weeks({}, today, CALENDAR_WEEKS)
    week_starts = stats.week_starts(today, RETENTION_WEEKS)
    month_starts = stats.month_starts(today, RETENTION_MONTHS)
    first = min(weeks[0][0][0], week_starts[0], month_starts[0])
    rows = stats.day_rows(session, first, today)  # one grouped scan for calendar, retention and time
    per_day = stats.reviews_per_day(rows)
    weeks = stats.calendar_weeks(per_day, today, CALENDAR_WEEKS)
    by_week = stats.fold_retention(rows, week_starts, today, "%b %d")
    by_month = stats.fold_retention(rows, month_starts, today, "%b %Y")
    time_first = today - timedelta(days=HISTORY_DAYS - 1)
    minutes = stats.minutes_per_day(rows, time_first, today)
    median = stats.median_ms(stats.duration_histogram(session, time_first, today))
    summary = stats.card_summary(session)
    states, intervals, eases = summary.states, summary.intervals, summary.eases
    # "The last 12 months" is one window everywhere on the page, the retention table's 12 calendar
    # months; the calendar's 53 full weeks reach up to a month further back.
    year = [day for week in weeks for day in week if day and day[0] >= month_starts[0]]
    months: dict[str, int] = {}
    for day, count in year:
        months[day.strftime("%Y-%m")] = months.get(day.strftime("%Y-%m"), 0) + count

    charts = {
        "reviews": chart(
            bar_chart([(d.strftime("%b %d"), n) for d, n, _ in history], title="Reviews per day (last 30 days)"),
            "Reviews per day (last 30 days)", ("day", "reviews", "answered right"),
            [(d.isoformat(), n, right) for d, n, right in history]),
        "accuracy": chart(
            bar_chart(
                [(d.strftime("%b %d"), 100 * right / n if n else None) for d, n, right in history],
                title="Accuracy per day, % answered right",
                value_label=lambda v: f"{v:.0f}%",
                max_value=100,
            ),
            "Accuracy per day, % answered right", ("day", "% right"),
            [(d.isoformat(), percent(100 * right / n if n else None)) for d, n, right in history]),
        "forecast": chart(
            bar_chart([(d.strftime("%b %d"), n) for d, n in forecast], title="Cards due, next 30 days"),
            "Cards due, next 30 days", ("day", "cards due"), [(d.isoformat(), n) for d, n in forecast]),
        "intervals": chart(
            bar_chart(intervals, title="Card intervals", label_every=1),
            "Card intervals", ("interval", "cards"), intervals),
        "ease": chart(
            bar_chart(eases, title="Card ease (SM-2 easiness factor)", label_every=1),
            "Card ease (SM-2 easiness factor)", ("ease", "cards"), eases),
        "retention": chart(
            bar_chart([(p.label, p.overall.percent) for p in by_week], title="True retention per week, %",
                      value_label=lambda v: f"{v:.0f}%", max_value=100, label_every=2),
            "True retention per week, %", ("week of", "young", "mature", "overall"),
            [(p.label, percent(p.young.percent), percent(p.mature.percent), percent(p.overall.percent)) for p in by_week]),
        "calendar": chart(
            calendar_chart(weeks, title="Review calendar, last 12 months"),
            "Review calendar, last 12 months", ("month", "reviews"), sorted(months.items())),
        "time": chart(
            bar_chart([(d.strftime("%b %d"), m) for d, m in minutes], title="Minutes answering per day (last 30 days)",
                      value_label=lambda v: f"{v:.1f}"),
            "Minutes answering per day (last 30 days)", ("day", "minutes"),
            [(d.isoformat(), f"{m:.1f}") for d, m in minutes]),
    }
    return render_template(
        "stats/index.html",
        charts=charts,
        total=total,
        accuracy=(100 * correct / total) if total else None,
        forecast_total=sum(n for _, n in forecast),
        states=states,
        by_week=by_week,
        by_month=by_month,
        retention_total=stats.total_retention(r for r in rows if r.day >= month_starts[0]),
        year_reviews=sum(n for _, n in year),
        year_days=sum(1 for _, n in year if n),
        busiest=max(year, key=lambda day: day[1], default=None),
        minutes_total=sum(m for _, m in minutes),
        median_ms=median,
        topics=stats.merge_deck_twins(stats.mastery(session, today, MASTERY_DAYS)),
        mastery_days=MASTERY_DAYS,
        lab_info=lab_info,
        percent=percent,
    )


@bp.get("/tags/<tag>")
def tag(tag: str):
    """A topic's cards, weakest first by ease, with their labs."""
    if not TAG.fullmatch(tag):  # the bank's own rule: every tag it accepts has a page
        abort(404, description="There is no such tag.")
    session = get_session()
    today = clock.today()
    # A prefix of the quoted tag narrows as well; SQLite refuses a LIKE pattern over 50,000 bytes.
    needle = f'"{tag}"'[:TAG_LIKE_MAX]
    # Weakest first (new cards last), in bank order among equals: ordered on the few columns it needs,
    # then only the page's cards are loaded whole.
    candidates = session.exec(
        select(Card.id, Card.tags, Card.due_day, Card.repeat_day, Card.easiness)
        .where(Card.retired.is_(False), cast(Card.tags, String).contains(needle)).order_by(Card.position)
    ).all()
    tagged = [row for row in candidates if tag in row.tags]
    ranked = [row.id for row in sorted(tagged, key=lambda row: (row.due_day is None, row.easiness))]
    # Step-7 repeats waiting today and not otherwise due, as the home page counts them: topic.due leaves them out.
    repeats = sum(1 for row in tagged if row.repeat_day == today and not (row.due_day and row.due_day <= today))
    if not ranked:
        abort(404, description=f"No card is tagged '{tag}'.")
    page = requested_page(len(ranked))
    shown = page.slice(ranked)
    by_id = {card.id: card for card in session.exec(select(Card).where(Card.id.in_(shown))).all()}
    topic = next((t for t in stats.mastery(session, today, MASTERY_DAYS) if t.kind == "tag" and t.name == tag), None)
    return render_template("stats/tag.html", tag=tag, cards=[by_id[card_id] for card_id in shown], page=page,
                           topic=topic, repeats=repeats, today=today, lab_info=lab_info, percent=percent,
                           mastery_days=MASTERY_DAYS)
