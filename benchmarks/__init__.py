"""Benchmarks for `make bench`: each bench_*.py module has `run() -> list[Figure]`."""
