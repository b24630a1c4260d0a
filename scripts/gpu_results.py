"""Write exports/gpu-results.json from what scripts/gpu-check collected in its work folder."""

from __future__ import annotations

import datetime
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # where numpy is absent; unused here
import torch  # noqa: E402


def _rows(work: Path, name: str) -> list[dict]:
    """The JSON lines the gpu tests appended to work/NAME.jsonl (none if that test did not get that far)."""
    path = work / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(work: Path, out: Path) -> int:
    comparisons, planner = _rows(work, "comparisons"), _rows(work, "planner")
    labs_file = work / "labs.json"
    try:
        runs = json.loads(labs_file.read_text())["runs"]
    except (OSError, ValueError, KeyError) as error:
        # The command's own one-line error says why there is no JSON (a failed rank, a refusal).
        err = work / "labs.err"
        said = [line for line in err.read_text().splitlines() if line.startswith("sharding-lab")] if err.exists() else []
        runs, labs_error = [], said[-1] if said else f"{type(error).__name__}: {error}"
    else:
        labs_error = None
    pytest_tail = (work / "pytest.txt").read_text().strip().splitlines()[-1:] if (work / "pytest.txt").exists() else []
    stopped_file = work / "stopped.txt"  # gpu-check's parts that ran past their limits
    stopped = stopped_file.read_text().strip().splitlines() if stopped_file.exists() else []
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "pytest": pytest_tail,
        "stopped": stopped,
        "simulator_vs_rank_view": comparisons,
        "planner_vs_rank_view": planner,
        # tests/test_sharding_gpu.py's figures: configurations in one launch against each alone, two ranks
        # on one GPU, DDP's mixed precision beside the allocator, what a matmul leaves allocated, what a
        # deleted DDP model leaves
        "independence": _rows(work, "independence"),
        "one_gpu": _rows(work, "one_gpu"),
        "ddp_mixed_precision": _rows(work, "ddp_mixed_precision"),
        "cublas_workspace": _rows(work, "cublas_workspace"),
        "ddp_leak_probe": _rows(work, "ddp_leak_probe"),  # bare DDP deleted on CUDA: what each variant leaves
        "labs": {
            run["lab"]: {
                "holds": run["holds"],
                "finding": run["finding"],
                "reasons": run["reasons"],
                "placement": sorted({m["config"].get("placement", "ranks") for m in run["measurements"].values()}),
            }
            for run in runs
        },
        "labs_error": labs_error,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}: {len(comparisons)} comparison(s), {len(runs)} lab(s)")
    held = all(run["holds"] for run in runs) and labs_error is None and not stopped
    return 0 if held and comparisons else 1


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
