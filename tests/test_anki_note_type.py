"""The multiple-choice note type: its templates, and its script run in a real Chromium the way
Anki desktop (one page, content swapped per side, scripts re-run) and AnkiDroid (a page per
side) render cards, and with JavaScript off."""

from __future__ import annotations

import re

import pytest

from studyapp.anki import render_note
from studyapp.anki.note_type import BACK, CSS, FIELDS, FRONT, note_type
from studyapp.bank import Question

QUESTION = Question(
    id="fsdp-all-gather-before-layer",
    deck_id="fsdp",
    prompt="Which collective rebuilds a layer's full weights?",
    choices=("Broadcast-only", "All-gather", "Scatter", "Barrier"),
    answer=1,
    explanation="Every rank contributes its shard and receives all of them.",
    why_wrong=("No rank holds the whole layer.", "", "Scatter shards, it does not reassemble.", "A barrier moves no data."),
    lab="allgather-before-layer",
    tags=("fsdp", "communication"),
)
OTHER = Question(**{**QUESTION.__dict__, "id": "zero-other", "answer": 0})


def render(template: str, question: Question) -> str:
    """Anki's substitution for the two template features used: {{Field}} and {{#Field}}...{{/Field}}."""
    values = dict(zip(FIELDS, render_note(question).fields, strict=True))

    def section(match: re.Match) -> str:
        return match.group(2) if values[match.group(1)] else ""

    template = re.sub(r"\{\{#(\w+)\}\}(.*?)\{\{/\1\}\}", section, template, flags=re.S)
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], template)


def test_templates_use_only_the_note_types_fields():
    for template in (FRONT, BACK):
        references = re.findall(r"\{\{([#/]?)(\w+)\}\}", template)
        assert {name for _, name in references} <= set(FIELDS)
        # Anything else in double braces would be read by Anki as a field reference.
        assert template.count("{{") == len(references) == template.count("}}")
    assert "{{" not in CSS
    assert "{{FrontSide}}" not in BACK
    assert "<script src" not in FRONT + BACK and "http" not in FRONT + BACK + CSS  # no external assets


def test_note_type_is_stamped_with_its_own_mtime():
    model = note_type(1234)
    assert model.to_json(9999, 1)["mod"] == 1234
    assert [f["name"] for f in model.fields] == list(FIELDS)


# --- In a real browser ----------------------------------------------------------------------


@pytest.fixture
def chromium(browser):
    """Debian's Chromium through pytest-playwright (conftest's launch args: skips without it, fails under CI)."""
    return browser


PAGE = "<!doctype html><html><head><style>{css}</style></head><body class='card'><div id='qa'>{body}</div></body></html>"

# Anki desktop's reviewer: replace #qa's content and run its scripts again.
SHOW_LIKE_DESKTOP = """html => {
  const qa = document.getElementById("qa");
  qa.innerHTML = html;
  for (const old of qa.querySelectorAll("script")) {
    const script = document.createElement("script");
    script.textContent = old.textContent;
    old.replaceWith(script);
  }
}"""


def serve(context, pages: dict[str, str]) -> None:
    """Serve each side at its own same-origin URL, as AnkiDroid loads a page per side."""
    for name, body in pages.items():
        context.route(f"http://anki.test/{name}", _fulfil(PAGE.format(css=CSS, body=body)))


def _fulfil(html: str):
    return lambda route: route.fulfill(body=html, content_type="text/html")


def choice_texts(page) -> list[str]:
    return page.locator("#mc-card .mc-choices li").all_inner_texts()


