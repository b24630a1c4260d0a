"""The web pages, one blueprint per area; `init_app` registers them, the error pages and the
templates' `plural` filter.

    /                           home.index        decks with due/new/learned counts, Anki downloads
    /study[?deck=ID]            study.show        the next card (or "done for today")
    /study/answer     POST      study.answer      the answer view: verdict, reasons, lab, grade buttons
    /study/grade      POST      study.submit_grade
    /study/undo       POST      study.undo
    /decks/<deck_id>            decks.deck        the deck's cards, each linking to its question and lab
    /questions/<question_id>    decks.question    one card: answer, reasons, lab, schedule, history
    /labs, /labs/<lab_id>       labs.index, labs.lab_page   claim, questions, Run this lab, results, past runs
    /labs/<lab_id>/runs  POST   labs.start_run    202 {"run_id"} (JSON) or back to the lab page (form)
    /labs/runs/<run_id>         labs.run_status   {"status", "result"}: the lab's JSON, or {"error"}
    /plan?<inputs>              plan.index        will it fit? the analytic answer per strategy, the simulated one
                                                  from the lab worker (see studyapp.views.plan)
    /stats                      stats.index       card states, intervals, ease, retention, calendar, time, forecast, mastery by topic
    /stats/tags/<tag>           stats.tag         a topic's cards and its lab
    /exports/<name>.apkg        exports.download  built Anki decks, by exact name only

Every POST needs the CSRF token (studyapp.csrf). Client errors render error.html, or JSON
`{"error": ..., "status": ...}` for JSON requests and on the JSON status routes (auth.JSON_ENDPOINTS).
"""

from __future__ import annotations

from flask import Flask, current_app, jsonify, render_template
from sqlalchemy.exc import OperationalError
from werkzeug.exceptions import HTTPException, ServiceUnavailable

from studyapp.auth import TokenFileError, wants_json
from studyapp.refusals import refusal_of, shown_cause
from studyapp.views import decks, exports, home, labs, plan, stats, study

BLUEPRINTS = (home.bp, study.bp, decks.bp, labs.bp, plan.bp, stats.bp, exports.bp)


def plural(count: int, noun: str) -> str:
    """`{{ n|plural("day") }}`: "1 day", "9 days" (every noun the pages count takes an s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def render_http_error(error: HTTPException):
    """Client errors as a page (or JSON) that says what was wrong, with the right status."""
    message = error.description or error.name
    headers = [(name, value) for name, value in error.get_headers() if name != "Content-Type"]  # Retry-After, Allow
    if wants_json():  # the JSON status routes too, whatever the Accept header
        body = {"error": message, "status": error.code}
        if getattr(error, "retry_after", None):
            body["retry_after_s"] = error.retry_after
        return jsonify(body), error.code, headers
    return render_template("error.html", error=error, message=message), error.code, headers


def render_damaged_token_file(error: TokenFileError):
    """The login token file damaged while serving (edited by hand): every request would be a bare 500.
    The log names the file; the page says what the owner must do, without the instance's path."""
    current_app.logger.error("%s", error)
    return render_http_error(ServiceUnavailable(
        description="The server's login token file is damaged, so no one can log in: its owner must delete "
                    "instance/login_token and run `studyapp token` for a new one (the server's log says more)."))


def render_database_refused(error: OperationalError):
    """The database refused a read or write (full, read-only, locked past its busy timeout, its server
    gone): a 503 that says nothing was changed, not a bare 500, and the error in the log. The page has
    SQLite's message (no other driver's: studyapp.refusals.shown_cause) and what to do, from the driver's
    error code (studyapp.refusals): a full disk needs space, not a retry."""
    current_app.logger.error("the database refused a request: %s", error)
    cause = f" ({shown})" if (shown := shown_cause(error.orig)) else ""
    return render_http_error(ServiceUnavailable(
        description=f"The database could not be read or written{cause}, so nothing was changed: "
                    f"{refusal_of(error.orig).value} (the server's log says more)."))


def init_app(app: Flask) -> None:
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.register_error_handler(HTTPException, render_http_error)
    app.register_error_handler(TokenFileError, render_damaged_token_file)
    app.register_error_handler(OperationalError, render_database_refused)
    app.add_template_filter(plural)
