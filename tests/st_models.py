"""sentence-transformers models built for the tests with the library's own modules over a tiny local encoder and
saved with `SentenceTransformer.save` (the layout sentence-transformers 6 writes)."""
from __future__ import annotations

from pathlib import Path

PROMPTS = {"query": "query: ", "passage": "passage of text: "}


def save_st(base: Path, dest: Path, modes, dense: bool = True, normalize: bool = True, **kwargs) -> Path:
    """Transformer(base) + Pooling(modes) [+ Dense(pooled -> 32, tanh)] [+ Normalize]; kwargs go to
    SentenceTransformer (prompts, default_prompt_name)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    torch.manual_seed(0)
    parts = [models.Transformer(str(base))]
    parts.append(models.Pooling(parts[0].get_embedding_dimension(), pooling_mode=modes))
    if dense:
        parts.append(models.Dense(parts[1].get_embedding_dimension(), 32, activation_function=torch.nn.Tanh()))
    if normalize:
        parts.append(models.Normalize())
    SentenceTransformer(modules=parts, device="cpu", **kwargs).save(str(dest))
    return dest
