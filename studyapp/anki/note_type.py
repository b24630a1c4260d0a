"""The Anki note type for the bank's multiple-choice questions: fields, templates, CSS and JS.

Anki has no multiple-choice note type, so this one brings its own. The front shows the
prompt and the choices; a small script shuffles them and lets the learner tap one. The back
marks the correct choice and the chosen one, then gives the answer, the explanation, why
each distractor is wrong and the card's lab.

Constraints the templates are written for:
- Anki desktop, AnkiDroid and AnkiWeb: plain ES5, no external assets, no add-ons.
- Anki desktop keeps one page across cards and sides and re-runs the template's scripts on
  every render, so the script is one IIFE (a top-level `const` would throw the second time)
  and attaches listeners only to the elements it was rendered with.
- The chosen choice must reach the back. Desktop and AnkiWeb keep `window` between sides,
  AnkiDroid may reload the page but keeps `sessionStorage`: the state goes to both and is
  read from whichever still has it, keyed by the question id so another card's is ignored.
  With neither, the back still marks the correct choice, only not the chosen one.
- Without JavaScript the front is a plain numbered list and the back names the answer in words.
- The back does not include `{{FrontSide}}`: on a page that is reloaded per side, the front's
  inline script would run before the back's markup exists.
- Field names are Anki's "schema": renaming, adding or removing one makes Anki import the
  note type as a new one and refuse updates to existing notes. Change templates and CSS freely
  (the manifest gives the changed note type a newer mtime, so Anki updates it in place).
"""

from __future__ import annotations

import hashlib
import json

import genanki

# Generated once, fixed forever: a new id would make Anki create a second note type.
NOTE_TYPE_ID = 1_607_392_417
NOTE_TYPE_NAME = "Sharding study: multiple choice"

FIELDS: tuple[str, ...] = (
    "Question",  # first field: Anki sorts and checks duplicates by it
    "Choices",  # <ol class="mc-choices"> in the bank's order; the script shuffles it
    "Answer",  # the correct choice's text, for the back without JavaScript
    "AnswerNumber",  # 1-based position of the correct choice in Choices
    "Explanation",
    "WhyWrong",  # <ul> of "distractor: reason"
    "LabTitle",
    "LabClaim",
    "LabCommand",
    "LabResult",  # the latest finding and where it was measured, or "not run yet"
    "QuestionId",  # the bank's stable id; also keys the chosen-choice state between sides
)

# One script for both sides: `data-side` on the card says which it is rendering.
# Kept free of double braces, which Anki would read as a field reference.
SCRIPT = r"""
<script>
(function () {
  var card = document.getElementById("mc-card");
  if (!card || card.getAttribute("data-mc-ready")) { return; }
  card.setAttribute("data-mc-ready", "1");
  var qid = card.getAttribute("data-qid");
  var list = card.querySelector(".mc-choices");
  if (!list) { return; }
  var items = [];
  for (var i = 0; i < list.children.length; i++) { items.push(list.children[i]); }
  var KEY = "sharding-study-mc";

  function usable(s) {
    return s && s.qid === qid && s.order && s.order.length === items.length ? s : null;
  }
  function load() {
    var s = usable(window.shardingStudyMc);
    if (!s) {
      try { s = usable(JSON.parse(window.sessionStorage.getItem(KEY))); } catch (e) { s = null; }
    }
    return s;
  }
  function save(s) {
    window.shardingStudyMc = s;
    try { window.sessionStorage.setItem(KEY, JSON.stringify(s)); } catch (e) { /* storage off */ }
  }
  function addClass(el, name) { el.className = (el.className + " " + name).replace(/^ /, ""); }
  function reorder(order) {
    for (var k = 0; k < order.length; k++) { list.appendChild(items[order[k]]); }
  }

  addClass(card, "mc-js");
  if (card.getAttribute("data-side") === "front") {
    var order = [];
    for (var j = 0; j < items.length; j++) { order.push(j); }
    for (var n = order.length - 1; n > 0; n--) {
      var r = Math.floor(Math.random() * (n + 1));
      var t = order[n]; order[n] = order[r]; order[r] = t;
    }
    var state = { qid: qid, order: order, chosen: null };
    save(state);
    reorder(order);
    list.setAttribute("role", "radiogroup");
    var choose = function (index) {
      state.chosen = index;
      save(state);
      for (var m = 0; m < items.length; m++) {
        items[m].className = items[m].className.replace(/ ?mc-chosen/g, "");
        items[m].setAttribute("aria-checked", m === index ? "true" : "false");
      }
      addClass(items[index], "mc-chosen");
    };
    for (var c = 0; c < items.length; c++) {
      items[c].setAttribute("role", "radio");
      items[c].setAttribute("tabindex", "0");
      items[c].onclick = (function (index) { return function () { choose(index); }; })(c);
      items[c].onkeydown = (function (index) {
        return function (event) {
          if (event.key === "Enter" || event.key === " ") { event.preventDefault(); choose(index); }
        };
      })(c);
    }
    return;
  }

  var answer = parseInt(card.getAttribute("data-answer"), 10) - 1;
  var saved = load();
  if (saved) { reorder(saved.order); }
  if (items[answer]) { addClass(items[answer], "mc-correct"); }
  var verdict = document.getElementById("mc-verdict");
  if (saved && saved.chosen !== null && items[saved.chosen]) {
    addClass(items[saved.chosen], "mc-chosen");
    var right = saved.chosen === answer;
    if (verdict) {
      verdict.textContent = right ? "Right." : "Not quite: your choice is marked, the correct one is green.";
      addClass(verdict, right ? "mc-right" : "mc-wrong");
    }
    var reasons = card.querySelectorAll(".mc-why-wrong li");
    for (var w = 0; w < reasons.length; w++) {
      if (parseInt(reasons[w].getAttribute("data-choice"), 10) - 1 === saved.chosen) {
        addClass(reasons[w], "mc-chosen");
      }
    }
  }
})();
</script>
"""

