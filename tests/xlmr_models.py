"""Small random XLM-RoBERTa checkpoints saved by `transformers` (what a user brings), for the export and serving tests.

The tokenizer is a SentencePiece-style Unigram trained here with `tokenizers` on the tiny corpus, in
XLMRobertaTokenizerFast's layout: <s> <pad> </s> <unk> ... <mask>, Metaspace, pairs as `<s> A </s></s> B </s>` and
no token types. The model: hidden 32, 2 layers, one token type, initializer_range 0.2 (HF: 0.02) so that a random
head separates inputs clearly and agreement means something.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tests.family_models import hf_feeds, save_transformers_checkpoints

LABELS = ["contradiction", "entailment", "neutral"]
TAGS = ["O", "B-X", "I-X"]
HF_CLASSES = {"classify": "XLMRobertaForSequenceClassification", "fill-mask": "XLMRobertaForMaskedLM",
              "token-classify": "XLMRobertaForTokenClassification", "embed": "XLMRobertaModel",
              "rerank": "XLMRobertaForSequenceClassification"}


def unigram_tokenizer(dest: Path, vocab_size: int = 300, texts: list[str] | None = None):
    """A Unigram model with XLM-R's normalizer, Metaspace pre-tokenizer, special tokens and template, trained on
    `texts` (default: the tiny corpus), saved to `dest` by transformers' XLMRobertaTokenizerFast (returned)."""
    import transformers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    from tests.conftest import tiny_corpus

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(texts or tiny_corpus(), trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    fast = transformers.XLMRobertaTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    fast.save_pretrained(dest)
    return fast


def hf_config(vocab_size: int, **extra: Any):
    import transformers

    return transformers.XLMRobertaConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1,
        layer_norm_eps=1e-5, initializer_range=0.2, **extra)


def build_checkpoints(root: Path) -> dict[str, Path]:
    """One transformers-saved checkpoint per HF_CLASSES key with the tokenizer's files: "classify" an NLI-shaped
    three-label head (LABELS), "rerank" a one-label cross-encoder head, "token-classify" TAGS."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = unigram_tokenizer(root / "tok")
    heads: dict[str, dict[str, Any]] = {"classify": {"id2label": dict(enumerate(LABELS))},
                                        "rerank": {"id2label": {0: "relevance"}},
                                        "token-classify": {"id2label": dict(enumerate(TAGS))}}
    return save_transformers_checkpoints(root, HF_CLASSES, hf_config, tokenizer, heads)


def hf_model(ckpt: Path, task: str):
    import transformers

    return getattr(transformers, HF_CLASSES[task]).from_pretrained(ckpt).eval()
