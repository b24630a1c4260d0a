"""The README's GPU figures are what scripts/gpu-table renders from exports/gpu-results.json, and
each figure in the rendering comes from that file, labelled measured, predicted or derived."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))  # the scripts import their shared readme_block module
table = types.ModuleType("gpu_table")  # a script without .py: run its source as a module
table.__file__ = str(REPO / "scripts" / "gpu-table")
exec(compile(Path(table.__file__).read_text(), table.__file__, "exec"), table.__dict__)

GIB, MIB = 2**30, 2**20


def _results() -> dict:
    """A whole gpu-check run's results, with figures chosen so each rendering is known by hand."""
    return {
        "date": "2026-12-01", "gpu": "NVIDIA H200", "gpus": 1, "torch": "2.11.0+cu130", "cuda": "13.0",
        "pytest": ["18 passed, 1 skipped in 201.5s"], "stopped": [],
        "simulator_vs_rank_view": [
            {"case": {"size": "gpt2-small", "world_size": 8, "seq": 512, "batch": 4, "mixed_precision": False,
                      "options": []},
             "simulated_peak": 5 * GIB, "tracked_peak": 4 * GIB, "cuda_peak": 4 * GIB,
             "simulated_model_states": 1, "measured_model_states": 1, "measured_step_counters": 0,
             "cuda_error": 0.25, "tracked_error": 0.25},
            {"case": {"size": "1b", "world_size": 64, "seq": 512, "batch": 4, "mixed_precision": True,
                      "options": [["activation_checkpointing", True]]},
             "simulated_peak": 990 * MIB, "cuda_workspaces": 5 * MIB, "tracked_peak": 980 * MIB,
             "cuda_peak": 1000 * MIB, "simulated_model_states": 1, "measured_model_states": 1,
             "measured_step_counters": 0, "cuda_error": 0.005, "tracked_error": 0.0102},
        ],
        "planner_vs_rank_view": [{"case": "gpt2-small-N8-seq512-fp32-cpu_offload=True", "planned_peak": 3 * GIB - 64 * MIB,
                                  "cuda_workspaces": 64 * MIB, "tracked_peak": 3 * GIB, "cuda_peak": 3 * GIB, "cuda_error": 0.0}],
        "independence": [
            {"strategy": "ddp", "size": "gpt2-medium", "world_size": 1, "tracked_peak": 10 * GIB,
             "cuda_peak_in_one_launch": 10 * GIB, "cuda_peak_alone": 10 * GIB},
            {"strategy": "zero1", "size": "gpt2-medium", "world_size": 1, "tracked_peak": 10 * GIB,
             "cuda_peak_in_one_launch": 11 * GIB, "cuda_peak_alone": None},
        ],
        "one_gpu": [{"rank_view_rank0_cuda_peak": 2 * GIB, "rank_view_rank0_tracked_peak": 2 * GIB,
                     "shared_gpu_cuda_peaks": [3 * GIB, 3 * GIB], "shared_gpu_tracked_peaks": [2 * GIB, 2 * GIB]}],
        "ddp_mixed_precision": [{"size": "gpt2-medium", "num_params": 400 * MIB, "tracked_peak": 8 * GIB,
                                 "cuda_peak": 10 * GIB, "tracked_categories_at_peak": {"params": 8 * GIB, "grads": 0}}],
        "cublas_workspace": [{"bytes_kept_after_a_matmul": 32 * MIB}],
        "ddp_leak_probe": [{"backend": "nccl", "comm_hook": True, "gradient_as_bucket_view": True, "steps": 3,
                            "bytes_left": 6_303_744}],
        "labs": {"a-lab": {"holds": True, "finding": "", "reasons": [], "placement": ["rank-view"]},
                 "b-lab": {"holds": False, "finding": "", "reasons": ["overlap was 0%"], "placement": ["ranks"]}},
        "labs_error": None,
    }


def test_the_readme_block_is_the_one_rendered_from_the_committed_results():
    results = json.loads(table.RESULTS.read_text()) if table.RESULTS.exists() else None
    assert table.BLOCK.read(table.README.read_text()) == table.render(results), "run `make gpu-table`"
    assert table.main(["--check"]) == 0


