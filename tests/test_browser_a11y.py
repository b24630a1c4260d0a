"""Every page in a real Chromium: an axe-core audit in light and dark, keyboard reach with a
visible focus ring, the night-mode toggle, charts with text alternatives, and phone width.

axe-core is vendored (tests/data/axe.min.js, MPL-2.0, its licence header kept), so nothing is
fetched at run time. It is evaluated through the DevTools protocol, which the page's
Content-Security-Policy does not govern; the app itself serves no inline script or style.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import ALPHA_DECK, BETA_DECK, REPO, with_committed_lab_results, write_bank
from playwright.sync_api import Page, expect
from review_driver import drive_reviews
from sqlmodel import Session

from studyapp.db import get_engine
from studyapp.lab_runs import enqueue
from studyapp.models import LabRun, RunStatus

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AXE = Path(__file__).parent / "data" / "axe.min.js"
BLOCKING = ("serious", "critical")
PHONE = {"width": 390, "height": 844}
PAGES = [
    "/", "/study", "/decks/alpha", "/questions/alpha-shards", "/labs", "/labs/what-fsdp-shards",
    "/labs/adam-optimizer-state", "/stats", "/stats/tags/fsdp", "/no-such-page",
]


@pytest.fixture
def app_config(app_config: dict, tmp_path: Path) -> dict:
    """The committed lab results as the reference, as on a fresh install."""
    return with_committed_lab_results(app_config, tmp_path)


@pytest.fixture
def reviewed(app, client, clock) -> None:
    """A fortnight of reviews (with undos), so the stats and topics have something to draw."""
    drive_reviews(client, clock, days=14, seed=3)


def audit(page: Page) -> list[str]:
    """The serious and critical axe violations on the page, one line each."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text(encoding="utf-8") + "\n;0")
    violations = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in violations
        if v["impact"] in BLOCKING
    ]


def no_horizontal_scroll(page: Page) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"{page.url} scrolls sideways at {width[1]} px: {width[0]} px wide"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_page_passes_axe_in_both_themes(page: Page, live_server: str, reviewed, scheme: str):
    page.emulate_media(color_scheme=scheme)
    problems = {}
    for path in PAGES:
        page.goto(live_server + path)
        assert page.evaluate("getComputedStyle(document.documentElement).colorScheme") == scheme
        if found := audit(page):
            problems[path] = found
    # The answer view and the done page are reached by answering.
    page.goto(live_server + "/study")
    page.locator("input[name=choice]").first.check()
    page.get_by_role("button", name="Check answer").click()
    expect(page.locator(".verdict")).to_be_visible()
    if found := audit(page):
        problems["answer view"] = found
    assert problems == {}


def test_every_page_loads_everything_it_asks_for_its_icon_included(page: Page, live_server: str, reviewed):
    # Chromium asked for /favicon.ico on every page, a 404 and a console error each time.
    failed: list[str] = []
    page.on("response", lambda response: failed.append(f"{response.status} {response.url}")
            if response.status >= 400 and not response.url.endswith("/no-such-page") else None)
    with page.expect_response(lambda response: response.url.endswith("/static/favicon.svg"), timeout=10_000) as icon:
        page.goto(live_server + "/")
    assert icon.value.status == 200 and icon.value.headers["content-type"].startswith("image/svg+xml")
    for path in PAGES:
        page.goto(live_server + path)
        page.wait_for_load_state("networkidle")
    assert failed == []


def test_every_interactive_element_is_reached_by_tab_with_a_visible_focus_ring(page: Page, live_server: str, reviewed):
    for path in ["/", "/study", "/questions/alpha-shards", "/labs/what-fsdp-shards", "/stats"]:
        page.goto(live_server + path)
        # Radio buttons of one group are one tab stop (arrow keys move within it).
        wanted = page.evaluate("""() => {
            const all = [...document.querySelectorAll('a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]')]
                .filter(e => e.checkVisibility() && !e.disabled && e.tabIndex >= 0);
            const seen = new Set();
            return all.filter(e => {
                if (e.type !== 'radio') return true;
                if (seen.has(e.name)) return false;
                seen.add(e.name); return true;
            }).map(e => e.outerHTML.slice(0, 80));
        }""")
        reached, rings = set(), []
        for _ in range(len(wanted) + 3):
            page.keyboard.press("Tab")
            focused = page.evaluate("""() => {
                const e = document.activeElement, s = getComputedStyle(e);
                const html = e.type === 'radio' ? document.querySelector(`input[name="${e.name}"]`).outerHTML : e.outerHTML;
                return [html.slice(0, 80), s.outlineStyle, parseFloat(s.outlineWidth)];
            }""")
            if focused[0].startswith("<body"):
                continue
            reached.add(focused[0])
            rings.append(focused)
        missing = [html for html in wanted if html not in reached]
        assert missing == [], f"{path}: not reachable by Tab: {missing}"
        no_ring = [html for html, style, width in rings if style == "none" or width < 2]
        assert no_ring == [], f"{path}: focus not visible on {no_ring}"


