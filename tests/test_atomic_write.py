"""sharding_lab.atomic_write: a file is replaced whole or not at all, and nothing is left beside it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from sharding_lab.atomic_write import create_text, replacing, write_text


def test_a_write_replaces_the_file_whole_with_the_mode_asked(tmp_path):
    path = tmp_path / "backup.csv"
    path.write_text("old\n")
    write_text(path, "new\r\nrows\n", mode=0o600, durable=True)
    assert path.read_bytes() == b"new\r\nrows\n"  # newlines as given
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_text(path, "again")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["backup.csv"]


def test_an_error_mid_write_leaves_the_old_file_and_no_scratch(tmp_path):
    path = tmp_path / "deck.apkg"
    path.write_bytes(b"the good package")
    with pytest.raises(OSError, match="No space left"):
        with replacing(path) as scratch:
            scratch.write_bytes(b"half a pack")
            raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"the good package"
    assert [p.name for p in tmp_path.iterdir()] == ["deck.apkg"]


def test_a_new_file_appears_only_once_written(tmp_path):
    path = tmp_path / "lab-results.json"
    with replacing(path) as scratch:
        scratch.write_text("{}\n")
        assert not path.exists()  # a reader meanwhile sees no file, never half of one
    assert path.read_text() == "{}\n"


def test_create_text_makes_a_file_once_and_never_replaces_it(tmp_path):
    path = tmp_path / "secret_key"
    assert create_text(path, "first", mode=0o600, durable=True)
    assert not create_text(path, "second")  # another process made it first: the caller reads it
    assert path.read_text() == "first" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret_key"]


def test_a_scratch_file_a_killed_writer_left_is_removed_by_the_next_write_of_that_path(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "all-decks.apkg"
    stale = tmp_path / f".all-decks.apkg.{dead.pid}.k3x9.part"  # SIGKILL ran no cleanup
    writing = tmp_path / f".all-decks.apkg.{os.getpid()}.q7z1.part"  # a writer still running: left alone
    others = tmp_path / f".zero.apkg.{dead.pid}.k3x9.part"  # another path's: its own next write removes it
    for scratch in (stale, writing, others):
        scratch.write_bytes(b"half a package")
    write_text(path, "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["all-decks.apkg", writing.name, others.name])
