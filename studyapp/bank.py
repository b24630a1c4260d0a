"""The question bank: one YAML file per deck in bank/, loaded and validated as a whole.

A deck file looks like this (every key shown; `retired_ids`, `description` and `order` are optional):

    id: fsdp
    title: Fully Sharded Data Parallel
    description: ...
    retired_ids: []          # question ids once used and removed: never to be reused
    order: 1                 # decks are listed by it (default 0), then by file name
    questions:
      - id: fsdp-what-is-sharded
        prompt: What does FSDP shard ...?
        choices:             # 2 to 9, exactly one correct
          - text: Parameters, gradients, and optimizer states
            correct: true
          - text: Only the input batches
            why_wrong: Batches are split under any data parallelism ...
        explanation: ...
        lab: what-fsdp-shards
        tags: [fsdp, memory]

Validation refuses the whole bank when anything is wrong, naming file, line, question id
and field for each problem, so nothing is ever half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_BANK_DIR = Path(__file__).resolve().parent.parent / "bank"
# Ids and tags, matched whole (fullmatch: `$` would let a trailing newline through).
SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:.-]*")  # Anki tags cannot contain spaces; the stats pages link each one (so no `.` or `..`)
# Ids are in URLs and in the database's unique indexes: PostgreSQL's index takes at most 2704 bytes a row,
# so a longer id passed `bank check` and then failed `bank sync` there, naming neither file nor card.
MAX_ID_LENGTH = 100
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # what a `\u` escape in a double-quoted YAML string can make

DECK_KEYS = {"id", "title", "description", "retired_ids", "questions", "order"}
DECK_REQUIRED = {"id", "title", "questions"}
QUESTION_KEYS = {"id", "prompt", "choices", "explanation", "lab", "tags"}
CHOICE_KEYS = {"text", "correct", "why_wrong"}
MAX_CHOICES = 9  # a key press is one character: 1 to 9 pick a choice in the review
DECK_SUFFIXES = (".yaml", ".yml")  # in any case: Zero.YAML is a deck file


@dataclass(frozen=True)
class Question:
    id: str
    deck_id: str
    prompt: str
    choices: tuple[str, ...]
    answer: int  # index of the correct choice
    explanation: str
    why_wrong: tuple[str, ...]  # one reason per choice; "" at the correct answer
    lab: str
    tags: tuple[str, ...]
    line: int = 0  # where the question starts in its file, for error messages

    def content_hash(self) -> str:
        """A digest of everything a learner sees, to tell an edited question from an unchanged one."""
        content = asdict(self)
        content.pop("line")
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Deck:
    id: str
    title: str
    questions: tuple[Question, ...]
    description: str = ""
    retired_ids: tuple[str, ...] = ()
    path: str = ""
    line: int = 0  # where the deck's `id` is in its file, for error messages
    order: int = 0  # where the deck comes in the bank (then by file name): the seed quizzes first

    def content_hash(self) -> str:
        digest = hashlib.sha256(f"{self.id}\n{self.title}\n{self.description}".encode())
        for question in self.questions:
            digest.update(question.content_hash().encode())
        return digest.hexdigest()


@dataclass(frozen=True)
class BankProblem:
    file: str
    line: int
    question_id: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        parts = [where]
        if self.question_id:
            parts.append(f"question {self.question_id}")
        if self.field:
            parts.append(f"field '{self.field}'")
        # A surrogate in a key, id or file name is shown as its escape: printing it would crash the report.
        return f"{', '.join(parts)}: {self.message}".encode("utf-8", "backslashreplace").decode("utf-8")


class BankError(ValueError):
    """The bank was refused; `problems` lists every reason, each naming file, line and field."""

    def __init__(self, problems: list[BankProblem]):
        self.problems = problems
        super().__init__("the question bank was refused:\n" + "\n".join(f"  {p}" for p in problems))


# --- YAML with line numbers -------------------------------------------------------------


class _Mapping(dict):
    """A YAML mapping that remembers the line of itself and of each key (1-based)."""

    line: int = 0
    key_lines: dict[str, int]


class _Sequence(list):
    """A YAML sequence that remembers the line of itself and of each item (1-based)."""

    line: int = 0
    item_lines: list[int]


def _yaml_kind(value: object) -> str:
    """What a YAML value is, in YAML's words (the loader's own classes are no concern of an author)."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return {bool: "true/false", int: "a number", float: "a number", str: "text"}.get(type(value), type(value).__name__)