def test_without_results_the_block_says_no_gpu_figures_are_recorded():
    rendered = table.render(None)
    assert rendered.startswith("No GPU figures are recorded yet")


def test_every_figure_is_rendered_with_what_it_is():
    rendered = table.render(_results())
    assert "2026-12-01: 1 × NVIDIA H200, torch 2.11.0+cu130, CUDA 13.0. pytest: 18 passed, 1 skipped" in rendered
    # the simulator: 5 GiB predicted (a file from before the workspaces were recorded: none) against 4 GiB
    # measured is 25% high and misses 3%; 990 + 5 against 1000 MiB is 0.5% low and holds
    assert ("| gpt2-small, N=8, batch 4 × seq 512, fp32 | 5.00 GiB | 0.0 MiB | 4.00 GiB | 4.00 GiB | +25.0% "
            "| **no** |" in rendered)
    assert ("| 1b, N=64, batch 4 × seq 512, bf16 mixed precision, activation_checkpointing=True | 990.0 MiB "
            "| 5.0 MiB | 980.0 MiB | 1000.0 MiB | -0.5% | yes |" in rendered)
    assert ("| gpt2-small-N8-seq512-fp32-cpu_offload=True | 2.94 GiB | 64.0 MiB | 3.00 GiB | +0.0% | yes |"
            in rendered)
    # one launch against alone: 11 GiB with no alone figure has no ratio
    assert "| ddp | 10.00 GiB | 10.00 GiB | 10.00 GiB | +0.0% |" in rendered
    assert "| zero1 | 10.00 GiB | 11.00 GiB | — | — |" in rendered
    assert "the two ranks' CUDA peaks were 3.00 GiB (tracked 2.00 GiB), 3.00 GiB (tracked 2.00 GiB)" in rendered
    # DDP's mixed precision: 2 GiB missed of an 8 GiB tracker peak is 25.0%; 2 GiB over 400 Mi parameters is 5.12 B
    assert "the tracker missed 2.00 GiB, 25.0% of its peak and 5.12 B per parameter (derived)" in rendered
    assert "categories at its peak: params 8.00 GiB." in rendered  # a category at zero is left out
    assert "one matmul left 32.0 MiB allocated" in rendered
    assert "| nccl, allreduce_hook, gradient_as_bucket_view=True, 3 step(s) | 6,303,744 |" in rendered
    assert "1 of 2 hold; placements used: rank-view, ranks. `b-lab` does not hold: overlap was 0%." in rendered
    assert "Not recorded" not in rendered


def test_a_run_cut_short_says_what_it_did_not_record():
    results = {**_results(), "stopped": ["pytest (240 s)"], "independence": [], "cublas_workspace": [],
               "labs": {}, "labs_error": "JSONDecodeError: Expecting value"}
    rendered = table.render(results)
    assert "Stopped at their limits: pytest (240 s)." in rendered
    assert "Not recorded in this run (the test did not run or did not get that far): independence, cublas_workspace." \
        in rendered
    assert "0 of 0 hold; placements used: none. The labs' results could not be read: JSONDecodeError" in rendered
    assert "Configurations in one launch" not in rendered


def test_check_fails_and_write_fixes_a_readme_out_of_date(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{table.BLOCK.begin}\n{table.NO_RESULTS}{table.BLOCK.end}\nafter\n")
    paths = ["--results", str(tmp_path / "results.json"), "--readme", str(readme)]
    assert table.main(["--check", *paths]) == 1
    assert table.main(["--write-readme", *paths]) == 0
    assert table.main(["--check", *paths]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "| +25.0% |" in text


def test_a_file_that_is_not_gpu_checks_results_is_named_without_a_traceback(tmp_path, capsys):
    for name, text in (("empty.json", ""), ("partial.json", json.dumps({"date": "2026-12-01"}))):
        (tmp_path / name).write_text(text)
        assert table.main(["--results", str(tmp_path / name)]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"{tmp_path / name} is not scripts/gpu-check's results: ")
        assert "Traceback" not in error
