"""Small random encoder-decoder checkpoints for tests: Hugging Face Marian / BART / T5 models built by
`transformers` itself from small configs (no hub downloads) and written with `save_pretrained`, plus a
character-level tokenizer.json (lowercased letters, digits and punctuation, `</s>` appended to every source),
i.e. what a user brings. Shared by the export tests and the serving tests.

    path = write_checkpoint("t5-gated", tmp_dir)        # an HF checkpoint directory
    model = hf_model("t5-gated")                       # the same weights as a transformers model (eval, eager)

Every family uses pad 0, eos 1, unk 2 (BART: bos 0, pad 1, eos 2, unk 3: its own convention), so the tokenizer's
special tokens are the model's. "marian-two-vocabs" has a separate target vocabulary of 45 ids and ships a
`target_tokenizer.json` (tokens p0..p44 with the specials at their ids).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'-")   # 44 symbols
_SMALL = dict(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
              dropout=0.0, init_std=0.2)
_T5 = dict(vocab_size=60, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
           relative_attention_max_distance=12, dropout_rate=0.0, initializer_factor=1.0, pad_token_id=0,
           eos_token_id=1, decoder_start_token_id=0)
_MARIAN_IDS = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
_BART_IDS = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)

# name -> (transformers config class, model class, config kwargs, special tokens {id: token})
MODELS: dict[str, tuple[str, str, dict[str, Any], dict[int, str]]] = {
    # The original Transformer as the g2p model uses it: sqrt(d) embeddings, relu, tied head, HF's forced eos.
    "marian": ("MarianConfig", "MarianMTModel", dict(scale_embedding=True, activation_function="relu",
                                                      forced_eos_token_id=1, **_MARIAN_IDS, **_SMALL),
               {0: "<pad>", 1: "</s>", 2: "<unk>"}),
    # Separate source / target vocabularies (decoder + head 45 rows), gelu; no forced eos.
    "marian-two-vocabs": ("MarianConfig", "MarianMTModel",
                          dict(decoder_vocab_size=45, share_encoder_decoder_embeddings=False,
                               forced_eos_token_id=None, **_MARIAN_IDS, **_SMALL),
                          {0: "<pad>", 1: "</s>", 2: "<unk>"}),
    # Untied head, encoder heads of 10 channels and decoder heads of 15 (padded to 16 in the package).
    "marian-odd-heads": ("MarianConfig", "MarianMTModel",
                         dict(tie_word_embeddings=False, forced_eos_token_id=1, **_MARIAN_IDS,
                              **{**_SMALL, "d_model": 30, "encoder_attention_heads": 3, "decoder_attention_heads": 2}),
                         {0: "<pad>", 1: "</s>", 2: "<unk>"}),
    "bart": ("BartConfig", "BartForConditionalGeneration", dict(**_BART_IDS, **_SMALL),
             {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}),
    "t5": ("T5Config", "T5ForConditionalGeneration", dict(**_T5), {0: "<pad>", 1: "</s>", 2: "<unk>"}),
    # T5 v1.1 / Flan: gated-GELU, untied head (no output scaling), d_kv 6 (padded to 16), inner width 24 != 32.
    "t5-gated": ("T5Config", "T5ForConditionalGeneration",
                 dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **{**_T5, "d_kv": 6}),
                 {0: "<pad>", 1: "</s>", 2: "<unk>"}),
}


def hf_model(name: str, seed: int = 1):
    """The transformers model of `name` (eval mode, eager attention), weights from `seed`."""
    import torch
    import transformers

    cfg_cls, model_cls, kw, _ = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(cfg).eval()


def char_tokenizer(specials: dict[int, str], vocab_size: int, eos: str = "</s>"):
    """Characters after the special tokens (ids beyond the characters, up to vocab_size, are never produced)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {tok: i for i, tok in specials.items()}
    for ch in CHARS:
        if len(vocab) >= vocab_size:
            break
        vocab[ch] = len(vocab)
    unk = next(t for t in specials.values() if "unk" in t)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split(Regex("."), "isolated")])
    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, vocab[eos])])
    tok.add_special_tokens(list(specials.values()))
    return tok


def target_tokenizer(specials: dict[int, str], vocab_size: int):
    """Tokens p{id} (whitespace-separated) for a separate target vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in specials.items()}
    for i in range(vocab_size):
        if i not in specials:
            vocab[f"p{i}"] = i
    unk = next(t for t in specials.values() if "unk" in t)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(specials.values()))
    return tok


def write_checkpoint(name: str, out: Path, seed: int = 1) -> Path:
    """save_pretrained of hf_model(name) + tokenizer.json (+ target_tokenizer.json for two vocabularies)."""
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()   # "Writing model shards" bars in every test's stderr
    out = Path(out)
    model = hf_model(name, seed)
    model.save_pretrained(out)
    _, _, kw, specials = MODELS[name]
    char_tokenizer(specials, kw["vocab_size"]).save(str(out / "tokenizer.json"))
    keys = {"<pad>": "pad_token", "</s>": "eos_token", "<unk>": "unk_token", "<s>": "bos_token"}
    (out / "tokenizer_config.json").write_text(json.dumps({keys[t]: t for t in specials.values()}))
    if kw.get("decoder_vocab_size"):
        target_tokenizer(specials, kw["decoder_vocab_size"]).save(str(out / "target_tokenizer.json"))
    return out


def export_repository(root: Path, names: list[str] | tuple[str, ...] = tuple(MODELS), seed: int = 1,
                      write=None) -> dict[str, Path]:
    """Checkpoints of `names` written under root/checkpoints (by `write`, this module's write_checkpoint unless
    another's) and exported (parity gate included) into the model repository root/repo, version 1 each: name ->
    package directory. ~1-3 s per model on 2 cores."""
    import torch

    from export import ExportConfig, export_checkpoint

    root = Path(root)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: export_checkpoint(ExportConfig(
            checkpoint=(write or write_checkpoint)(name, root / "checkpoints" / name, seed), task="generate",
            repository=root / "repo", name=name)).package_dir for name in names}
    finally:
        torch.set_num_threads(before)