def test_night_mode_follows_the_system_and_the_toggle_is_remembered(page: Page, live_server: str):
    page.emulate_media(color_scheme="light")
    page.goto(live_server + "/stats")
    background = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    toggle = page.get_by_role("button", name="Dark mode")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    dark = page.evaluate(background)
    assert dark != light
    bar = page.locator("svg.chart .axis").first  # the charts take the theme's colours
    assert bar.evaluate("e => getComputedStyle(e).stroke") != "rgb(0, 0, 0)"
    page.goto(live_server + "/")  # remembered on the next page, whatever the system says
    assert page.evaluate(background) == dark
    expect(page.get_by_role("button", name="Dark mode")).to_have_attribute("aria-pressed", "true")
    page.get_by_role("button", name="Dark mode").click()
    page.emulate_media(color_scheme="dark")
    page.reload()
    assert page.evaluate(background) == light  # the learner's pick beats the system's


def test_every_chart_has_a_title_and_a_text_alternative(page: Page, live_server: str, reviewed):
    page.goto(live_server + "/stats")
    charts = page.locator("svg.chart")
    assert charts.count() >= 8
    for i in range(charts.count()):
        chart = charts.nth(i)
        label = chart.get_attribute("aria-label")
        assert label and chart.get_attribute("role") == "img"
        assert chart.locator("title").first.text_content() == label
        table = chart.locator("xpath=ancestor::figure//details//table")
        expect(table).to_have_count(1)
        assert table.locator("tbody tr").count() >= 1


def test_the_review_flow_stats_and_a_lab_fit_a_phone(page: Page, live_server: str, reviewed, app):
    page.set_viewport_size(PHONE)
    page.goto(live_server + "/")
    no_horizontal_scroll(page)
    page.get_by_role("link", name="Study all decks").click()
    for _ in range(3):
        if page.locator("h1", has_text="Done for today").count():
            break
        no_horizontal_scroll(page)
        page.locator("ol.choices label").first.click()
        with page.expect_navigation():  # measured on the next page, never on one that is leaving
            page.get_by_role("button", name="Check answer").click()
        no_horizontal_scroll(page)
        with page.expect_navigation():
            page.locator("button.grade").first.click()
    no_horizontal_scroll(page)
    for path in ["/stats", "/labs", "/labs/what-fsdp-shards", "/questions/alpha-shards", "/stats/tags/fsdp"]:
        page.goto(live_server + path)
        no_horizontal_scroll(page)


# Every page that shows a table, with the tables inside closed <details> opened (the stats figures).
TABLE_PAGES = ["/", "/decks/alpha", "/questions/alpha-shards", "/labs/what-fsdp-shards", "/stats", "/stats/tags/fsdp", "/plan"]
# The words of the visible table cells that are laid out over more than one line. A word is a run of
# characters between spaces or hyphens (a break after a hyphen is a word boundary); it is split when
# its text's line boxes (a Range's client rects) sit at more than one height.
SPLIT_WORDS = """() => {
    document.querySelectorAll('details').forEach(d => { d.open = true; });
    const split = [];
    for (const cell of document.querySelectorAll('th, td')) {
        if (!cell.checkVisibility()) continue;
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (const word of node.data.matchAll(/[^\\s-]+/g)) {
                const range = document.createRange();
                range.setStart(node, word.index);
                range.setEnd(node, word.index + word[0].length);
                const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
                if (lines.size > 1) split.push(word[0]);
            }
        }
    }
    return split;
}"""


def split_words(page: Page) -> list[str]:
    return page.evaluate(SPLIT_WORDS)


