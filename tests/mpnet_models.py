"""Small random MPNet checkpoints saved by `transformers` (what a user brings), for the export and serving tests.

The tokenizer is a WordPiece vocabulary trained here with `tokenizers` on the tiny corpus and saved by transformers'
MPNetTokenizer, in the released layout: <s> <pad> </s> [UNK] <mask> first (the pad token id 1, which MPNet's
positions count from), lower-cased BERT normalizer, pairs as `<s> A </s></s> B </s>` and no token types. The model:
hidden 32, 4 heads, 2 layers, 160 positions so that texts reach relative distances past every bucket boundary (8 exact
buckets, then logarithmic to 128), initializer_range 0.2 (HF: 0.02) so a random head separates inputs clearly.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tests.family_models import hf_feeds, save_transformers_checkpoints

LABELS = ["contradiction", "entailment", "neutral"]
TAGS = ["O", "B-X", "I-X"]
HF_CLASSES = {"classify": "MPNetForSequenceClassification", "fill-mask": "MPNetForMaskedLM",
              "token-classify": "MPNetForTokenClassification", "embed": "MPNetModel"}
SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
TEXTS = ["Now is the winter of our discontent made glorious summer by this sun of York",
         "A horse! a horse! my kingdom for a horse!", "To be",
         "the king sat on his throne in the old castle"]
# A long text: over 130 tokens, so keys sit farther than MAX_DISTANCE (128) from their query.
LONG = " ".join(["the king sat on his throne in the old castle and the queen spoke to him of the winter"] * 5)


def wordpiece_tokenizer(dest: Path, vocab_size: int = 400):
    """A WordPiece vocabulary trained on the tiny corpus, saved to `dest` by transformers' MPNetTokenizer (returned)."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from tests.conftest import tiny_corpus

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(tiny_corpus(), trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=1,
                                                                 special_tokens=SPECIALS))
    fast = transformers.MPNetTokenizer(vocab=tok.get_vocab(), unk_token="[UNK]")
    assert [fast.convert_tokens_to_ids(t) for t in SPECIALS[:3]] == [0, 1, 2]
    fast.save_pretrained(dest)
    return fast


def hf_config(vocab_size: int, **extra: Any):
    import transformers

    return transformers.MPNetConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=162, layer_norm_eps=1e-5, initializer_range=0.2, **extra)


def build_checkpoints(root: Path) -> dict[str, Path]:
    """One transformers-saved checkpoint per HF_CLASSES key with the tokenizer's files."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = wordpiece_tokenizer(root / "tok")
    heads: dict[str, dict[str, Any]] = {"classify": {"id2label": dict(enumerate(LABELS))},
                                        "token-classify": {"id2label": dict(enumerate(TAGS))}}
    return save_transformers_checkpoints(root, HF_CLASSES, hf_config, tokenizer, heads)


def hf_outputs(ckpt: Path, task: str, feeds: dict[str, Any]):
    """transformers' answer: logits, or the last hidden state for "embed"."""
    import torch
    import transformers

    with torch.no_grad():
        out = getattr(transformers, HF_CLASSES[task]).from_pretrained(ckpt).eval()(**feeds)
    return out.last_hidden_state if task == "embed" else out.logits


def save_sentence_transformer(base: Path, dest: Path) -> Path:
    """all-mpnet-base-v2's module stack over `base`: Transformer -> Pooling(mean) -> Normalize, saved by
    sentence-transformers itself."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    word = Transformer(str(base))
    modules = [word, Pooling(word.get_embedding_dimension(), "mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(dest))
    return dest
