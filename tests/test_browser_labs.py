"""From a card to its lab's measured finding in a real Chromium: the real lab, in its own process; and the
device choice filled in once the lab process has answered."""

from __future__ import annotations

import sys

import pytest
from conftest import DatabaseOnSmallDisk, filling_first
from playwright.sync_api import Page, expect
from test_lab_runs import FAKE_LAB, devices_command

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

    page.keyboard.press("h")  # the keys still work after a submit the page's script took over
    expect(page).to_have_url(live_server + "/")

    # Back on the card, its lab box now carries the measured finding.
    page.goto(live_server + "/questions/beta-adam")
    expect(page.locator("section.lab .lab-measured")).to_contain_text("Measured: the claim held.")


def test_the_device_choice_appears_once_the_lab_process_answers_without_a_reload(page: Page, live_server: str, app,
                                                                                  tmp_path):
    gate = tmp_path / "answer-now"  # the fake detection answers (one GPU) once this file exists
    app.config["LAB_DEVICES_COMMAND"] = devices_command(gpus=1, gate=str(gate))
    page.goto(live_server + "/labs/adam-optimizer-state")
    expect(page.locator("#lab-devices")).to_contain_text("Looking for GPUs in a lab process")
    choice = page.locator("#device-choice")
    expect(choice.locator("option")).to_have_count(1)
    page.select_option("select[name=world_size]", "4")
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page

    gate.touch()
    expect(choice.locator("option")).to_have_count(2, timeout=20_000)
    expect(choice.locator("option").nth(1)).to_have_text("CUDA: 1 GPU (Fake GPU)")
    expect(page.locator("#lab-devices")).to_contain_text("On CUDA (torch 9.9.0+fake, CUDA 13.0):")
    expect(page.locator("#lab-devices li").nth(1)).to_have_text(
        "4 ranks on cuda: this machine has 1 GPU (Fake GPU): 4 real ranks share cuda:0 over gloo")
    assert page.evaluate("window.sameDocument") is True
    assert choice.input_value() == "cpu" and page.locator("select[name=world_size]").input_value() == "4"
    choice.select_option("cuda")  # now a real choice
    assert choice.input_value() == "cuda"


def test_a_device_detection_the_page_cannot_follow_says_so_and_keeps_cpu(page: Page, live_server: str, app, tmp_path):
    gate = tmp_path / "answer-now"
    app.config["LAB_DEVICES_COMMAND"] = devices_command(gpus=1, gate=str(gate))  # still looking
    page.route("**/labs/devices", lambda route: route.fulfill(status=500, body="broken"))
    try:
        page.goto(live_server + "/labs/adam-optimizer-state")
        expect(page.locator("#lab-devices")).to_have_text(
            "Could not learn whether CUDA can be chosen (HTTP 500); reload to ask again. Labs run on CPU ranks meanwhile.")
        expect(page.locator("#device-choice option")).to_have_count(1)
        expect(page.get_by_role("button", name="Run this lab")).to_be_enabled()
    finally:
        gate.touch()  # the fake detection answers and ends, rather than wait out its 60 s


class TestAFullDisk(DatabaseOnSmallDisk):
    """The lab (a fake) fills the database's 4 MiB tmpfs before it answers."""

    @pytest.fixture
    def app_config(self, app_config: dict, small_disk) -> dict:
        return {**app_config, "LAB_COMMAND": filling_first([sys.executable, str(FAKE_LAB)], small_disk)}

    def test_a_result_waiting_for_space_says_so_and_shows_once_stored(self, page: Page, live_server: str, worker,
                                                                       small_disk):
        page.goto(live_server + "/labs/adam-optimizer-state")
        page.get_by_role("button", name="Run this lab").click()
        expect(page.locator("#run-status")).to_have_text(
            "Run #1 finished, but the database has not taken its result yet (database or disk is full: the disk "
            "that holds the database is full: free space on it, then try again); it is stored as soon as it does.",
            timeout=30_000)
        (small_disk / "filler").unlink()
        expect(page.locator("#run-status")).to_contain_text("Run #1 done in", timeout=20_000)
        expect(page.locator(".finding")).to_contain_text("fake finding for adam-optimizer-state at 2 ranks")


class TestAFakeLab:
    """The lab is tests/data/fake_sharding_lab.py, done in about a second."""

    @pytest.fixture
    def app_config(self, app_config: dict) -> dict:
        return {**app_config, "LAB_COMMAND": [sys.executable, str(FAKE_LAB), "--sleep", "1"]}

    def test_run_this_lab_keeps_focus_on_the_status_line_and_tab_goes_on_to_the_result(self, page: Page, live_server: str,
                                                                                       worker):
        # The button was disabled while it had focus: focus fell to <body>, and Tab began again from the top.
        page.goto(live_server + "/labs/adam-optimizer-state")
        page.get_by_role("button", name="Run this lab").focus()
        page.keyboard.press("Enter")
        status = page.locator("#run-status")
        expect(status).to_be_focused()
        expect(status).to_contain_text("Run #1 done in", timeout=30_000)
        expect(page.locator(".finding")).to_have_text("fake finding for adam-optimizer-state at 2 ranks")
        expect(status).to_be_focused()
        page.keyboard.press("Tab")  # on to the result the run just gave
        expect(page.get_by_role("region", name="Fake table, latest run")).to_be_focused()
        page.keyboard.press("Shift+Tab")  # and back to the button, enabled again
        expect(page.get_by_role("button", name="Run this lab")).to_be_focused()