FRONT = (
    '<div class="mc" id="mc-card" data-side="front" data-qid="{{QuestionId}}">\n'
    '<div class="mc-prompt">{{Question}}</div>\n'
    "{{Choices}}\n"
    '<p class="mc-hint">Pick one, then show the answer.</p>\n'
    "</div>\n" + SCRIPT
)

BACK = (
    '<div class="mc" id="mc-card" data-side="back" data-qid="{{QuestionId}}" data-answer="{{AnswerNumber}}">\n'
    '<div class="mc-prompt">{{Question}}</div>\n'
    "{{Choices}}\n"
    '<p class="mc-verdict" id="mc-verdict"></p>\n'
    "<hr id=answer>\n"
    '<div class="mc-answer"><span class="mc-label">Answer:</span> {{Answer}}</div>\n'
    '<div class="mc-explanation">{{Explanation}}</div>\n'
    "{{#WhyWrong}}<div class=\"mc-section\"><span class=\"mc-label\">Why not the others</span>{{WhyWrong}}</div>{{/WhyWrong}}\n"
    '<div class="mc-lab">\n'
    '<div class="mc-label">Lab: {{LabTitle}}</div>\n'
    '<div class="mc-lab-claim">{{LabClaim}}</div>\n'
    '<div class="mc-lab-run">Run it: <code>{{LabCommand}}</code></div>\n'
    '<div class="mc-lab-result">{{LabResult}}</div>\n'
    "</div>\n"
    '<div class="mc-id">{{QuestionId}}</div>\n'
    "</div>\n" + SCRIPT
)

CSS = """
.card { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; font-size: 18px;
  line-height: 1.45; color: #1d1d1f; background: #fff; text-align: left; }
/* Night mode: Anki desktop and AnkiWeb add .nightMode, AnkiDroid .night_mode. */
.card.nightMode, .card.night_mode, .nightMode .card, .night_mode .card { color: #e8e8e8; background: #1e1e1e; }
.mc { max-width: 44em; margin: 0 auto; padding: 0 0.5em; }
.mc-prompt { font-weight: 600; margin: 0.4em 0 0.8em; }
.mc-choices { padding-left: 1.6em; }
.mc-choices li { margin: 0.35em 0; padding: 0.35em 0.5em; border: 1px solid transparent; border-radius: 6px; }
.mc-js .mc-choices li { border-color: #c8c8cc; }
.mc-js[data-side="front"] .mc-choices li { cursor: pointer; }
.mc-choices li.mc-chosen { border-color: #3478f6; background: rgba(52, 120, 246, 0.12); }
.mc-choices li.mc-correct { border-color: #2e9b47; background: rgba(46, 155, 71, 0.16); }
.mc[data-side="back"] .mc-choices li.mc-chosen:not(.mc-correct) { border-color: #d93b3b; background: rgba(217, 59, 59, 0.14); }
.mc-hint { display: none; font-size: 0.8em; opacity: 0.7; }
.mc-js .mc-hint { display: block; }
.mc-verdict.mc-right { color: #2e9b47; font-weight: 600; }
.mc-verdict.mc-wrong { color: #d93b3b; font-weight: 600; }
.mc-label { font-weight: 600; }
.mc-answer, .mc-explanation, .mc-section, .mc-lab { margin: 0.7em 0; }
.mc-why-wrong { margin: 0.3em 0; padding-left: 1.2em; font-size: 0.92em; }
.mc-why-wrong li.mc-chosen { font-weight: 600; }
.mc-lab { padding: 0.6em 0.8em; border-left: 4px solid #3478f6; background: rgba(52, 120, 246, 0.07);
  font-size: 0.92em; }
.mc-lab code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.95em; }
.mc-lab-result p { margin: 0.3em 0; }
.mc-lab-where, .mc-lab-pending, .mc-id { font-size: 0.85em; opacity: 0.75; }
"""


class _StampedModel(genanki.Model):
    """A genanki model with its own modification time instead of the package's timestamp."""

    def __init__(self, mod: int, **kwargs):
        super().__init__(**kwargs)
        self.mod = mod

    def to_json(self, timestamp: float, deck_id: int) -> dict:
        return super().to_json(self.mod, deck_id)


def _definition() -> dict:
    return {"name": NOTE_TYPE_NAME, "fields": list(FIELDS), "front": FRONT, "back": BACK, "css": CSS}


def note_type_hash() -> str:
    """A digest of everything Anki stores for the note type, to tell when it changed."""
    return hashlib.sha256(json.dumps(_definition(), sort_keys=True).encode()).hexdigest()


def note_type(mod: int) -> genanki.Model:
    """The note type, stamped `mod` (Anki updates its copy only when this is newer)."""
    return _StampedModel(
        mod,
        model_id=NOTE_TYPE_ID,
        name=NOTE_TYPE_NAME,
        fields=[{"name": name} for name in FIELDS],
        templates=[{"name": "Multiple choice", "qfmt": FRONT, "afmt": BACK}],
        css=CSS,
        sort_field_index=0,
    )
