"""The question page by keyboard and screen reader in a real Chromium: Enter before a choice,
and the choices as a group named by the question."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_browser_review import correct_text, press_and_wait

pytestmark = pytest.mark.browser


def test_enter_before_a_choice_says_one_is_needed_and_focuses_the_choices(page: Page, live_server: str, app):
    page.goto(live_server + "/study")
    url = page.url
    page.keyboard.press("Enter")  # the page says Enter checks: with nothing chosen it must not do nothing
    first = page.locator("input[name=choice]").first
    expect(first).to_be_focused()
    assert page.url == url and first.evaluate("radio => radio.validationMessage") != ""
    prompt = page.locator("h1.prompt").inner_text()
    page.keyboard.press(str(page.locator("ol.choices .choice-text").all_inner_texts().index(correct_text(app, prompt)) + 1))
    press_and_wait(page, "Enter")
    expect(page.locator(".verdict")).to_have_text("Right")


def test_the_choices_are_a_radio_group_named_by_the_question_with_their_keys(page: Page, live_server: str):
    page.goto(live_server + "/study")
    prompt = page.locator("h1.prompt").inner_text()
    group = page.get_by_role("radiogroup", name=prompt)
    radios = group.get_by_role("radio")
    expect(radios).to_have_count(4)
    for number in range(1, 5):
        radio = radios.nth(number - 1)
        expect(radio).to_have_attribute("aria-keyshortcuts", str(number))
        expect(radio).to_have_attribute("data-key", str(number))  # the key the shortcut presses
