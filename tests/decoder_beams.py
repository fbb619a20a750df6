"""The decoder-only beam tests' models and reference: random `transformers` GPT-2 / Llama checkpoints, and
transformers' own `generate(num_beams=4)` answers and hypothesis scores."""
from __future__ import annotations

import numpy as np
import torch

NEW = 8


def hf_decoder(kind: str, vocab: int, eot: int):
    """A random GPT-2 or Llama (2 layers, width 64, seed 11, initializer range 0.2: logits with margins) whose
    vocabulary and end of text are the caller's."""
    import transformers

    torch.manual_seed(11)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                      initializer_range=0.2, bos_token_id=eot, eos_token_id=eot)
        cfg._attn_implementation = "eager"
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128,
                                   initializer_range=0.2, bos_token_id=eot, eos_token_id=eot, rope_theta=10000.0,
                                   tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg).eval()


def transformers_beams(hf, ids: list[int], n: int, length_penalty: float = 1.0) -> list[tuple[list[int], float]]:
    """transformers' n best hypotheses of a 4-beam search: new ids up to (and with) eos, and sequences_scores."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), num_beams=4, num_return_sequences=n, max_new_tokens=NEW,
                          do_sample=False, length_penalty=length_penalty, output_scores=True,
                          return_dict_in_generate=True, pad_token_id=hf.config.eos_token_id)
    eos, answers = hf.config.eos_token_id, []
    for row, score in zip(out.sequences[:, len(ids):].tolist(), out.sequences_scores.tolist()):
        answers.append((row[:row.index(eos) + 1] if eos in row else row, score))
    return answers


def beam_score(logprobs: list[float], length_penalty: float = 1.0) -> float:
    """transformers' hypothesis score from its tokens' logprobs: a float32 running sum / length ** penalty."""
    total = np.float32(0)
    for lp in logprobs:
        total = np.float32(total + np.float32(lp))
    return float(total / np.float32(len(logprobs) ** length_penalty))
