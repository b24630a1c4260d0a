"""A page per lab from the catalogue: its claim, the questions it backs, how to run it.

The labs-in-app work adds runs and results here (`lab_page` renders labs/lab.html with
`lab`, `cards`; extend the template's `results` block and add the JSON API to this blueprint).
"""

from __future__ import annotations

from flask import Blueprint, abort, render_template
from sqlmodel import select

from sharding_lab.catalog import CATALOG, lab_info
from studyapp.db import get_session
from studyapp.models import Card

bp = Blueprint("labs", __name__, url_prefix="/labs")


@bp.get("")
def index():
    return render_template("labs/index.html", labs=CATALOG)


@bp.get("/<lab_id>")
def lab_page(lab_id: str):
    lab = lab_info(lab_id)
    if lab is None:
        abort(404, description=f"There is no lab '{lab_id[:60]}'.")
    cards = get_session().exec(select(Card).where(Card.lab == lab_id, Card.retired.is_(False)).order_by(Card.position)).all()
    synced = {card.question_id for card in cards}
    return render_template(
        "labs/lab.html",
        lab=lab,
        cards=cards,
        unsynced=[qid for qid in lab.questions if qid not in synced],
    )