def _shown(value: object, limit: int = 60) -> str:
    """A value quoted in a message: repr, so an invisible character shows, and cut short, so a
    value repeated by YAML aliases cannot make a message of gigabytes."""
    shown = repr(value if isinstance(value, str) else str(value))
    return shown if len(shown) <= limit else f"{shown[:limit - 4]}...{shown[-1]}"


def _surrogate_problem(value: str) -> str | None:
    """YAML reads "\\ud83d\\ude00" as two halves of a UTF-16 pair, not as one character: the check passed,
    and then the database (or any UTF-8 file) could not store the text."""
    match = _SURROGATE.search(value)
    if match is None:
        return None
    pair = value[match.start():match.start() + 2]
    try:  # a high half followed by its low half: the character they were meant to be
        whole = pair.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        whole = ""
    fix = f"write \\U{ord(whole):08X} (or the character itself)" if len(whole) == 1 else "remove it"
    return (f"holds U+{ord(match.group()):04X}, half of a UTF-16 surrogate pair, which is not a character "
            f"and cannot be stored: {fix}")


def _id_problem(value: str) -> str | None:
    if not SLUG.fullmatch(value):
        return "must be a slug: lowercase letters, digits and dashes"
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_ID_LENGTH}"
    return None


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    duplicates = []
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # SafeLoader's own mapping would merge; this one names keys by line
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                "a merge key (<<) is not read in a deck file: write its keys out", key_node.start_mark,
            )
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found an unhashable key", key_node.start_mark
            ) from None
        if key in mapping:
            duplicates.append((key, key_node.start_mark.line + 1))
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[key] = key_node.start_mark.line + 1
    mapping.duplicate_keys = duplicates
    return mapping


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> _Sequence:
    sequence = _Sequence(loader.construct_object(child, deep=True) for child in node.value)
    sequence.line = node.start_mark.line + 1
    sequence.item_lines = [child.start_mark.line + 1 for child in node.value]
    return sequence


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _item_line(sequence: list, index: int, default: int) -> int:
    lines = getattr(sequence, "item_lines", None)
    return lines[index] if lines and index < len(lines) else default


# --- Validation -------------------------------------------------------------------------


class _Checker:
    """Collects problems for one file instead of stopping at the first."""

    def __init__(self, file: str):
        self.file = file
        self.problems: list[BankProblem] = []

    def add(self, line: int, message: str, question_id: str | None = None, field: str | None = None) -> None:
        self.problems.append(BankProblem(self.file, line, question_id, field, message))

    def keys(
        self, mapping: _Mapping, allowed: set[str], required: set[str], what: str, qid: str | None, prefix: str = ""
    ) -> None:
        """Duplicate, unknown and missing keys; `prefix` names the field's parent (e.g. "choices[2].")."""
        for key, line in getattr(mapping, "duplicate_keys", []):
            self.add(line, f"duplicate key {_shown(key)} in {what}", qid, f"{prefix}{key}")
        for key in mapping:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                self.add(mapping.key_lines.get(key, mapping.line), f"unknown key {_shown(key)} in {what} (known: {known})",
                         qid, f"{prefix}{key}")
        for key in sorted(required - set(mapping)):
            self.add(mapping.line, f"missing required key '{key}' in {what}", qid, f"{prefix}{key}")

    def text(self, mapping: _Mapping, key: str, qid: str | None, field: str | None = None) -> str:
        value = mapping.get(key)
        line = mapping.key_lines.get(key, mapping.line)
        if key not in mapping:
            return ""
        if not isinstance(value, str):
            self.add(line, f"must be text, got {_yaml_kind(value)}", qid, field or key)
            return ""
        if not value.strip():
            self.add(line, "must not be empty", qid, field or key)
            return ""
        if problem := _surrogate_problem(value):
            self.add(line, problem, qid, field or key)
            return ""
        return value.strip()


