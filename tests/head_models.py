"""Random tiny sequence-classification heads built by transformers (save_pretrained) with the tiny trained tokenizers
(tests/conftest.py family_tokenizers): the checkpoints of the head-activation and zero-shot tests.

    multi-label   BERT, 4 labels, problem_type multi_label_classification (sigmoid per label)
    regression    BERT, 1 label, problem_type regression (the logit itself)
    nli-bert      BERT, id2label {0: contradiction, 1: neutral, 2: entailment} (zero-shot)
    nli-roberta   RoBERTa, the same label map
    ce-identity   BERT, 1 label, a sentence-transformers CrossEncoder saved with activation_fn Identity

initializer_range 0.2 (HF: 0.02): logits spread over several units, so softmax, sigmoid and the raw logits differ
clearly and a wrong activation cannot pass for the right one.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MULTI_LABELS = ["anger", "joy", "fear", "surprise"]
NLI = {0: "contradiction", 1: "neutral", 2: "entailment"}


def _config(family: str, vocab: int, **extra: Any):
    import transformers

    pad = 1 if family == "roberta" else 0
    small = dict(vocab_size=vocab, pad_token_id=pad, max_position_embeddings=64, initializer_range=0.2,
                 hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **extra)
    if family == "roberta":
        return transformers.RobertaConfig(bos_token_id=0, eos_token_id=2, **small)
    return transformers.BertConfig(**small)


def _vocab(tok_dir: Path) -> int:
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    return len(tok["model"]["vocab"]) + sum(1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"])


def _save(model, tok_dir: Path, out: Path) -> Path:
    model.eval().save_pretrained(out)
    for f in tok_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def build_heads(root: Path) -> dict[str, Path]:
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from tests.conftest import family_tokenizers

    toks = family_tokenizers(root / "tokenizers")
    torch.manual_seed(0)
    labels = dict(enumerate(MULTI_LABELS))
    specs = {
        "multi-label": ("bert", dict(id2label=labels, label2id={v: k for k, v in labels.items()},
                                     problem_type="multi_label_classification")),
        "regression": ("bert", dict(id2label={0: "LABEL_0"}, problem_type="regression")),
        "nli-bert": ("bert", dict(id2label=NLI, label2id={v: k for k, v in NLI.items()})),
        "nli-roberta": ("roberta", dict(id2label=NLI, label2id={v: k for k, v in NLI.items()})),
        "ce-identity": ("bert", dict(id2label={0: "LABEL_0"})),
    }
    out = {}
    for name, (family, extra) in specs.items():
        tok_dir = toks["roberta" if family == "roberta" else "wordpiece"]
        cls = transformers.RobertaForSequenceClassification if family == "roberta" else \
            transformers.BertForSequenceClassification
        out[name] = _save(cls(_config(family, _vocab(tok_dir), **extra)), tok_dir, root / name)
    # sentence-transformers' own save writes the activation where it reads it back (config_sentence_transformers.json)
    ce = CrossEncoder(str(out["ce-identity"]), activation_fn=torch.nn.Identity(), device="cpu")
    ce.save(str(out["ce-identity"]))
    return out


__all__ = ["MULTI_LABELS", "NLI", "build_heads"]