@pytest.mark.parametrize("width", [375, 1280])
def test_no_table_breaks_a_word_and_no_page_scrolls_sideways(page: Page, live_server: str, app, reviewed, width: int):
    # At 375 px "Repeats", "new" and "communication" were broken a letter or two a line.
    enqueue(get_engine(app), "what-fsdp-shards", 4, "cpu")  # a past run, for the lab page's table of them
    page.set_viewport_size({"width": width, "height": 812})
    split = {}
    for path in TABLE_PAGES:
        page.goto(live_server + path)
        assert page.locator("table").count() >= 1, f"{path} shows no table to check"
        assert not path.startswith("/labs/") or page.locator("table.runs").count() == 1, "no past runs shown"
        no_horizontal_scroll(page)
        if words := split_words(page):
            split[path] = words
    assert split == {}


def test_on_a_phone_each_decks_study_button_is_in_view(page: Page, live_server: str):
    # Once the decks table scrolled in its own region at 375 px, Study sat last, past its right edge.
    page.set_viewport_size({"width": 375, "height": 812})
    page.goto(live_server + "/")
    buttons = page.locator("table.decks a.button")
    assert buttons.count() == 2  # the test bank's decks
    for i in range(buttons.count()):
        box = buttons.nth(i).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, buttons.nth(i).inner_text()


def test_the_split_word_check_reports_what_it_should(page: Page):
    """The check is live: a word forced to break in a narrow cell is found; words wrapped between them are not."""
    page.set_content('<table style="width: 60px"><tr><td style="overflow-wrap: anywhere">gradients</td>'
                     '<td>new words</td></tr></table>')
    assert split_words(page) == ["gradients"]


def test_the_audit_reports_what_it_should(page: Page):
    """The audit is live: a page with an unlabelled image and a nameless button fails it."""
    page.set_content('<html lang="en"><body><main><img src="x.png"><button></button></main></body></html>')
    found = audit(page)
    assert any(line.startswith("image-alt") for line in found) and any(line.startswith("button-name") for line in found)


def audit_rules(page: Page, rules: list[str]) -> list[str]:
    """The violations of just these axe rules, whatever their impact (audit() keeps serious and critical)."""
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text(encoding="utf-8") + "\n;0")
    violations = page.evaluate("async (rules) => (await axe.run(document, {runOnly: {type: 'rule', values: rules}, "
                               "resultTypes: ['violations']})).violations", rules)
    return [f"{v['id']}: {v['help']} at {[n['target'] for n in v['nodes']][:3]}" for v in violations]


def test_each_study_link_names_its_deck_and_the_decks_table_has_every_header(page: Page, live_server: str):
    # The links were "Study 1" and "Study 2", under an empty <th>, beside a deck name in a plain <td>.
    page.goto(live_server + "/")
    table = page.locator("table.decks")
    expect(table.get_by_role("link", name="Study Alpha deck", exact=True)).to_have_attribute("href", "/study?deck=alpha")
    expect(table.get_by_role("link", name="Study Beta deck", exact=True)).to_have_attribute("href", "/study?deck=beta")
    expect(table.get_by_role("rowheader")).to_have_text(["Alpha deck", "Beta deck"])
    expect(table.get_by_role("columnheader")).to_have_text(["Deck", "Study", "Due", "Repeats", "New", "Learned", "Anki"])
    assert audit_rules(page, ["empty-table-header", "th-has-data-cells", "td-has-header"]) == []
    page.keyboard.press("2")  # the key still studies the second deck
    expect(page).to_have_url(live_server + "/study?deck=beta")


ADAM = "Adam's optimizer state against the model"  # the lab's title in the catalogue


def test_links_to_a_labs_run_form_say_so_and_name_the_lab(page: Page, live_server: str):
    # Every one of them was "Run it here", and the card's "Run this lab →" only opens the lab's page.
    page.goto(live_server + "/labs")
    items = page.locator("ul.labs > li", has_text="committed reference")
    assert items.count() >= 20  # a fresh install: every lab has its committed reference
    for i in range(items.count()):
        item = items.nth(i)
        lab = item.get_by_role("link").first
        title, href = lab.inner_text(), lab.get_attribute("href")
        expect(item.get_by_role("link", name=f"Run it here (goes to the form that runs “{title}”)", exact=True)
               ).to_have_attribute("href", href + "#run-lab")

    page.goto(live_server + "/labs/adam-optimizer-state")  # not run here: two links up to the form
    expect(page.locator("#lab-results").get_by_role(
        "link", name=f"Run it here (goes to the form above that runs “{ADAM}”)", exact=True)).to_have_count(2)
    expect(page.get_by_role("link", name="Run it here", exact=True)).to_have_count(0)

    page.goto(live_server + "/questions/beta-adam")
    lab_box = page.locator("section.lab")
    expect(lab_box.get_by_role("link", name=f"Run it here (goes to the form that runs “{ADAM}”)", exact=True)
           ).to_have_attribute("href", "/labs/adam-optimizer-state#run-lab")
    expect(lab_box.get_by_role("link", name=f"Run this lab (opens the page of “{ADAM}”)", exact=True)
           ).to_have_attribute("href", "/labs/adam-optimizer-state")


