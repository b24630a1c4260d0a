"""The current time and study settings as the views see them (tests swap the clock)."""

from __future__ import annotations

from datetime import date, datetime

from flask import current_app

from studyapp.study import StudySettings, study_day


def now() -> datetime:
    return current_app.config["CLOCK"]()


def settings() -> StudySettings:
    return StudySettings.from_config(current_app.config)


def today() -> date:
    return study_day(now(), settings())
