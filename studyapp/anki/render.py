"""A bank question as an Anki note: its fields as HTML (the bank's text escaped), its tags, its GUID.

Pure: the question, and its lab's latest result (the JSON of `sharding-lab run LAB --json`) for
the back's finding. `NoteContent.content_hash` is what the manifest compares to decide whether a
note changed.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import genanki

from sharding_lab.catalog import lab_info
from sharding_lab.labs.evaluate import measured_where
from studyapp.anki.note_type import FIELDS
from studyapp.bank import Deck, Question

LabResult = Mapping[str, Any]  # the JSON of `sharding-lab run LAB --json`
LabResults = Mapping[str, Mapping[str, Any] | None]  # lab id -> its latest result, None: not run


@dataclass(frozen=True)
class NoteContent:
    """One question as Anki will store it: fields are HTML with the bank's text escaped."""

    question_id: str
    deck_id: str
    guid: str
    fields: tuple[str, ...]  # in note_type.FIELDS order
    tags: tuple[str, ...]

    def content_hash(self) -> str:
        """A digest of what a re-import would overwrite in the learner's note."""
        # Unit and record separators cannot occur in the fields: escape_text drops them (Anki joins fields with \x1f).
        text = "\x1f".join(self.fields) + "\x1e" + "\x1f".join(self.tags)
        return hashlib.sha256(text.encode()).hexdigest()


# Control characters other than tab and newline: not text in HTML, and Anki joins a note's fields
# with \x1f, so one in a field splits it and Anki refuses the whole package ("note has 12 fields").
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def escape_text(value: str) -> str:
    # Quotes stay as typed: fields are element content; the two the templates put in attributes
    # (QuestionId, AnswerNumber) are a slug and a number.
    return html.escape(CONTROL_CHARACTERS.sub("", value), quote=False).replace("\n", "<br>")


def render_lab_result(result: LabResult | None) -> str:
    """The back's lab finding: whether the claim held, the finding with its numbers, and where
    it was measured (device and GPU, world size, backend, torch and CUDA versions, model size)."""
    if not result:
        return (
            '<p class="mc-lab-pending">Not run yet: run the command above (or "Run this lab" '
            "in the study app) to measure it.</p>"
        )
    # Read field by field, as the pages do (findings.ShownResult): only a JSON true or false is a
    # verdict (a dict lookup would read 1 as True), and only text is a finding.
    holds = result.get("holds")
    verdict = "<b>The claim held.</b> " if holds is True else "<b>The claim did not hold.</b> " if holds is False else ""
    finding, at_scale = (value if isinstance(value, str) else "" for value in (result.get("finding"), result.get("at_scale")))
    parts = [f'<p class="mc-lab-finding">{verdict}{escape_text(finding)}</p>']
    if at_scale:
        parts.append(f'<p class="mc-lab-at-scale">{escape_text(at_scale)}</p>')
    where = measured_where(result)
    if where:
        parts.append(f'<p class="mc-lab-where">Measured on {escape_text(", ".join(where))}.</p>')
    return "".join(parts)


def lab_fields(lab_id: str, lab_result: LabResult | None) -> tuple[str, str, str, str]:
    """LabTitle, LabClaim, LabCommand and LabResult: the same for every question of a lab."""
    lab = lab_info(lab_id)
    if lab is None:  # an unknown lab is the bank validator's to refuse; still show what we can
        return escape_text(lab_id), "", escape_text(f"sharding-lab run {lab_id}"), render_lab_result(lab_result)
    return escape_text(lab.title), escape_text(lab.claim), escape_text(lab.command), render_lab_result(lab_result)


def render_note(question: Question, lab_result: LabResult | None = None, lab: tuple[str, ...] | None = None) -> NoteContent:
    """The note for one question, its lab's latest result (None: not run yet) on the back.

    `lab` passes `lab_fields(...)` already rendered, to share them between a lab's questions.
    """
    choices = [escape_text(text) for text in question.choices]
    listed = "".join([f'<li data-choice="{n}">{text}</li>' for n, text in enumerate(choices, 1)])
    reasons = "".join(
        [
            f'<li data-choice="{n}"><i>{choices[n - 1]}</i>: {escape_text(reason)}</li>'
            for n, reason in enumerate(question.why_wrong, 1)
            if n - 1 != question.answer
        ]
    )
    fields = (
        escape_text(question.prompt),
        f'<ol class="mc-choices">{listed}</ol>',
        choices[question.answer],
        str(question.answer + 1),
        escape_text(question.explanation),
        f'<ul class="mc-why-wrong">{reasons}</ul>' if reasons else "",
        *(lab or lab_fields(question.lab, lab_result)),
        question.id,  # a slug: nothing to escape
    )
    assert len(fields) == len(FIELDS)
    tags = tuple(dict.fromkeys((question.deck_id, *question.tags, question.lab)))  # ordered, no repeats
    return NoteContent(question.id, question.deck_id, genanki.guid_for(question.id), fields, tags)


def render_decks(decks: Iterable[Deck], lab_results: LabResults) -> dict[str, list[NoteContent]]:
    """Every question of every deck as a note, keyed by deck id, in bank order."""
    decks = list(decks)
    labs = {q.lab: lab_fields(q.lab, lab_results.get(q.lab)) for deck in decks for q in deck.questions}
    return {deck.id: [render_note(q, lab=labs[q.lab]) for q in deck.questions] for deck in decks}
