"""Will it fit? in a real Chromium: fill the form, see the verdict and the chart, share the URL, fix a bad
field, and simulate without a reload (the worker runs a fake `sharding-lab plan`: the real one is
tests/test_app_plan.py's slow test)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import DatabaseOnSmallDisk, filling_first
from playwright.sync_api import Page, expect
from test_app_plan import FAKE_CLI
from test_browser_a11y import audit

from studyapp.lab_runs import start_worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def app_config(app_config: dict, tmp_path: Path) -> dict:
    script = tmp_path / "fake_plan_cli.py"
    script.write_text(FAKE_CLI, encoding="utf-8")
    return {**app_config, "PLAN_SIMULATION_COMMAND": [sys.executable, str(script)]}


@pytest.fixture
def worker(app):
    lab_worker = start_worker(app)  # what `studyapp serve` does
    yield lab_worker
    lab_worker.stop()


def test_fill_the_form_and_see_the_verdict_and_the_chart(page: Page, live_server: str):
    page.goto(live_server + "/")
    page.get_by_role("link", name="Will it fit?").click()
    expect(page.get_by_role("heading", name="Will it fit?", level=1)).to_be_visible()
    page.get_by_label("Model", exact=True).select_option("gpt2-small")
    page.get_by_label("GPUs", exact=True).fill("8")
    page.get_by_label("GPU memory (GB)").fill("4")
    page.get_by_label("Micro-batch").fill("4")
    page.get_by_label("bf16 mixed precision").check()
    page.get_by_label("Your strategy").select_option("zero2")
    page.get_by_role("button", name="Will it fit?").click()

    query = {k: v[0] for k, v in parse_qs(urlsplit(page.url).query).items()}
    assert query["size"] == "gpt2-small" and query["gpus"] == "8" and query["mixed_precision"] == "on"
    assert query["gpu_memory_gb"] == "4" and query["strategy"] == "zero2"
    expect(page.locator("#verdict")).to_contain_text(re.compile(r"zero2: (fits|does NOT fit)\."))
    chart = page.locator("figure.plan-chart svg")
    expect(chart).to_be_visible()
    expect(chart.locator("text", has_text="GPU memory 4 GB")).to_have_count(0)  # the line is labelled on the axis
    expect(chart.locator("line.gpu-line")).to_have_count(2)  # GPU memory and usable
    expect(page.locator("#memory-table thead th")).to_have_text(["Category", "ddp", "zero1", "zero2 (yours)", "zero3"])
    expect(page.locator("#comm-table")).to_contain_text("derived")
    assert audit(page) == []


def test_a_changed_url_brings_its_inputs_back(page: Page, live_server: str):
    page.goto(live_server + "/plan?size=custom&layers=6&width=512&heads=8&vocab=32000&seq_len=1024&gpus=16&mesh=4x4"
              "&gpu_memory_gb=141&headroom=15&micro_batch=3&seq=256&strategy=zero3&grad_accum=4&cpu_offload=on")
    expect(page.get_by_label("Model", exact=True)).to_have_value("custom")
    expect(page.get_by_label("Width")).to_have_value("512")
    expect(page.get_by_label("HSDP mesh (replicas x shards)")).to_have_value("4x4")
    expect(page.get_by_label("GPU memory (GB)")).to_have_value("141")
    expect(page.get_by_label("Gradient-accumulation steps")).to_have_value("4")
    expect(page.get_by_label("CPU offload (FSDP2's CPUOffloadPolicy)")).to_be_checked()
    expect(page.get_by_label("bf16 mixed precision")).not_to_be_checked()
    expect(page.locator("#plan-summary")).to_contain_text("4 replicas x 4 shards")

    page.goto(live_server + "/plan?size=1b&gpus=8&gpu_memory_gb=24&mixed_precision=on")  # the URL edited by hand
    expect(page.get_by_label("Model", exact=True)).to_have_value("1b")
    expect(page.get_by_label("Layers")).to_have_value("20")
    expect(page.get_by_label("GPU memory (GB)")).to_have_value("24")
    expect(page.get_by_label("bf16 mixed precision")).to_be_checked()
    expect(page.get_by_label("CPU offload (FSDP2's CPUOffloadPolicy)")).not_to_be_checked()
    page.go_back()
    expect(page.get_by_label("GPU memory (GB)")).to_have_value("141")


def test_a_bad_field_is_named_on_the_page_and_can_be_fixed(page: Page, live_server: str):
    page.goto(live_server + "/plan?size=gpt2-small&gpus=8&strategy=ddp")
    page.get_by_label("CPU offload (FSDP2's CPUOffloadPolicy)").check()
    page.get_by_label("GPUs", exact=True).fill("-8")
    with page.expect_response(re.compile(r"/plan\?")) as response:
        page.get_by_role("button", name="Will it fit?").click()
    assert response.value.status == 400
    errors = page.get_by_role("alert")
    expect(errors).to_contain_text("GPUs must be a whole number from 1 to 131,072, got '-8'")
    expect(errors).to_contain_text("CPU offload is FSDP2's (zero2, zero3): ddp does not shard parameters")
    expect(page.get_by_label("GPUs", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#memory-table")).to_have_count(0)
    assert audit(page) == []

    page.get_by_label("GPUs", exact=True).fill("8")
    page.get_by_label("Your strategy").select_option("zero3")
    page.get_by_role("button", name="Will it fit?").click()
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.locator("#verdict")).to_contain_text("zero3:")


def test_simulate_shows_the_simulated_column_without_a_reload(page: Page, live_server: str, worker):
    page.goto(live_server + "/plan?size=gpt2-small&gpus=8&micro_batch=2&seq=512&strategy=zero3")
    expect(page.locator("#simulated-table")).to_have_count(0)
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page
    page.get_by_role("button", name="Simulate (exact, FSDP2)").click()
    expect(page.locator("#simulated-table")).to_be_visible(timeout=60_000)
    assert page.evaluate("window.sameDocument") is True
    expect(page.locator("#simulation-status")).to_contain_text(re.compile(r"Simulation #1 done in"))
    expect(page.locator("#simulated-zero3-total")).to_contain_text("1.02 kB")
    expect(page.locator("figure.plan-chart svg text", has_text="zero3 sim")).to_have_count(1)
    expect(page.get_by_role("button", name="Simulate again (exact, FSDP2)")).to_be_enabled()
    page.keyboard.press("h")  # the keys still work after a submit the page's script took over
    expect(page).to_have_url(live_server + "/")
    page.goto(live_server + "/plan?size=gpt2-small&gpus=8&micro_batch=2&seq=512&strategy=zero3")  # stored, it stays
    expect(page.locator("#simulated-zero3-total")).to_contain_text("1.02 kB")


def test_every_control_is_reached_by_tab_with_a_focus_ring_and_dark_mode_passes_axe(page: Page, live_server: str):
    page.emulate_media(color_scheme="dark")
    page.goto(live_server + "/plan?size=gpt2-small&gpus=16&mesh=2x8&cpu_offload=on&mixed_precision=on")
    assert audit(page) == []
    wanted = page.evaluate("""() => [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, [tabindex]')]
        .filter(e => e.checkVisibility() && !e.disabled && e.tabIndex >= 0).map(e => e.outerHTML.slice(0, 80))""")
    reached, no_ring = set(), []
    for _ in range(len(wanted) + 3):
        page.keyboard.press("Tab")
        html, style, width = page.evaluate("""() => { const e = document.activeElement, s = getComputedStyle(e);
            return [e.outerHTML.slice(0, 80), s.outlineStyle, parseFloat(s.outlineWidth)]; }""")
        reached.add(html)
        if not html.startswith("<body") and (style == "none" or width < 2):
            no_ring.append(html)
    assert [html for html in wanted if html not in reached] == []
    assert no_ring == []


class TestAFullDisk(DatabaseOnSmallDisk):
    """The simulation (a fake) fills the database's 4 MiB tmpfs before it answers."""

    @pytest.fixture
    def app_config(self, app_config: dict, small_disk) -> dict:
        return {**app_config, "PLAN_SIMULATION_COMMAND": filling_first(app_config["PLAN_SIMULATION_COMMAND"], small_disk)}

    def test_a_simulation_waiting_for_space_says_so_and_shows_once_stored(self, page: Page, live_server: str, worker,
                                                                          small_disk):
        page.goto(live_server + "/plan?size=gpt2-small&gpus=8&micro_batch=2&seq=512&strategy=zero3")
        page.get_by_role("button", name="Simulate (exact, FSDP2)").click()
        expect(page.locator("#simulation-status")).to_have_text(
            "Simulation #1 finished, but the database has not taken its result yet (database or disk is full: the "
            "disk that holds the database is full: free space on it, then try again); it is stored as soon as it does.",
            timeout=30_000)
        (small_disk / "filler").unlink()
        expect(page.locator("#simulated-zero3-total")).to_contain_text("1.02 kB", timeout=20_000)


def test_simulate_keeps_focus_on_the_status_line_and_only_that_line_is_live(page: Page, live_server: str, worker):
    # The button was disabled while it had focus, and the whole answer was one polite live region.
    page.goto(live_server + "/plan?size=gpt2-small&gpus=8&micro_batch=2&seq=512&strategy=zero3")
    assert page.evaluate("[...document.querySelectorAll('[aria-live]')].map(e => e.id)") == ["simulation-status"]
    page.get_by_role("button", name="Simulate (exact, FSDP2)").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#simulation-status")).to_be_focused()
    expect(page.locator("#simulated-table")).to_be_visible(timeout=60_000)
    status = page.locator("#simulation-status")
    expect(status).to_have_text(re.compile(r"Simulation #1 done in \d+\.\d s\."))
    expect(status).to_be_focused()
    assert page.evaluate("[...document.querySelectorAll('[aria-live]')].map(e => e.id)") == ["simulation-status"]
    page.keyboard.press("Shift+Tab")
    expect(page.get_by_role("button", name="Simulate again (exact, FSDP2)")).to_be_focused()


def test_a_form_error_moves_focus_to_the_error_summary(page: Page, live_server: str):
    # Focus stayed on <body>, above the summary of what to correct.
    page.goto(live_server + "/plan?size=gpt2-small&gpus=8&strategy=zero3")
    page.get_by_label("GPUs", exact=True).fill("-3")
    page.get_by_label("GPUs", exact=True).press("Enter")
    summary = page.locator("#plan-errors")
    expect(summary).to_be_focused()
    expect(summary).to_have_accessible_name("Please correct this field")
    expect(summary).to_contain_text("GPUs must be a whole number from 1 to 131,072, got '-3'")
    page.keyboard.press("Tab")  # on to the link to the field
    expect(summary.get_by_role("link", name="GPUs", exact=True)).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_label("GPUs", exact=True)).to_be_focused()
