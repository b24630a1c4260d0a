"""`make bench`: every benchmark in one run, each figure beside its target; exits 1 when a target is
missed, naming each one missed (`python -m benchmarks labs app` runs only those benchmarks)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import benchmarks


def main() -> int:
    only = set(sys.argv[1:])
    names = sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name.startswith("bench_"))
    rows = []
    for name in names:
        if only and name.removeprefix("bench_") not in only:
            continue
        print(f"running {name} ...", flush=True)
        started = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        figures = module.run()
        print(f"  done in {time.perf_counter() - started:.1f} s", flush=True)
        rows.extend(figures)
    print()
    print(f"{'figure':<62} {'value':>12}  {'target':<10} met")
    for f in rows:
        met = {True: "yes", False: "NO", None: "-"}[f.met]
        print(f"{f.name:<62} {f.value:>10.3f} {f.unit:<3} {f.target:<10} {met}")
        if f.detail:
            print(f"    {f.detail}")
    missed = [f for f in rows if f.met is False]
    if missed:
        print(f"\n{len(missed)} target(s) missed:", file=sys.stderr)
        for f in missed:
            print(f"  {f.name}: {f.value:.3f} {f.unit}, target {f.target}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
