"""Small random translation checkpoints for tests: Hugging Face M2M100 (NLLB's architecture) and mBART models built
by `transformers` itself from small configs (no hub downloads), written with `save_pretrained` beside a
character-level tokenizer.json whose special added tokens include language tokens, spelled as each family's own
tokenizer spells them, with the source language put before the text and </s> after it (as M2M100Tokenizer,
NllbTokenizer and MBart50Tokenizer do):

    m2m100:  __en__ __fr__ __de__      (source __en__)
    nllb:    eng_Latn fra_Latn deu_Latn (source eng_Latn; M2M100's architecture)
    mbart:   en_XX fr_XX de_DE          (source en_XX)

Ids: <s> 0, <pad> 1, </s> 2, <unk> 3 (fairseq's), the characters next, the language tokens after them.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from testing.seq2seq_checkpoints import char_tokenizer

SPECIALS = {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}
_SMALL = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=40,
              dropout=0.0, attention_dropout=0.0, init_std=0.2, bos_token_id=0, pad_token_id=1, eos_token_id=2,
              decoder_start_token_id=2)

# name -> (transformers config class, model class, config kwargs, language tokens (the first is the source's))
MODELS: dict[str, tuple[str, str, dict[str, Any], tuple[str, ...]]] = {
    "m2m100": ("M2M100Config", "M2M100ForConditionalGeneration", dict(_SMALL), ("__en__", "__fr__", "__de__")),
    "nllb": ("M2M100Config", "M2M100ForConditionalGeneration", dict(_SMALL), ("eng_Latn", "fra_Latn", "deu_Latn")),
    # mBART-50's released configs: scaled embeddings, forced eos; a final_logits_bias of its own is set below.
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", dict(scale_embedding=True, forced_eos_token_id=2,
                                                                   **_SMALL), ("en_XX", "fr_XX", "de_DE")),
}


def hf_model(name: str, seed: int = 1):
    """The transformers model of `name` (eval mode, eager attention), weights from `seed`."""
    import torch
    import transformers

    cfg_cls, model_cls, kw, _ = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).eval()
    if hasattr(model, "final_logits_bias"):
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 0.5)
    return model


def tokenizer(name: str, source: str | None = None):
    """The characters' tokenizer with the family's language tokens; a source is `<source language> text </s>`,
    the source language the family's first unless `source` names another (as NllbTokenizer(src_lang=...))."""
    from tokenizers import AddedToken, processors

    _, _, kw, languages = MODELS[name]
    tok = char_tokenizer(SPECIALS, kw["vocab_size"])
    tok.add_special_tokens([AddedToken(lang, special=True, normalized=False) for lang in languages])
    src = source or languages[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{src} $A </s>", special_tokens=[(src, tok.token_to_id(src)), ("</s>", 2)])
    return tok


def language_id(name: str, language: str) -> int:
    return int(tokenizer(name).token_to_id(language))


def write_checkpoint(name: str, out: Path, seed: int = 1) -> Path:
    """save_pretrained of hf_model(name) + tokenizer.json + tokenizer_config.json."""
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    out = Path(out)
    hf_model(name, seed).save_pretrained(out)
    tokenizer(name).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
         "src_lang": MODELS[name][3][0], "additional_special_tokens": list(MODELS[name][3])}))
    return out


def export_repository(root: Path, names: tuple[str, ...] = tuple(MODELS), seed: int = 1) -> dict[str, Path]:
    """Checkpoints of `names` written under root/checkpoints and exported (parity gate included) into the model
    repository root/repo, version 1 each: name -> package directory."""
    from testing import seq2seq_checkpoints

    return seq2seq_checkpoints.export_repository(root, names, seed, write=write_checkpoint)