def _question(raw: Any, deck_id: str, index: int, line: int, check: _Checker) -> Question | None:
    if not isinstance(raw, _Mapping):
        check.add(line, f"question #{index + 1} must be a mapping, got {_yaml_kind(raw)}", None, "questions")
        return None
    qid = raw.get("id") if isinstance(raw.get("id"), str) else None
    label = qid if qid and len(qid) <= MAX_ID_LENGTH else f"#{index + 1}"
    check.keys(raw, QUESTION_KEYS, QUESTION_KEYS - {"tags"}, "a question", label)
    if qid is not None and (problem := _id_problem(qid)):
        check.add(raw.key_lines.get("id", raw.line), problem, label, "id")
    elif "id" in raw and qid is None:
        check.add(raw.key_lines["id"], "must be text", label, "id")
    prompt = check.text(raw, "prompt", label)
    explanation = check.text(raw, "explanation", label)
    lab = check.text(raw, "lab", label)
    if lab and not SLUG.fullmatch(lab):
        check.add(raw.key_lines["lab"], f"{_shown(lab)} is not a lab slug (lowercase letters, digits and dashes)", label, "lab")

    tags: list[str] = []
    raw_tags = raw.get("tags", [])
    if not isinstance(raw_tags, list):
        check.add(raw.key_lines.get("tags", raw.line), "must be a list of tags", label, "tags")
    else:
        for tag in raw_tags:
            if not isinstance(tag, str):  # its kind, never its repr: an alias can make a list of billions
                check.add(raw.key_lines["tags"], f"a tag must be text, got {_yaml_kind(tag)}", label, "tags")
            elif not TAG.fullmatch(tag):
                check.add(raw.key_lines["tags"], f"tag {_shown(tag)} must be one word without spaces", label, "tags")
            else:
                tags.append(tag)

    choices: list[str] = []
    why_wrong: list[str] = []
    correct: list[int] = []
    raw_choices = raw.get("choices")
    choices_line = raw.key_lines.get("choices", raw.line)
    if "choices" in raw and not isinstance(raw_choices, list):
        check.add(choices_line, "must be a list of choices", label, "choices")
    elif isinstance(raw_choices, list):
        if len(raw_choices) < 2:
            check.add(choices_line, f"needs at least two choices, got {len(raw_choices)}", label, "choices")
        if len(raw_choices) > MAX_CHOICES:
            check.add(choices_line, f"has {len(raw_choices)} choices; at most {MAX_CHOICES}, "
                      f"so the keys 1 to {MAX_CHOICES} can pick each one", label, "choices")
        for number, choice in enumerate(raw_choices, start=1):
            field = f"choices[{number}]"
            if not isinstance(choice, _Mapping):
                line = _item_line(raw_choices, number - 1, choices_line)
                check.add(line, "must be a mapping with 'text' and 'correct' or 'why_wrong'", label, field)
                continue
            check.keys(choice, CHOICE_KEYS, {"text"}, f"choice {number}", label, prefix=f"{field}.")
            text = check.text(choice, "text", label, f"{field}.text")
            is_correct = choice.get("correct", False)
            unreadable = not isinstance(is_correct, bool)
            if unreadable:
                check.add(choice.key_lines["correct"], "must be true or false", label, f"{field}.correct")
                is_correct = False
            reason = ""
            if is_correct:
                correct.append(number - 1)
                if "why_wrong" in choice:
                    check.add(choice.key_lines["why_wrong"], "the correct choice cannot have a 'why_wrong'", label, f"{field}.why_wrong")
            elif "why_wrong" not in choice:
                if not unreadable:  # an unreadable `correct` may have meant true: asking for a reason would mislead
                    check.add(choice.line, "a distractor needs a one-line 'why_wrong'", label, f"{field}.why_wrong")
            else:
                reason = check.text(choice, "why_wrong", label, f"{field}.why_wrong")
                lines = reason.count("\n") + 1  # shown as one line beside its choice, in the app and on Anki's back
                if lines > 1:
                    check.add(choice.key_lines["why_wrong"], f"must be one line, got {lines} "
                              "(a folded `>` block joins its lines)", label, f"{field}.why_wrong")
            if text and text in choices:  # an empty or unreadable text was reported above
                check.add(choice.line, f"repeats the choice {_shown(text)}", label, f"{field}.text")
            choices.append(text)
            why_wrong.append(reason)
        if len(raw_choices) >= 2 and len(correct) != 1:
            found = "none" if not correct else ", ".join(str(i + 1) for i in correct)
            check.add(choices_line, f"exactly one choice must be correct; marked correct: {found}", label, "choices")

    if qid is None or len(correct) != 1:
        return None
    return Question(
        id=qid,
        deck_id=deck_id,
        prompt=prompt,
        choices=tuple(choices),
        answer=correct[0],
        explanation=explanation,
        why_wrong=tuple(why_wrong),
        lab=lab,
        tags=tuple(tags),
        line=raw.line,
    )


