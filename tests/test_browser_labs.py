"""From a card to its lab's measured finding in a real Chromium: the real lab, in its own process."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from studyapp.lab_runs import start_worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def worker(app):
    lab_worker = start_worker(app)  # what `studyapp serve` does
    yield lab_worker
    lab_worker.stop()


def test_run_a_cards_lab_and_see_the_finding_without_a_reload(page: Page, live_server: str, worker):
    page.goto(live_server + "/questions/beta-adam")
    lab_box = page.locator("section.lab")
    expect(lab_box).to_contain_text("Adam's optimizer state against the model")
    lab_box.get_by_role("link", name="Run this lab").click()
    assert page.url.endswith("/labs/adam-optimizer-state")
    expect(page.locator("#lab-results")).to_contain_text("Not run yet")

    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page
    page.get_by_role("button", name="Run this lab").click()
    expect(page.locator("#run-status")).to_contain_text("Run #1 is", timeout=10_000)  # queued or running
    expect(page.locator(".finding")).to_contain_text("2.00x its parameter bytes", timeout=180_000)

    assert page.evaluate("window.sameDocument") is True
    expect(page.locator(".lab-verdict")).to_contain_text("The claim held.")
    expect(page.locator("#run-status")).to_contain_text("Run #1 done in")
    expect(page.locator("figure.lab-chart svg").first).to_be_visible()
    expect(page.locator("table.runs tbody tr")).to_have_count(1)
    expect(page.locator("table.runs tbody tr")).to_contain_text("held")

    # Back on the card, its lab box now carries the measured finding.
    page.goto(live_server + "/questions/beta-adam")
    expect(page.locator("section.lab .lab-measured")).to_contain_text("Measured: the claim held.")
