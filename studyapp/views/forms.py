"""Reading form fields strictly: anything malformed is a 400 that names the field."""

from __future__ import annotations

from typing import Any

from flask import abort, request

from studyapp.bank import SLUG

MAX_ID = 2**31 - 1  # fits every database's INTEGER column


def form_int(name: str, minimum: int = 0, maximum: int = MAX_ID) -> int:
    raw = request.form.get(name)
    if raw is None or raw.strip() == "":
        abort(400, description=f"The form field '{name}' is missing.")
    raw = raw.strip()
    digits = raw.removeprefix("-")  # a negative whole number is one: the range check below refuses it
    if not digits.isascii() or not digits.isdigit() or len(digits) > max(12, len(str(maximum))):
        abort(400, description=f"The form field '{name}' must be a whole number, got {raw[:40]!r}.")
    value = int(raw)
    if not minimum <= value <= maximum:
        abort(400, description=f"The form field '{name}' must be from {minimum} to {maximum}, got {value}.")
    return value


def optional_form_int(name: str, minimum: int = 0, maximum: int = MAX_ID) -> int | None:
    """Like form_int, but a missing or empty field is None (a malformed one is still a 400)."""
    raw = request.form.get(name)
    if raw is None or raw.strip() == "":
        return None
    return form_int(name, minimum, maximum)


def json_body() -> Any:
    """The request's JSON body, or None when it is not valid JSON. Nested too deep counts as not valid:
    Python's parser raises RecursionError there (2 KB of brackets will do), which Flask's silent mode,
    catching only ValueError, would let through as a 500."""
    try:
        return request.get_json(silent=True)
    except RecursionError:
        return None


def known_slug(raw: str, what: str) -> str:
    """A deck or question id from a URL or form; anything that is not a slug cannot exist (404),
    and is never sent to the database (PostgreSQL refuses NUL bytes with an error, not a miss)."""
    if len(raw) > 200 or not SLUG.fullmatch(raw) or not raw.isascii():
        abort(404, description=f"There is no {what} '{raw[:60]}'.")
    return raw
