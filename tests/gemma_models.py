"""Random tiny transformers Gemma 2 / Gemma 3 text models, the references of tests/export/test_gemma_export.py and
tests/e2e/grpc/test_gemma_serving.py: both layer kinds, a window prompts run past, caps small enough to bite."""
from __future__ import annotations

import torch
import transformers

VOCAB, WINDOW, MAX = 300, 8, 64
FINAL_CAP, ATTN_CAP = 4.0, 1.5
KINDS = ("gemma2", "gemma3")


def hf_gemma(kind: str, vocab: int = VOCAB, **extra):
    """A random transformers Gemma: layers alternate sliding / full, norm weights drawn (transformers starts them
    at 0, which would hide a wrong (1 + w)), caps small enough that they change the answers."""
    sizes = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16,
                 intermediate_size=128, max_position_embeddings=MAX, sliding_window=WINDOW, initializer_range=0.2,
                 query_pre_attn_scalar=24, final_logit_softcapping=FINAL_CAP, bos_token_id=2, eos_token_id=1,
                 pad_token_id=0)
    if kind == "gemma2":
        sizes.update(num_key_value_heads=2, attn_logit_softcapping=ATTN_CAP)
        sizes.update(extra)
        cfg, cls = transformers.Gemma2Config(**sizes), transformers.Gemma2ForCausalLM
    else:   # one kv head; distinct rotary bases per layer kind
        sizes.update(num_key_value_heads=1, sliding_window_pattern=2, rope_theta=5000.0, rope_local_base_freq=100.0)
        sizes.update(extra)
        cfg, cls = transformers.Gemma3TextConfig(**sizes), transformers.Gemma3ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(11)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    return model
