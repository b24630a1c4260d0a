"""The `studyapp` commands, run through app.test_cli_runner()."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ALPHA_DECK, write_bank
from sqlmodel import Session, select

from studyapp import auth, cli
from studyapp.bank import parse_deck
from studyapp.cli import serve as serve_cli
from studyapp.db import get_engine
from studyapp.models import Card

SEEDS = Path(__file__).resolve().parent / "data"


def card_count(app) -> int:
    with Session(get_engine(app)) as session:
        return len(session.exec(select(Card).where(Card.retired.is_(False))).all())


def test_bank_sync_reports_and_is_idempotent(runner, app, bank_dir):
    write_bank(bank_dir, {"alpha": ALPHA_DECK})
    result = runner.invoke(args=["bank", "sync"])
    assert result.exit_code == 0, result.output
    assert "0 added, 0 updated, 2 retired" in result.output
    again = runner.invoke(args=["bank", "sync"])
    assert "0 added, 0 updated, 0 retired, 0 restored, 3 unchanged" in again.output
    assert card_count(app) == 3


def test_bank_sync_of_a_bad_bank_fails_cleanly_and_changes_nothing(runner, app, bank_dir):
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("prompt: Why are gathered", "prompt:  \n    extra: Why")})
    result = runner.invoke(args=["bank", "sync"])
    assert result.exit_code == 1
    assert "alpha.yaml:" in result.output and "alpha-free" in result.output and "Nothing was changed" in result.output
    assert card_count(app) == 5


def test_bank_check_validates_without_writing(runner, app, tmp_path):
    folder = write_bank(tmp_path / "other", {"alpha": ALPHA_DECK})
    result = runner.invoke(args=["bank", "check", "--path", str(folder)])
    assert result.exit_code == 0 and "ok: 1 decks, 3 questions" in result.output
    bad = write_bank(tmp_path / "bad", {"alpha": ALPHA_DECK.replace("lab: reshard-after-forward", "lab: Not A Slug")})
    result = runner.invoke(args=["bank", "check", "--path", str(bad)])
    assert result.exit_code == 1 and "field 'lab'" in result.output
    unknown = write_bank(tmp_path / "unknown", {"alpha": ALPHA_DECK.replace("lab: reshard-after-forward", "lab: no-such-lab")})
    result = runner.invoke(args=["bank", "check", "--path", str(unknown)])
    assert result.exit_code == 0 and "lab 'no-such-lab' is not in the catalogue" in result.output
    assert card_count(app) == 5


def test_check_and_sync_refuse_a_bank_folder_holding_a_file_that_is_no_deck(runner, app, bank_dir):
    # beta.json was skipped unread: `check` said ok with one deck, and `sync` retired beta's cards, rc 0.
    (bank_dir / "beta.yaml").rename(bank_dir / "beta.json")
    said = f"{bank_dir / 'beta.json'}: is not a deck file (*.yaml or *.yml): rename it, or move it out of the bank folder"
    checked = runner.invoke(args=["bank", "check"])
    assert checked.exit_code == 1 and said in checked.output, checked.output
    synced = runner.invoke(args=["bank", "sync"])
    assert synced.exit_code == 1 and said in synced.output and "Nothing was changed." in synced.output, synced.output
    assert card_count(app) == 5


def test_sync_warns_of_a_lab_missing_from_the_catalogue_as_check_does(runner, app, bank_dir):
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("lab: reshard-after-forward", "lab: no-such-lab")})
    line = f"warning: {bank_dir / 'alpha.yaml'}:32: question alpha-free: lab 'no-such-lab' is not in the catalogue"
    checked = runner.invoke(args=["bank", "check"])
    assert checked.output.splitlines() == [line, "ok: 1 decks, 3 questions"]
    synced = runner.invoke(args=["bank", "sync"])
    assert synced.exit_code == 0 and synced.output.splitlines()[0] == line, synced.output


def test_a_surrogate_escape_fails_check_and_sync_refuses_it_before_writing(runner, app, bank_dir):
    # `bank check` said ok, then `bank sync` failed with a UnicodeEncodeError traceback.
    write_bank(bank_dir, {"alpha": ALPHA_DECK.replace("prompt: Why are gathered", 'prompt: "Why \\ud83d\\ude00 are gathered')
                          .replace("after a layer runs?", 'after a layer runs?"')})
    said = ("question alpha-free, field 'prompt': holds U+D83D, half of a UTF-16 surrogate pair, which is not a "
            "character and cannot be stored: write \\U0001F600 (or the character itself)")
    checked = runner.invoke(args=["bank", "check"])
    assert checked.exit_code == 1 and said in checked.output, checked.output
    synced = runner.invoke(args=["bank", "sync"])
    assert synced.exit_code == 1 and said in synced.output and "Nothing was changed" in synced.output, synced.output
    assert card_count(app) == 5


def test_import_quiz_prints_a_skeleton_the_validator_then_explains(runner):
    result = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "zero-quiz.txt"), "--deck", "zero"])
    assert result.exit_code == 0, result.output
    skeleton = yaml.safe_load(result.output)
    assert skeleton["id"] == "zero" and len(skeleton["questions"]) == 8
    assert skeleton["questions"][0]["choices"][0]["text"].startswith("Duplicate full copies of optimizer state")
    deck, problems = parse_deck(result.output, "zero.yaml")
    assert deck is None and any("exactly one choice must be correct" in p.message for p in problems)


def test_import_quiz_writes_a_file_and_never_overwrites(runner, tmp_path):
    out = tmp_path / "fsdp.yaml"
    args = ["bank", "import-quiz", str(SEEDS / "fsdp-quiz.txt"), "--deck", "fsdp", "--out", str(out)]
    result = runner.invoke(args=args)
    assert result.exit_code == 0 and out.exists() and "wrote" in result.output
    result = runner.invoke(args=args)
    assert result.exit_code == 1 and "not overwriting" in result.output
    bad = runner.invoke(args=["bank", "import-quiz", str(SEEDS / "fsdp-quiz.txt"), "--deck", "Bad Id"])
    assert bad.exit_code == 1 and "must be a slug" in bad.output


def fake_server(monkeypatch) -> dict:
    """Stands in for the server: records what `serve` bound, serves nothing."""
    served: dict = {}

    def make_server(app, host: str, port: int, *, debug: bool = False):
        served.update(host=host, port=port, debug=debug)
        return serve_cli.Server(port or 5000, lambda: None)

    monkeypatch.setattr(serve_cli, "make_server", make_server)
    return served


def test_serve_syncs_then_serves_on_localhost(runner, app, bank_dir, monkeypatch):
    served = fake_server(monkeypatch)
    write_bank(bank_dir, {"alpha": ALPHA_DECK})
    result = runner.invoke(args=["serve"])
    assert result.exit_code == 0, result.output
    assert "bank synced" in result.output and "2 retired" in result.output
    assert served["host"] == "127.0.0.1" and served["port"] == 5000 and not served["debug"]
    assert "serving on http://127.0.0.1:5000/" in result.output and "development server" not in result.output
    assert "login" not in result.output and not app.config["REQUIRE_LOGIN"], "loopback: no login"
    assert not (Path(app.instance_path) / auth.TOKEN_FILE).exists()


def test_serve_beyond_loopback_requires_the_login_and_prints_the_token_url_once(runner, app, monkeypatch):
    served = fake_server(monkeypatch)
    first = runner.invoke(args=["serve", "--host", "0.0.0.0"])
    assert first.exit_code == 0, first.output
    assert app.config["REQUIRE_LOGIN"] and app.config["SESSION_COOKIE_SAMESITE"] == "Strict"
    token = (Path(app.instance_path) / auth.TOKEN_FILE).read_text().strip()
    lines = [line for line in first.output.splitlines() if token in line]
    assert len(lines) == 1 and lines[0].startswith("login required: open http://")
    assert f":5000/login?token={token}" in lines[0] and "LAN addresses" in lines[0]
    again = runner.invoke(args=["serve", "--host", "0.0.0.0"])
    assert token not in again.output and "`studyapp token`" in again.output, "the token is printed once"
    assert not served["debug"]


@pytest.mark.parametrize("debug", [False, True])
def test_serve_on_a_taken_port_says_so_in_one_line_and_starts_nothing(runner, app, monkeypatch, debug):
    # With --debug, Werkzeug's own bind printed two lines of its own ("Address already in use", "Port N
    # is in use by another program...") and exited, with no `Error:` line.
    import socket

    started = []
    monkeypatch.setattr(serve_cli, "start_worker", started.append)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(args=["serve", "--port", str(port), *(["--debug"] if debug else [])])
    assert result.exit_code == 1
    assert result.output == (f"Error: cannot serve on 127.0.0.1:{port}: Address already in use (another server, "
                             "perhaps studyapp itself, is using it; choose another with --port)\n")
    assert started == [], "the lab worker starts only once the port is bound"
    assert not app.debug


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_that_does_not_exist(runner, app, port):
    result = runner.invoke(args=["serve", "--port", port])
    assert result.exit_code == 2 and "Invalid value for '--port'" in result.output


def test_serve_refuses_a_configured_port_that_does_not_exist(runner, app):
    app.config["PORT"] = 70000  # as instance/config.py might set it
    result = runner.invoke(args=["serve"])
    assert result.exit_code == 1 and "PORT must be a whole number from 0 to 65535, got 70000" in result.output


def test_serve_refuses_to_start_on_a_bad_bank(runner, bank_dir, monkeypatch):
    # The address is bound first (a taken port or a bad --host ends before the database is touched);
    # a bad bank then ends it before anything is served.
    monkeypatch.setattr(serve_cli, "make_server", lambda *args, **kwargs: serve_cli.Server(
        5000, lambda: (_ for _ in ()).throw(AssertionError("served"))))
    write_bank(bank_dir, {"alpha": "id: alpha\ntitle: [unclosed\n"})
    result = runner.invoke(args=["serve"])
    assert result.exit_code == 1 and "YAML syntax error" in result.output


def test_every_listed_command_is_registered(app):
    for command in cli.COMMANDS:
        assert app.cli.get_command(None, command.name) is command
