"""A stand-in for `sharding-lab` in the lab-queue tests: prints a lab's run JSON fast, or misbehaves
on request. Options before `run` shape it; `run LAB --world-size N --device D --json` is what the app
passes (the device is echoed in the result's config; on "cuda" it names a fake GPU).

    fake_sharding_lab.py [--sleep S] [--log FILE] [--child] [--fail N] [--holds no] [--chart SVG] run LAB --world-size N [--device D] --json
"""

import argparse
import json
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--log")  # appends "start|end LAB PID TIME" (and "child PID") lines
parser.add_argument("--child", action="store_true", help="spawn a long-lived grandchild, like the ranks")
parser.add_argument("--fail", type=int, default=0, help="exit with this status, printing no JSON")
parser.add_argument("--holds", default="yes")
parser.add_argument("--chart", default="<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 10 10'><title>fake &lt;chart&gt;</title><rect width='10' height='10' fill='#0072B2'/></svg>")
parser.add_argument("--finding", default="fake finding for {lab} at {n} ranks")
parser.add_argument("command")
parser.add_argument("lab")
parser.add_argument("--world-size", type=int, required=True)
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
parser.add_argument("--json", action="store_true")
args = parser.parse_args()
assert args.command == "run" and args.json


def log(line: str) -> None:
    if args.log:
        with open(args.log, "a", encoding="utf-8") as out:
            out.write(line + "\n")


log(f"start {args.lab} {os.getpid()} {time.time()}")
if args.child:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    log(f"child {child.pid}")
print("launching 2 ranks ...", file=sys.stderr, flush=True)
time.sleep(args.sleep)
if args.fail:
    print("Traceback (most recent call last):\nRuntimeError: rank 1 exploded", file=sys.stderr)
    log(f"end {args.lab} {os.getpid()} {time.time()}")
    sys.exit(args.fail)
holds = args.holds == "yes"
print(json.dumps({
    "lab": args.lab,
    "title": "Fake",
    "claim": "A fake claim.",
    "holds": holds,
    "finding": args.finding.format(lab=args.lab, n=args.world_size),
    "reasons": ["fake reason"],
    "table": {"columns": ["part", "bytes"], "rows": [["params", 240384], ["grads", 120192]]},
    "charts": {"memory": args.chart},
    "measurements": {},
    "config": {"world_size": args.world_size, "device": "cuda:0" if args.device == "cuda" else "cpu",
               "torch_version": "fake", **({"gpu_name": "Fake GPU", "cuda_version": "13.0"} if args.device == "cuda" else {})},
    "duration_s": args.sleep,
}))
log(f"end {args.lab} {os.getpid()} {time.time()}")
sys.exit(0 if holds else 1)
