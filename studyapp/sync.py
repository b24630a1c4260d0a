"""Bank → database, idempotent: run it as often as you like.

New questions become new cards; edited questions update their card's content and keep its
progress; questions gone from the bank are retired (out of reviews) with their history kept,
and come back with it if their id returns. The whole bank is loaded and validated before
the database is touched, so a bad bank (BankError) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from studyapp.bank import Deck as BankDeck
from studyapp.bank import Question, load_bank
from studyapp.models import Card, Deck

_PG_LOCK_KEY = 7_210_532  # any constant (migrate's is ...531): one sync at a time


@dataclass(frozen=True)
class RetiredDeck:
    """A deck the bank no longer holds: its file renamed, moved or deleted. Its cards go with it."""

    id: str
    cards: int
    reviewed: int  # of those, cards with progress: what a learner loses from reviews (kept, not deleted)


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)  # question ids
    updated: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)  # only their place in the bank changed
    unchanged: int = 0
    decks: int = 0
    retired_decks: list[RetiredDeck] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.retired or self.restored or self.moved)

    def summary(self) -> str:
        return (
            f"{self.decks} decks: {len(self.added)} added, {len(self.updated)} updated, "
            f"{len(self.retired)} retired, {len(self.restored)} restored, "
            + (f"{len(self.moved)} moved, " if self.moved else "")
            + f"{self.unchanged} unchanged"
            # Named: a whole deck gone is more likely a file renamed by mistake than a card removed.
            + "".join(f"; retired deck {d.id} ({d.cards} cards, {d.reviewed} reviewed; their history is kept)"
                      for d in self.retired_decks)
        )


def _copy_content(card: Card, question: Question, position: int) -> None:
    card.deck_id = question.deck_id
    card.position = position
    card.prompt = question.prompt
    card.choices = list(question.choices)
    card.answer = question.answer
    card.explanation = question.explanation
    card.why_wrong = list(question.why_wrong)
    card.lab = question.lab
    card.tags = list(question.tags)
    card.content_hash = question.content_hash()


class SyncRefused(Exception):
    """A sync that would retire decks its bank does not hold, from a path that is one file: said before
    anything is written."""


def sync_decks(session: Session, bank: list[BankDeck], *, whole_bank: bool = True) -> SyncReport:
    """Make the database match `bank` (already validated) in one transaction. Unless `bank` is the
    whole bank (a folder's decks), it may not retire a deck: SyncRefused, naming them, before any write."""
    report = SyncReport(decks=len(bank))
    decks = {deck.id: deck for deck in session.exec(select(Deck)).all()}
    # FOR UPDATE (PostgreSQL): a grade waits, so the version bumped below is the card's newest.
    cards = {card.question_id: card for card in session.exec(select(Card).with_for_update()).all()}
    in_bank_decks = {deck.id for deck in bank}
    dropped = sorted(d.id for d in decks.values() if not d.retired and d.id not in in_bank_decks)
    if dropped and not whole_bank:
        count = sum(1 for card in cards.values() if card.deck_id in dropped and not card.retired)
        raise SyncRefused(f"this bank is one file, and a sync makes the database match its bank: it would retire "
                          f"the decks the file does not hold ({', '.join(dropped)}) and their {count} cards. "
                          "Sync the bank's folder instead (its edits to this deck are synced with it).")
    in_bank: set[str] = set()
    position = 0

    for deck_position, bank_deck in enumerate(bank):
        deck = decks.get(bank_deck.id) or Deck(id=bank_deck.id, title=bank_deck.title)
        deck.title, deck.description = bank_deck.title, bank_deck.description
        deck.position, deck.retired = deck_position, False
        session.add(deck)
    session.flush()  # decks before the cards that reference them

    for bank_deck in bank:
        for question in bank_deck.questions:
            in_bank.add(question.id)
            card = cards.get(question.id)
            if card is None:
                card = Card(question_id=question.id, choices=[], why_wrong=[], tags=[], prompt="", answer=0,
                            explanation="", lab="", content_hash="")
                _copy_content(card, question, position)
                report.added.append(question.id)
            elif card.content_hash != question.content_hash() or card.position != position or card.retired:
                if card.retired:
                    report.restored.append(question.id)
                elif card.content_hash != question.content_hash():
                    report.updated.append(question.id)
                else:  # only its place: what a learner sees of it is the same, so an open answer stays good
                    report.moved.append(question.id)
                if card.retired or card.content_hash != question.content_hash():
                    card.version += 1  # an answer to the old text must not be graded against the new
                _copy_content(card, question, position)
                card.retired = False
            else:
                report.unchanged += 1
            session.add(card)
            position += 1

    for deck_id in dropped:  # live decks the bank no longer holds
        decks[deck_id].retired = True
        session.add(decks[deck_id])
        live = [card for card in cards.values() if card.deck_id == deck_id and not card.retired]
        report.retired_decks.append(RetiredDeck(deck_id, len(live), sum(not card.is_new for card in live)))
    for card in cards.values():
        if card.question_id not in in_bank and not card.retired:
            card.retired = True
            card.version += 1
            report.retired.append(card.question_id)
            session.add(card)
    session.commit()
    return report


def sync_bank(engine: Engine, path: str | Path | None = None, bank: list[BankDeck] | None = None) -> SyncReport:
    """Load the bank at `path` (default bank/; a folder, or one deck file) and sync it; `bank`: the decks
    already loaded from `path`. Raises BankError or SyncRefused before any write."""
    bank = load_bank(path) if bank is None else bank
    with Session(engine) as session:
        _lock_for_sync(session)
        return sync_decks(session, bank, whole_bank=path is None or Path(path).is_dir())


def _lock_for_sync(session: Session) -> None:
    """Take the write lock before reading: a sync writes what it read, so another sync (two processes
    starting on a new database: both would insert the same decks) or a grade must not write in between.
    SQLite: BEGIN IMMEDIATE (pysqlite would begin only at the first write); PostgreSQL: an advisory
    lock to the commit (row locks cannot stop two inserts of the same new deck)."""
    connection = session.connection()
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    elif connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
