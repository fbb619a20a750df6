"""The structured-output tests' decoder: a random Qwen2-shaped model (transformers) with a given tokenizer, exported
by the command line as a user would (tests/hf_decoder_export.py)."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tests.hf_decoder_export import export_hf_decoder


def qwen2_repository(tokenizer_dir: Path, root: Path, name: str, context: int = 1024) -> Path:
    """root/"repo" holding `name`: hf_qwen2's model exported."""
    return export_hf_decoder(hf_qwen2(tokenizer_dir, context), name, tokenizer_dir, root)


def hf_qwen2(tokenizer_dir: Path, context: int = 1024):
    """Qwen2ForCausalLM (2 layers, width 64, random weights, seed 7) whose vocabulary and end of text are
    tokenizer_dir's."""
    import torch
    import transformers

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    cfg = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                   max_position_embeddings=context, initializer_range=0.2, bos_token_id=eot,
                                   eos_token_id=eot, rope_theta=10000.0, tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(7)
    return transformers.Qwen2ForCausalLM(cfg).eval()