def parse_deck(text: str, file: str) -> tuple[Deck | None, list[BankProblem]]:
    """Parse and validate one deck file's text. Returns the deck (None when invalid) and the problems."""
    check = _Checker(file)
    try:
        raw = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.reader.ReaderError as error:  # its message names a character offset in "<unicode string>"
        line = text.count("\n", 0, error.position) + 1
        check.add(line, f"YAML syntax error: unacceptable character #x{error.character:04x}: {error.reason}")
        return None, check.problems
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = mark.line + 1 if mark else 0
        reason = getattr(error, "problem", None) or str(error)
        context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
        if context and context_mark is not None and context_mark is not mark and context_mark.line + 1 != line:
            reason += f" ({context} started at line {context_mark.line + 1})"
        check.add(line, f"YAML syntax error: {reason}", None, None)
        return None, check.problems
    except RecursionError:  # PyYAML composes nested lists and mappings recursively
        check.add(0, "the file nests lists or mappings too deeply to read", None, None)
        return None, check.problems
    if not isinstance(raw, _Mapping):
        check.add(1, f"a deck file must be a mapping with {sorted(DECK_REQUIRED)}, got {_yaml_kind(raw)}")
        return None, check.problems

    check.keys(raw, DECK_KEYS, DECK_REQUIRED, "the deck", None)
    deck_id = raw.get("id")
    if "id" in raw and (not isinstance(deck_id, str) or _id_problem(deck_id)):
        problem = _id_problem(deck_id) if isinstance(deck_id, str) else "must be a slug: lowercase letters, digits and dashes"
        check.add(raw.key_lines["id"], f"deck id {problem}", None, "id")
        deck_id = None
    title = check.text(raw, "title", None)
    description = raw.get("description", "")  # optional, so it may be empty; but `0` or `[]` is no description
    if not isinstance(description, str):
        check.add(raw.key_lines["description"], f"must be text, got {_yaml_kind(description)}", None, "description")
        description = ""
    elif problem := _surrogate_problem(description):
        check.add(raw.key_lines["description"], problem, None, "description")
        description = ""
    retired = raw.get("retired_ids", [])
    if not isinstance(retired, list) or not all(isinstance(r, str) and SLUG.fullmatch(r) for r in retired):
        check.add(raw.key_lines.get("retired_ids", raw.line), "must be a list of question ids", None, "retired_ids")
        retired = []

    raw_questions = raw.get("questions")
    questions: list[Question] = []
    if "questions" in raw and (not isinstance(raw_questions, list) or not raw_questions):
        check.add(raw.key_lines["questions"], "must be a non-empty list of questions", None, "questions")
    elif isinstance(raw_questions, list):
        first_lines: dict[str, int] = {}
        for index, raw_question in enumerate(raw_questions):
            line = _item_line(raw_questions, index, raw.key_lines["questions"])
            question = _question(raw_question, deck_id or "", index, line, check)
            if question is None:
                continue
            if question.id in retired:
                check.add(question.line, "this id was retired and must not be reused", question.id, "id")
            if question.id in first_lines:
                check.add(question.line, f"duplicate question id, first used at {file}:{first_lines[question.id]}", question.id, "id")
            first_lines.setdefault(question.id, question.line)
            questions.append(question)

    order = raw.get("order", 0)
    if not isinstance(order, int) or isinstance(order, bool):
        check.add(raw.key_lines["order"], "must be a whole number (decks are listed by it, then by file name)",
                  None, "order")
    if check.problems or not deck_id:
        return None, check.problems
    deck = Deck(
        id=deck_id,
        title=title,
        questions=tuple(questions),
        description=description.strip(),
        retired_ids=tuple(retired),
        path=file,
        line=raw.key_lines["id"],
        order=order,
    )
    return deck, []


