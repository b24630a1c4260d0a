"""Property-based fuzzing (hypothesis) of every state-changing endpoint, taken from the app's URL
map (so a new POST endpoint is fuzzed without editing this file): form, JSON and raw bodies,
odd path arguments, with and without the CSRF token. Never a 5xx; a rejection is a 4xx that
says what was wrong, and writes nothing."""

from __future__ import annotations

import json
import re
from collections import Counter
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import record_figures
from sqlalchemy import text

from studyapp.db import get_engine

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
FIELDS = ["card_id", "version", "choice", "quality", "deck", "shown_at", "duration_ms", "lab_id", "params", "world_size"]
EXAMPLES = 1200

pytestmark = pytest.mark.slow  # 1,200 requests

# Text that is hard on parsers and databases: NUL, long, non-ASCII digits, SQL, markup, paths.
nasty_text = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    st.sampled_from(["", " ", "\x00", "-1", "0", "1", "5", "6", "99", "١٢", "1e3", "0x10", "2147483648", "9" * 30,
                     "1.5", " 3 ", "NaN", "null", "true", "'; DROP TABLE card; --", "<script>x</script>",
                     "../../etc/passwd", "%00", "alpha", "beta", "what-fsdp-shards", "A" * 5000]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | nasty_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS) | nasty_text, inner, max_size=3),
    max_leaves=8,
)


def state_changing_rules(app) -> list:
    return sorted((r for r in app.url_map.iter_rules() if r.methods & STATE_CHANGING), key=lambda r: r.rule)


def fingerprint(app) -> tuple:
    """Changes whenever anything is written: every write adds rows or bumps a card's version."""
    with get_engine(app).connect() as connection:
        return tuple(connection.execute(text(
            "SELECT (SELECT count(*) FROM reviewlog), (SELECT count(*) FROM reviewlog WHERE undone_at IS NOT NULL),"
            " (SELECT coalesce(sum(version), 0) FROM card), (SELECT count(*) FROM card),"
            " (SELECT count(*) FROM deck), (SELECT count(*) FROM labrun)"
        )).one())


def near_valid_form(app, card_id: int) -> dict[str, str]:
    """What the answer page would post for this card now: a grade that may or may not fit."""
    with get_engine(app).connect() as connection:
        version, answer = connection.execute(text("SELECT version, answer FROM card WHERE id = :id"), {"id": card_id}).one()
    return {"card_id": str(card_id), "version": str(version), "choice": str(answer), "quality": "4", "deck": "alpha"}


def says_why(response) -> bool:
    body = response.get_data(as_text=True)
    if response.is_json:
        return bool((response.get_json() or {}).get("error"))
    return 'class="error-message">' in body and '<p class="error-message"></p>' not in body


def test_every_state_changing_endpoint_refuses_bad_input_cleanly(app, client, csrf_token, tmp_path_factory):
    rules = state_changing_rules(app)
    assert {"/study/answer", "/study/grade", "/study/undo"} <= {r.rule for r in rules}
    tried: Counter = Counter()
    outcomes: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.data())
    def fuzz(data):
        rule = data.draw(st.sampled_from(rules), label="rule")
        values = {arg: data.draw(nasty_text, label=arg) for arg in rule.arguments}
        path = rule.rule
        for arg, value in values.items():
            path = re.sub(rf"<(?:[^:>]+:)?{arg}>", quote(value, safe="").replace("\\", "\\\\"), path)
        method = data.draw(st.sampled_from(sorted(rule.methods & STATE_CHANGING)), label="method")
        with_token = data.draw(st.integers(0, 9), label="token") > 0  # 1 in 10 without: refused by CSRF
        kind = data.draw(st.sampled_from(["form", "json", "raw"]), label="body")
        headers = {"X-CSRF-Token": csrf_token} if with_token else {}
        if kind == "form":
            form = data.draw(st.dictionaries(st.sampled_from(FIELDS) | nasty_text, nasty_text, max_size=6), label="form")
            if data.draw(st.booleans(), label="near-valid"):  # a real card's form with some fields spoiled
                form = {**near_valid_form(app, data.draw(st.integers(1, 5), label="card")), **form}
            if with_token:
                form["csrf_token"] = csrf_token
            response = client.open(path, method=method, data=form, headers=headers)
        elif kind == "json":
            body = json.dumps(data.draw(json_value, label="json"))
            response = client.open(path, method=method, data=body, content_type="application/json", headers=headers)
        else:
            body = data.draw(st.binary(max_size=200), label="raw")
            response = client.open(path, method=method, data=body, content_type="application/octet-stream", headers=headers)
        tried[rule.rule] += 1
        outcomes[response.status_code] += 1

        before = fingerprint_before[0]
        after = fingerprint(app)
        fingerprint_before[0] = after
        assert response.status_code < 500, (path, response.get_data(as_text=True)[:500])
        if response.status_code >= 400:
            assert says_why(response), (path, response.status_code, response.get_data(as_text=True)[:500])
            assert after == before, f"a rejected {method} {path} ({response.status_code}) wrote to the database"

    fingerprint_before = [fingerprint(app)]
    fuzz()
    server_errors = sum(count for status, count in outcomes.items() if status >= 500)
    assert server_errors == 0, outcomes
    assert set(tried) == {r.rule for r in rules}, "some endpoint was never fuzzed"
    assert all(n >= EXAMPLES // (3 * len(rules)) for n in tried.values()), tried
    record_figures(tmp_path_factory.getbasetemp(), f"fuzz-{get_engine(app).dialect.name}", {
        "inputs_tried": sum(tried.values()), "per_endpoint": dict(tried),
        "statuses": {str(k): v for k, v in sorted(outcomes.items())}, "server_errors": server_errors,
    })


def test_json_nested_too_deep_is_a_clear_400_on_every_endpoint(app, client, csrf_token):
    """2 KB of brackets: Python's JSON parser gives up with RecursionError, not the ValueError a
    malformed body raises, so without its own handling this was a 500."""
    body = "[" * 1000 + "]" * 1000
    before, statuses = fingerprint(app), {}
    for rule in state_changing_rules(app):
        path = re.sub(r"<(?:[^:>]+:)?[^>]+>", "what-fsdp-shards", rule.rule)
        response = client.post(path, data=body, content_type="application/json", headers={"X-CSRF-Token": csrf_token})
        assert response.status_code < 500, (path, response.get_data(as_text=True)[:300])
        statuses[path] = response.status_code
        if response.status_code >= 400:
            assert says_why(response), (path, response.get_data(as_text=True)[:300])
    assert statuses["/labs/what-fsdp-shards/runs"] == statuses["/plan/simulations"] == 400  # the two that read JSON
    assert fingerprint(app) == before
