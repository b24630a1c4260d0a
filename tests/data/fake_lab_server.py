"""A stand-in for `sharding-lab serve-labs` in the lab-server tests: answers each request line with a
fake run, or misbehaves on request.

    fake_lab_server.py [--sleep S] [--child] [--die-after N] [--leader-exits-after N] [--error-for LAB] [--log FILE]
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--child", action="store_true", help="spawn a long-lived grandchild, like the ranks")
parser.add_argument("--die-after", type=int, default=-1, help="exit 3 on this request (0-based) without answering")
parser.add_argument("--leader-exits-after", type=int, default=-1,
                    help="after answering this many requests, end the main thread while another lives on for 5 s: "
                         "a process killed outright, its main thread gone, its last thread not yet, so not reapable")
parser.add_argument("--error-for", default="")
parser.add_argument("--log")  # appends "start PID" and "child PID" lines
args = parser.parse_args()


def log(line: str) -> None:
    if args.log:
        with open(args.log, "a", encoding="utf-8") as out:
            out.write(line + "\n")


log(f"start {os.getpid()}")
if args.child:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    log(f"child {child.pid}")
for index, line in enumerate(sys.stdin):
    request = json.loads(line)
    print(f"request {index}: {request['lab']}", file=sys.stderr, flush=True)
    if index == args.die_after:
        sys.exit(3)
    time.sleep(args.sleep)
    if request["lab"] == args.error_for:
        answer = {"error": "rank 1 failed: process died without reporting (killed by signal 9)"}
    else:
        answer = {"result": {"lab": request["lab"], "title": "Fake", "claim": "A fake claim.", "holds": True,
                             "finding": f"served by {os.getpid()}", "reasons": [], "table": {"columns": [], "rows": []},
                             "charts": {}, "measurements": {}, "config": {"world_size": request["world_size"], "device": request.get("device")},
                             "duration_s": args.sleep}}
    print(json.dumps(answer), flush=True)
    if index + 1 == args.leader_exits_after:
        threading.Thread(target=time.sleep, args=(5,)).start()
        ctypes.CDLL(None).pthread_exit(None)
