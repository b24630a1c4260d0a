"""`make run` is the README's one command for the app: options reach `studyapp serve` through ARGS
(a taken port 5000 says "choose another with --port", which `make run` alone could not pass on)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_make_run_passes_args_to_serve() -> None:
    # Under `make test` this is a sub-make: without --no-print-directory it says "make[1]: Leaving ...".
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "-n", "--no-print-directory", "run", "ARGS=--port 5001 --host 0.0.0.0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[-1] == ".venv/bin/studyapp serve --port 5001 --host 0.0.0.0"