def _let_be(entry: Path) -> bool:
    """What a bank folder may hold beside its deck files, unread: hidden files (an editor's lock
    `.#fsdp.yaml`, a dangling link, or swap file; `.DS_Store`), an editor's backup (`fsdp.yaml~`), a README,
    and folders. Anything else is refused by name: a deck skipped unread would be retired by a sync."""
    name = entry.name
    return name.startswith(".") or name.endswith("~") or name.split(".")[0].upper() == "README" or entry.is_dir()


def load_bank(path: str | Path | None = None) -> list[Deck]:
    """Load every deck file (*.yaml, *.yml) in `path` (default: the repository's bank/), or one file.

    Raises BankError listing every problem in every file; on any problem nothing is returned.
    """
    root = Path(path) if path is not None else DEFAULT_BANK_DIR
    problems: list[BankProblem] = []
    if root.is_dir():
        files = []
        for entry in sorted(root.iterdir()):
            if entry.suffix.lower() in DECK_SUFFIXES and not entry.name.startswith("."):
                files.append(entry)  # a folder or FIFO so named is refused below, as not a regular file
            elif not _let_be(entry):
                problems.append(BankProblem(str(entry), 0, None, None, "is not a deck file (*.yaml or *.yml): "
                                            "rename it, or move it out of the bank folder"))
    elif root.exists():
        files = [root]
    else:
        raise BankError([BankProblem(str(root), 0, None, None, "no such file or folder")])
    if not files and not problems:
        raise BankError([BankProblem(str(root), 0, None, None, "no deck files (*.yaml) found")])

    decks: list[Deck] = []
    for file in files:
        if file.exists() and not file.is_file():  # a FIFO would block the read forever; a folder cannot be read
            problems.append(BankProblem(str(file), 0, None, None, "is not a regular file"))
            continue
        try:
            raw = file.read_bytes()
            text = raw.decode("utf-8")
        except OSError as error:
            problems.append(BankProblem(str(file), 0, None, None, f"cannot be read: {error}"))
            continue
        except UnicodeDecodeError as error:  # the line an editor shows, not a byte offset
            line = raw.count(b"\n", 0, error.start) + 1
            problems.append(BankProblem(str(file), line, None, None,
                                        f"is not UTF-8: byte {raw[error.start]:#04x} cannot start or continue a "
                                        "character (save the file as UTF-8)"))
            continue
        deck, deck_problems = parse_deck(text, str(file))
        problems.extend(deck_problems)
        if deck:
            decks.append(deck)

    problems.extend(_cross_deck_problems(decks))
    if problems:
        raise BankError(problems)
    return sorted(decks, key=lambda deck: deck.order)  # stable: file-name order within one `order`


