"""Tiny DeBERTa-v2 / v3 checkpoints as a user brings them: random `transformers` models saved with save_pretrained,
beside a DeBERTa-v3-style tokenizer.json (a sentencepiece Unigram with [PAD] [CLS] [SEP] [UNK] [MASK], Metaspace,
pairs as `[CLS] A [SEP] B [SEP]` with type ids 0 / 1) trained with `tokenizers` on the tiny corpus.

Sizes keep the tests fast (hidden 64, 2 layers, vocab ~300) while exercising what makes the family: 8 position
buckets with max_position_embeddings 64, so test sentences (30-60 tokens) reach the logarithmic buckets and the
clipped ends of the relative table."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
LABELS = ["contradiction", "entailment", "neutral"]
MAX_POSITIONS = 64


def unigram_tokenizer(out: Path, vocab_size: int = 300, texts: list[str] | None = None,
                      max_length: int = MAX_POSITIONS) -> Path:
    """tokenizer.json + tokenizer_config.json in `out` (created), trained on `texts` (default: the tiny corpus);
    returns `out`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from tests.conftest import tiny_corpus

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("``", '"')])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token="[UNK]",
                                      max_piece_length=8)
    tok.train_from_iterator(texts or tiny_corpus(), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "DebertaV2Tokenizer", "model_max_length": max_length,
              **{f"{k}_token": t for k, t in zip(("pad", "cls", "sep", "unk", "mask"), SPECIALS)}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out


def hf_config(vocab_size: int, **overrides: Any):
    """A DeBERTa-v3-shaped config (relative positions only, shared keys, LayerNormed distance table, no token
    types); `overrides` make the v2 shapes (absolute positions, token types, separate position projections, conv).
    initializer_range 0.2: a random head then separates inputs clearly, so agreement means something."""
    import transformers

    base = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=MAX_POSITIONS, initializer_range=0.2,
                relative_attention=True, position_buckets=8, max_relative_positions=-1,
                pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
                share_att_key=True, type_vocab_size=0, pad_token_id=0, hidden_act="gelu")
    base.update(overrides)
    return transformers.DebertaV2Config(**base)


V2_SHAPE = dict(position_biased_input=True, type_vocab_size=2, share_att_key=False, pos_att_type="c2p|p2c",
                norm_rel_ebd="none", position_buckets=-1, max_relative_positions=16, conv_kernel_size=3)


def train_classifier(model: Any, tokenizer_dir: Path, steps: int = 40) -> None:
    """Full-batch AdamW steps of transformers' classifier on the export gate's own held-out texts with made-up labels
    (text i -> label i mod 3), so the logits the int8 gate compares have real margins: top-1 agreement on a
    random head's near ties is a coin toss."""
    import torch

    from export.heldout import BUILTIN_TEXTS

    texts = list(BUILTIN_TEXTS)
    feeds = pair_feeds(tokenizer_dir, [(t, None) for t in texts], limit=MAX_POSITIONS)
    labels = torch.arange(len(texts)) % 3
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=feeds["input_ids"], attention_mask=feeds["attention_mask"], labels=labels).loss.backward()
        opt.step()
    model.eval()


def pair_feeds(ckpt: Path, pairs: list[tuple[str, str | None]], mask_every: int = 0,
               limit: int | None = None) -> dict[str, Any]:
    """A right-padded batch (torch tensors) of texts or pairs from the checkpoint's tokenizer.json (type ids 0 / 1),
    as the server builds it; mask_every=k puts [MASK] at every k-th inner position; limit cuts the columns."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    encs = [tok.encode(a, b) if b else tok.encode(a) for a, b in pairs]
    n = max(len(e.ids) for e in encs)
    ids = torch.zeros((len(encs), n), dtype=torch.long)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, :len(e.ids)], mask[i, :len(e.ids)], types[i, :len(e.ids)] = (
            torch.tensor(e.ids), 1, torch.tensor(e.type_ids))
        if mask_every:
            ids[i, 1:len(e.ids) - 1:mask_every] = tok.token_to_id("[MASK]")
    return {"input_ids": ids[:, :limit], "attention_mask": mask[:, :limit], "token_type_ids": types[:, :limit]}


def save_checkpoint(out: Path, cls_name: str, tokenizer_dir: Path, seed: int = 0, train_steps: int = 0,
                    **overrides: Any) -> Path:
    """transformers' `cls_name` (DebertaV2ForSequenceClassification, ...) from hf_config(**overrides), saved
    with its tokenizer files; classifiers get LABELS (and `train_steps` of train_classifier)."""
    import torch
    import transformers

    logging.getLogger("transformers").setLevel(logging.ERROR)
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"]
    if "Classification" in cls_name:
        overrides.setdefault("id2label", dict(enumerate(LABELS)))
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(hf_config(len(vocab), **overrides)).eval()
    if train_steps:
        train_classifier(model, tokenizer_dir, train_steps)
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out
