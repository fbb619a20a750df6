"""Benchmarks, every one through one entry point: `python -m bench NAME [options]` (bench/harness.py, bench/README.md).

`python -m bench suite --out bench/results` runs ortserve's own suite (encoder, decoder, server, peer: each writes
`<out>/<piece>.json`; the report, docs/BENCHMARKS.md and docs/bench/*.png, is regenerated from those files).
"""
