"""`sharding-lab list` and `sharding-lab run` through the CLI: JSON shape, exit status, export."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharding_lab import cli
from sharding_lab.catalog import CATALOG

REPO = Path(__file__).resolve().parent.parent


def test_list_json_prints_every_lab_once(capsys):
    assert cli.main(["list", "--json"]) == 0
    out = capsys.readouterr().out
    listing = json.loads(out)  # exactly one JSON object
    assert [lab["id"] for lab in listing["labs"]] == [info.id for info in CATALOG]
    first = listing["labs"][0]
    assert set(first) >= {"id", "title", "claim", "questions", "command", "runs"}
    assert {run["strategy"] for run in first["runs"]} == {"ddp", "zero3"}  # what-fsdp-shards compares them
    assert first["command"] == f"sharding-lab run {first['id']}"


def test_list_as_a_table_names_every_lab(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(info.id in out for info in CATALOG)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run"], "name one LAB or pass --all"),
        (["run", "adam-optimizer-state", "--all"], "name one LAB or pass --all"),
        (["run", "no-such-lab"], "no-such-lab"),
        (["run", "adam-optimizer-state", "--world-size", "1"], "--world-size must be at least 2"),
        (["run", "adam-optimizer-state", "--export", "{tmp}"], "--export {tmp} is a folder; give a file path"),
        (["run", "adam-optimizer-state", "--export", "{tmp}/a-file/x.json"],
         "--export {tmp}/a-file/x.json: {tmp}/a-file is a file, not a folder"),
        # Missing folders were made, silently: `--export /nonexistent/dir/x.json` made /nonexistent/dir.
        (["run", "adam-optimizer-state", "--export", "{tmp}/missing/dir/x.json"],
         "--export {tmp}/missing/dir/x.json: no folder {tmp}/missing/dir; make it first (mkdir -p {tmp}/missing/dir)"),
        (["at-scale", "no-such-lab"], "sharding-lab at-scale: "),
    ],
)
def test_run_refuses_a_missing_extra_or_unknown_lab_before_running(argv, message, tmp_path, capsys, monkeypatch):
    from sharding_lab.labs import commands

    monkeypatch.setattr(commands, "_run_with_progress", lambda *a, **k: pytest.fail("ran before refusing"))
    (tmp_path / "a-file").write_text("")
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2  # a usage error, as argparse's: 1 is a failed claim
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert not (tmp_path / "missing").exists()


def _fake_run(lab_id: str, holds: bool) -> dict:
    return {
        "lab": lab_id,
        "title": "t",
        "claim": "c",
        "holds": holds,
        "finding": "f 1",
        "reasons": [],
        "table": {"columns": ["a"], "rows": [[1]]},
        "charts": {"c": "<svg/>"},
        "measurements": {"x": {}},
        "config": {},
        "duration_s": 0.0,
    }


def test_run_exits_non_zero_when_a_claim_does_not_hold_and_exports_summaries(monkeypatch, tmp_path, capsys):
    def fake_run_labs(lab_ids, world_size, **_):
        return [_fake_run(lab_id, holds=lab_id != "communication-volume") for lab_id in lab_ids]

    monkeypatch.setattr("sharding_lab.engine.run_labs.run_labs", fake_run_labs)
    export = tmp_path / "lab-results.json"
    assert cli.main(["run", "--all", "--json", "--export", str(export)]) == 1
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [run["lab"] for run in runs] == [info.id for info in CATALOG]
    summaries = json.loads(export.read_text())
    assert sorted(summaries) == sorted(info.id for info in CATALOG)
    assert all("measurements" not in s and "charts" not in s for s in summaries.values())
    assert summaries["communication-volume"]["holds"] is False


def test_run_refuses_an_export_folder_it_may_not_write_in_before_running(monkeypatch, tmp_path, capsys):
    from sharding_lab.labs import commands

    monkeypatch.setattr(commands, "_run_with_progress", lambda *a, **k: pytest.fail("ran before refusing"))

    def denied(dir):  # root may write anywhere: the error a user without permission gets
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(commands.tempfile, "TemporaryFile", denied)
    export = tmp_path / "x.json"
    assert cli.main(["run", "what-fsdp-shards", "--export", str(export)]) == 2
    assert capsys.readouterr().err == f"sharding-lab run: --export {export}: no permission to write in {tmp_path}\n"


def test_run_names_a_read_only_file_system_as_why_it_cannot_export(small_disk, monkeypatch, capsys):
    # It said "no permission to write in ...", as access(2) answers no for either reason.
    from sharding_lab.labs import commands

    monkeypatch.setattr(commands, "_run_with_progress", lambda *a, **k: pytest.fail("ran before refusing"))
    remounted = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True, text=True)
    assert remounted.returncode == 0, remounted.stderr
    export = small_disk / "x.json"
    assert cli.main(["run", "what-fsdp-shards", "--export", str(export)]) == 2
    assert capsys.readouterr().err == f"sharding-lab run: --export {export}: {small_disk} is on a read-only file system\n"


@pytest.mark.parametrize(("code", "says"), [
    (errno.ENOSPC, "no space left on the disk of out"),
    (errno.ENAMETOOLONG, "cannot write in out: File name too long"),  # any other: the OS's own words
])
def test_a_folder_no_file_can_be_made_in_is_named_by_the_errno(code, says):
    from sharding_lab.labs.commands import _cannot_write_in

    assert _cannot_write_in(Path("out"), OSError(code, os.strerror(code))) == says


def test_an_export_that_fails_on_writing_still_prints_the_runs_and_says_so(monkeypatch, tmp_path, capsys):
    # A file system that takes no new files (/proc) once ended in a FileNotFoundError traceback after the labs ran.
    monkeypatch.setattr(
        "sharding_lab.engine.run_labs.run_labs", lambda lab_ids, world_size, **_: [_fake_run(i, True) for i in lab_ids]
    )

    def no_new_files(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr("sharding_lab.atomic_write.tempfile.mkstemp", no_new_files)
    export = tmp_path / "x.json"
    assert cli.main(["run", "what-fsdp-shards", "--json", "--export", str(export)]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["lab"] == "what-fsdp-shards"
    assert err == (f"sharding-lab run: could not write --export {export}: No such file or directory; "
                   "the runs are not exported\n")
    assert not export.exists()


# communication-volume's table as measured (tiny, 2 ranks): 7 columns, which at 80 characters rich had folded
# mid-word ("all_redu / ce x1", "broadcas / t x53").
COMMUNICATION_VOLUME = {
    "columns": ["strategy", "collectives per step", "logical bytes", "wire bytes (derived, ring)",
                "measured volume (xΨ)", "paper volume (xΨ)", "model states bytes per rank"],
    "rows": [["ddp", "all_reduce x1", 240384, 240384, 2.0, 2, 961536],
             ["zero1", "all_reduce x1, broadcast x53", 480768, 360576, 3.0, 2, 721152],
             ["zero2", "all_gather x5, reduce_scatter x5", 480768, 240384, 2.0, 2, 480768],
             ["zero3", "all_gather x9, reduce_scatter x5", 684032, 342016, 2.846, 3, 480768]],
}
# zero1-whole-tensors': a cell of tensor names too long for a column per rank at 80 characters.
WHOLE_TENSORS = {
    "columns": ["rank", "Adam state elements (measured)", "greedy whole-tensor rule",
                "DeepSpeed flat partition (derived)", "tensors owned", "largest owned"],
    "rows": [["N=2, rank 0", 514176, 514176, 514176, 54, "wte.weight, blocks.0.mlp.c_fc.weight, blocks.1.mlp.c_fc.weight ..."],
             ["N=2, rank 1", 514176, 514176, 514176, 71,
              "lm_head.weight, blocks.0.mlp.c_proj.weight, blocks.1.mlp.c_proj.weight ..."],
             ["N=8, rank 0 (view)", 262144, 262144, 128544, 1, "wte.weight"]],
}


@pytest.mark.parametrize(("columns", "table", "lines"), [
    # A row per configuration, where it fits.
    ("200", COMMUNICATION_VOLUME, [
        "│ zero1    │ all_reduce x1, broadcast x53     │ 480,768       │ 360,576                    │ 3.0                  │ 2 "
        "                │ 721,152                     │"]),
    # A column per configuration, where a row each would break words.
    ("80", COMMUNICATION_VOLUME, [
        "┃ strategy     ┃ ddp        ┃ zero1       ┃ zero2           ┃ zero3           ┃",
        "│ collectives  │ all_reduce │ all_reduce  │ all_gather x5,  │ all_gather x9,  │",
        "│ per step     │ x1         │ x1,         │ reduce_scatter  │ reduce_scatter  │",
        "│              │            │ broadcast   │ x5              │ x5              │",
        "│              │            │ x53         │                 │                 │",
        "│ logical      │ 240,384    │ 480,768     │ 480,768         │ 684,032         │"]),
    # Each configuration's figures under each other, where neither layout fits.
    ("80", WHOLE_TENSORS, [
        "│ rank                   │ N=2, rank 1                                        │",
        "│ DeepSpeed flat         │ 514,176                                            │",
        "│ partition (derived)    │                                                    │",
        "│ largest owned          │ lm_head.weight, blocks.0.mlp.c_proj.weight,        │",
        "│                        │ blocks.1.mlp.c_proj.weight ...                     │"]),
])
def test_a_runs_table_reads_with_no_word_broken(columns, table, lines, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr("sharding_lab.engine.run_labs.run_labs",
                        lambda lab_ids, world_size, **_: [{**_fake_run(i, True), "table": table} for i in lab_ids])
    assert cli.main(["run", "communication-volume"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert all(line in shown for line in lines), "\n".join(shown)
    assert max(map(len, shown)) <= int(columns)


def test_run_exits_zero_when_every_claim_holds(monkeypatch, capsys):
    monkeypatch.setattr(
        "sharding_lab.engine.run_labs.run_labs", lambda lab_ids, world_size, **_: [_fake_run(i, True) for i in lab_ids]
    )
    assert cli.main(["run", "what-fsdp-shards"]) == 0
    assert "what-fsdp-shards" in capsys.readouterr().out


@pytest.mark.slow
def test_run_one_lab_json_measures_and_holds():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharding_lab.cli",
            "run",
            "adam-optimizer-state",
            "--world-size",
            "2",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run = json.loads(result.stdout)  # exactly one JSON object on stdout
    assert run["lab"] == "adam-optimizer-state" and run["holds"] is True
    assert "2.00x" in run["finding"]
    assert run["measurements"]["ddp"]["config"]["world_size"] == 2
    assert {"strategy", "world_size", "backend", "device", "torch_version"} <= set(run["config"])
    assert run["config"]["world_size"] == 2 and run["config"]["strategy"] == "ddp, zero3"


def test_run_refuses_a_size_this_host_cannot_hold_before_any_rank_starts(capsys):
    # what-fsdp-shards runs ddp: 70b's model states on 2 CPU ranks alone are about 1.9 TiB.
    assert cli.main(["run", "what-fsdp-shards", "--size", "70b", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("sharding-lab run: ddp on 2 CPU rank(s) of 70b")
    assert "needs at least 1.9 TiB of host memory" in captured.err and "engine failed" not in captured.err


def test_run_passes_its_timeout_to_every_launch(capsys):
    # 0.3 s cannot even start a rank (importing torch takes seconds): the engine says so, and names the flag.
    assert cli.main(["run", "what-fsdp-shards", "--timeout", "0.3", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("sharding-lab run: the engine failed: rank 0 failed: did not start within 0.3 s")
