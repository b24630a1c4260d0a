"""Statistics: reviews per day, accuracy and the due forecast, as SVG charts."""

from __future__ import annotations

from datetime import date, timedelta

from flask import Blueprint, render_template
from sqlalchemy import case, func
from sqlmodel import Session, select

from studyapp.charts import bar_chart
from studyapp.db import get_session
from studyapp.models import Card, ReviewLog
from studyapp.views import clock

bp = Blueprint("stats", __name__, url_prefix="/stats")

HISTORY_DAYS = 30
FORECAST_DAYS = 30


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


@bp.get("")
def index():
    session = get_session()
    today = clock.today()
    history = reviews_by_day(session, today)
    forecast = due_forecast(session, today)
    total = sum(count for _, count, _ in history)
    correct = sum(right for _, _, right in history)
    charts = {
        "reviews": bar_chart([(d.strftime("%b %d"), n) for d, n, _ in history], title="Reviews per day (last 30 days)"),
        "accuracy": bar_chart(
            [(d.strftime("%b %d"), 100 * right / n if n else None) for d, n, right in history],
            title="Accuracy per day, % answered right",
            value_label=lambda v: f"{v:.0f}%",
            max_value=100,
        ),
        "forecast": bar_chart([(d.strftime("%b %d"), n) for d, n in forecast], title="Cards due, next 30 days"),
    }
    return render_template(
        "stats/index.html",
        charts=charts,
        total=total,
        accuracy=(100 * correct / total) if total else None,
        forecast_total=sum(n for _, n in forecast),
    )
