"""Reading form fields strictly: anything malformed is a 400 that names the field."""

from __future__ import annotations

from typing import Any

from flask import abort, request

from studyapp.bank import SLUG

MAX_ID = 2**31 - 1  # fits every database's INTEGER column


def form_value(name: str) -> str | None:
    """The form field's one value (None when it is absent). Sent twice with different values, it is a
    400: taking the first would record what the sender may not have meant (`quality=1&quality=5`)."""
    values = list(dict.fromkeys(request.form.getlist(name)))
    if len(values) > 1:
        shown = ", ".join(repr(value[:40]) for value in values[:3])
        abort(400, description=f"The form field '{name}' was sent {len(values)} different ways ({shown}): send it once.")
    return values[0] if values else None


def form_int(name: str, minimum: int = 0, maximum: int = MAX_ID) -> int:
    raw = form_value(name)
    if raw is None or raw.strip() == "":
        abort(400, description=f"The form field '{name}' is missing.")
    raw = raw.strip()
    digits = raw.removeprefix("-")  # a negative whole number is one: the range check below refuses it
    if not digits.isascii() or not digits.isdigit():
        abort(400, description=f"The form field '{name}' must be a whole number, got {raw[:40]!r}.")
    # A whole number too long to read is out of range: said so, without converting all its digits.
    too_long = len(digits) > max(12, len(str(maximum)))
    shown = raw if len(raw) <= 20 else f"{raw[:20]}… ({len(digits)} digits)"
    if too_long or not minimum <= int(raw) <= maximum:
        abort(400, description=f"The form field '{name}' must be from {minimum} to {maximum}, got {shown}.")
    return int(raw)


def optional_form_int(name: str, minimum: int = 0, maximum: int = MAX_ID) -> int | None:
    """Like form_int, but a missing or empty field is None (a malformed one is still a 400)."""
    raw = form_value(name)
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
