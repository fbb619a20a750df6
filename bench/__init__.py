"""Benchmark suite: `python -m bench --out bench/results [--only encoder,decoder,server,peer] [--quick]`.

Each piece (encoder, decoder, server, peer) writes `<out>/<piece>.json`; the report (docs/BENCHMARKS.md and
docs/bench/*.png) is regenerated from whatever JSON files are in `<out>`.
"""