class TestADeckAndItsTagOfTheSameName:
    """Every card of the beta deck tagged beta, as every card of the real bank's beyond deck is tagged beyond."""

    @pytest.fixture
    def bank_dir(self, tmp_path: Path) -> Path:
        return write_bank(tmp_path / "bank", {"alpha": ALPHA_DECK, "beta": BETA_DECK.replace("tags: [zero]", "tags: [beta]")})

    def test_the_mastery_table_names_the_deck_link_apart_from_the_tag_link(self, page: Page, live_server: str):
        # Both links were named "beta".
        page.goto(live_server + "/stats")
        row = page.locator('tr[data-topic="deck:beta"]')
        expect(row).to_contain_text("every card tagged beta")
        expect(row.get_by_role("link", name="Deck beta", exact=True)).to_have_attribute("href", "/decks/beta")
        expect(row.get_by_role("link", name="beta", exact=True)).to_have_attribute("href", "/stats/tags/beta")


def local_run(app, lab_id: str, charts: dict[str, str]) -> None:
    """A finished local run of `lab_id`: the committed reference's result, with these charts."""
    reference = json.loads((REPO / "exports" / "lab-results.json").read_text(encoding="utf-8"))[lab_id]
    moment = datetime(2026, 3, 1, 9, 30, tzinfo=timezone.utc)
    with Session(get_engine(app)) as session:
        session.add(LabRun(lab_id=lab_id, params={"world_size": 2}, status=RunStatus.done,
                           result={**reference, "charts": charts}, created_at=moment, started_at=moment, finished_at=moment))
        session.commit()


# A chart as sharding_lab.svg draws one: the chart's <title>, then a <title> on each mark, shown on hover.
CHART = ("<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 200 80' width='200' height='80' role='img' "
         "aria-label='Model states per rank'><title>Model states per rank</title>"
         "<rect x='10' y='10' width='60' height='20' fill='#0072B2'><title>ddp: params 939 KiB</title></rect>"
         "<rect x='70' y='10' width='60' height='20' fill='#E69F00'><title>ddp: grads 939 KiB</title></rect>"
         "<rect x='10' y='40' width='30' height='20' fill='#0072B2'><title>zero3: params 470 KiB</title></rect>"
         "<text x='140' y='25'>1.8 MiB</text></svg>")


def test_after_a_local_run_the_latest_and_the_reference_tables_are_named_apart(page: Page, live_server: str, app):
    # Both regions were named "Adam's optimizer state against the model table" (axe landmark-unique).
    local_run(app, "adam-optimizer-state", {"model_states": CHART})
    page.goto(live_server + "/labs/adam-optimizer-state")
    expect(page.get_by_role("region", name=f"{ADAM} table, latest run", exact=True)).to_have_count(1)
    expect(page.get_by_role("region", name=f"{ADAM} table, committed reference", exact=True)).to_have_count(1)
    assert audit_rules(page, ["landmark-unique"]) == []


def test_a_lab_chart_gives_the_figures_of_its_hover_titles_as_text(page: Page, live_server: str, app):
    # Its figures were only in the <title>s a mouse pointer shows.
    local_run(app, "adam-optimizer-state", {"model_states": CHART})
    page.goto(live_server + "/labs/adam-optimizer-state")
    figure = page.locator("figure.lab-chart")
    expect(figure.get_by_role("img", name="Model states per rank")).to_be_visible()
    details = figure.locator("details")
    expect(details.locator("summary")).to_have_text("Model states per rank: the figures as a list")
    details.locator("summary").click()
    expect(details.locator("li")).to_have_text(["ddp: params 939 KiB", "ddp: grads 939 KiB", "zero3: params 470 KiB"])
    assert audit(page) == []
