"""sharding_lab.atomic_write: a file is replaced whole or not at all, and nothing is left beside it."""

from __future__ import annotations

import stat

import pytest

from sharding_lab.atomic_write import replacing, write_text


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
