"""Small random configs of the BERT-family encoders (RoBERTa, ALBERT, DistilBERT, ELECTRA) as transformers builds them,
and their base models (RobertaModel, ...) saved with save_pretrained beside the family tests' tokenizers: what a user
brings (tests/export/test_families.py, tests/export/test_st_embed.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

BASE_CLASSES = {"roberta": "RobertaModel", "albert": "AlbertModel", "distilbert": "DistilBertModel",
                "electra": "ElectraModel"}


def hf_config(family: str, vocab: int, pad: int, **extra: Any):
    import transformers

    # initializer_range 0.2 (HF: 0.02): a random head then separates inputs clearly, so agreement means something.
    small = dict(vocab_size=vocab, pad_token_id=pad, max_position_embeddings=64, initializer_range=0.2, **extra)
    if family == "roberta":
        return transformers.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, bos_token_id=0, eos_token_id=2, **small)
    if family == "albert":  # E != H, three passes through one shared layer
        return transformers.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                         num_attention_heads=2, intermediate_size=64, **small)
    if family == "electra":  # E != H: the embeddings_project path
        return transformers.ElectraConfig(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=64, **small)
    return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=64, **small)


def tokenizer_of(family: str, tokenizers: dict[str, Path]) -> tuple[Path, int, int]:
    """The family's tokenizer directory (tests.conftest.family_tokenizers), its vocabulary size and pad id."""
    tok_dir = tokenizers["roberta" if family == "roberta" else "wordpiece"]
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    size = len(vocab) + sum(1 for t in tok["added_tokens"] if t["content"] not in vocab)
    return tok_dir, size, 1 if family == "roberta" else 0


def save_with_tokenizer(model, tok_dir: Path, dest: Path) -> Path:
    model.eval().save_pretrained(dest)
    for f in tok_dir.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def base_checkpoint(family: str, tokenizers: dict[str, Path], dest: Path) -> Path:
    """The family's base model (no head) from a random config, saved with its tokenizer."""
    import torch
    import transformers

    tok_dir, vocab, pad = tokenizer_of(family, tokenizers)
    torch.manual_seed(0)
    return save_with_tokenizer(getattr(transformers, BASE_CLASSES[family])(hf_config(family, vocab, pad)), tok_dir,
                               dest)


def save_transformers_checkpoints(root: Path, classes: dict[str, str], config_of: Callable[..., Any], tokenizer,
                                  heads: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """One checkpoint per `classes` key (task -> transformers class name) under root/task, each from
    config_of(vocabulary size, **heads[task]) with the same seed, saved with the transformers tokenizer's files."""
    import torch
    import transformers

    out = {}
    for task, cls_name in classes.items():
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(config_of(len(tokenizer), **heads.get(task, {})))
        out[task] = root / task
        model.eval().save_pretrained(out[task])
        tokenizer.save_pretrained(out[task])
    return out


def hf_feeds(ckpt: Path, texts: list[str], pairs: list[str] | None = None) -> dict[str, Any]:
    """transformers' own tokenizer of the checkpoint: a right-padded batch of texts (or of text pairs), torch tensors."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    batch = tok(texts, pairs, padding=True, return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def reloaded_by_transformers(ours, cls_name: str, dest: Path):
    """`ours` with every weight moved away from the file it came from, saved by training.checkpoint.save_model and
    read back by transformers' `cls_name`, which must find no missing, unexpected or mismatched key: that model, in
    eval mode (`ours` is left in eval mode too)."""
    import torch
    import transformers

    from training.checkpoint import save_model

    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model(ours, dest)
    hf, info = getattr(transformers, cls_name).from_pretrained(dest, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours.eval()
    return hf.eval()


def assert_gate_refuses_a_perturbed_graph(ckpt: Path, task: str, repo: Path, monkeypatch) -> None:
    """ORTSERVE_EXPORT_PERTURB=fp32 (export/model_builder.py) moves the fp32 graph's answers: the parity gate must
    raise and publish nothing."""
    import pytest

    from export import ExportConfig, export_checkpoint
    from export.errors import ParityFailure

    monkeypatch.setenv("ORTSERVE_EXPORT_PERTURB", "fp32")
    with pytest.raises(ParityFailure):
        export_checkpoint(ExportConfig(checkpoint=ckpt, task=task, repository=repo, name="bad"))
    assert not (repo / "bad" / "1").exists()