@pytest.mark.browser
def test_desktop_keeps_the_shuffled_order_and_the_choice_from_front_to_back(chromium):
    context = chromium.new_context()
    serve(context, {"blank": ""})
    page = context.new_page()
    page.goto("http://anki.test/blank")
    orders = set()
    for _ in range(12):  # the order is shuffled each time the front is shown
        page.evaluate(SHOW_LIKE_DESKTOP, render(FRONT, QUESTION))
        orders.add(tuple(choice_texts(page)))
    assert all(sorted(order) == sorted(QUESTION.choices) for order in orders)
    assert len(orders) > 1
    front_order = choice_texts(page)
    assert page.locator(".mc-hint").is_visible()

    page.locator("#mc-card .mc-choices li", has_text="Scatter").click()
    chosen = page.locator("#mc-card li.mc-chosen")
    assert chosen.inner_text() == "Scatter"
    blue = "rgba(52, 120, 246, 0.12)"  # the front marks a choice as chosen, never as right or wrong
    assert chosen.evaluate("el => getComputedStyle(el).backgroundColor") == blue
    page.evaluate(SHOW_LIKE_DESKTOP, render(BACK, QUESTION))
    assert choice_texts(page) == front_order
    assert page.locator("#mc-card .mc-choices li.mc-correct").inner_text() == "All-gather"
    assert page.locator("#mc-card .mc-choices li.mc-chosen").inner_text() == "Scatter"
    red = "rgba(217, 59, 59, 0.14)"
    assert page.locator("#mc-card .mc-choices li.mc-chosen").evaluate("el => getComputedStyle(el).backgroundColor") == red
    assert "Not quite" in page.locator("#mc-verdict").inner_text()
    assert "Scatter shards" in page.locator(".mc-why-wrong li.mc-chosen").inner_text()

    # The next card's back never shows this card's choice.
    page.evaluate(SHOW_LIKE_DESKTOP, render(BACK, OTHER))
    assert page.locator("#mc-card .mc-choices li.mc-chosen").count() == 0
    assert page.locator("#mc-card .mc-choices li.mc-correct").inner_text() == "Broadcast-only"
    context.close()


@pytest.mark.browser
def test_a_page_per_side_carries_the_choice_through_session_storage(chromium):
    context = chromium.new_context()
    serve(context, {"front": render(FRONT, QUESTION), "back": render(BACK, QUESTION)})
    page = context.new_page()
    page.goto("http://anki.test/front")
    front_order = choice_texts(page)
    page.locator("#mc-card .mc-choices li", has_text="All-gather").press("Enter")  # keyboard works too
    page.goto("http://anki.test/back")
    assert choice_texts(page) == front_order
    assert page.locator("#mc-card li.mc-chosen.mc-correct").inner_text() == "All-gather"
    assert page.locator("#mc-verdict").inner_text() == "Right."
    context.close()


@pytest.mark.browser
def test_without_session_storage_one_page_still_carries_the_choice(chromium):
    context = chromium.new_context()
    # As on a page whose storage is off or whose origin forbids it: every access throws.
    context.add_init_script("Object.defineProperty(window, 'sessionStorage', { get() { throw new Error('denied'); } });")
    serve(context, {"blank": ""})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(error))
    page.goto("http://anki.test/blank")
    page.evaluate(SHOW_LIKE_DESKTOP, render(FRONT, QUESTION))
    page.locator("#mc-card .mc-choices li", has_text="Barrier").click()
    page.evaluate(SHOW_LIKE_DESKTOP, render(BACK, QUESTION))
    assert page.locator("#mc-card .mc-choices li.mc-chosen").inner_text() == "Barrier"
    assert page.locator("#mc-card .mc-choices li.mc-correct").inner_text() == "All-gather"
    assert errors == []
    context.close()


@pytest.mark.browser
def test_without_javascript_both_sides_stay_readable(chromium):
    context = chromium.new_context(java_script_enabled=False)
    serve(context, {"front": render(FRONT, QUESTION), "back": render(BACK, QUESTION)})
    page = context.new_page()
    page.goto("http://anki.test/front")
    assert choice_texts(page) == list(QUESTION.choices)  # a plain numbered list, in the bank's order
    assert not page.locator(".mc-hint").is_visible()
    page.goto("http://anki.test/back")
    assert "Answer: All-gather" in page.locator(".mc-answer").inner_text()
    assert "sharding-lab run allgather-before-layer" in page.locator(".mc-lab").inner_text()
    context.close()
