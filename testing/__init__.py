"""Harness code shared by the tests, the benchmarks and scripts/soak.py; not part of the product packages
(not installed by `pip install .`).

    testing.launch    start `python -m server` (or a peer server) as a child process and wait until it serves
    testing.closedloop  the one closed-loop driver (threads or coroutines) and the one percentile function
    testing.loadgen   a bounded, checked load generator against a running server (soak script, reliability tests)
    testing.offline   reference greedy decoding on a decoder graph (no engine, no batching)
    testing.tls       a self-signed certificate for TLS tests
"""