def _cross_deck_problems(decks: list[Deck]) -> list[BankProblem]:
    """Ids are unique across the whole bank, and a retired id is retired everywhere:
    a card's progress is keyed by its question id."""
    problems = []
    deck_files: dict[str, str] = {}
    question_places: dict[str, str] = {}
    retired_by = {retired_id: deck for deck in decks for retired_id in deck.retired_ids}
    for deck in decks:
        if deck.id in deck_files:
            problems.append(BankProblem(deck.path, deck.line, None, "id", f"deck id '{deck.id}' is also used by {deck_files[deck.id]}"))
        deck_files.setdefault(deck.id, deck.path)
        for question in deck.questions:
            place = f"{deck.path}:{question.line}"
            if question.id in question_places:
                problems.append(
                    BankProblem(deck.path, question.line, question.id, "id", f"duplicate question id, first used at {question_places[question.id]}")
                )
            question_places.setdefault(question.id, place)
            retiring = retired_by.get(question.id)
            if retiring is not None and retiring is not deck:  # within one deck, parse_deck reports it
                problems.append(
                    BankProblem(deck.path, question.line, question.id, "id", f"this id was retired by deck '{retiring.id}' ({retiring.path}) and must not be reused")
                )
    return problems


def find_question(decks: list[Deck], question_id: str) -> Question | None:
    for deck in decks:
        for question in deck.questions:
            if question.id == question_id:
                return question
    return None


# --- Importing a quiz in the seeds' plain-text format ----------------------------------

_NUMBERED = re.compile(r"^\s*(\d+)\.\s+(.*\S)\s*$")
_BULLET = re.compile(r"^\s*[•*\-]\s+(.*\S)\s*$")


def quiz_to_yaml(text: str, deck_id: str) -> str:
    """Turn a plain-text quiz (a title line, numbered questions, bulleted choices) into a deck skeleton.

    Correct answers, explanations, reasons and labs are left empty for the author; the validator
    then names exactly what is missing.
    """
    if not SLUG.fullmatch(deck_id):
        raise ValueError(f"deck id {deck_id!r} must be a slug: lowercase letters, digits and dashes")
    # Numbered as in the file (blank lines count), and without the BOM a Windows editor may save. Split at
    # "\n" alone: splitlines() also breaks at a form feed, \x85 or \u2028, which no editor counts as a line.
    file_lines = text.removeprefix("\ufeff").split("\n")  # a "\r\n" line keeps its "\r", which strip() drops
    lines = [(number, line) for number, line in enumerate(file_lines, start=1) if line.strip()]
    if not lines:
        raise ValueError("the quiz is empty")
    title = lines[0][1].strip()
    questions: list[dict[str, Any]] = []
    for number, line in lines[1:]:
        if match := _NUMBERED.match(line):
            questions.append({"id": f"{deck_id}-q{match.group(1)}", "prompt": match.group(2), "choices": []})
        elif (match := _BULLET.match(line)) and questions:
            questions[-1]["choices"].append({"text": match.group(1), "correct": False, "why_wrong": ""})
        elif questions:
            raise ValueError(f"line {number}: expected a numbered question or a bulleted choice, got {line.strip()!r}")
    if not questions:
        raise ValueError("no numbered questions found")
    for question in questions:
        question.update({"explanation": "", "lab": "", "tags": [deck_id]})
    deck = {"id": deck_id, "title": title, "questions": questions}
    header = "# Generated by `studyapp bank import-quiz`: mark one choice per question `correct: true`,\n"
    header += "# drop its why_wrong, and fill in the empty explanations, reasons and labs.\n"
    return header + yaml.safe_dump(deck, sort_keys=False, allow_unicode=True, width=100)
