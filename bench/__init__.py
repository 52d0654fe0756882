"""The benchmark suite behind ``make bench``: every figure measured beside its baseline.

Layer: benchmark (never imported by the services or the tests of the product). ``python -m
bench`` starts the daemons as child processes, measures, and writes bench/results/latest.json,
docs/benchmarks.md and docs/benchmarks.png. ``bench.naive_fit`` is the deliberately naive fit
the real one is compared with.
"""
