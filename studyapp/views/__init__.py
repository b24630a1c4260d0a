"""The web pages, one blueprint per area; `init_app` registers them and the error pages."""

from __future__ import annotations

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from studyapp.views import decks, exports, home, labs, stats, study

BLUEPRINTS = (home.bp, study.bp, decks.bp, labs.bp, stats.bp, exports.bp)


def _wants_json() -> bool:
    return request.is_json or request.accept_mimetypes.best == "application/json"


def render_http_error(error: HTTPException):
    """Client errors as a page (or JSON) that says what was wrong, with the right status."""
    message = error.description or error.name
    if _wants_json():
        return jsonify(error=message, status=error.code), error.code
    return render_template("error.html", error=error, message=message), error.code


def init_app(app: Flask) -> None:
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    app.register_error_handler(HTTPException, render_http_error)
