"""Harness code shared by the tests, the benchmarks and scripts/soak.py; not part of the product packages
(not installed by `pip install .`).

    testing.launch    start `python -m server` as a child process and wait until it serves
    testing.offline   reference greedy decoding on a decoder graph (no engine, no batching)
"""
