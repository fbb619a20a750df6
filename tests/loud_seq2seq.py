"""Random encoder-decoders whose activations are large (init std 1.0: logits of +-25), for the tests of the fp32
gate's float-noise tolerance (export/parity_noise.py): transformers' own fp32 result differs from its fp64 result
on them by far more than the gate's fixed bound, which refused their exact exports before. The small test models
of testing/seq2seq_checkpoints.py at width 64 with a larger init; checkpoints written by `transformers` itself."""
from __future__ import annotations

from pathlib import Path

from testing import seq2seq_checkpoints as sc

# name -> (testing/seq2seq_checkpoints.py model, config changes)
LOUD = {
    "marian-loud": ("marian", dict(d_model=64, init_std=1.0)),
    "bart-loud": ("bart", dict(d_model=64, init_std=1.0)),
    # T5 initializes from initializer_factor (x d_model^-0.5 and the like): 3.0 gives logits of the same size
    "t5-loud": ("t5", dict(d_model=64, d_kv=16, initializer_factor=3.0)),
}


def register() -> None:
    """Adds the LOUD models to testing.seq2seq_checkpoints.MODELS, so its write_checkpoint / hf_model build them."""
    for name, (base, changes) in LOUD.items():
        cls, model_cls, kwargs, specials = sc.MODELS[base]
        sc.MODELS.setdefault(name, (cls, model_cls, {**kwargs, **changes}, specials))


def write_loud_checkpoint(name: str, out: Path) -> Path:
    register()
    return sc.write_checkpoint(name, out)
