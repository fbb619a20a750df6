"""Random tiny transformers Llama-family decoders (Llama 3 and the other rope scalings, Qwen3, SmolLM3, Phi-3): the
references of tests/export/test_llama_family_rope.py and the fp16 CUDA check of tests/e2e/grpc/test_server_gpu_families.py."""
from __future__ import annotations

from typing import Any

import torch
import transformers

VOCAB = 300
SIZES = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, max_position_embeddings=64, initializer_range=0.2, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
ROPE = dict(rope_theta=10000.0)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": ("Llama", dict(rope_parameters=dict(ROPE, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                  high_freq_factor=4.0, original_max_position_embeddings=16))),
    "yarn": ("Llama", dict(rope_parameters=dict(ROPE, rope_type="yarn", factor=4.0,
                                                original_max_position_embeddings=16))),
    "linear": ("Llama", dict(rope_parameters=dict(ROPE, rope_type="linear", factor=4.0))),
    "dynamic": ("Llama", dict(rope_parameters=dict(ROPE, rope_type="dynamic", factor=4.0))),
    "qwen3": ("Qwen3", dict(head_dim=32, tie_word_embeddings=True)),     # head_dim != hidden / heads
    "smollm3": ("SmolLM3", dict(no_rope_layer_interval=2)),             # layer 1 has no rotary
    "phi3": ("Phi3", dict(original_max_position_embeddings=64, sliding_window=12)),   # a query sees 12 keys
    # head 32, rotary on its first 16 channels; longrope's short factors (package <= original length)
    "phi3-partial-longrope": ("Phi3", dict(hidden_size=128, original_max_position_embeddings=64, rope_parameters=dict(
        ROPE, rope_type="longrope", partial_rotary_factor=0.5, short_factor=[1.0 + 0.1 * i for i in range(8)],
        long_factor=[2.0 + 0.3 * i for i in range(8)], attention_factor=1.2))),
}
EXPORTED = ("llama3", "qwen3", "smollm3", "phi3", "phi3-partial-longrope")


def hf_model(name: str, **change: Any):
    family, extra = FAMILIES[name]
    cfg = getattr(transformers, f"{family}Config")(**{**SIZES, **extra, **change})
    cfg._attn_implementation = "eager"
    torch.manual_seed(5)
    return getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
